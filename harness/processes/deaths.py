"""How a worker died, in words, and what it measured before: a signal by its name; SIGKILL with the memory
evidence where the host keeps any (its cgroup's count of out-of-memory kills, cgroup v2 or v1, read before and
after the run); and the epochs its progress lines reported, which a worker that dies never writes into a result.
Everything here is read from untrusted places (the kernel's files, a worker's output): a file that cannot be read
is no evidence, never an error."""

from __future__ import annotations

import math
import signal
from pathlib import Path

# How how_it_died's words begin: a node's failure is read by its line that says how its process ended.
ENDINGS = ("worker exited with status", "worker killed by")
# What an epoch's progress line holds (common/loop.py train_epoch, progress.emit("epoch", ...)), as numbers.
EPOCH_FIELDS = ("epoch", "time_s", "images_per_s", "train_loss", "test_acc", "steps")


def oom_kills(
    proc_self: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")
) -> int | None:
    """This process's cgroup's count of out-of-memory kills (its descendants' included: where the workers run),
    or None where the host does not say: cgroup v2's memory.events `oom_kill`, else v1's memory.oom_control."""
    try:
        lines = proc_self.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2 (at the root, or beside v1 as "unified")
            found = next(
                (
                    n
                    for top in (root, root / "unified")
                    if (n := counted(top / path.lstrip("/") / "memory.events", "oom_kill"))
                    is not None
                ),
                None,
            )
        elif "memory" in controllers.split(","):
            found = counted(root / "memory" / path.lstrip("/") / "memory.oom_control", "oom_kill")
        else:
            continue
        if found is not None:
            return found
    return None


def counted(path: Path, name: str) -> int | None:
    """The value of the line `NAME N` of a kernel's counters file (None: no such file or line)."""
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name and value.strip().isdigit():
                return int(value)
    except OSError:
        return None
    return None


def how_it_died(returncode: int, oom_before: int | None, oom_after: int | None) -> str:
    """A worker's end in words: its exit status, or the signal that ended it by name; a SIGKILL says whether the
    out-of-memory killer did it, by this cgroup's count of its kills before and after the run."""
    if returncode >= 0:
        return f"worker exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    said = f"worker killed by {name}"
    if -returncode != signal.SIGKILL:
        return said
    if oom_before is None or oom_after is None:
        return f"{said}: often the kernel's out-of-memory killer (this host keeps no count of its kills here)"
    if oom_after > oom_before:
        return (
            f"{said}: the kernel's out-of-memory killer (this cgroup's out-of-memory kills went from "
            f"{oom_before} to {oom_after} during the run)"
        )
    return f"{said}, not by the out-of-memory killer (this cgroup counted no out-of-memory kill during the run)"


def finished_epoch(record: dict) -> dict | None:
    """An epoch's progress line as a record of its figures (untrusted: None unless every field is a finite
    number)."""
    epoch = {name: record.get(name) for name in EPOCH_FIELDS}
    numbers = all(
        isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        for v in epoch.values()
    )
    return epoch if numbers else None


def keep_epoch(record: dict, finished: list[dict]) -> None:
    """A progress record that is a finished epoch's, into `finished` (anything else, and a malformed one: nothing)."""
    if record.get("event") == "epoch" and (epoch := finished_epoch(record)):
        finished.append(epoch)


def keep_partial_epochs(result: dict, finished: list[dict]) -> None:
    """A run that failed or ran out of time before writing its epochs keeps the ones its progress lines reported,
    as `partial_epochs`: in the report beside the failure, never averaged into a row."""
    if result["status"] in ("failed", "timeout") and not result.get("epochs") and finished:
        result["partial_epochs"] = finished
