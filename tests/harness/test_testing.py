"""`python -m harness test`: the environment each suite's pytest gets, normal and --portable (no framework runs)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

from harness import testing
from harness.processes.envs import ROOT
from harness.suites import catalog, kernels, lanes, records, times
from tests.harness.helpers import run_harness

CALLER = {
    "PATH": "tools/bin",
    "PYTHONPATH": "vendor/lib",
    "OMP_NUM_THREADS": "8",
    "XLA_FLAGS": "--xla_force_host_platform_device_count=4",
}


def test_portable_environment_caps_every_framework_to_sse4_and_one_thread():
    env = kernels.suite_env({"DPBENCH_BACKEND": "torch"}, True, CALLER)
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
    env = kernels.suite_env({}, True, CALLER)
    assert env["XLA_FLAGS"] == (
        "--xla_force_host_platform_device_count=4 "
        "--xla_cpu_max_isa=SSE4_2 --xla_cpu_multi_thread_eigen=false"
    )
    assert (
        kernels.suite_env({}, True, {})["XLA_FLAGS"]
        == "--xla_cpu_max_isa=SSE4_2 --xla_cpu_multi_thread_eigen=false"
    )


def test_pythonpath_puts_the_project_first_and_keeps_the_callers_entry():
    for portable in (False, True):
        assert (
            kernels.suite_env({}, portable, CALLER)["PYTHONPATH"] == f"{ROOT}{os.pathsep}vendor/lib"
        )
        assert kernels.suite_env({}, portable, {})["PYTHONPATH"] == str(ROOT)


def test_the_normal_pass_changes_nothing_but_pythonpath():
    env = kernels.suite_env({"DPBENCH_BACKEND": "jax"}, False, CALLER)
    assert env == {
        **CALLER,
        "PYTHONPATH": f"{ROOT}{os.pathsep}vendor/lib",
        "DPBENCH_BACKEND": "jax",
    }


def test_the_project_is_byte_compiled_before_the_suites_where_python_writes_nothing(
    tmp_path, monkeypatch
):
    """Under PYTHONDONTWRITEBYTECODE an import writes no byte code: the pass compiles every package once, so that
    its processes read it instead of compiling the modules again. Where Python reads it: beside the sources for a
    harness installed outside .venvs/ (as here), in the environment's own cache inside .venvs/harness/."""
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(catalog, "ROOT", tmp_path)
    for package in catalog.PROJECT_PACKAGES:
        (tmp_path / package / "inner").mkdir(parents=True)
        (tmp_path / package / "inner" / "module.py").write_text("X = 1\n")
    catalog.compile_the_project()
    tag = sys.implementation.cache_tag
    compiled = sorted(p.relative_to(tmp_path).parts[0] for p in tmp_path.rglob(f"module.{tag}.pyc"))
    assert compiled == sorted(catalog.PROJECT_PACKAGES)


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
    suite = lanes.Suite("fake", str(fake), [], {**os.environ}, [], ["-k", "x"])
    outcome = lanes.run_suite(suite, {cpu})
    assert outcome.output.split("\n")[:2] == [f"[{cpu}]", f"[{cpu}]"], outcome.output


