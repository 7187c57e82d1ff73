"""The worker side of `python -m harness check`: measure what the equivalence table compares.

Runs inside one backend's environment, on canonical weights and batches written by the
harness, and stores flat arrays in an .npz (readable whatever numpy the harness has):

  <model>|forward|train, <model>|forward|eval         logits of the first batch, 1 device
  <model>|<strategy>|<k>|<bn>|loss                    mean loss of the first global batch
  <model>|<strategy>|<k>|<bn>|grad|<name>             its gradient, after the strategy's reduction
  <model>|<strategy>|<k>|<bn>|first|<name>            weights after one SGD step
  <model>|<strategy>|<k>|<bn>|losses                  the mean loss of every step of the trace
and a JSON of what could not run here, with the reason.
"""

from __future__ import annotations

import json

import numpy as np

from common import weights as weightslib
from common.loop import Unsupported


def measure(backend, job: dict) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with np.load(job["batches"]) as f:
        xs, ys = f["x"], f["y"]
    batches = list(zip(xs, ys))
    out, skipped = {}, {}
    for model in job["models"]:
        w = weightslib.load(job["weights"][model], model)
        out[f"{model}|forward|train"] = backend.predict(model, w, xs[0], train=True)
        out[f"{model}|forward|eval"] = backend.predict(model, w, xs[0])
        for strategy in job["strategies"]:
            for k in job["devices"]:
                for bn in job["bn"]:
                    if bn == "sync" and model == "lenet":
                        continue  # no BatchNorm: the same as local
                    key = f"{model}|{strategy}|{k}|{bn}"
                    common = dict(bn=bn, device_kind=job["device_kind"])
                    try:
                        loss, grads = backend.gradients(strategy, model, k, w, xs[0], ys[0], **common)
                        trace = backend.train_trace(strategy, model, k, w, batches, job["lr"], **common)
                    except Unsupported as e:
                        skipped[key] = str(e)
                        continue
                    out[f"{key}|loss"] = np.float64(loss)
                    out[f"{key}|losses"] = np.asarray(trace["losses"], dtype=np.float64)
                    out.update({f"{key}|grad|{n}": g for n, g in grads.items()})
                    out.update({f"{key}|first|{n}": v for n, v in trace["first"].items()})
    return out, skipped


def run(backend, job_path: str, result_path: str) -> None:
    with open(job_path) as f:
        job = json.load(f)
    out, skipped = measure(backend, job)
    np.savez(result_path, **out)
    with open(result_path + ".skipped.json", "w") as f:
        json.dump(skipped, f, indent=2)
