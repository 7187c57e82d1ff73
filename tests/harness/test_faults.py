"""Faults around the runs: signals to the harness, runs started together, an --out that cannot hold a
report, a full disk. Whatever happens, the finished results survive, no worker outlives the harness, and
no `.tmp-<run-id>` is left in --out.

The signal tests start a real harness process with a fake worker interpreter (a Python script that
succeeds, or hangs with a child of its own), signal it mid-run and bound every wait."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness import cli
from harness.processes import envs, runner
from harness.reporting import document
from tests.harness.helpers import ROOT, TORCH_LENET, fake_python

BASE = (
    *TORCH_LENET,
    "--dataset",
    "synthetic",
    "--train-size",
    "64",
    "--test-size",
    "32",
    "--batch-size",
    "32",
    "--epochs",
    "1",
    "--device",
    "cpu",
    "--timed-steps",
    "0",
    "--quiet",
)

# Succeeds at once in a 1-device run; a 2-device run (or the equivalence check, with FAKE_HANG_CHECK) hangs
# with a child process of its own, after writing both pids to $FAKE_STATE/pids. With FAKE_IGNORE_TERM the
# worker and its child ignore SIGTERM: only SIGKILL ends them.
FAKE_WORKER = r"""
import json, os, signal, subprocess, sys, time
from common.worker import watch_lifeline   # as every real worker does first
watch_lifeline()
state = os.environ["FAKE_STATE"]
hang = "--check" in sys.argv if os.environ.get("FAKE_HANG_CHECK") else "--config" in sys.argv
if "--config" in sys.argv:
    cfg = json.load(open(sys.argv[sys.argv.index("--config") + 1]))
    hang = hang and cfg["devices"] > 1
if hang:
    if os.environ.get("FAKE_IGNORE_TERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # inherited by the child too
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(state, "pids.tmp"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(os.path.join(state, "pids.tmp"), os.path.join(state, "pids"))
    time.sleep(1000)
    sys.exit(0)
if "--check" in sys.argv:
    sys.exit("no check here")
result = sys.argv[sys.argv.index("--result") + 1]
epochs = [{"epoch": 1, "time_s": 1.0, "steps": 2, "images": 64, "images_per_s": 64.0, "train_loss": 1.0,
           "train_acc": 0.5, "test_acc": 0.5}]
json.dump({"schema_version": 1, "status": "ok", "config": cfg, "environment": {}, "epochs": epochs,
           "compile_s": 0.1, "params": 1, "weights_hash": "w" * 64, "data_hash": "d" * 64, "error": None,
           "memory": {}}, open(result, "w"))
"""

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def fake_worker(tmp_path: Path) -> str:
    script = tmp_path / "fake_worker.py"
    script.write_text(FAKE_WORKER)
    return fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')


def start_harness(*args: str, env: dict | None = None, ignored: tuple = ()) -> subprocess.Popen:
    """`python -m harness ARGS` in the background, with the stop signals at their defaults whatever the
    test runner inherited (a background job may ignore SIGINT), except those `ignored` (as nohup does)."""

    def default_signals():
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN if s in ignored else signal.SIG_DFL)

    return subprocess.Popen(
        [sys.executable, "-m", "harness", *args],
        cwd=ROOT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=default_signals,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            pytest.fail(f"the harness ended before {path.name} appeared: {proc.communicate()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{path.name} did not appear within {timeout} s")
        time.sleep(0.05)


def finish(proc: subprocess.Popen, timeout: float = 60) -> tuple[int, str]:
    try:
        _, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(
            f"the harness did not exit within {timeout} s of the signal: {proc.communicate()}"
        )
    return proc.returncode, stderr


def alive(pids: list[int]) -> list[int]:
    """Those still running (a zombie, dead but not yet reaped by whoever adopted it, is not running)."""
    running = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in ("Z", "X"):
            running.append(pid)
    return running


def assert_none_survive(pids: list[int], within: float = 10) -> None:
    deadline = time.monotonic() + within
    while alive(pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    survivors = alive(pids)
    for pid in survivors:  # do not leave them behind when the test fails
        os.kill(pid, signal.SIGKILL)
    assert survivors == [], f"processes of the worker's group outlived the harness: {survivors}"


def only_report(out: Path) -> Path:
    entries = list(out.iterdir())
    # no .tmp-<run-id> left
    assert len(entries) == 1 and not entries[0].name.startswith("."), entries
    return entries[0]


def statuses(report_dir: Path) -> list[tuple[int, str]]:
    runs = json.loads((report_dir / "results.json").read_text())["runs"]
    return [(r["config"]["devices"], r["status"]) for r in runs]


# ------------------------------------------------------------------------- signals


def stopped_in_the_2_device_run(tmp_path, out, state, gpus: str, signum) -> tuple[int, str]:
    """The harness over `gpus` device counts with a worker that hangs at 2 devices, sent `signum` once the
    1-device run is done: its exit status and stderr."""
    state.mkdir()
    proc = start_harness(
        *BASE,
        "--no-check",
        "--gpus",
        gpus,
        "--python",
        f"torch={fake_worker(tmp_path)}",
        "--out",
        str(out),
        env={"FAKE_STATE": str(state)},
    )
    wait_for(state / "pids", proc)  # the 1-device run is done, the 2-device one hangs
    proc.send_signal(signum)
    return finish(proc)


@pytest.mark.parametrize("signum", SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_a_stop_signal_during_training_writes_the_partial_report_and_kills_the_workers(
    tmp_path, signum
):
    """SIGTERM (timeout, systemd, scancel) and SIGHUP (a closed terminal) do what Ctrl-C does."""
    out, state = tmp_path / "reports", tmp_path / "state"
    code, stderr = stopped_in_the_2_device_run(tmp_path, out, state, "1,2", signum)
    assert_none_survive([int(p) for p in (state / "pids").read_text().split()])
    assert code == 128 + signum, stderr
    assert "Traceback" not in stderr
    assert f"Interrupted ({signal.Signals(signum).name})" in stderr
    report_dir = only_report(out)
    assert statuses(report_dir) == [(1, "ok"), (2, "interrupted")]
    assert "interrupted" in (report_dir / "report.md").read_text()


def test_the_runs_an_interrupt_kept_from_starting_say_so(tmp_path):
    """Of the runs an interrupt ends, the one that was training says it was interrupted; the ones after it say
    they never started, so that a report does not suggest they ran."""
    out, state = tmp_path / "reports", tmp_path / "state"
    code, stderr = stopped_in_the_2_device_run(tmp_path, out, state, "1,2,4", signal.SIGTERM)
    assert code == 128 + signal.SIGTERM, stderr
    runs = json.loads((only_report(out) / "results.json").read_text())["runs"]
    assert [(r["config"]["devices"], r["status"], r["error"]) for r in runs] == [
        (1, "ok", None),
        (2, "interrupted", "interrupted by SIGTERM"),
        (4, "interrupted", "not started: the harness was interrupted by SIGTERM first"),
    ]


def test_sighup_stays_ignored_under_nohup(tmp_path):
    out, state = tmp_path / "reports", tmp_path / "state"
    state.mkdir()
    proc = start_harness(
        *BASE,
        "--no-check",
        "--gpus",
        "2",
        "--python",
        f"torch={fake_worker(tmp_path)}",
        "--out",
        str(out),
        env={"FAKE_STATE": str(state)},
        ignored=(signal.SIGHUP,),
    )
    wait_for(state / "pids", proc)
    proc.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert proc.poll() is None  # still running
    proc.send_signal(signal.SIGTERM)
    code, stderr = finish(proc)
    assert_none_survive([int(p) for p in (state / "pids").read_text().split()])
    assert code == 143, stderr
    assert statuses(only_report(out)) == [(2, "interrupted")]


def test_a_second_ctrl_c_does_not_stop_the_kill_of_a_worker_that_ignores_sigterm(tmp_path):
    """The SIGKILL after the grace period must come even if the user presses Ctrl-C again meanwhile."""
    out, state = tmp_path / "reports", tmp_path / "state"
    state.mkdir()
    proc = start_harness(
        *BASE,
        "--no-check",
        "--gpus",
        "2",
        "--python",
        f"torch={fake_worker(tmp_path)}",
        "--out",
        str(out),
        env={"FAKE_STATE": str(state), "FAKE_IGNORE_TERM": "1"},
    )
    wait_for(state / "pids", proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)  # inside kill_group's 5 s grace: the worker ignored SIGTERM
    proc.send_signal(signal.SIGINT)
    code, stderr = finish(proc)
    assert_none_survive([int(p) for p in (state / "pids").read_text().split()], within=2)
    assert code == 130, stderr
    assert "Traceback" not in stderr
    assert statuses(only_report(out)) == [(2, "interrupted")]


def test_ctrl_c_during_the_equivalence_check_still_writes_the_report(tmp_path):
    out, state = tmp_path / "reports", tmp_path / "state"
    state.mkdir()
    proc = start_harness(
        *BASE,
        "--gpus",
        "1",
        "--python",
        f"torch={fake_worker(tmp_path)}",
        "--out",
        str(out),
        env={"FAKE_STATE": str(state), "FAKE_HANG_CHECK": "1"},
    )
    wait_for(state / "pids", proc)  # the check's worker hangs
    proc.send_signal(signal.SIGINT)
    code, stderr = finish(proc)
    assert_none_survive([int(p) for p in (state / "pids").read_text().split()])
    assert code == 130, stderr
    assert "Traceback" not in stderr
    report_dir = only_report(out)
    assert statuses(report_dir) == [(1, "interrupted")]
    assert "Interrupted before the check finished" in (report_dir / "report.md").read_text()


def test_a_harness_killed_with_sigkill_takes_its_workers_along_and_the_next_run_keeps_what_finished(
    tmp_path,
):
    """SIGKILL cannot be handled: the workers watch their lifeline (common/worker.py) and end their process
    groups; the killed run's staging folder is found by the next run and kept as a report of its finished
    runs (harness/reporting/leftovers.py)."""
    out, state = tmp_path / "reports", tmp_path / "state"
    state.mkdir()
    python = fake_worker(tmp_path)
    proc = start_harness(
        *BASE,
        "--no-check",
        "--gpus",
        "1,2",
        "--python",
        f"torch={python}",
        "--out",
        str(out),
        env={"FAKE_STATE": str(state)},
    )
    wait_for(state / "pids", proc)  # the 1-device run is done, the 2-device one hangs with a child
    proc.kill()
    proc.communicate()
    assert_none_survive([int(p) for p in (state / "pids").read_text().split()], within=5)
    (staging,) = out.iterdir()
    assert staging.name.startswith(".tmp-")
    run_id = staging.name[len(".tmp-") :]

    (state / "pids").unlink()
    proc = start_harness(
        *BASE,
        "--no-check",
        "--gpus",
        "1",
        "--python",
        f"torch={python}",
        "--out",
        str(out),
        env={"FAKE_STATE": str(state)},
    )
    code, stderr = finish(proc)
    assert code == 0, stderr
    assert (
        f"harness: the run {run_id} was killed before it finished; kept as {out / run_id}-killed, with the "
        "report of its 1 finished run(s)"
    ) in stderr
    kept = out / f"{run_id}-killed"
    assert (
        statuses(kept) == [(1, "ok"), (2, "interrupted")]
        and (kept / "report.md").is_file()
        and (kept / "logs").is_dir()
    )
    # it says it was killed, the run that was training is an interrupted row, and the finished run names its log
    doc = json.loads((kept / "results.json").read_text())
    assert "the harness was killed" in doc["finished"] and doc["killed"]["found"]
    assert "finished never: the harness was killed" in (kept / "report.md").read_text()
    assert doc["runs"][1]["error"] == "interrupted: the harness was killed while it ran"
    assert (kept / doc["runs"][0]["log"]).is_file()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith(".")) == []


def test_an_interrupt_while_the_report_is_written_loses_nothing(tmp_path, monkeypatch, capfd):
    """In-process: the signal arrives inside document.write; the report is finished, the exit status says it."""
    real_write = document.write

    def write_interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler runs here, in the main thread
        return real_write(*args, **kwargs)

    monkeypatch.setattr(document, "write", write_interrupted)
    # SIGINT at its default whatever the test runner inherited (a background job ignores it, and the harness
    # leaves an ignored signal ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    out = tmp_path / "reports"
    monkeypatch.setenv("FAKE_STATE", str(tmp_path))
    try:
        code = cli.main(
            [
                *BASE,
                "--no-check",
                "--gpus",
                "1",
                "--python",
                f"torch={fake_worker(tmp_path)}",
                "--out",
                str(out),
            ]
        )
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped while the report was written")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert code == 130
    report_dir = only_report(out)
    assert statuses(report_dir) == [(1, "ok")]
    assert (report_dir / "report.md").is_file()
    assert "Traceback" not in capfd.readouterr().err


@pytest.mark.parametrize("at", ["read", "announced"])
def test_a_signal_as_a_run_finishes_keeps_that_run(tmp_path, monkeypatch, capfd, at):
    """In-process: SIGTERM arrives the moment the 1-device run's result is read, or the moment the run is
    announced (`ok`): the report keeps that run, ok with its figures and log, and the 2-device run says it never
    started. The signal is raised in the harness's own thread, so it lands exactly there, every time."""
    if at == "read":
        real_load = runner.load_result

        def load_result(*args, **kwargs):
            signal.raise_signal(signal.SIGTERM)
            return real_load(*args, **kwargs)

        monkeypatch.setattr(runner, "load_result", load_result)
    else:
        real_finished = runner.Console.finished

        def finished(self, cfg, result):
            if result["status"] == "ok":
                signal.raise_signal(signal.SIGTERM)
            return real_finished(self, cfg, result)

        monkeypatch.setattr(runner.Console, "finished", finished)
    # SIGTERM at its default whatever the test runner inherited (the harness leaves an ignored signal ignored)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    out = tmp_path / "reports"
    monkeypatch.setenv("FAKE_STATE", str(tmp_path))
    try:
        code = cli.main(
            [
                *BASE,
                "--no-check",
                "--gpus",
                "1,2",
                "--timeout",  # the 2-device worker hangs: were it started, the row would say so in time
                "30",
                "--python",
                f"torch={fake_worker(tmp_path)}",
                "--out",
                str(out),
            ]
        )
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capfd.readouterr().err
    assert code == 143, err
    assert "Traceback" not in err
    report_dir = only_report(out)
    runs = json.loads((report_dir / "results.json").read_text())["runs"]
    assert [(r["config"]["devices"], r["status"], r["error"]) for r in runs] == [
        (1, "ok", None),
        (2, "interrupted", "not started: the harness was interrupted by SIGTERM first"),
    ]
    assert [e["test_acc"] for e in runs[0]["epochs"]] == [0.5]
    assert runs[0]["weights_hash"] == "w" * 64
    assert (report_dir / runs[0]["log"]).is_file()


# -------------------------------------------------------------------- same second


def test_two_runs_started_together_give_two_reports(tmp_path):
    out = tmp_path / "reports"
    python = fake_worker(tmp_path)
    procs = [
        start_harness(
            *BASE,
            "--no-check",
            "--gpus",
            "1",
            "--python",
            f"torch={python}",
            "--out",
            str(out),
            env={"FAKE_STATE": str(tmp_path)},
        )
        for _ in range(2)
    ]
    for proc in procs:
        code, stderr = finish(proc)
        assert code == 0, stderr
    reports = sorted(p.name for p in out.iterdir())
    assert len(reports) == 2 and not any(name.startswith(".") for name in reports), reports
    assert all((out / name / "report.md").is_file() for name in reports)


def test_run_ids_claimed_in_the_same_second_get_a_suffix(tmp_path, monkeypatch):
    monkeypatch.setattr(document.time, "strftime", lambda fmt, *a: "20260101-000000")
    first = document.Staging(tmp_path, ["torch"]).create()
    second = document.Staging(tmp_path, ["torch"]).create()
    assert (first.run_id, second.run_id) == ("20260101-000000-torch", "20260101-000000-torch-2")
    assert first.path != second.path and first.path.is_dir() and second.path.is_dir()


# ------------------------------------------------------------------------- --out


def refused_out(tmp_path: Path, out: Path, capfd) -> str:
    """Run in-process with a worker that marks that it started; return the one error line."""
    python = fake_python(
        tmp_path, f"touch {tmp_path / 'worker-started'}; exit 1", name="marking-python"
    )
    code = cli.main(
        [*BASE, "--no-check", "--gpus", "1", "--python", f"torch={python}", "--out", str(out)]
    )
    err = capfd.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    assert not (tmp_path / "worker-started").exists()  # refused before any work
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def assert_refused(line: str, out: Path, reason: str) -> None:
    """ "harness: error: --out OUT: could not write OUT...: REASON (N free there)": what, where, why, the space."""
    assert line.startswith(f"harness: error: --out {out}: could not write {out}"), line
    assert line.endswith(" free there)") and f": {reason} (" in line, line


def test_out_under_a_file_is_refused_before_any_work(tmp_path, capfd):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "reports"
    assert_refused(refused_out(tmp_path, out, capfd), out, "Not a directory")


def test_out_with_a_name_too_long_is_refused_before_any_work(tmp_path, capfd):
    out = tmp_path / ("r" * 300)
    assert_refused(refused_out(tmp_path, out, capfd), out, "File name too long")


def test_out_in_a_read_only_directory_is_refused_before_any_work(tmp_path, monkeypatch, capfd):
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o555)
    if os.geteuid() == 0:  # root writes anywhere: answer as the kernel answers anyone else
        real_mkdir = Path.mkdir

        def mkdir(self, *args, **kwargs):
            if read_only in self.parents:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
            return real_mkdir(self, *args, **kwargs)

        monkeypatch.setattr(Path, "mkdir", mkdir)
    out = read_only / "reports"
    try:
        assert_refused(refused_out(tmp_path, out, capfd), out, "Permission denied")
    finally:
        read_only.chmod(0o755)


@pytest.mark.parametrize(
    "temp_dir_writable", [True, False], ids=["kept-in-temp-dir", "kept-in-staging-dir"]
)
def test_a_full_disk_at_the_end_keeps_the_results_and_says_where(
    tmp_path, monkeypatch, capfd, temp_dir_writable
):
    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(document, "write", full_disk)
    temp_dir = tmp_path / "temp"
    if not temp_dir_writable:
        (tmp_path / "a-file").write_text("")
        temp_dir = tmp_path / "a-file" / "temp"
    monkeypatch.setattr(document.tempfile, "tempdir", str(temp_dir))
    monkeypatch.setenv("FAKE_STATE", str(tmp_path))
    out = tmp_path / "reports"
    try:
        code = cli.main(
            [
                *BASE,
                "--no-check",
                "--gpus",
                "1",
                "--python",
                f"torch={fake_worker(tmp_path)}",
                "--out",
                str(out),
            ]
        )
    finally:
        monkeypatch.undo()  # pytest's own capture needs the real temp dir
    err = capfd.readouterr().err
    assert code == 1
    assert "Traceback" not in err
    line = [l for l in err.splitlines() if l.startswith("harness: error: ")]
    assert len(line) == 1, err
    assert f"could not write the report in {out}: No space left on device (" in line[0]
    assert " free there); the results are kept in " in line[0]
    kept = Path(line[0].rsplit(" ", 1)[1])
    if temp_dir_writable:
        assert kept.parent == temp_dir and kept.name.startswith("dpbench-")
        assert [r["status"] for r in json.loads(kept.read_text())["runs"]] == ["ok"]
        assert list(out.iterdir()) == []  # nothing half-written left in --out
    else:
        assert kept.parent == out and kept.name.startswith(".tmp-")
        (result,) = (kept / "runs").glob("*.result.json")
        assert json.loads(result.read_text())["status"] == "ok"


# ------------------------------------------------------------------ torch DDP

TORCH = envs.venv_python("torch")


@pytest.mark.skipif(not TORCH.exists(), reason="no .venvs/torch")
def test_a_ddp_worker_killed_at_its_timeout_leaves_nothing_in_the_temp_dir(tmp_path):
    """torch's DDP launcher keeps per-rank files in a temporary directory that a killed worker cannot remove:
    it must lie inside the run's own directory, which the harness removes."""
    temp_dir, out = tmp_path / "temp", tmp_path / "reports"
    temp_dir.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "--backend",
            "torch",
            "--strategy",
            "ddp",
            "--model",
            "lenet",
            "--dataset",
            "synthetic",
            "--train-size",
            "8192",
            "--test-size",
            "64",
            "--epochs",
            "100",
            "--gpus",
            "2",
            "--device",
            "cpu",
            "--no-check",
            "--timed-steps",
            "0",
            "--quiet",
            "--timeout",
            "15",
            "--python",
            f"torch={TORCH}",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(temp_dir)},
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 1, result.stderr
    report_dir = only_report(out)
    assert statuses(report_dir) == [(2, "timeout")]
    if '"event": "warmup"' not in (report_dir / "logs" / "torch-ddp-x2.log").read_text():
        pytest.skip(
            "the DDP ranks did not start training within the timeout on this (busy) machine"
        )
    # torch's own compile cache (torchinductor_<user>) is meant to outlive a run; anything else is a leak
    assert [p.name for p in temp_dir.iterdir() if not p.name.startswith("torchinductor_")] == []


