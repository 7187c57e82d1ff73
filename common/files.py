"""Files written whole or not at all: a temp file beside the target, renamed onto it once complete, with the mode a
plainly created file gets. Results, reports, checkpoints, the data cache and the projection are written this way,
so a crash, a full disk or a signal never leaves half a file or a temp file behind."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path


def publish(tmp, path) -> None:
    """Rename a finished temp file onto `path` with the mode a plainly created file gets (0644 under the usual
    umask): mkstemp makes it 0600, which would leave results.json and checkpoints unreadable to the group that
    reads report.md beside them."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, path)


def write_atomic(path, write, mode: str = "w") -> None:
    """`write(file)` into a temp file beside `path`, then rename: never half a file, nor a temp file left."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
        publish(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text_atomic(path, text: str) -> None:
    write_atomic(path, lambda f: f.write(text))


def write_json_atomic(path, obj) -> None:
    """JSON (NaN and inf as strings) written whole or not at all (write_text_atomic)."""
    write_text_atomic(path, json.dumps(finite(obj), indent=2, sort_keys=False) + "\n")


def finite(obj):
    """JSON has no NaN/inf: write them as strings so the file stays standard."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj
