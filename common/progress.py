"""Progress lines from a worker to the harness: one JSON object per line behind a marker.

Anything else a worker prints is its own log; the harness keeps it and shows it on failure.
"""

from __future__ import annotations

import json
import math
import sys

MARKER = "@dpbench "

# The fields the harness shows for each event, all finite numbers. A line that lacks one is not a progress
# record (the worker's output is untrusted: a malformed line must not stop the harness).
FIELDS = {
    "warmup": ("seconds",),
    "step": ("epoch", "epochs", "step", "steps"),
    "epoch": ("epoch", "epochs", "time_s", "images_per_s", "train_loss", "test_acc"),
    "rounding": ("first", "last", "steps"),
}


def emit(event: str, **fields) -> None:
    sys.stdout.write(MARKER + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def parse(line: str) -> dict | None:
    """The progress record in a line, or None for ordinary output (and for a malformed record)."""
    if not line.startswith(MARKER):
        return None
    try:
        record = json.loads(line[len(MARKER) :])
    except (ValueError, RecursionError):  # not JSON, or absurdly nested
        return None
    if not isinstance(record, dict) or not isinstance(record.get("event"), str):
        return None
    if not all(_finite_number(record.get(name)) for name in FIELDS.get(record["event"], ())):
        return None
    return record


def _finite_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
