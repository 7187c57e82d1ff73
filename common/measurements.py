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
# lr 0.1): float64 rounding (1e-16) stays far below the check's 1e-10 over a few steps, while a different
# rule (a BatchNorm convention, a reduction) shows at once.
FLOAT64_STEPS = 3


def topology(job: dict) -> dict:
    """The RunConfig fields that make a probe one node of several ({} for one process)."""
    if job.get("nodes", 1) == 1:
        return {}
    return {"nodes": job["nodes"], "node_rank": job["node_rank"], "coordinator": job["coordinator"]}


def across_nodes(backend, strategy: str, nodes: dict) -> dict:
    """The options a strategy takes on several nodes (MXNet's dist_sync kvstore), {} on one."""
    if not nodes:
        return {}
    declared = manifest.load(backend.NAME).options_for(strategy)
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
        if (
            job.get("float64") and not nodes
        ):  # the float32 floor: the same math in float64, the whole trace
            for k in job["devices"]:
                for bn in job["bn"]:
                    if not (bn == "sync" and model == "lenet"):
                        loss, grads, trace = backend.float64_reference(
                            model, k, w, batches, job["lr"], bn=bn
                        )
                        out.update(_flat(f"{model}|float64|{k}|{bn}", loss, grads, trace))
    return out, skipped


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
    return backend.session(probe.config(backend.NAME, batch_size, job["lr"]))


def run(backend, job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    with node_session(backend, job):
        out, skipped = measure(backend, job)
    np.savez(result_path, **out)
    with open(result_path + ".skipped.json", "w") as f:
        json.dump(skipped, f, indent=2)