def test_a_suite_compiles_into_caches_of_its_own_that_end_with_it(tmp_path):
    """Inductor's cache keys do not hold the CPU's capability: the portable pass, reading the normal pass's cache
    (one folder per user by default), failed to compile. Each suite gets its own folders, removed after it."""
    fake = tmp_path / "fake-python"
    fake.write_text(
        "#!/bin/sh\n"
        'echo "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"\n'
        'mkdir -p "$TORCHINDUCTOR_CACHE_DIR" && touch "$TORCHINDUCTOR_CACHE_DIR/kernel.so"\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "users")}
    seen = []
    for _ in range(2):
        suite = lanes.Suite("fake", str(fake), [], env, [], ["-k", "x"])
        inductor, triton = lanes.run_suite(suite).output.split("\n")[0].split()
        assert Path(inductor).name == "torchinductor" and Path(triton).name == "triton"
        assert not Path(inductor).exists()
        seen.append(inductor)
    assert seen[0] != seen[1] and not (tmp_path / "users").exists()


# A stand-in for a suite's pytest that starts a child, as a test starting a harness run does, and writes both pids.
SUITE_WITH_A_CHILD = """#!/bin/sh
sleep 300 &
echo $$ $! > "{pids}"
wait
"""
# A pass of that one suite, stopped as `python -m harness test` is (harness/cli.py's Stoppable).
ONE_SUITE_PASS = (
    "import os, sys\n"
    "from harness.suites import lanes\n"
    "from harness.processes import interrupts\n"
    "suite = lanes.Suite('fake', sys.argv[1], [], {**os.environ}, [], ['-k', 'x'])\n"
    "with interrupts.handled():\n"
    "    try:\n"
    "        lanes.run_suites([suite], jobs=1)\n"
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
    assert lanes.lanes(2, {0, 1}) == [{0}, {1}]
    assert lanes.lanes(2, {0, 1, 2, 3, 4}) == [{0, 2, 4}, {1, 3}]
    assert lanes.lanes(4, {3, 5}) == [{3}, {5}]  # no more lanes than CPUs
    assert lanes.lanes(1, {0, 1}) == [{0, 1}]
    assert lanes.lanes(0, {0, 1}) == [{0, 1}]


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
    assert kernels.probe_facts(torch) == [
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
    assert kernels.probe_facts(mxnet) == [
        "OpenBLAS core Nehalem, 1 OpenMP thread(s)",
        "oneDNN ISA Intel SSE4.1",
        "oneDNN convolution jit:sse41",
    ]
    jax = (
        "I1122 23:30:25.157505    7150 cpu_compiler.cc:1495] `xla_cpu_max_isa` is set. Will not use features "
        "newer than: SSE4_2\n"
    )
    assert kernels.probe_facts(jax) == ["XLA codegen capped to SSE4_2"]
    assert kernels.probe_facts("nothing to see\n") == []


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
    probes = {name: manifest.load(name).kernels_probe for name in manifest.known()}
    missing = {lib: name for lib, name in declared.items() if not probes.get(lib)}
    assert declared and not missing, missing
    assert all(probe.script.is_file() for probe in probes.values() if probe)
    assert manifest.load("keras").kernels == ("torch", "jax")


# A host as /proc/cpuinfo describes it, for the record a pass keeps and its budget.
CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse4_2 avx2 fma\n"


def fake_pass(
    monkeypatch,
    tmp_path,
    passes=None,
    portable=False,
    pytest_args=(),
    ran=None,
    backend="torch,jax",
):
    """`python -m harness test` (torch and jax, or `backend`) on the host of CPUINFO, the suites not run: each gives
    `ran(suite)`'s outcome (default: one passed test, no test's time). The one queue handed to run_suites, and the
    exit status; TIMES_FILE is tmp_path/times.json."""
    from argparse import Namespace

    queues = []

    def run_suites(items, jobs):
        queues.append(list(items))
        return {
            i.key: (ran or (lambda s: records.Outcome(records.Counts(passed=1), "", 1.0)))(i)
            for i in items
        }

    monkeypatch.setattr(testing, "run_suites", run_suites)
    monkeypatch.setattr(times, "TIMES_FILE", tmp_path / "times.json")
    (tmp_path / "cpuinfo").write_text(CPUINFO)
    monkeypatch.setattr(testing.sysinfo, "CPUINFO", str(tmp_path / "cpuinfo"))
    monkeypatch.setattr(
        catalog.envs, "ensure_backend", lambda name, requirements, say=print: f"python-{name}"
    )
    args = Namespace(
        backend=backend,
        python=[],
        passes=passes,
        portable=portable,
        pytest_args=list(pytest_args),
        jobs=None,
    )
    status = testing.main(args)
    (queue,) = queues  # one queue, whatever the passes
    return queue, status


def suites_run(monkeypatch, tmp_path, portable: bool, pytest_args=()) -> dict[str, list[str]]:
    """Each suite of a fake pass by its short title, with the pytest arguments after its test paths."""
    queue, status = fake_pass(monkeypatch, tmp_path, portable=portable, pytest_args=pytest_args)
    assert status == 0
    return {
        s.title.split(" ")[0]: [*s.selection, *s.pytest_args]
        for s in queue
        if isinstance(s, lanes.Suite)
    }


def test_the_portable_pass_runs_the_rounding_tests_of_each_backend_and_across_them(
    monkeypatch, tmp_path
):
    assert suites_run(monkeypatch, tmp_path, True) == {
        "torch": ["-m", "rounding"],
        "jax": ["-m", "rounding"],
        "cross-backend": ["-m", "rounding"],
    }
    assert suites_run(monkeypatch, tmp_path, False) == {
        "harness": [],
        "torch": [],
        "jax": [],
        "cross-backend": [],
    }
    assert suites_run(monkeypatch, tmp_path, True, ["-k", "split"])["torch"] == [
        "-m",
        "rounding",
        "-k",
        "split",
    ]


def test_both_passes_run_from_one_queue_the_probes_first_then_the_longest_suite(
    monkeypatch, tmp_path
):
    """No lane waits for the other pass: the normal and the portable suites are one queue, ordered by their
    declared minutes on a fresh clone (the portable ones are short), the portable pass's probes first."""
    from common import manifest

    queue, _ = fake_pass(monkeypatch, tmp_path, passes="portable,normal")
    assert isinstance(queue[0], kernels.Probes) and queue[0].pythons == {
        "torch": "python-torch",
        "jax": "python-jax",
    }
    suites = queue[1:]
    assert {s.pass_name for s in suites} == {"normal", "portable"}
    seconds = [s.minutes * 60 for s in suites]
    assert seconds == sorted(seconds, reverse=True)
    assert suites[0].title == "jax (inside its environment)"
    assert suites[0].minutes == manifest.load("jax").test_minutes
    # each portable suite by its own declared minutes, so the longest of them (not the last built) ends no lane
    assert [s.key for s in suites if s.pass_name == "portable"] == [
        ("portable", "cross-backend (torch, jax)"),
        ("portable", "torch (inside its environment)"),
        ("portable", "jax (inside its environment)"),
    ]
    assert all(s.one_cpu == (s.pass_name == "portable") for s in suites)
    normal_only, _ = fake_pass(monkeypatch, tmp_path)
    assert {i.pass_name for i in normal_only} == {"normal"}


def test_passes_are_chosen_each_once_and_portable_is_the_portable_pass():
    assert testing.chosen_passes(None, False) == ["normal"]
    assert testing.chosen_passes("portable, normal,portable", False) == ["normal", "portable"]
    assert testing.chosen_passes(None, True) == testing.chosen_passes("portable", False)
    assert testing.chosen_passes("portable", True) == ["portable"]
    with pytest.raises(testing.UsageError, match="unknown pass 'fast' in --passes"):
        testing.chosen_passes("normal,fast", False)
    with pytest.raises(testing.UsageError, match="--portable is --passes portable"):
        testing.chosen_passes("normal", True)


def test_an_item_of_the_portable_pass_runs_on_one_cpu_of_its_lane_a_normal_one_on_the_lane():
    normal = catalog.harness_suite([])
    portable = catalog.backend_suite("torch", "python", True, [])
    assert lanes.item_cpus(normal, {2, 3}, jobs=2) == {2, 3}
    assert lanes.item_cpus(normal, {2, 3}, jobs=1) is None  # one lane: wherever the pass may run
    for item in (portable, kernels.Probes({})):
        assert lanes.item_cpus(item, {2, 3}, jobs=1) == {2}
        assert lanes.item_cpus(item, {2, 3}, jobs=2) == {2}


# A stand-in for a suite's pytest: it waits for each file named in $WAIT_FOR to exist, creates $DONE, writes a JUnit
# report of one passed test of $SECONDS and prints its pass.
FAKE_PYTEST = """#!{python}
import os, sys, time
deadline = time.monotonic() + 60
for path in filter(None, os.environ.get("WAIT_FOR", "").split(",")):
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not os.path.exists(path):
        sys.exit("never came: " + path)
open(os.environ["DONE"], "w").close()
xml = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("--junitxml="))
with open(xml, "w") as f:
    f.write('<testsuites><testsuite tests="1" failures="0" errors="0" skipped="0">'
            '<testcase classname="tests.fake" name="test_it" time="' + os.environ["SECONDS"] + '"/>'
            '</testsuite></testsuites>')
print(os.environ["PASS"], "ran")
"""


def test_a_lane_takes_the_other_passes_suites_while_a_long_suite_runs(tmp_path, monkeypatch):
    """Two lanes, one queue: the long normal suite ends only after both portable suites have ended, which it
    can only see if the other lane took them while it ran (in passes one after the other it would wait in vain)."""
    fake = tmp_path / "fake-pytest"
    fake.write_text(FAKE_PYTEST.format(python=sys.executable))
    fake.chmod(0o755)
    cpu = min(os.sched_getaffinity(0))
    # two lanes on whatever this test may use (inside a pass, one CPU)
    monkeypatch.setattr(lanes, "lanes", lambda jobs, cpus: [{cpu}, {cpu}])

    def suite(title, pass_name, seconds, wait_for=()):
        env = {
            **os.environ,
            "PASS": pass_name,
            "SECONDS": seconds,
            "DONE": str(tmp_path / title),
            "WAIT_FOR": ",".join(str(tmp_path / w) for w in wait_for),
        }
        return lanes.Suite(title, str(fake), [], env, [], [], pass_name)

    queue = [
        suite("long", "normal", "300.5", wait_for=("short1", "short2")),
        suite("short1", "portable", "2.25"),
        suite("short2", "portable", "1.0"),
    ]
    outcomes = lanes.run_suites(queue, jobs=2)
    assert list(outcomes) == [("normal", "long"), ("portable", "short1"), ("portable", "short2")]
    assert [o.counts for o in outcomes.values()] == [records.Counts(passed=1)] * 3
    assert outcomes[("normal", "long")].tests == {"tests.fake::test_it": 300.5}
    assert outcomes[("portable", "short1")].output.startswith("portable ran")


def test_a_suite_keeps_each_tests_seconds_from_its_junit_report(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite tests="3" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.backends.test_contract" name="test_steps[ddp]" time="12.500">'
        '<properties><property name="cpu_s" value="3.25"/></properties></testcase>'
        '<testcase classname="tests.backends.test_contract" name="test_steps[scratch]" time="0.250">'
        '<properties><property name="cpu_s" value="-1"/><property name="cpu_s" value="inf"/>'
        '<property name="other" value="2"/></properties>'
        "<failure/></testcase>"
        '<testcase classname="tests.backends.test_torch" name="test_on_gpu" time="0.001"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    assert records.junit_counts(report) == records.Counts(passed=1, failed=1, skipped=1)
    assert records.junit_times(report) == {
        "tests.backends.test_contract::test_steps[ddp]": 12.5,
        "tests.backends.test_contract::test_steps[scratch]": 0.25,
        "tests.backends.test_torch::test_on_gpu": 0.001,
    }
    # the CPU seconds tests/conftest.py records; a value that is no CPU time is left out
    assert records.junit_cpu(report) == {"tests.backends.test_contract::test_steps[ddp]": 3.25}


def test_a_suite_whose_report_was_cut_short_fails_in_one_line(tmp_path):
    """A JUnit report cut short (pytest killed while writing it, a full disk) is untrusted input: the suite fails,
    saying so, and the pass goes on."""
    fake = tmp_path / "fake-python"
    fake.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        '    case "$arg" in\n'
        '        --junitxml=*) printf \'<testsuites><testsuite tests="3"\' > "${arg#*=}" ;;\n'
        "    esac\n"
        "done\n"
    )
    fake.chmod(0o755)
    suite = lanes.Suite("fake", str(fake), [], {**os.environ}, [], ["-k", "x"])
    outcome = lanes.run_suite(suite)
    assert outcome.counts == records.Counts(failed=1)
    assert "fake: pytest exited with status 0 and an unreadable report (" in outcome.output


def one_test(seconds: dict[str, float]):
    """A fake suite's outcome: one passed test of seconds[its short title] (the suite took one second more)."""

    def ran(item):
        s = seconds.get(item.title.split(" ")[0], 1.0)
        test = f"tests.{item.title.split(' ')[0]}::test_{item.pass_name}"
        return records.Outcome(records.Counts(passed=1), "", s + 1, {test: s}, s / 2, {test: s / 4})

    return ran


def test_the_pass_leaves_each_suites_times_with_its_date_and_host(monkeypatch, tmp_path):
    fake_pass(monkeypatch, tmp_path, passes="normal,portable", ran=one_test({"torch": 30.0}))
    kept = json.loads((tmp_path / "times.json").read_text())
    assert kept["host"]["cpu"] == "AMD EPYC" and kept["host"]["vector_isa"] == ["AVX2"]
    assert kept["passes"] == ["normal", "portable"] and kept["backends"] == ["torch", "jax"]
    assert datetime.fromisoformat(kept["date"]).tzinfo is not None and kept["wall_s"] >= 0
    assert sorted(kept["suites"]) == [
        "normal: cross-backend (torch, jax)",
        "normal: harness (no framework)",
        "normal: jax (inside its environment)",
        "normal: torch (inside its environment)",
        "portable: cross-backend (torch, jax)",
        "portable: jax (inside its environment)",
        "portable: torch (inside its environment)",
    ]
    torch = kept["suites"]["portable: torch (inside its environment)"]
    assert torch == {
        "date": kept["date"],
        "seconds": 31.0,
        "passed": 1,
        "failed": 0,
        "skipped": 0,
        "cpu_seconds": 15.0,
        "tests": {"tests.torch::test_portable": 30.0},
        "tests_cpu": {"tests.torch::test_portable": 7.5},
    }


def test_the_next_pass_keeps_the_suites_it_did_not_run_and_orders_its_lanes_by_the_times(
    monkeypatch, tmp_path
):
    """A pass of one backend keeps the others' times; a pass with the user's pytest arguments ran part of each
    suite and keeps nothing; the next pass starts the suites by the times measured (torch's 900 s before the
    cross suite's declared 3.1 minutes, the harness's 2 s after everything), a suite never measured by its declared
    minutes."""
    fake_pass(monkeypatch, tmp_path, backend="torch", ran=one_test({"torch": 899.0}))
    fake_pass(monkeypatch, tmp_path, backend="jax", ran=one_test({"jax": 9.0}))
    kept = json.loads((tmp_path / "times.json").read_text())["suites"]
    assert {k: v["seconds"] for k, v in kept.items()} == {
        "normal: harness (no framework)": 2.0,
        "normal: torch (inside its environment)": 900.0,
        "normal: jax (inside its environment)": 10.0,
    }
    before = (tmp_path / "times.json").read_text()
    fake_pass(monkeypatch, tmp_path, pytest_args=["-k", "split"], ran=one_test({"torch": 5.0}))
    assert (tmp_path / "times.json").read_text() == before
    queue, _ = fake_pass(monkeypatch, tmp_path, passes="normal,portable")
    assert [lanes.label(i.key) for i in queue] == [
        "portable: what each backend's CPU kernels run with",
        "torch (inside its environment)",
        "cross-backend (torch, jax)",
        "portable: cross-backend (torch, jax)",
        "portable: torch (inside its environment)",
        "portable: jax (inside its environment)",
        "jax (inside its environment)",
        "harness (no framework)",
    ]


def test_times_from_another_host_or_unreadable_ones_are_not_used(tmp_path):
    same = {"cpu": "AMD EPYC", "vector_isa": ["AVX2"]}
    earlier = {"host": same, "suites": {"normal: mxnet": {"seconds": 100}}}
    now = {"normal: torch": {"seconds": 9}}
    pass_ = {"date": "d"}
    assert times.times_record(earlier, now, same, pass_)["suites"] == {
        "normal: mxnet": {"seconds": 100},
        "normal: torch": {"seconds": 9},
    }
    other = {**same, "vector_isa": ["AVX2", "AVX-512"]}
    assert times.times_record(earlier, now, other, pass_)["suites"] == now
    assert times.times_record(earlier, {}, same, pass_) is None  # nothing measured: the file stays
    assert times.measured_seconds(
        {
            "suites": {
                "a": {"seconds": 12.5},
                "b": {"seconds": "12"},
                "c": {"seconds": -1},
                "d": {"seconds": True},
                "e": [],
            }
        }
    ) == {"a": 12.5}
    assert times.measured_seconds({"suites": []}) == {}
    (tmp_path / "times.json").write_text("{not json")
    assert times.read_times(tmp_path / "times.json") == {}
    assert times.read_times(tmp_path / "absent.json") == {}


def test_the_longest_tests_are_shown_longest_first_with_their_suite():
    outcomes = {
        ("normal", "torch (inside its environment)"): records.Outcome(
            records.Counts(), "", 0.0, {f"t::test_{i}": float(i) for i in range(8)}
        ),
        ("portable", "jax (inside its environment)"): records.Outcome(
            records.Counts(),
            "",
            0.0,
            {"j::test_a": 6.5, "j::test_b": 100.0, "j::test_c": 0.5},
            tests_cpu={"j::test_b": 12.0},
        ),
    }
    rows = times.longest_tests(outcomes)
    assert len(rows) == times.LONGEST_SHOWN == 10
    assert rows[:3] == [
        ("portable: jax (inside its environment)", "j::test_b", 100.0, 12.0),
        ("torch (inside its environment)", "t::test_7", 7.0, None),
        ("portable: jax (inside its environment)", "j::test_a", 6.5, None),
    ]
    assert [r[2] for r in rows] == [100.0, 7.0, 6.5, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.5]


def test_the_summary_counts_each_pass_then_all_of_them_last(capsys):
    outcomes = {
        ("normal", "harness (no framework)"): records.Outcome(records.Counts(10, 0, 1), "", 300.0),
        ("normal", "torch (inside its environment)"): records.Outcome(
            records.Counts(20, 1, 2), "", 500.0
        ),
        ("portable", "torch (inside its environment)"): records.Outcome(
            records.Counts(5, 0, 0), "", 60.0
        ),
    }
    status = testing.summarise(outcomes, ["normal", "portable"], ["wall time of the pass: 1 s"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-4:] == [
        "normal pass: 30 passed, 1 failed, 3 skipped",
        "portable pass: 5 passed, 0 failed, 0 skipped",
        "wall time of the pass: 1 s",
        "35 passed, 1 failed, 3 skipped",
    ]
    assert status == 1
    del outcomes[("normal", "torch (inside its environment)")]
    assert testing.summarise(outcomes, ["normal", "portable"], []) == 0


def test_the_wall_time_is_held_to_the_budget_of_the_hosts_widest_vectors():
    """Over budget is one line, a report: the status is the tests' alone. Only the full pass has a budget."""
    assert times.budget(["AVX2"]) == (1500, "a 2-core host with AVX2")
    assert times.budget(["AVX2", "AVX-512", "AVX512-BF16"]) == (900, "a 2-core host with AVX-512")
    assert times.budget([]) == times.budget(None) == times.budget(["AVX2"])
    assert testing.wall_time(1450.4, ["AVX2"], full=True) == [
        "wall time of the pass: 1,450 s (24.2 min), budget 1,500 s on a 2-core host with AVX2"
    ]
    assert testing.wall_time(1278.0, ["AVX2", "AVX-512"], full=True) == [
        "wall time of the pass: 1,278 s (21.3 min), budget 900 s on a 2-core host with AVX-512",
        "over budget by 378 s (a report, not a failure)",
    ]
    assert testing.wall_time(1278.0, ["AVX-512"], full=False) == [
        "wall time of the pass: 1,278 s (21.3 min); the budget, 900 s on a 2-core host with AVX-512, is the "
        "full pass's (--passes normal,portable, every backend)"
    ]


def test_ci_runs_the_readmes_test_command():
    readme = (ROOT / "README.md").read_text()
    command = "python3 -m harness test --passes normal,portable"
    assert f"\n{command} " in readme
    assert f"\n{command} | tee" in (ROOT / ".ci" / "run").read_text()


def test_the_longest_suite_starts_first():
    """The lanes end together when the longest suites start first: on a fresh clone by their declared minutes
    (backend.toml's [tests] minutes, HARNESS_MINUTES), every one of them stated."""
    from common import manifest

    suites = [
        catalog.harness_suite([]),
        *(catalog.backend_suite(n, "python", False, []) for n in manifest.known()),
    ]
    ordered = [s.title.split(" ")[0] for s in catalog.longest_first(suites)]
    minutes = {n: manifest.load(n).test_minutes for n in manifest.known()} | {
        "harness": catalog.HARNESS_MINUTES
    }
    assert all(minutes[n] > 0 for n in minutes), minutes
    assert ordered == sorted(minutes, key=lambda n: -minutes[n])
    assert all(manifest.load(n).portable_test_minutes > 0 for n in manifest.known())


def test_a_backends_suite_is_the_contract_and_every_file_of_its_own():
    """test_torch_torchvision.py is torch's too: a backend's own files are test_<name>.py and test_<name>_*.py;
    the contract's are test_contract.py and test_contract_*.py."""
    contract = ["tests/backends/test_contract.py", "tests/backends/test_contract_hosts.py"]
    suite = catalog.backend_suite("torch", "python", False, [])
    assert suite.paths == [
        *contract,
        "tests/backends/test_torch.py",
        "tests/backends/test_torch_torchvision.py",
    ]
    assert catalog.backend_suite("jax", "python", False, []).paths == [
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
