"""`python -m harness test`: the harness's tests here, each backend's tests inside its own environment.

Each suite is a pytest run with a JUnit XML report; the counts are added up and the
last line printed is `N passed, N failed` (and skipped). Exit status 0 only if nothing
failed and every suite ran at least one test.

`--portable` runs the backend and cross-backend tests whose verdict rests on how the CPU kernels
round (marked `rounding`: a float32 or bf16 tolerance) again, on one CPU with every framework's
CPU kernels capped to SSE4.1/SSE4.2 (x86-64-v2, numpy 2's own floor), so that a pass says the
tests hold on any x86-64 CPU, not only on the one they were written on. The other tests judge
float64 identities, exact copies, processes and records: no kernel's rounding decides them.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from common import manifest
from harness import envs
from harness.arguments import Parser, backends_flags, python_flags
from harness.envs import ROOT
from harness.plan import parse_backends, parse_pythons

# What --portable caps, per library; each was checked to change the kernels in the pinned versions
# (the probes below print the evidence at the start of the pass).
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",   # torch's ATen kernels: no AVX2 / AVX-512 variants
    "ONEDNN_MAX_CPU_ISA": "SSE41",      # torch's oneDNN 3.x
    "DNNL_MAX_CPU_ISA": "SSE41",        # MXNet 1.9.1's oneDNN 2.4, which reads only this name
    "MKL_CBWR": "COMPATIBLE",           # torch's MKL: the code path that computes alike on every x86-64 CPU
    "OPENBLAS_CORETYPE": "Nehalem",     # MXNet's and numpy's OpenBLAS: SSE4.2 kernels, no AVX
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MXNET_CPU_WORKER_NTHREADS": "1",
}
# Appended to the caller's XLA_FLAGS. A flag XLA does not know aborts jax: these two exist in jaxlib 0.10.2.
PORTABLE_XLA_FLAGS = "--xla_cpu_max_isa=SSE4_2 --xla_cpu_multi_thread_eigen=false"
# What the portable pass selects: the tests marked `rounding` (pyproject.toml lists the marker).
PORTABLE_SELECTION = ["-m", "rounding"]

# One tiny computation per kernel library (a backend.toml's `kernels`), run in each backend's environment with the
# portable environment and the library's own verbose switches, so that the pass starts by showing what the kernels
# really run with.
PROBES = {
    "torch": ({"ONEDNN_VERBOSE": "1", "MKL_VERBOSE": "1"},
              "import torch\n"
              "torch.nn.functional.conv2d(torch.ones(2, 16, 8, 8), torch.ones(32, 16, 3, 3))\n"
              "torch.ones(64, 64) @ torch.ones(64, 64)\n"
              "print(f'probe: ATen capability {torch.backends.cpu.get_cpu_capability()}, '\n"
              "      f'{torch.get_num_threads()} thread(s)')\n"),
    "jax": ({"TF_CPP_MIN_LOG_LEVEL": "0", "TF_CPP_VMODULE": "cpu_compiler=1"},
            "import os, jax, jax.numpy as jnp\n"
            "jax.jit(lambda a: jnp.tanh(a).sum())(jnp.ones(64)).block_until_ready()\n"
            "print(f'probe: XLA_FLAGS accepted ({os.environ.get(\"XLA_FLAGS\")}); the XLA thread pool spans '\n"
            "      f'{len(os.sched_getaffinity(0))} usable CPU(s): '\n"
            "      f'jaxlib {jax.__version__} has no thread-count switch')\n"),
    "mxnet": ({"DNNL_VERBOSE": "1"},
              "import ctypes, os\n"
              "from backends.mxnet.compat import mx\n"
              "mx.nd.Convolution(mx.nd.ones((2, 16, 8, 8)), mx.nd.ones((32, 16, 3, 3)), kernel=(3, 3),\n"
              "                  num_filter=32, no_bias=True).wait_to_read()\n"
              "blas = ctypes.CDLL(os.path.join(os.path.dirname(mx.__file__), 'libopenblas.so.0'))\n"
              "blas.openblas_get_corename.restype = ctypes.c_char_p\n"
              "omp = ctypes.CDLL('libgomp.so.1')\n"
              "print(f'probe: OpenBLAS core {blas.openblas_get_corename().decode()}, '\n"
              "      f'{omp.omp_get_max_threads()} OpenMP thread(s)')\n"),
}
# The lines of a probe's output worth showing, and how to say them.
PROBE_FACTS = [
    (r"^probe: (.*)$", "{}"),
    (r"^(?:onednn|dnnl)_verbose,.*info,cpu,isa:(.*)$", "oneDNN ISA {}"),
    (r"^(?:onednn|dnnl)_verbose,.*info,cpu,runtime:OpenMP,nthr:(\d+)$", "oneDNN {} thread(s)"),
    (r"^(?:onednn|dnnl)_verbose,.*exec,cpu,convolution,([^,]+),", "oneDNN convolution {}"),
    (r"^MKL_VERBOSE SGEMM.* CNR:(\S+) .*NThr:(\d+)", "MKL CNR {} with {} thread(s)"),
    (r"`xla_cpu_max_isa` is set\. Will not use features newer than: (\S+)", "XLA codegen capped to {}"),
]


@dataclass
class Counts:
    passed: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


def junit_counts(path: Path) -> Counts:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    c = Counts()
    for s in suites:
        tests, failures, errors, skipped = (int(s.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        c.failed += failures + errors
        c.skipped += skipped
        c.passed += tests - failures - errors - skipped
    return c


def suite_env(extra_env: dict, portable: bool, caller: Mapping[str, str] = os.environ) -> dict:
    """A suite's environment: the caller's, with the project importable and the suite's own variables;
    portable adds the caps of PORTABLE_ENV and appends PORTABLE_XLA_FLAGS to the caller's XLA_FLAGS."""
    env = envs.worker_env(caller, **extra_env)
    if portable:
        env.update(PORTABLE_ENV)
        env["XLA_FLAGS"] = " ".join(f for f in (caller.get("XLA_FLAGS", ""), PORTABLE_XLA_FLAGS) if f)
    return env


