"""Progress lines from a worker to the harness: one JSON object per line behind a marker.

Anything else a worker prints is its own log; the harness keeps it and shows it on failure.
"""

from __future__ import annotations

import json
import sys

MARKER = "@dpbench "


def emit(event: str, **fields) -> None:
    sys.stdout.write(MARKER + json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


def parse(line: str) -> dict | None:
    """The progress record in a line, or None for ordinary output."""
    if not line.startswith(MARKER):
        return None
    try:
        record = json.loads(line[len(MARKER):])
    except ValueError:
        return None
    return record if isinstance(record, dict) and "event" in record else None
