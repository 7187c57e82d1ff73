"""The worker side of `python -m harness check`: measure what the equivalence table compares.

Runs inside one backend's environment, on canonical weights and batches written by the
harness, and stores flat arrays in an .npz (readable whatever numpy the harness has):

  <model>|forward|train, <model>|forward|eval         logits of the first batch, 1 device
  <model>|<strategy>|<k>|<bn>|loss                    mean loss of the first global batch
  <model>|<strategy>|<k>|<bn>|grad|<name>             its gradient, after the strategy's reduction
  <model>|<strategy>|<k>|<bn>|first|<name>            weights after one SGD step (BatchNorm running statistics too)
  <model>|<strategy>|<k>|<bn>|final|<name>            weights after the last step of the trace (the same)
  <model>|<strategy>|<k>|<bn>|losses                  the mean loss of every step of the trace
  <model>|<strategy>:float64|<k>|<bn>|...             the same run in float64 (dtype="float64": the strategy's
                                                      own code path), over the first FLOAT64_STEPS steps
  <model>|float64|loss, <model>|float64|grad|<name>   the first batch's mean loss and gradient in float64, 1 device
  <model>|float64|forward|train, ...|eval             the logits in float64 (the reference backend only)
  <model>|float64|<k>|<bn>|...                        loss, grad, first, final, losses in float64 over the whole
                                                      trace (the reference backend only: the float32 floor)
  <model>|float64-in-order|<k>|<bn>|...               the same over the first FLOAT64_STEPS steps, and again with
  <model>|float64-permuted|<k>|<bn>|...               the images of every device's shard permuted (the reference
                                                      backend only: the float64 floor, FLOOR_RUNS)
and a JSON of what could not run here, with the reason.

The file is an uncompressed .npz with one more entry, ALIASES, where one array is stored under several names:
a trace of one step stores its weights under `first` only (its `final` are the same arrays), and the reference
backend's 1-device float64 loss and gradients, and its in-order floor run on the CPU over at most FLOAT64_STEPS,
are its whole-trace run's arrays (the same calls, measured once). Read it with common/measurement_files.py's
`MeasurementFile`, which gives every
name, aliases included; np.load gives the stored entries only.

The job (common/checkjob.py's CheckJob, JSON) says what to measure; a job with `nodes` > 1 is one node of a
multi-process measurement: every node runs the same job with its own `node_rank`, joined at `coordinator`
(a probe's `nodes`, common/nodes.py's NodeSpec); it measures only the strategies (the
same keys, `k` the global device count), and every node stores the same values (replica 0's).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, replace

import numpy as np

from common import manifest
from common import weights as weightslib
from common.backend import Probe
from common.checkjob import (
    BN_MODES,
    FLOAT64_RUN,
    FORWARD_MODES,
    IN_ORDER,
    PERMUTED,
    SEPARATOR,
    CheckJob,
    JobError,
    MeasurementKey,
    float64_key,
    forward_key,
)
from common.errors import Unsupported
from common.measurement_files import save
from common.nodes import NodeSpec

# Steps of each strategy's float64 trace. A trace amplifies a difference by ~2x per step (ResNet-18 at
# lr 0.1): a different rule (a BatchNorm convention, a reduction) shows at once, while float64 rounding
# mostly stays below 1e-10 over a few steps (where it does not, the float64 floor below says how far).
FLOAT64_STEPS = 3


@dataclass(frozen=True)
class Inputs:
    """What every measurement of one model starts from: its canonical weights, the batches (one per step) and
    the learning rate."""

    weights: dict[str, np.ndarray]
    batches: list
    lr: float

    def first(self, steps: int) -> Inputs:
        return replace(self, batches=self.batches[:steps])


def topology(job: CheckJob) -> NodeSpec | None:
    """The nodes that make a probe one node of several (None for one process)."""
    if job.nodes == 1:
        return None
    return NodeSpec(job.nodes, job.node_rank, job.coordinator)


def across_nodes(backend, strategy: str, nodes: NodeSpec | None) -> dict:
    """The options a strategy takes on several nodes (MXNet's dist_sync kvstore), {} on one."""
    if not nodes:
        return {}
    declared = manifest.load(backend.name).options_for(strategy)
    return {k: o.nodes_default for k, o in declared.items() if o.nodes_default}


def read_batches(path: str) -> list[tuple[np.ndarray, np.ndarray]]:
    with np.load(path) as f:
        return list(zip(f["x"], f["y"]))


def measure(backend, job: CheckJob) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Every measurement of the job: {key: array} and {the key of a configuration that could not run: why}."""
    batches = read_batches(job.batches)
    out, skipped = {}, {}
    nodes = topology(job)
    for model in job.models:
        inputs = Inputs(weightslib.load(job.weights[model], model), batches, job.lr)
        if not nodes:
            out.update(_one_device(backend, model, inputs, job.float64))
            if not job.float64:
                out.update(_float64_gradients(backend, model, inputs))
        for key in job.keys(model):
            probe = Probe(
                key.strategy,
                model,
                key.devices,
                bn=key.bn,
                device_kind=job.device_kind,
                options=across_nodes(backend, key.strategy, nodes),
                nodes=nodes or NodeSpec(),
            )
            try:
                measured, refused = _run(backend, key, probe, inputs)
            except Unsupported as e:
                measured, refused = {}, str(e)
            out.update(measured)
            if refused:
                skipped[key.to_str()] = refused
        if job.float64 and not nodes:
            reference = _reference_runs(backend, job, model, inputs)
            out.update(_float64_gradients(backend, model, inputs, reference))
            out.update(reference)
    return out, skipped


def _one_device(backend, model: str, inputs: Inputs, reference: bool) -> dict[str, np.ndarray]:
    """The first batch's logits in both BatchNorm modes (the reference's in float64 too: its logits' own float32
    rounding)."""
    w = inputs.weights
    x, _ = inputs.batches[0]
    out = {
        forward_key(model, mode): backend.predict(model, w, x, train=mode == "train")
        for mode in FORWARD_MODES
    }
    if reference:
        for mode in FORWARD_MODES:
            out[forward_key(model, mode, "float64")] = backend.predict(
                model, w, x, train=mode == "train", dtype="float64"
            )
    return out


def _float64_gradients(backend, model: str, inputs: Inputs, reference: dict | None = None) -> dict:
    """The first batch's loss and gradients in float64 on 1 CPU device. The reference backend's whole-trace run
    on 1 device began with that very call (Backend.float64_reference's first, on the CPU): its values, stored
    once; else computed here."""
    for bn in BN_MODES:
        run = MeasurementKey(model, FLOAT64_RUN, 1, bn)
        if reference and run.part("loss") in reference:
            grad = run.part("grad") + SEPARATOR
            return {
                float64_key(model, "loss"): reference[run.part("loss")],
                **{
                    float64_key(model, "grad", k[len(grad) :]): v
                    for k, v in reference.items()
                    if k.startswith(grad)
                },
            }
    x, y = inputs.batches[0]
    loss, grads = backend.float64_gradients(model, inputs.weights, x, y)
    return {
        float64_key(model, "loss"): np.float64(loss),
        **{float64_key(model, "grad", n): g for n, g in grads.items()},
    }


def _reference_runs(backend, job: CheckJob, model: str, inputs: Inputs) -> dict[str, np.ndarray]:
    """The reference backend's float64 runs of every device count and BatchNorm mode: the whole trace on the CPU
    (the float32 floor), and FLOAT64_STEPS as they come and permuted on the strategies' devices (the float64
    floor)."""
    out = {}
    for k, bn in job.configurations(model):
        key = MeasurementKey(model, FLOAT64_RUN, k, bn)
        whole = _reference_run(backend, key, inputs, "cpu")
        out.update(whole)
        first = inputs.first(FLOAT64_STEPS)
        permuted = replace(first, batches=permuted_within_shards(first.batches, k))
        if job.device_kind == "cpu" and len(first.batches) == len(inputs.batches):
            # the same call as the whole trace's (its steps, on the CPU): its values, stored once
            out.update(_renamed(whole, key, key.run_of(IN_ORDER)))
        else:
            out.update(_reference_run(backend, key.run_of(IN_ORDER), first, job.device_kind))
        out.update(_reference_run(backend, key.run_of(PERMUTED), permuted, job.device_kind))
    return out


def _renamed(arrays: dict, old: MeasurementKey, new: MeasurementKey) -> dict:
    """The measurements of run `old` under run `new`'s key: the same arrays (the file stores them once)."""
    prefix = old.to_str() + SEPARATOR
    return {new.part(k[len(prefix) :]): v for k, v in arrays.items() if k.startswith(prefix)}


