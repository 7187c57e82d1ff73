"""How a worker died, in words, and what it measured before: a signal by its name; SIGKILL with the memory
evidence where the host keeps any (the worker's last peak resident set, and its cgroup's count of out-of-memory
kills, cgroup v2 or v1, read before and after the run); a device's out-of-memory error said as such, with the
device's memory its message gives; and the epochs its progress lines reported, which a worker that dies never
writes into a result.
Everything here is read from untrusted places (the kernel's files, a worker's output): a file that cannot be read
is no evidence, never an error."""

from __future__ import annotations

import math
import re
import signal
import time
from pathlib import Path

from common import manifest

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


def how_it_died(
    returncode: int, oom_before: int | None, oom_after: int | None, peak_mb: float | None = None
) -> str:
    """A worker's end in words: its exit status, or the signal that ended it by name; a SIGKILL says the worker's
    last peak resident set (`peak_mb`, where known) and whether the out-of-memory killer did it, by this cgroup's
    count of its kills before and after the run."""
    if returncode >= 0:
        return f"worker exited with status {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    said = f"worker killed by {name}"
    if -returncode != signal.SIGKILL:
        return said
    if peak_mb is not None:
        said += f" (peak RSS {size_words(peak_mb)})"
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


def size_words(mb: float) -> str:
    return f"{mb / 1024:.1f} GiB" if mb >= 1024 else f"{mb:.0f} MB"


# ------------------------------------------------------------------ the worker's peak resident set

SAMPLE_EVERY_S = 0.5  # VmHWM is a high-water mark: a sample now and then misses only the last rise before a death


def vm_hwm_mb(pid: int, proc: Path = Path("/proc")) -> float | None:
    """A process's peak resident set so far (its VmHWM), in MB; None once it has ended, or where /proc says none."""
    try:
        for line in (proc / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def descendants(pid: int, proc: Path = Path("/proc")) -> list[int]:
    """The processes `pid` started (a DDP worker's ranks), and theirs, where the kernel lists children."""
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            children = [
                int(c)
                for c in (proc / str(parent) / "task" / str(parent) / "children")
                .read_text()
                .split()
            ]
        except (OSError, ValueError):
            continue
        found += children
        todo += children
    return found


class PeakRSS:
    """The largest peak resident set of any process of a worker (its ranks included): what the worker's own
    progress lines report (`peak_host_rss_mb`, read as untrusted), and what the runner samples of /proc while they
    live. `mb`: None until either says."""

    def __init__(self, proc: Path = Path("/proc")):
        self.mb: float | None = None
        self.proc = proc
        self.sampled_at = -math.inf

    def seen(self, mb) -> None:
        if isinstance(mb, int | float) and not isinstance(mb, bool) and 0 < mb < math.inf:
            self.mb = max(self.mb or 0.0, float(mb))

    def reported(self, record: dict) -> None:
        """A progress line's own figure, if it carries one."""
        self.seen(record.get("peak_host_rss_mb"))

    def sample(self, pids: list[int]) -> None:
        """The workers' VmHWM now, at most every SAMPLE_EVERY_S (it is called on every line a worker prints)."""
        if time.monotonic() - self.sampled_at < SAMPLE_EVERY_S:
            return
        self.sampled_at = time.monotonic()
        for pid in pids + [d for p in pids for d in descendants(p, self.proc)]:
            self.seen(vm_hwm_mb(pid, self.proc))


# ------------------------------------------------------------------ a device out of memory


def out_of_memory_words() -> re.Pattern:
    """A device's out-of-memory error as each framework words it (each backend.toml's [framework] out_of_memory:
    torch's CUDA errors, XLA's for jax and Keras on jax, MXNet's)."""
    words = [w for framework in manifest.frameworks() for w in framework.out_of_memory]
    return re.compile("|".join(words), re.IGNORECASE)


def memory_words() -> list[tuple[re.Pattern, str]]:
    """The device's memory such an error gives, and how to say each (each backend.toml's [framework] memory_words:
    torch's "GPU 0 has a total capacity of 79.15 GiB of which 12.00 MiB is free", "77.50 GiB is allocated by
    PyTorch" and "Tried to allocate 2.00 GiB"; XLA's "Failed to allocate request for 2.00GiB" or "while trying to
    allocate 2147483648 bytes")."""
    return [
        (re.compile(regex), said)
        for framework in manifest.frameworks()
        for regex, said in framework.memory_words
    ]


def device_out_of_memory(text: str) -> str | None:
    """A worker's error or output that says its device ran out of memory, as one line with the device's memory
    at the time where the message gives it; None if it says no such thing."""
    if not out_of_memory_words().search(text):
        return None
    words = [
        said.format(*m.groups()) for pattern, said in memory_words() if (m := pattern.search(text))
    ]
    return "the device ran out of memory" + (f" ({'; '.join(words)})" if words else "")