def pin_to_one_cpu() -> None:
    """Run this process and all it starts on one CPU. The workers size their thread pools from the usable
    CPUs, not from OMP_NUM_THREADS (torch's set_num_threads, MXNet's compat, XLA, which has no switch)."""
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def probe_facts(output: str) -> list[str]:
    """What a probe's output says about its kernels, in PROBE_FACTS order, each fact once."""
    facts = []
    for pattern, template in PROBE_FACTS:
        match = re.search(pattern, output, re.MULTILINE)
        if match:
            facts.append(template.format(*match.groups()))
    return facts


def probe(library: str, python: str) -> str:
    """One line: what `library`'s kernels run with in the environment of `python`."""
    if library not in PROBES:
        return f"{library}: no probe for this library"
    verbose, code = PROBES[library]
    proc = subprocess.run([python, "-c", code], cwd=ROOT, env={**suite_env({}, True), **verbose},
                          capture_output=True, text=True, timeout=600)
    if proc.returncode:
        return f"{library}: the probe failed (status {proc.returncode}): {proc.stderr.strip()[-500:]}"
    return f"{library}: " + "; ".join(probe_facts(proc.stdout + proc.stderr))


def print_caps(pythons: dict[str, str]) -> None:
    """One line per backend and kernel library: what the kernels are capped to, as the library reports it."""
    print("\n=== portable: what each backend's CPU kernels run with ===", flush=True)
    for name, python in pythons.items():
        for library in manifest.load(name).kernels:
            print(f"{name}: {probe(library, python)}" if library != name else probe(library, python), flush=True)


