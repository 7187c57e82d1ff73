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

A job with "nodes" > 1 is one node of a multi-process measurement: every node runs the same job with its
own "node_rank", joined at "coordinator" (common.config.RunConfig's fields, a probe's `levers` beside
with the levers); it measures only the strategies (the same keys, `k` the global device count), and every
node stores the same values (replica 0's).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace

import numpy as np

from common import manifest
from common import weights as weightslib
from common.backend import Probe
from common.errors import Unsupported

# Steps of each strategy's float64 trace. A trace amplifies a difference by ~2x per step (ResNet-18 at
# lr 0.1): a different rule (a BatchNorm convention, a reduction) shows at once, while float64 rounding
# mostly stays below 1e-10 over a few steps (where it does not, the float64 floor below says how far).
FLOAT64_STEPS = 3

# The float64 floor: how far float64 rounding alone moves each quantity the float64 rows compare. The reference
# runs the same math twice over FLOAT64_STEPS steps, once as the batches come and once with the images of every
# device's shard permuted (labels with them): the mean loss, the summed gradients and BatchNorm's batch
# statistics do not change in exact arithmetic, only the order of their sums. Reserved names, never a strategy.
IN_ORDER, PERMUTED = "float64-in-order", "float64-permuted"
FLOOR_RUNS = (IN_ORDER, PERMUTED)


def topology(job: dict) -> dict:
    """The RunConfig fields that make a probe one node of several ({} for one process)."""
    if job.get("nodes", 1) == 1:
        return {}
    return {"nodes": job["nodes"], "node_rank": job["node_rank"], "coordinator": job["coordinator"]}


def across_nodes(backend, strategy: str, nodes: dict) -> dict:
    """The options a strategy takes on several nodes (MXNet's dist_sync kvstore), {} on one."""
    if not nodes:
        return {}
    declared = manifest.load(backend.name).options_for(strategy)
    return {k: o.nodes_default for k, o in declared.items() if o.nodes_default}


def measure(backend, job: dict) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with np.load(job["batches"]) as f:
        xs, ys = f["x"], f["y"]
    batches = list(zip(xs, ys))
    out, skipped = {}, {}
    nodes = topology(job)
    for model in job["models"]:
        w = weightslib.load(job["weights"][model], model)
        if not nodes:
            out[f"{model}|forward|train"] = backend.predict(model, w, xs[0], train=True)
            out[f"{model}|forward|eval"] = backend.predict(model, w, xs[0])
            if job.get("float64"):  # the reference backend: its logits' own float32 rounding
                for mode in ("train", "eval"):
                    out[f"{model}|float64|forward|{mode}"] = backend.predict(
                        model, w, xs[0], train=mode == "train", dtype="float64"
                    )
            loss, grads = backend.float64_gradients(model, w, xs[0], ys[0])
            out[f"{model}|float64|loss"] = np.float64(loss)
            out.update({f"{model}|float64|grad|{n}": g for n, g in grads.items()})
        for strategy in job["strategies"]:
            for k in job["devices"]:
                for bn in job["bn"]:
                    if bn == "sync" and model == "lenet":
                        continue  # no BatchNorm: the same as local
                    key = f"{model}|{strategy}|{k}|{bn}"
                    probe = Probe(
                        strategy,
                        model,
                        k,
                        bn=bn,
                        device_kind=job["device_kind"],
                        options=across_nodes(backend, strategy, nodes),
                        levers=nodes,
                    )
                    try:
                        out.update(_run(backend, key, probe, w, batches, job["lr"]))
                        out.update(
                            _run(
                                backend,
                                f"{model}|{strategy}:float64|{k}|{bn}",
                                replace(probe, dtype="float64"),
                                w,
                                batches[:FLOAT64_STEPS],
                                job["lr"],
                            )
                        )
                    except Unsupported as e:
                        skipped[key] = str(e)
        if job.get("float64") and not nodes:
            out.update(_reference_runs(backend, model, w, batches, job))
    return out, skipped


def _reference_runs(backend, model: str, w, batches: list, job: dict) -> dict[str, np.ndarray]:
    """The reference backend's float64 runs of every device count and BatchNorm mode: the whole trace on the CPU
    (the float32 floor), and FLOAT64_STEPS as they come and permuted on the strategies' devices (the float64
    floor)."""
    out = {}
    for k in job["devices"]:
        for bn in job["bn"]:
            if bn == "sync" and model == "lenet":
                continue  # no BatchNorm: the same as local
            loss, grads, trace = backend.float64_reference(model, k, w, batches, job["lr"], bn=bn)
            out.update(_flat(f"{model}|float64|{k}|{bn}", loss, grads, trace))
            for name, run in (
                (IN_ORDER, batches[:FLOAT64_STEPS]),
                (PERMUTED, permuted_within_shards(batches[:FLOAT64_STEPS], k)),
            ):
                loss, grads, trace = backend.float64_reference(
                    model, k, w, run, job["lr"], bn=bn, device_kind=job["device_kind"]
                )
                out.update(_flat(f"{model}|{name}|{k}|{bn}", loss, grads, trace))
    return out


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


def _run(backend, key: str, probe: Probe, w, batches, lr) -> dict[str, np.ndarray]:
    """The first batch's loss and gradients, and the trace over `batches`, of one configuration."""
    loss, grads = backend.gradients(probe, w, *batches[0])
    return _flat(key, loss, grads, backend.train_trace(probe, w, batches, lr))


def _flat(key: str, loss: float, grads: dict, trace: dict) -> dict[str, np.ndarray]:
    return {
        f"{key}|loss": np.float64(loss),
        f"{key}|losses": np.asarray(trace["losses"], dtype=np.float64),
        **{f"{key}|grad|{n}": g for n, g in grads.items()},
        **{f"{key}|first|{n}": v for n, v in trace["first"].items()},
        **{f"{key}|final|{n}": v for n, v in trace["final"].items()},
    }


def node_session(backend, job: dict):
    """One node of several: the engine joined for the whole job (every probe of it runs inside this session, so
    none joins or leaves again: ps-lite and jax.distributed join once per process). One process: nothing."""
    nodes = topology(job)
    if not nodes:
        return contextlib.nullcontext()
    strategy, model = job["strategies"][0], job["models"][0]
    probe = Probe(
        strategy,
        model,
        job["devices"][0],
        device_kind=job["device_kind"],
        options=across_nodes(backend, strategy, nodes),
        levers=nodes,
    )
    with np.load(job["batches"]) as f:
        batch_size = len(f["y"][0])
    return backend.session(probe.config(backend.name, batch_size, job["lr"]))


def run(backend, job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    with node_session(backend, job):
        out, skipped = measure(backend, job)
    np.savez(result_path, **out)
    with open(result_path + ".skipped.json", "w") as f:
        json.dump(skipped, f, indent=2)