# ------------------------------------------------------------------------------ a worker that dies mid-run

DIES_AT_EPOCH_3 = """
import json, os, signal, sys
cfg = json.load(open(sys.argv[sys.argv.index('--config') + 1]))
for n, seconds in ((1, 5.13), (2, 5.02)):
    epoch = {"epoch": n, "time_s": seconds, "steps": 8, "images": 256, "images_per_s": 256 / seconds,
             "train_loss": 2.0 / n, "train_acc": 0.3 * n, "test_acc": 0.35 * n,
             "peak_host_rss_mb": 1638.4 * n}  # its own report of its peak resident set
    print("@dpbench " + json.dumps({"event": "epoch", **epoch, "epochs": 3}), flush=True)
print("@dpbench " + json.dumps({"event": "epoch", "epoch": 3, "time_s": "soon"}), flush=True)  # not a record
os.kill(os.getpid(), signal.SIGKILL)  # as the out-of-memory killer does, in epoch 3
"""


def test_a_worker_killed_in_epoch_3_keeps_epochs_1_and_2_as_partial_and_says_how_it_died(tmp_path):
    """A worker killed by SIGKILL after two of its three epochs: its row fails naming the signal (with the peak
    resident set it last reported, and what the host's out-of-memory count says of it), and the two epochs its
    progress lines reported are in results.json and in the report as partial, in no row's figures."""
    script = tmp_path / "worker.py"
    script.write_text(DIES_AT_EPOCH_3)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    out = tmp_path / "reports"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            *TORCH_LENET,
        ]
        + ["--dataset", "synthetic", "--train-size", "256", "--test-size", "64", "--epochs", "3"]
        + ["--gpus", "1", "--device", "cpu", "--no-check", "--quiet", "--python", f"torch={python}"]
        + ["--out", str(out)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    (report,) = out.iterdir()
    (run,) = json.loads((report / "results.json").read_text())["runs"]
    assert run["status"] == "failed" and run["epochs"] == []
    assert "worker killed by SIGKILL (peak RSS 3.2 GiB)" in run["error"], run["error"]
    assert "out-of-memory killer" in run["error"], run["error"]
    assert [(e["epoch"], e["time_s"]) for e in run["partial_epochs"]] == [(1, 5.13), (2, 5.02)]
    text = (report / "report.md").read_text()
    assert (
        "partial, before it failed (1 device(s)): epoch 1: 5.13 s, 49.9 images/s, test acc 0.3500"
        in text
    )
    assert "No run finished successfully." in text  # no row of figures: the run did not finish


def memory_cgroup(tmp_path, limit_mb: int) -> Path | None:
    """A memory cgroup of its own below this process's (cgroup v1's memory controller, or v2 where it can hold
    processes), limited to `limit_mb`; None where the host does not let this process make one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        hierarchy, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            parent, limit_file = (
                Path("/sys/fs/cgroup/memory") / path.lstrip("/"),
                "memory.limit_in_bytes",
            )
        elif hierarchy == "0" and (Path("/sys/fs/cgroup") / "cgroup.controllers").is_file():
            parent, limit_file = Path("/sys/fs/cgroup") / path.lstrip("/"), "memory.max"
        else:
            continue
        group = parent / f"dpbench-test-{os.getpid()}-{tmp_path.name}"
        try:
            group.mkdir()
            (group / limit_file).write_text(str(limit_mb * 2**20))
            return group
        except OSError:
            if group.is_dir():
                group.rmdir()
    return None


@pytest.mark.skipif(not TORCH.exists(), reason="no .venvs/torch")
def test_a_real_worker_killed_for_memory_is_reported_as_killed_for_memory(tmp_path):
    """torch scratch training ResNet-18 on 2 simulated devices, its harness and worker in a memory cgroup of
    400 MB: the kernel's out-of-memory killer ends the worker, and the failed row says so with the cgroup's count
    and the worker's last peak resident set (where the host lets the test make a cgroup; skipped, saying why,
    where not)."""
    group = memory_cgroup(tmp_path, 400)
    if group is None:
        pytest.skip(
            "this host does not let the test make a memory cgroup (no permission, or no controller)"
        )
    out = tmp_path / "reports"
    command = (
        f"echo $$ > {group}/cgroup.procs && exec {sys.executable} -m harness --backend torch --strategy scratch "
        f"--model resnet18 --dataset synthetic --train-size 512 --test-size 64 --batch-size 64 --epochs 1 "
        f"--gpus 2 --device cpu --no-check --quiet --timed-steps 0 --python torch={TORCH} --out {out}"
    )
    try:
        result = subprocess.run(
            ["sh", "-c", command],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        group.rmdir()  # (empty once its processes ended)
    (report,) = out.iterdir()
    (run,) = json.loads((report / "results.json").read_text())["runs"]
    if run["status"] == "ok":
        pytest.skip("the run fitted in 400 MB on this host")
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    said = re.search(
        r"worker killed by SIGKILL \(peak RSS (\d+) MB\): the kernel's out-of-memory killer",
        run["error"],
    )
    assert said and 0 < int(said.group(1)) <= 400, run[
        "error"
    ]  # the last peak the runner saw, within the limit


def test_a_workers_peak_resident_set_is_sampled_from_proc_while_it_and_its_ranks_live(tmp_path):
    """VmHWM of the worker and of every process it started (a DDP worker's ranks), the largest kept; a process that
    has ended, a file that says nothing and a figure that is not one are no evidence."""
    from harness.processes import deaths

    def process(pid: int, status: str, children: str = "") -> None:
        (tmp_path / str(pid) / "task" / str(pid)).mkdir(parents=True)
        (tmp_path / str(pid) / "status").write_text(f"Name:\tpython\n{status}\n")
        (tmp_path / str(pid) / "task" / str(pid) / "children").write_text(children)

    process(100, "VmHWM:\t  204800 kB", children="101 102 ")
    process(101, "VmHWM:\t 3355443 kB", children="103")
    process(102, "VmHWM:\t     soon kB")
    process(103, "VmRSS:\t 9999999 kB")  # no high-water mark: no evidence
    peak = deaths.PeakRSS(proc=tmp_path)
    peak.sample([100, 999])  # 999 has ended
    assert peak.mb == pytest.approx(3355443 / 1024)
    assert deaths.how_it_died(-9, 0, 0, peak.mb).startswith(
        "worker killed by SIGKILL (peak RSS 3.2 GiB),"
    )
    for figure in ("4096", True, float("nan"), -1.0):
        peak.reported({"peak_host_rss_mb": figure})
    assert peak.mb == pytest.approx(3355443 / 1024)  # a progress line's figure is read as untrusted
    assert deaths.how_it_died(-9, None, None, 512.0).startswith(
        "worker killed by SIGKILL (peak RSS 512 MB): often"
    )


TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.15 "
    "GiB of which 12.00 MiB is free. Process 4242 has 79.13 GiB memory in use. Of the allocated memory 77.50 GiB "
    "is allocated by PyTorch, and 1.10 GiB is reserved by PyTorch but unallocated."
)
XLA_OOM = (
    "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate 2147483648 "
    "bytes.\n"
)


@pytest.mark.parametrize(
    "written, output, said",
    [
        (
            TORCH_OOM,
            [],
            "the device ran out of memory (GPU 0: 79.15 GiB in all, 12.00 MiB free; 77.50 GiB allocated by "
            "PyTorch; 2.00 GiB asked for)",
        ),
        (
            None,
            ["2026-01-01 W external/xla: allocator\n", XLA_OOM],
            "the device ran out of memory (2147483648 bytes asked for)",
        ),
        ("ValueError: not a number", [], None),
    ],
    ids=["torch-in-its-result", "jax-in-its-output", "another-failure"],
)
def test_a_device_out_of_memory_is_said_as_such_with_its_memory(tmp_path, written, output, said):
    """A worker whose device ran out of memory (torch's CUDA error in its failed result, XLA's RESOURCE_EXHAUSTED in
    the output of one that died without one): the row's headline, its error's last line, says so with the device's
    memory its message gives; any other failure is left as it was."""
    from common.config import RunConfig
    from common.results import failed_result
    from harness.processes import runner

    cfg = RunConfig(
        backend="torch", strategy="scratch", devices=1, batch_size=8, dataset="synthetic"
    ).validate()
    (tmp_path / "runs").mkdir()
    node = runner.Node(cfg, tmp_path, "torch-scratch-x1")
    if written is not None:
        node.result_path.write_text(json.dumps(failed_result(cfg.to_dict(), "failed", written)))
    result = node.result(1, output, tmp_path)
    assert result["status"] == "failed"
    if said is None:
        assert result["error"] == written
    else:
        assert result["error"].splitlines()[-1] == said, result["error"]