def _reference_run(backend, key: MeasurementKey, inputs: Inputs, device_kind: str) -> dict:
    """One float64 run of the reference strategy, stored under `key`."""
    loss, grads, trace = backend.float64_reference(
        key.model,
        key.devices,
        inputs.weights,
        inputs.batches,
        inputs.lr,
        bn=key.bn,
        device_kind=device_kind,
    )
    return _flat(key, loss, grads, trace)


def permuted_within_shards(batches: list, devices: int) -> list:
    """Each batch with the images of every device's shard (a contiguous 1/devices of it, as every backend's
    split takes it) rotated by one, labels with them: each device sees the same images, summed in another order.
    A rotation moves every image, and changes the pairs a pairwise sum adds first (a reversal would not)."""
    out = []
    for x, y in batches:
        shard = len(y) // devices
        index = np.roll(np.arange(len(y)).reshape(devices, shard), 1, axis=1).ravel()
        out.append((x[index], y[index]))
    return out


def _run(backend, key: MeasurementKey, probe: Probe, inputs: Inputs) -> tuple[dict, str | None]:
    """The first batch's loss and gradients, and the trace over the batches, of one configuration, and the same in
    float64 over the first FLOAT64_STEPS steps: all four in one launch of the strategy's processes. With why its
    float64 run cannot run here (an engine that carries float32 only), if it cannot: then only the float32 ones.
    Unsupported if the configuration cannot run at all."""
    first = inputs.batches[:1]
    float32 = [("gradients", "float32", first), ("trace", "float32", inputs.batches)]
    float64 = [
        ("gradients", "float64", first),
        ("trace", "float64", inputs.first(FLOAT64_STEPS).batches),
    ]
    try:
        backend.check_supported(probe.config(backend.name, len(first[0][1]), inputs.lr), "float64")
        refused = None
    except Unsupported as e:
        float64, refused = [], str(e)
    values = backend.run_probes(probe, inputs.weights, float32 + float64, inputs.lr)
    out = _flat(key, *values[0], values[1])
    if float64:
        out.update(_flat(key.float64(), *values[2], values[3]))
    return out, refused


