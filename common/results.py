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


def write_json_atomic(path, obj) -> None:
    """Write to a temp file in the same directory, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(_finite(obj), f, indent=2, sort_keys=False)
            f.write("\n")
        os.replace(tmp, path)
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


def load_result(path) -> dict:
    """Read a worker's result and check it is one we understand."""
    with open(path) as f:
        result = json.load(f)
    if not isinstance(result, dict) or result.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"{path}: not a schema v{SCHEMA_VERSION} result")
    if result.get("status") not in STATUSES:
        raise ValueError(f"{path}: unknown status {result.get('status')!r}")
    return result


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
