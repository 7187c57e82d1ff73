"""`python -m harness test`: the environment each suite's pytest gets, normal and --portable (no framework runs)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from harness import testing
from harness.processes.envs import ROOT
from tests.harness.helpers import run_harness

CALLER = {
    "PATH": "tools/bin",
    "PYTHONPATH": "vendor/lib",
    "OMP_NUM_THREADS": "8",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
}


def test_portable_environment_caps_every_framework_to_sse4_and_one_thread():
    env = testing.suite_env({"DPBENCH_BACKEND": "torch"}, True, CALLER)
    assert env["ATEN_CPU_CAPABILITY"] == "default"
    assert env["ONEDNN_MAX_CPU_ISA"] == "SSE41" and env["DNNL_MAX_CPU_ISA"] == "SSE41"
    assert env["MKL_CBWR"] == "COMPATIBLE" and env["OPENBLAS_CORETYPE"] == "Nehalem"
    for threads in (
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "MXNET_CPU_WORKER_NTHREADS",
    ):
        assert env[threads] == "1", threads  # the caller's 8 threads too
    assert env["DPBENCH_BACKEND"] == "torch" and env["PATH"] == "tools/bin"


def test_portable_xla_flags_are_appended_to_the_callers():
    env = testing.suite_env({}, True, CALLER)
    assert env["XLA_FLAGS"] == (
        "--xla_force_host_platform_device_count=4 "
        "--xla_cpu_max_isa=SSE4_2 --xla_cpu_multi_thread_eigen=false"
    )
    assert (
        testing.suite_env({}, True, {})["XLA_FLAGS"]
        == "--xla_cpu_max_isa=SSE4_2 --xla_cpu_multi_thread_eigen=false"
    )


def test_pythonpath_puts_the_project_first_and_keeps_the_callers_entry():
    for portable in (False, True):
        assert (
            testing.suite_env({}, portable, CALLER)["PYTHONPATH"] == f"{ROOT}{os.pathsep}vendor/lib"
        )
        assert testing.suite_env({}, portable, {})["PYTHONPATH"] == str(ROOT)


def test_the_normal_pass_changes_nothing_but_pythonpath():
    env = testing.suite_env({"DPBENCH_BACKEND": "jax"}, False, CALLER)
    assert env == {
        **CALLER,
        "PYTHONPATH": f"{ROOT}{os.pathsep}vendor/lib",
        "DPBENCH_BACKEND": "jax",
    }


def test_a_suite_runs_on_its_lane_and_everything_it_starts_inherits_it(tmp_path):
    """Each suite of a pass runs on its own CPUs: its thread pools are sized from them, and two suites never
    share a core. A stand-in for pytest reports the CPUs it and its child may use."""
    fake = tmp_path / "fake-python"
    fake.write_text(
        "#!/bin/sh\n"
        f"{sys.executable} -c 'import os; print(sorted(os.sched_getaffinity(0)))'\n"
        f"sh -c \"{sys.executable} -c 'import os; print(sorted(os.sched_getaffinity(0)))'\"\n"
    )
    fake.chmod(0o755)
    cpu = min(os.sched_getaffinity(0))
    suite = testing.Suite("fake", str(fake), [], {**os.environ}, [], ["-k", "x"])
    outcome = testing.run_suite(suite, {cpu})
    assert outcome.output.split("\n")[:2] == [f"[{cpu}]", f"[{cpu}]"], outcome.output


# A stand-in for a suite's pytest that starts a child, as a test starting a harness run does, and writes both pids.
SUITE_WITH_A_CHILD = """#!/bin/sh
sleep 300 &
echo $$ $! > "{pids}"
wait
"""
# A pass of that one suite, stopped as `python -m harness test` is (harness/cli.py's Stoppable).
ONE_SUITE_PASS = (
    "import os, sys\n"
    "from harness import testing\n"
    "from harness.processes import interrupts\n"
    "suite = testing.Suite('fake', sys.argv[1], [], {**os.environ}, [], ['-k', 'x'])\n"
    "with interrupts.handled():\n"
    "    try:\n"
    "        testing.run_suites([suite], jobs=1)\n"
    "    except KeyboardInterrupt:\n"
    "        sys.exit(interrupts.exit_status())\n"
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigterm_stops_every_suite_with_what_it_started(tmp_path):
    pids = tmp_path / "pids"
    fake = tmp_path / "fake-python"
    fake.write_text(SUITE_WITH_A_CHILD.format(pids=pids))
    fake.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    harness = subprocess.Popen([sys.executable, "-c", ONE_SUITE_PASS, str(fake)], cwd=ROOT, env=env)
    deadline = time.monotonic() + 60
    while not (pids.exists() and len(pids.read_text().split()) == 2):
        assert time.monotonic() < deadline and harness.poll() is None, "the suite never started"
        time.sleep(0.1)
    suite_pid, child_pid = map(int, pids.read_text().split())
    harness.send_signal(signal.SIGTERM)
    assert harness.wait(timeout=60) == 128 + signal.SIGTERM
    deadline = time.monotonic() + 10  # (init reaps the orphans)
    while (alive(suite_pid) or alive(child_pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(suite_pid) and not alive(child_pid)


def test_lanes_split_the_usable_cpus_evenly_and_never_share_one():
    assert testing.lanes(2, {0, 1}) == [{0}, {1}]
    assert testing.lanes(2, {0, 1, 2, 3, 4}) == [{0, 2, 4}, {1, 3}]
    assert testing.lanes(4, {3, 5}) == [{3}, {5}]  # no more lanes than CPUs
    assert testing.lanes(1, {0, 1}) == [{0, 1}]
    assert testing.lanes(0, {0, 1}) == [{0, 1}]


def test_probe_facts_read_what_the_libraries_report():
    # Lines as torch 2.13 (oneDNN 3.12, MKL 2024), MXNet 1.9.1 (oneDNN 2.4) and jaxlib 0.10.2 print them.
    torch = (
        "onednn_verbose,v1,info,cpu,runtime:OpenMP,nthr:1\n"
        "onednn_verbose,v1,info,cpu,isa:Intel SSE4.1\n"
        "onednn_verbose,v1,primitive,exec,cpu,convolution,jit:sse41,forward_training,src:f32,,mb1_ic16oc32,0.2\n"
        "MKL_VERBOSE SGEMM(N,N,64,64,64,0x1,0x2,64,0x3,64,0x4,0x5,64) 4.42ms CNR:COMPATIBLE Dyn:1 "
        "FastMM:1 TID:0  NThr:1\n"
        "probe: ATen capability DEFAULT, 1 thread(s)\n"
    )
    assert testing.probe_facts(torch) == [
        "ATen capability DEFAULT, 1 thread(s)",
        "oneDNN ISA Intel SSE4.1",
        "oneDNN 1 thread(s)",
        "oneDNN convolution jit:sse41",
        "MKL CNR COMPATIBLE with 1 thread(s)",
    ]
    mxnet = (
        "dnnl_verbose,info,cpu,isa:Intel SSE4.1\n"
        "dnnl_verbose,exec,cpu,convolution,jit:sse41,forward_inference,src_f32::blocked:aBcd8b:f0,,mb1,0.4\n"
        "probe: OpenBLAS core Nehalem, 1 OpenMP thread(s)\n"
    )
    assert testing.probe_facts(mxnet) == [
        "OpenBLAS core Nehalem, 1 OpenMP thread(s)",
        "oneDNN ISA Intel SSE4.1",
        "oneDNN convolution jit:sse41",
    ]
    jax = (
        "I1122 23:30:25.157505    7150 cpu_compiler.cc:1495] `xla_cpu_max_isa` is set. Will not use features "
        "newer than: SSE4_2\n"
    )
    assert testing.probe_facts(jax) == ["XLA codegen capped to SSE4_2"]
    assert testing.probe_facts("nothing to see\n") == []


def test_help_names_the_portable_pass():
    out = run_harness("test", "--help")
    assert out.returncode == 0 and "--portable" in out.stdout and "SSE4" in out.stdout


@pytest.mark.parametrize("jobs", ["0", "-2"])
def test_jobs_below_one_is_one_line_and_exit_2(jobs):
    out = run_harness("test", "--backend", "none", "--jobs", jobs)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    expected = (
        f"harness: error: --jobs takes the number of suites to run at once, at least 1 (got {jobs})"
    )
    assert out.stderr.strip() == expected


def test_every_kernel_library_a_backend_declares_has_a_probe():
    """The portable pass shows what each backend's kernels run with: a backend.toml naming a library without a
    probe would show nothing for it."""
    from common import manifest

    declared = {lib: name for name in manifest.known() for lib in manifest.load(name).kernels}
    missing = {lib: name for lib, name in declared.items() if lib not in testing.PROBES}
    assert declared and not missing, missing
    assert manifest.load("keras").kernels == ("torch", "jax")


def suites_run(monkeypatch, portable: bool, pytest_args=(), jobs=None) -> dict[str, list[str]]:
    """`python -m harness test` for torch and jax with the suites not run: each suite's title and the pytest
    arguments after its test paths, in the order the lanes take them."""
    from argparse import Namespace

    calls = {}

    def run_suites(suites, jobs, one_cpu_each=False):
        for s in suites:
            calls[s.title.split(" ")[0]] = [*s.selection, *s.pytest_args]
        return {s.title: testing.Outcome(testing.Counts(passed=1), "", 0.0) for s in suites}

    monkeypatch.setattr(testing, "run_suites", run_suites)
    monkeypatch.setattr(testing, "print_caps", lambda pythons: None)
    monkeypatch.setattr(
        testing.envs, "ensure_backend", lambda name, requirements, say=print: f"python-{name}"
    )
    args = Namespace(
        backend="torch,jax", python=[], portable=portable, pytest_args=list(pytest_args), jobs=jobs
    )
    assert testing.main(args) == 0
    return calls


def test_the_portable_pass_runs_the_rounding_tests_of_each_backend_and_across_them(monkeypatch):
    assert suites_run(monkeypatch, True) == {
        "torch": ["-m", "rounding"],
        "jax": ["-m", "rounding"],
        "cross-backend": ["-m", "rounding"],
    }
    assert suites_run(monkeypatch, False) == {
        "harness": [],
        "torch": [],
        "jax": [],
        "cross-backend": [],
    }
    assert suites_run(monkeypatch, True, ["-k", "split"])["torch"] == [
        "-m",
        "rounding",
        "-k",
        "split",
    ]


def test_the_longest_suite_starts_first():
    """The lanes end together when the longest suites start first (backend.toml's [tests] minutes)."""
    from common import manifest

    suites = [
        testing.Suite(t, "python", [], {}, [], [])
        for t in (
            testing.HARNESS_TITLE,
            *(testing.backend_suite_title(n) for n in manifest.known()),
        )
    ]
    ordered = [s.title.split(" ")[0] for s in testing.longest_first(suites, list(manifest.known()))]
    minutes = {n: manifest.load(n).test_minutes for n in manifest.known()} | {
        "harness": testing.HARNESS_MINUTES
    }
    assert all(minutes[n] > 0 for n in minutes), minutes
    assert ordered == sorted(minutes, key=lambda n: -minutes[n])


def test_a_backends_suite_is_the_contract_and_every_file_of_its_own():
    """test_torch_torchvision.py is torch's too: a backend's own files are test_<name>.py and test_<name>_*.py;
    the contract's are test_contract.py and test_contract_*.py."""
    contract = ["tests/backends/test_contract.py", "tests/backends/test_contract_hosts.py"]
    suite = testing.backend_suite("torch", "python", False, [])
    assert suite.paths == [
        *contract,
        "tests/backends/test_torch.py",
        "tests/backends/test_torch_torchvision.py",
    ]
    assert testing.backend_suite("jax", "python", False, []).paths == [
        *contract,
        "tests/backends/test_jax.py",
    ]


def test_the_contract_marks_rounding_tests_so_every_backends_portable_suite_runs_some():
    """The portable pass selects `-m rounding`; a backend suite that selected nothing would count as a failure.
    The contract, run for every backend, holds float32 claims, and the marker is registered (--strict-markers)."""
    import ast

    tree = ast.parse((ROOT / "tests" / "backends" / "test_contract.py").read_text())
    marked = [
        f.name
        for f in tree.body
        if isinstance(f, ast.FunctionDef)
        and any(ast.unparse(d) == "pytest.mark.rounding" for d in f.decorator_list)
    ]
    assert "test_k_device_step_in_float32_is_within_float32_rounding" in marked
    assert "rounding:" in (ROOT / "pyproject.toml").read_text()
