"""What a failed write says: which file, why, and the space left where it was going (a full disk, a quota,
a read-only or unwritable folder all end in one line, never a traceback)."""

from __future__ import annotations

import shutil
from pathlib import Path


def not_written(path, error: OSError) -> str:
    """ "could not write PATH: No space left on device (12 kB free there)"."""
    return f"could not write {error.filename or path}: {error.strerror or error} ({free_at(path)} free there)"


def free_at(path) -> str:
    """The space free to this user on the filesystem that holds `path` (or would: its nearest existing folder)."""
    place = Path(path).absolute()
    while place != place.parent:
        try:
            free = shutil.disk_usage(place).free
            break
        except OSError:  # not there (yet), not a folder, a name too long: its parent's filesystem
            place = place.parent
    else:
        return "unknown space"
    for unit in ("bytes", "kB", "MB"):
        if free < 1000:
            return f"{free:.0f} bytes" if unit == "bytes" else f"{free:.1f} {unit}"
        free /= 1000
    return f"{free:.1f} GB"