def _flat(key: MeasurementKey, loss: float, grads: dict, trace: dict) -> dict[str, np.ndarray]:
    # After one step the last step's weights are the first step's: the same arrays, which the file stores once.
    final = trace["first"] if len(trace["losses"]) == 1 else trace["final"]
    return {
        key.part("loss"): np.float64(loss),
        key.part("losses"): np.asarray(trace["losses"], dtype=np.float64),
        **{key.part("grad", n): g for n, g in grads.items()},
        **{key.part("first", n): v for n, v in trace["first"].items()},
        **{key.part("final", n): final[n] for n in trace["final"]},
    }


def node_session(backend, job: CheckJob):
    """One node of several: the engine joined for the whole job (every probe of it runs inside this session, so
    none joins or leaves again: ps-lite and jax.distributed join once per process). One process: nothing."""
    nodes = topology(job)
    if not nodes:
        return contextlib.nullcontext()
    strategy, model = job.strategies[0], job.models[0]
    probe = Probe(
        strategy,
        model,
        job.devices[0],
        device_kind=job.device_kind,
        options=across_nodes(backend, strategy, nodes),
        nodes=nodes,
    )
    with np.load(job.batches) as f:
        batch_size = len(f["y"][0])
    return backend.session(probe.config(backend.name, batch_size, job.lr))


def run(backend, job_path: str, result_path: str) -> None:
    """The check worker: the job file's measurements into `result_path` (.npz) and what could not run into
    `result_path`.skipped.json. A malformed job file ends the worker with its one-line reason (no traceback)."""
    try:
        job = CheckJob.load(job_path)
    except JobError as e:
        raise SystemExit(str(e)) from None
    with node_session(backend, job):
        out, skipped = measure(backend, job)
    save(result_path, out)
    with open(result_path + ".skipped.json", "w") as f:
        json.dump(skipped, f, indent=2)
