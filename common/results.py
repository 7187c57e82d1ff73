"""Result JSON: one per worker run, versioned, always written atomically.

status is one of:
  ok           trained and evaluated every epoch
  failed       the worker (or one of its ranks) raised or crashed; `error` holds the tail
  diverged     a loss became NaN/inf
  timeout      the harness killed it after --timeout seconds
  unavailable  refused before starting (backend missing, strategy the hardware cannot run)
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "diverged", "timeout", "unavailable", "interrupted")
ERROR_TAIL_CHARS = 2000


def publish(tmp, path) -> None:
    """Rename a finished temp file onto `path` with the mode a plainly created file gets (0644 under the usual
    umask): mkstemp makes it 0600, which would leave results.json and checkpoints unreadable to the group that
    reads report.md beside them."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def write_json_atomic(path, obj) -> None:
    """Write to a temp file in the same directory, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_finite(obj), f, indent=2, sort_keys=False)
            f.write("\n")
        publish(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _finite(obj):
    """JSON has no NaN/inf: write them as strings so the file stays standard."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def new_result(config: dict, status: str = "failed") -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "status": status,
        "config": config,
        "environment": {},
        "epochs": [],
        "compile_s": None,
        "params": None,
        "weights_hash": None,
        "data_hash": None,
        "error": None,
    }


def failed_result(config: dict, status: str, error: str) -> dict:
    result = new_result(config, status)
    result["error"] = tail(error)
    return result


def tail(text: str, n: int = ERROR_TAIL_CHARS) -> str:
    text = (text or "").strip()
    return text if len(text) <= n else "..." + text[-n:]


def load_result(path, config: dict) -> dict:
    """Read the result of the run given `config` and check it holds what the report reads, with the types it
    expects: a worker's file is untrusted input. ValueError, with a one-line reason, otherwise."""
    try:
        with open(path) as f:
            result = json.load(f)
    except (ValueError, RecursionError) as e:   # not JSON (or not UTF-8), or absurdly nested
        raise ValueError(f"{path}: not a JSON file ({type(e).__name__})") from None
    problem = result_problem(result, config)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return result


# Optional top-level fields and the types the report can use.
FIELD_TYPES = {"environment": dict, "error": (str, type(None)), "epochs": list, "memory": (dict, type(None)),
               "step_time": (dict, type(None)), "allreduce": (dict, type(None)),
               "weights_hash": (str, type(None)), "data_hash": (str, type(None))}
EPOCH_FIELDS = ("epoch", "time_s", "steps", "images", "images_per_s", "train_loss", "train_acc", "test_acc")


def result_problem(result, config: dict) -> str | None:
    """Why `result` is not a usable result of the run given `config`, or None."""
    if not isinstance(result, dict) or result.get("schema_version") != SCHEMA_VERSION:
        return f"not a schema v{SCHEMA_VERSION} result"
    if not isinstance(result.get("status"), str) or result["status"] not in STATUSES:
        return f"unknown status {result.get('status')!r}"
    if result.get("config") != config:
        return "its config is missing or is not the one this run was given"
    for name, kinds in FIELD_TYPES.items():
        if name in result and not isinstance(result[name], kinds):
            return f"{name} is a {type(result[name]).__name__}"
    for name in ("compile_s", "params", "final_test_acc"):
        if result.get(name) is not None and not _number(result[name]):
            return f"{name} is not a number"
    environment = result.get("environment") or {}
    if not isinstance(environment.get("devices") or [], list) or \
            not isinstance(environment.get("precision") or {}, dict):
        return "environment.devices or environment.precision has the wrong type"
    return _metrics_problem(result) if result["status"] == "ok" else None


def _metrics_problem(result: dict) -> str | None:
    for epoch in result.get("epochs") or []:
        if not isinstance(epoch, dict) or not all(_number(epoch.get(name)) for name in EPOCH_FIELDS):
            return f"an epoch record lacks one of {', '.join(EPOCH_FIELDS)} (finite numbers)"
        if epoch["time_s"] <= 0:
            return "an epoch took no time"
    required = {"step_time": ("median_s", "p10_s", "p90_s", "steps"), "allreduce": ("median_s", "bytes"),
                "memory": ()}
    optional = {"step_time": ("images_per_s",), "allreduce": ("gb_per_s", "share_of_step"),
                "memory": ("peak_device_mb", "peak_host_rss_mb")}
    for name in required:
        part = result.get(name)
        if part is None:
            continue
        if not all(_number(part.get(k)) for k in required[name]) or \
                not all(part.get(k) is None or _number(part[k]) for k in optional[name]):
            return f"{name} lacks a field or has one that is not a number"
    return None


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def summary(result: dict) -> dict:
    """The headline numbers of one run: mean over all epochs (as d2l), warm-up excluded by the loop."""
    epochs = result.get("epochs") or []
    if not epochs:  # evaluation only (--epochs 0 with --load-weights)
        acc = result.get("final_test_acc")
        return {} if acc is None else {"test_acc": acc}
    seconds = sum(e["time_s"] for e in epochs)
    return {
        "sec_per_epoch": seconds / len(epochs),
        "images_per_s": sum(e["images"] for e in epochs) / seconds,
        "test_acc": epochs[-1]["test_acc"],
        "train_loss": epochs[-1]["train_loss"],
    }
