"""MLPerf Training's log format: `:::MLLOG {json}` lines, as MLCommons' reference implementations write them and
its `mlperf-logging` package reads them (docs/time-to-accuracy.md).

A worker's rank 0 prints them on its standard output while it trains (common/loop.py): the run's parameters
(`seed`, `global_batch_size`, `opt_base_learning_rate`, ...), `run_start` after the warm-up, `epoch_start` and
`epoch_stop` around each timed epoch, `eval_accuracy` after each evaluation, and `run_stop` with its status:
"success" where the run reached its --target-accuracy (or trained every epoch without one), "aborted" where it did
not. The suite's own keys carry the prefix `dpbench_`. The harness copies the lines out of the worker's log into
`logs/<run>.mllog` (extract()), keeping only well-formed ones: a worker's output is untrusted input.

The format is written here, in a few lines, rather than with `mlperf_logging.mllog`: the workers' environments
(torch, jax, MXNet, Keras) would each need the package and its dependencies (pandas, scipy) for a JSON line. The
test suite reads the files back with the package's own parser.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

MARKER = ":::MLLOG "
POINT, START, END = "POINT_IN_TIME", "INTERVAL_START", "INTERVAL_END"
EVENT_TYPES = (POINT, START, END)
PREFIX = "dpbench_"


def line(key: str, value=None, event_type: str = POINT, **metadata) -> str:
    """One log line, stamped now (milliseconds since the epoch, as MLPerf's time_ms)."""
    record = {
        "namespace": "",
        "time_ms": round(time.time() * 1000, 3),
        "event_type": event_type,
        "key": key,
        "value": value,
        "metadata": metadata,
    }
    return MARKER + json.dumps(record)


def event(key: str, value=None, **metadata) -> None:
    _print(line(key, value, POINT, **metadata))


def start(key: str, value=None, **metadata) -> None:
    _print(line(key, value, START, **metadata))


def end(key: str, value=None, **metadata) -> None:
    _print(line(key, value, END, **metadata))


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------ the harness's side


def parse(text: str) -> dict | None:
    """The record of a log line holding a `:::MLLOG` record (a launcher may prefix the line), or None for any
    other line and for a malformed record."""
    at = text.find(MARKER)
    if at < 0:
        return None
    try:
        record = json.loads(text[at + len(MARKER) :])
    except (ValueError, RecursionError):
        return None
    if not (
        isinstance(record, dict)
        and isinstance(record.get("key"), str)
        and record.get("event_type") in EVENT_TYPES
        and isinstance(record.get("metadata"), dict)
        and isinstance(record.get("time_ms"), (int, float))
        and not isinstance(record["time_ms"], bool)
        and math.isfinite(record["time_ms"])
    ):
        return None
    return record


def extract(log: Path, out: Path) -> int:
    """The well-formed `:::MLLOG` lines of a worker's log, written to `out` (none, or a disk that cannot take
    them: no file); how many were written."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return 0
    records = [r for r in map(parse, text.splitlines()) if r is not None]
    if not records:
        return 0
    try:
        out.write_text("".join(MARKER + json.dumps(r) + "\n" for r in records), encoding="utf-8")
    except OSError:  # a full disk: the run's result stands without its MLPerf log
        out.unlink(missing_ok=True)
        return 0
    return len(records)