def run_suite(title: str, python: str, paths: list[str], env: dict, selection: list[str],
              pytest_args: list[str]) -> Counts:
    """One pytest run: the pass's own selection (PORTABLE_SELECTION or none), then the user's arguments."""
    print(f"\n=== {title} ===", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [python, "-m", "pytest", *paths, "-q", f"--junitxml={xml}", *selection, *pytest_args]
        rc = subprocess.run(cmd, cwd=ROOT, env=env).returncode
        if not xml.exists():
            print(f"{title}: pytest exited with status {rc} and no report", flush=True)
            return Counts(failed=1)
        counts = junit_counts(xml)
    if counts.total == 0 and not pytest_args:  # (with -k and the like, selecting nothing is fine)
        print(f"{title}: no test ran; counted as a failure", flush=True)
        counts.failed += 1
    return counts


DESCRIPTION = "Run the harness tests, then each backend's tests in its own environment."


def parents() -> list[Parser]:
    """The flags of `python -m harness test`."""
    own = Parser(add_help=False)
    own.add_argument("--portable", action="store_true",
                     help="run the backend and cross-backend tests whose verdict rests on the kernels' rounding "
                          "(marked rounding) on one CPU with every framework's CPU kernels capped to SSE4.1/SSE4.2 "
                          "and one thread (torch: ATEN_CPU_CAPABILITY=default, oneDNN SSE41, MKL_CBWR=COMPATIBLE; "
                          "jax: XLA_FLAGS --xla_cpu_max_isa=SSE4_2; mxnet: oneDNN SSE41, OpenBLAS Nehalem), to show "
                          "the tests pass on any x86-64 CPU; it first prints what each backend's kernels run with")
    own.add_argument("pytest_args", nargs="*", help="passed to pytest (after --), e.g. -- -k split -x")
    return [backends_flags("backends whose tests to run (comma list, or all, or none)"),
            python_flags("use this interpreter for BACKEND's tests instead of .venvs/BACKEND/"), own]


def main(args) -> int:
    """`python -m harness test`, its flags parsed (cli.build_parser)."""
    names = [] if args.backend == "none" else parse_backends(args.backend)
    pythons = parse_pythons(args.python)

    results: dict[str, Counts] = {}
    if args.portable:
        pin_to_one_cpu()
    else:
        results["harness"] = run_suite("harness (no framework)", sys.executable, ["tests/harness"],
                                       suite_env({}, False), [], args.pytest_args)
    backend_pythons: dict[str, str] = {}
    for name in names:
        backend = manifest.load(name)
        try:
            backend_pythons[name] = pythons.get(name) or str(envs.ensure_backend(name, backend.requirements))
        except envs.EnvError as e:
            print(f"\n=== {name}: environment setup failed ===\n{e}")
            results[name] = Counts(failed=1)
    if args.portable:
        print_caps(backend_pythons)
    selection = PORTABLE_SELECTION if args.portable else []
    for name, python in backend_pythons.items():
        own = [f"tests/backends/test_{name}.py"] if (ROOT / "tests" / "backends" / f"test_{name}.py").exists() else []
        results[name] = run_suite(f"{name} (inside its environment)", python, ["tests/backends/test_contract.py", *own],
                                  suite_env({"DPBENCH_BACKEND": name}, args.portable), selection, args.pytest_args)

    tested = [name for name in names if name in results and results[name].failed == 0]
    if len(tested) >= 2 and not args.pytest_args:
        results["cross"] = run_suite(f"cross-backend ({', '.join(tested)})", sys.executable, ["tests/cross"],
                                     suite_env({"DPBENCH_BACKENDS": ",".join(tested),
                                                "DPBENCH_PYTHONS": ",".join(f"{k}={v}" for k, v in pythons.items())},
                                               args.portable), selection, [])

    total = Counts()
    print(f"\n=== summary{' (portable: capped CPU kernels, one CPU)' if args.portable else ''} ===")
    for title, c in results.items():
        print(f"{title:10} {c.passed} passed, {c.failed} failed, {c.skipped} skipped")
        total.passed += c.passed
        total.failed += c.failed
        total.skipped += c.skipped
    print(f"{total.passed} passed, {total.failed} failed, {total.skipped} skipped", flush=True)
    return 1 if total.failed or total.passed == 0 else 0
