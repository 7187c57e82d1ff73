"""Which GPUs this process may use, found without importing a framework.

Asked in order: nvidia-smi; then the driver's own files under /proc (a container may carry the
driver but not nvidia-smi on its PATH). CUDA_VISIBLE_DEVICES is applied the way CUDA applies it:
indices (nvidia-smi's order) or GPU UUIDs, full or a unique prefix, MIG instances by their UUID.
Whatever the outcome, `how` says in one line how the GPUs were found or why none were, so a GPU
host never falls back to simulated CPU devices without saying why.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

NVIDIA_SMI_TIMEOUT_S = 20  # a wedged driver can hang nvidia-smi; the harness must not hang with it
# one directory per GPU (its PCI bus id), with an `information` file
PROC_GPUS = Path("/proc/driver/nvidia/gpus")
DEV_NVIDIA0 = Path("/dev/nvidia0")  # the first GPU's device node
# "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15 ..."
PROC_VERSION = Path("/proc/driver/nvidia/version")


@dataclass
class Detection:
    gpus: list[str]  # names of the visible GPUs, in CUDA's order
    how: str  # one line: how they were found, or why none were


@dataclass
class Gpu:
    uuid: str
    name: str


def detect() -> Detection:
    tried = []
    for source, ask in (
        ("by nvidia-smi", from_nvidia_smi),
        (f"in the driver's files under {PROC_GPUS}", from_proc),
    ):
        gpus, why_none = ask()
        if gpus:
            return apply_visible_devices(
                gpus, os.environ.get("CUDA_VISIBLE_DEVICES"), source, tried
            )
        tried.append(why_none)
    if DEV_NVIDIA0.exists():
        # A device node without a listed GPU: a broken or partial driver install. The frameworks
        # are asked in the worker; the harness only says what it saw.
        return Detection(
            [],
            f"no GPU found: {DEV_NVIDIA0} exists but neither nvidia-smi nor the driver's "
            f"/proc files list a GPU ({'; '.join(tried)})",
        )
    return Detection([], "no GPU found: " + "; ".join(tried))


# ------------------------------------------------------------------ the two sources


def run_nvidia_smi(*args: str) -> tuple[str | None, str]:
    """(stdout, "") when nvidia-smi ran and succeeded, else (None, why not)."""
    if not shutil.which("nvidia-smi"):
        return None, "nvidia-smi is not on PATH"
    try:
        out = subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return None, f"nvidia-smi did not answer within {NVIDIA_SMI_TIMEOUT_S} s"
    except OSError as e:
        return None, f"nvidia-smi could not start ({e})"
    if out.returncode:
        message = (out.stderr.strip() or out.stdout.strip()).splitlines()
        return None, f"nvidia-smi failed with exit status {out.returncode}" + (
            f": {message[0]}" if message else ""
        )
    return out.stdout, ""


def from_nvidia_smi() -> tuple[list[Gpu], str]:
    """Every GPU nvidia-smi lists, in its index order (the order CUDA's indices refer to)."""
    text, why = run_nvidia_smi("--query-gpu=index,uuid,name", "--format=csv,noheader")
    if text is None:
        return [], why
    listed = []
    for line in text.splitlines():
        index, uuid, name = (part.strip() for part in (line.split(",", 2) + ["", ""])[:3])
        if index.isdigit() and uuid:
            listed.append((int(index), Gpu(uuid, name or "NVIDIA GPU")))
    if not listed:
        return [], "nvidia-smi lists no GPU"
    return [gpu for _, gpu in sorted(listed, key=lambda pair: pair[0])], ""


def from_proc() -> tuple[list[Gpu], str]:
    """Every GPU the driver lists under /proc, in PCI bus order (nvidia-smi's order too)."""
    if not PROC_GPUS.is_dir():
        return [], f"{PROC_GPUS} is absent"
    gpus = []
    for bus in sorted(PROC_GPUS.iterdir(), key=lambda p: p.name):
        try:
            fields = read_fields(bus / "information")
        except OSError:
            continue
        gpus.append(
            Gpu(fields.get("GPU UUID", ""), fields.get("Model") or f"NVIDIA GPU at {bus.name}")
        )
    return gpus, ("" if gpus else f"{PROC_GPUS} lists no GPU")


def read_fields(path: Path) -> dict[str, str]:
    """`Key:   value` lines of a driver file."""
    fields = {}
    for line in path.read_text(errors="replace").splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def mig_instances() -> list[Gpu]:
    """MIG instances from `nvidia-smi -L`, named after their GPU and profile (e.g. `NVIDIA H200 MIG 1g.18gb`)."""
    text, _ = run_nvidia_smi("-L")
    instances, parent = [], "NVIDIA GPU"
    for line in (text or "").splitlines():
        gpu = re.match(r"GPU \d+: (.+?) \(UUID: GPU-", line)
        mig = re.match(r"\s+MIG (\S+)\s+Device\s+\d+: \(UUID: (MIG-[^)\s]+)\)", line)
        if gpu:
            parent = gpu.group(1)
        elif mig:
            instances.append(Gpu(mig.group(2), f"{parent} MIG {mig.group(1)}"))
    return instances


def driver_version() -> tuple[int, ...] | None:
    """The NVIDIA driver's version, e.g. (550, 54, 15), from nvidia-smi or the driver's /proc file; None without
    a driver."""
    text, _ = run_nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    found = re.search(r"^\s*(\d+)\.(\d+)(?:\.(\d+))?\s*$", text or "", re.M)
    if not found:
        try:
            found = re.search(
                r"NVRM version:.*?\s(\d+)\.(\d+)(?:\.(\d+))?\s",
                PROC_VERSION.read_text(errors="replace"),
            )
        except OSError:
            found = None
    return tuple(int(g) for g in found.groups() if g is not None) if found else None


# ---------------------------------------------------------------- CUDA_VISIBLE_DEVICES


def apply_visible_devices(
    gpus: list[Gpu], visible: str | None, source: str, tried: list[str]
) -> Detection:
    """The GPUs CUDA would show under CUDA_VISIBLE_DEVICES, with a line saying where they came from."""
    if visible is None:
        chosen, notes = gpus, list(tried)
    else:
        chosen, problem = select_visible(gpus, visible)
        notes = [visible_note(visible, problem), *tried]
    if not chosen:
        return Detection(
            [], f"no GPU visible: {'; '.join(notes)}; {count(len(gpus), 'GPU')} found {source}"
        )
    return Detection(
        [g.name for g in chosen], f"found {source}" + (f" ({'; '.join(notes)})" if notes else "")
    )


def select_visible(gpus: list[Gpu], visible: str) -> tuple[list[Gpu], str | None]:
    """CUDA's reading of CUDA_VISIBLE_DEVICES: (the GPUs, what cut the list short, or None).

    An entry that names no GPU (-1, an index too large, an unknown or ambiguous UUID) ends the
    list there; a GPU named twice leaves CUDA with none (as torch's own parser reads CUDA).
    """
    entries = [e.strip() for e in visible.split(",")] if visible.strip() else []
    mig = mig_instances() if any(e.startswith("MIG-") for e in entries) else []
    chosen: list[Gpu] = []
    for entry in entries:
        gpu = find_gpu(entry, gpus, mig)
        if gpu is None:
            return chosen, f"CUDA stops at {abbreviate(entry)}" + unmatched(entry)
        if any(gpu is g for g in chosen):
            return [], f"{abbreviate(entry)} names a GPU a second time, so CUDA shows none"
        chosen.append(gpu)
    return chosen, None


def unmatched(entry: str) -> str:
    if entry == "-1":
        return ""  # the usual way to hide every GPU: nothing to explain
    if entry.startswith("MIG-"):
        # MIG instances are listed only by `nvidia-smi -L`: without it, say where we looked
        return ", which names no MIG instance `nvidia-smi -L` lists"
    return ", which names no GPU here"


def find_gpu(entry: str, gpus: list[Gpu], mig: list[Gpu]) -> Gpu | None:
    if entry.isdigit():
        return gpus[int(entry)] if int(entry) < len(gpus) else None
    if not entry.startswith(("GPU-", "MIG-")):
        return None
    matches = [g for g in gpus + mig if g.uuid.startswith(entry)]
    return matches[0] if len(matches) == 1 else None  # an ambiguous prefix names no GPU


def visible_note(visible: str, problem: str | None) -> str:
    if not visible.strip():
        return "CUDA_VISIBLE_DEVICES is empty"
    text = "CUDA_VISIBLE_DEVICES=" + ",".join(abbreviate(e.strip()) for e in visible.split(","))
    return f"{text}: {problem}" if problem else text


def abbreviate(entry: str) -> str:
    """A full UUID is 40 characters: its first 12 tell GPUs apart in a line someone reads."""
    return entry if len(entry) <= 13 else entry[:12] + "…"


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def describe(gpus: list[str]) -> str:
    """`1 GPU (NVIDIA H200)`, `8 GPUs (8x NVIDIA H200)`, `2 GPUs (NVIDIA H200, NVIDIA A100)`."""
    names = list(dict.fromkeys(gpus))
    if len(names) == 1 and len(gpus) > 1:
        return f"{count(len(gpus), 'GPU')} ({len(gpus)}x {names[0]})"
    return f"{count(len(gpus), 'GPU')} ({', '.join(gpus)})"
