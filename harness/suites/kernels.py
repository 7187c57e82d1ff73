"""The portable pass's kernel caps, and its opening evidence: what each backend's CPU kernels run with, as the
library itself reports it (each backend's kernel probe, declared in its backend.toml)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass

from common import manifest
from harness.processes import envs
from harness.processes.envs import ROOT
from harness.suites.lanes import start_on
from harness.suites.records import Counts, Outcome

# What --portable caps beside each framework's own caps (backend.toml's [framework] portable_env and
# portable_flags): numpy's OpenBLAS (MXNet's too) to SSE4.2 kernels, no AVX, and one thread for every OpenMP and
# OpenBLAS pool. Each cap was checked to change the kernels in the pinned versions (each backend's kernel probe,
# probe() below, prints the evidence at the start of the pass).
SHARED_CAPS = {
    "OPENBLAS_CORETYPE": "Nehalem",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}


def portable_env() -> dict[str, str]:
    """The variables the portable pass sets: the shared caps, then every framework's."""
    declared = {k: v for framework in manifest.frameworks() for k, v in framework.portable_env}
    return {**SHARED_CAPS, **declared}


def portable_flags() -> dict[str, str]:
    """The flags the portable pass appends to a variable of the caller's (XLA's to XLA_FLAGS), by variable."""
    flags: dict[str, str] = {}
    for framework in manifest.frameworks():
        for variable, added in framework.portable_flags:
            flags[variable] = " ".join(f for f in (flags.get(variable, ""), added) if f)
    return flags


def caps_words() -> str:
    """The caps in words, for --help: each framework's, then the shared ones."""
    said = []
    for name in manifest.known():
        f = manifest.load(name).framework
        caps = [f"{k}={v}" for k, v in f.portable_env] + [f"{k} {v}" for k, v in f.portable_flags]
        if caps:
            said.append(f"{name}: {', '.join(caps)}")
    said.append(", ".join(f"{k}={v}" for k, v in SHARED_CAPS.items()))
    return "; ".join(said)


# What the portable pass selects: the tests marked `rounding` (pyproject.toml lists the marker).
PORTABLE_SELECTION = ["-m", "rounding"]


# The lines of a probe's output worth showing, and how to say them.
PROBE_FACTS = [
    (r"^probe: (.*)$", "{}"),
    (r"^(?:onednn|dnnl)_verbose,.*info,cpu,isa:(.*)$", "oneDNN ISA {}"),
    (r"^(?:onednn|dnnl)_verbose,.*info,cpu,runtime:OpenMP,nthr:(\d+)$", "oneDNN {} thread(s)"),
    (r"^(?:onednn|dnnl)_verbose,.*exec,cpu,convolution,([^,]+),", "oneDNN convolution {}"),
    (r"^MKL_VERBOSE SGEMM.* CNR:(\S+) .*NThr:(\d+)", "MKL CNR {} with {} thread(s)"),
    (
        r"`xla_cpu_max_isa` is set\. Will not use features newer than: (\S+)",
        "XLA codegen capped to {}",
    ),
]


def suite_env(extra_env: dict, portable: bool, caller: Mapping[str, str] = os.environ) -> dict:
    """A suite's environment: the caller's, with the project importable and the suite's own variables;
    portable adds the caps of portable_env() and appends portable_flags() to the caller's (XLA_FLAGS)."""
    env = envs.worker_env(caller, **extra_env)
    if portable:
        env.update(portable_env())
        for variable, added in portable_flags().items():
            env[variable] = " ".join(f for f in (caller.get(variable, ""), added) if f)
    return env


def probe_facts(output: str) -> list[str]:
    """What a probe's output says about its kernels, in PROBE_FACTS order, each fact once."""
    facts = []
    for pattern, template in PROBE_FACTS:
        match = re.search(pattern, output, re.MULTILINE)
        if match:
            facts.append(template.format(*match.groups()))
    return facts


def probe(library: str, python: str, cpus: set[int]) -> str:
    """One line: what `library`'s kernels run with in the environment of `python`, on `cpus`: the probe its backend
    declares (backend.toml's [kernels_probe]), with the portable environment and the library's verbose switches,
    so that the pass starts by showing what the kernels really run with."""
    declared = manifest.load(library).kernels_probe if library in manifest.known() else None
    if declared is None:
        return f"{library}: no probe for this library"
    # a script, not its package's module: importing backends.<name> sets the backend up (jax's asks XLA for
    # devices); -P keeps its folder, whose models.py and the like would shadow modules of those names, off sys.path
    proc = start_on(
        [python, "-P", str(declared.script)],
        cpus,
        cwd=ROOT,
        env={**suite_env({}, True), **declared.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=600)
    if proc.returncode:
        return f"{library}: the probe failed (status {proc.returncode}): {stderr.strip()[-500:]}"
    return f"{library}: " + "; ".join(probe_facts(stdout + stderr))


def caps(pythons: dict[str, str], cpus: set[int]) -> list[str]:
    """One line per backend and kernel library: what the kernels are capped to, as the library reports it."""
    return [
        f"{name}: {probe(library, python, cpus)}"
        if library != name
        else probe(library, python, cpus)
        for name, python in pythons.items()
        for library in manifest.load(name).kernels
    ]


@dataclass
class Probes:
    """The portable pass's opening evidence, what each backend's kernels run with: an item of the pass's queue like
    a suite, on one CPU of the lane that takes it, so that no lane waits for it."""

    pythons: dict[str, str]
    title: str = "what each backend's CPU kernels run with"
    pass_name: str = "portable"
    one_cpu: bool = True

    @property
    def key(self) -> tuple[str, str]:
        return (self.pass_name, self.title)

    def run(self, cpus: set[int]) -> Outcome:
        start = time.monotonic()
        return Outcome(Counts(), "\n".join(caps(self.pythons, cpus)), time.monotonic() - start)
