"""Which code made a report, and where: the suite's version, its checkout's git commit, whether that checkout had
uncommitted changes, the host's name and its machine (the CPU's model, family and vector instruction sets, the usable
cores, the GPUs: common/sysinfo.py machine). Recorded once per run in results.json's meta (`provenance`), shown in
report.md's header, and compared by `harness compare` and `harness history`: a step time measured on another
machine says nothing about the code (XLA's and oneDNN's CPU kernels run twice as wide with AVX-512 as with AVX2).

The version is the checkout's pyproject.toml (the file the commit describes), read with tomllib; only where there is
none (an installed copy) the installed distribution's metadata. The commit is `git rev-parse HEAD` of the project
root, and only when the root is a checkout's top level: a copy unpacked inside another repository is not that
repository's commit. Uncommitted changes are what `git status` lists (tracked files changed, staged or not, and
untracked files git does not ignore) outside reports/ and .venvs/, which hold what the suite writes, not its code.
Every git call is bounded in time; a field that cannot be found (no git, not a checkout, a timeout) is null.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
import subprocess
import tomllib
from pathlib import Path

from common import sysinfo
from common.results import provenance_problem

ROOT = Path(__file__).resolve().parents[2]  # harness/reporting/ -> the checkout
DISTRIBUTION = "dpbench"
GIT_TIMEOUT_S = 10.0
NOT_CODE = ("reports/", ".venvs/")  # what the suite writes into its own tree
# Variables that would point git at another repository than the one `root` is in.
GIT_LOCATION = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE")


def record(root: Path = ROOT, gpus: list[str] | None = None) -> dict:
    """The provenance of a run started now from the checkout at `root` on the GPUs `gpus` (the ones the harness
    found: harness/processes/devices.py; none for simulated devices) (results.json's meta["provenance"])."""
    commit = git_commit(root)
    return {
        "version": suite_version(root),
        "commit": commit,
        "uncommitted_changes": uncommitted_changes(root) if commit else None,
        "host": socket.gethostname() or None,
        "machine": {**sysinfo.machine(), "gpus": list(gpus or [])},
    }


def suite_version(root: Path = ROOT) -> str | None:
    """pyproject.toml's version, read as data (nothing imported); without that file, the installed package's."""
    try:
        with open(root / "pyproject.toml", "rb") as f:
            version = tomllib.load(f).get("project", {}).get("version")
        return version if isinstance(version, str) else None
    except OSError:
        pass
    except tomllib.TOMLDecodeError:
        return None
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def git(root: Path, *args: str) -> str | None:
    """`git ARGS` run in `root`, its output; None if git is missing, fails or takes longer than GIT_TIMEOUT_S.
    --no-optional-locks: reading the status must not take the index's lock from a git command running beside."""
    env = {k: v for k, v in os.environ.items() if k not in GIT_LOCATION}
    try:
        done = subprocess.run(
            ["git", "--no-optional-locks", *args],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=GIT_TIMEOUT_S,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def git_commit(root: Path = ROOT) -> str | None:
    """HEAD's commit id, if `root` is the top level of a git checkout with a commit."""
    out = git(root, "rev-parse", "--show-toplevel", "HEAD")
    lines = (out or "").splitlines()
    if len(lines) != 2 or Path(lines[0]).resolve() != Path(root).resolve():
        return None
    return lines[1]


def uncommitted_changes(root: Path = ROOT) -> bool | None:
    """Whether the checkout differs from its commit in code (see the module's docstring); None if unknown."""
    out = git(root, "status", "--porcelain=v1", "-z")
    if out is None:
        return None
    return any(not path.startswith(NOT_CODE) for path in changed_paths(out))


def changed_paths(porcelain_z: str) -> list[str]:
    """Every path `git status --porcelain=v1 -z` names: entries "XY PATH", a rename's or copy's followed by its
    origin, a field of its own (a file moved out of the code changes the code too)."""
    paths, origin_next = [], False
    for entry in porcelain_z.split("\0"):
        if origin_next:
            paths.append(entry)
            origin_next = False
        elif len(entry) > 3:
            paths.append(entry[3:])
            origin_next = entry[0] in "RC"
    return paths


# ------------------------------------------------------------------------ reading it back


def short(commit: str | None) -> str:
    return commit[:7] if commit else "unknown"


def known(provenance) -> dict | None:
    """`provenance` if it is a record this version can read (results.json's, validated on load), else None."""
    return provenance if provenance is not None and not provenance_problem(provenance) else None


def header_line(provenance) -> str:
    """report.md's line, e.g. "- Code: dpbench 0.1.0, commit abc1234 (uncommitted changes), host gpu-7"."""
    p = known(provenance)
    if p is None:
        return "- Code: not recorded"
    commit = f"commit {short(p.get('commit'))}"
    changes = p.get("uncommitted_changes")
    if p.get("commit") and changes is not False:
        commit += " (uncommitted changes)" if changes else " (uncommitted changes unknown)"
    return f"- Code: dpbench {p.get('version') or 'unknown'}, {commit}, host {p.get('host') or 'unknown'}"


def difference(old, new) -> str | None:
    """compare's line above a table: how OLD's and NEW's code, host or machine differ, and whose machine is
    unknown; None when they agree."""
    unknown = [side for side, p in (("OLD", old), ("NEW", new)) if known(p) is None]
    if unknown:
        return f"Code and host: unknown for {' and '.join(unknown)}"
    found = code_or_host_differences(old, new)
    line = "Code or host differ: " + "; ".join(found) if found else None
    missing = [side for side, p in (("OLD", old), ("NEW", new)) if machine_of(p) is None]
    if missing:
        said = f"machine unknown for {' and '.join(missing)}"
        return f"{line}; {said}" if line else said[0].upper() + said[1:]
    return line


def code_or_host_differences(old: dict, new: dict) -> list[str]:
    """What differs between two readable provenances, each in a few words."""
    found = []
    if old.get("version") != new.get("version"):
        found.append(f"dpbench {old.get('version')} vs {new.get('version')}")
    if old.get("commit") != new.get("commit"):
        found.append(f"commits {short(old.get('commit'))} vs {short(new.get('commit'))}")
    changed = [side for side, p in (("OLD", old), ("NEW", new)) if p.get("uncommitted_changes")]
    if changed:
        found.append(f"uncommitted changes in {' and '.join(changed)}")
    if old.get("host") != new.get("host"):
        found.append(f"hosts {old.get('host')} vs {new.get('host')}")
    moved = machine_change(machine_of(old), machine_of(new))
    if moved:
        found.append(f"machine {moved}")
    return found


# ------------------------------------------------------------------------ the machine


def machine_of(provenance) -> dict | None:
    """The machine a readable provenance records; None where it has none (written before it was recorded)."""
    p = known(provenance)
    return p.get("machine") if p else None


def machine_line(provenance) -> str:
    """report.md's line, e.g. "- Host: AMD EPYC 9R14 (family 25, model 17), AVX2 AVX-512 AVX512-BF16, 2 cores;
    GPU NVIDIA H200"."""
    m = machine_of(provenance)
    if m is None:
        return "- Host: not recorded"
    cores = "cores unknown" if m.get("cpus") is None else f"{m['cpus']} cores"
    gpus = f"; {gpu_words(m['gpus'])}" if m.get("gpus") else ""
    return f"- Host: {cpu_words(m)}, {isa_words(m.get('vector_isa'))}, {cores}{gpus}"


def cpu_words(m: dict) -> str:
    """ "AMD EPYC 9R14 (family 25, model 17)": the model name with the numbers that tell alike names apart."""
    numbers = [
        f"{word} {m[key]}"
        for key, word in (("cpu_family", "family"), ("cpu_model", "model"))
        if m.get(key) is not None
    ]
    return (m.get("cpu") or "unknown CPU") + (f" ({', '.join(numbers)})" if numbers else "")


def isa_words(isa: list[str] | None) -> str:
    if isa is None:
        return "vector sets unknown"
    return " ".join(isa) if isa else "no AVX2"


def gpu_words(gpus: list[str]) -> str:
    """ "no GPU", "GPU NVIDIA H200", "GPUs 8x NVIDIA H200", "GPUs NVIDIA H200, NVIDIA A100"."""
    if not gpus:
        return "no GPU"
    names = list(dict.fromkeys(gpus))
    if len(gpus) == 1:
        return f"GPU {gpus[0]}"
    return f"GPUs {len(gpus)}x {names[0]}" if len(names) == 1 else f"GPUs {', '.join(gpus)}"


CPU_FIELDS = ("cpu", "cpu_vendor", "cpu_family", "cpu_model")


def machine_change(old: dict | None, new: dict | None) -> str | None:
    """How NEW's machine differs from OLD's, e.g. "AVX-512 AVX512-BF16 -> AVX2 only; 2 -> 16 cores"; None where
    they agree or either is unknown. Only what both record is compared: a field one lacks is no difference."""
    if old is None or new is None:
        return None

    def both(name: str) -> bool:
        return old.get(name) is not None and new.get(name) is not None

    changes = []
    if any(both(f) and old[f] != new[f] for f in CPU_FIELDS):
        changes.append(f"{cpu_words(old)} -> {cpu_words(new)}")
    if both("vector_isa") and set(old["vector_isa"]) != set(new["vector_isa"]):
        changes.append(isa_change(old["vector_isa"], new["vector_isa"]))
    if both("cpus") and old["cpus"] != new["cpus"]:
        changes.append(f"{old['cpus']} -> {new['cpus']} cores")
    if both("gpus") and sorted(old["gpus"]) != sorted(new["gpus"]):
        changes.append(f"{gpu_words(old['gpus'])} -> {gpu_words(new['gpus'])}")
    return "; ".join(changes) or None


def isa_change(old: list[str], new: list[str]) -> str:
    """ "AVX-512 AVX512-BF16 -> AVX2 only": each side's sets the other lacks, or, where it has none of its own, the
    widest it shares ("only")."""
    common = [name for name in old if name in new]

    def side(isa: list[str]) -> str:
        own = [name for name in isa if name not in common]
        return " ".join(own) if own else (f"{common[-1]} only" if common else "no AVX2")

    return f"{side(old)} -> {side(new)}"
