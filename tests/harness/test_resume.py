"""--resume REPORT_DIR: a report taken up again keeps every run that finished there, byte for byte, runs the others,
and says so; a report it cannot take up (unreadable, another command's, other code's) is refused in one line."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from harness import cli
from harness.processes import runner
from harness.reporting import document, leftovers
from harness.session import idioms, paired, resume
from tests.harness.helpers import TORCH_LENET, fake_python, harness_in_process, run_harness
from tests.harness.test_faults import BASE, assert_none_survive, finish, start_harness

# A worker that writes a finished result, except on the devices counts FAIL_ON names (a file beside it), where it
# dies as a killed worker does: what a report cut off mid-sweep holds.
WORKER = """
import json, os, sys
from pathlib import Path
cfg = json.load(open(sys.argv[sys.argv.index('--config') + 1]))
result_path = sys.argv[sys.argv.index('--result') + 1]
fail_on = Path(__file__).with_name('fail_on').read_text().split()
if str(cfg['devices']) in fail_on:
    sys.exit('died')
images = 256.0 / cfg['devices']
epochs = [{"epoch": 1, "time_s": 2.0, "steps": 8, "images": 256, "images_per_s": images, "train_loss": 1.0,
           "train_acc": 0.5, "test_acc": 0.5}]
result = {"schema_version": 3, "status": "ok", "config": cfg, "environment": {}, "epochs": epochs,
          "final_test_acc": 0.5, "compile_s": 0.5, "params": 1, "weights_hash": "w", "data_hash": "d",
          "error": None, "log": None}
json.dump(result, open(result_path, "w"))
"""


def sweep(tmp_path: Path, fail_on: str) -> tuple[Path, list[str]]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    (tmp_path / "fail_on").write_text(fail_on)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    out = tmp_path / "reports"
    flags = [*TORCH_LENET, "--dataset", "synthetic"]
    flags += ["--gpus", "1,2,4", "--device", "cpu", "--no-check", "--quiet"]
    flags += ["--python", f"torch={python}", "--out", str(out)]
    return out, flags


def typed(flags: list[str]) -> list[str]:
    """The sweep's --python, typed again with --resume: a report names no interpreter to run."""
    at = flags.index("--python")
    return flags[at : at + 2]


def only_report(out: Path, but: set[Path] = frozenset()) -> Path:
    (report,) = [p for p in out.iterdir() if p not in but and not p.name.startswith(".")]
    return report


def runs_of(report: Path) -> list[dict]:
    return json.loads((report / "results.json").read_text())["runs"]


def test_a_resumed_report_keeps_what_finished_and_runs_only_the_rest(tmp_path):
    out, flags = sweep(tmp_path, fail_on="2 4")
    first = run_harness(*flags)
    assert first.returncode == 1, first.stderr
    cut = only_report(out)
    assert [r["status"] for r in runs_of(cut)] == ["ok", "failed", "failed"]
    (tmp_path / "fail_on").write_text("4")  # the host is better now, but not for 4 devices
    second = run_harness("--resume", str(cut), "--quiet", *typed(flags))
    assert second.returncode == 1, second.stderr
    assert f"[torch scratch x1] kept from {cut}: finished there" in second.stderr
    resumed = only_report(out, {cut})
    runs = runs_of(resumed)
    assert [r["status"] for r in runs] == ["ok", "ok", "failed"]
    assert runs[0] == runs_of(cut)[0]  # the finished run's record, byte for byte
    text = (resumed / "report.md").read_text()
    assert f"- Resumed `{cut}` at " in text
    (tmp_path / "fail_on").write_text("")
    third = run_harness(
        "--resume", str(resumed), "--quiet", *typed(flags)
    )  # cut off again, taken up again: the same holds
    assert third.returncode == 0, third.stderr
    final = only_report(out, {cut, resumed})
    assert [r["status"] for r in runs_of(final)] == ["ok", "ok", "ok"]
    assert runs_of(final)[:2] == runs[:2]
    meta = json.loads((final / "results.json").read_text())
    assert meta["command"] == json.loads((cut / "results.json").read_text())["command"]


@pytest.mark.parametrize("target", [[], ["--target-accuracy", "0.4"]], ids=["repeat", "target"])
def test_a_resume_keeps_each_finished_trial_of_repeat_and_target_accuracy(tmp_path, target):
    """--repeat, alone (every trial the same configuration) and with --target-accuracy (each trial its own batch
    order): each trial is a run of its own, kept or run again by itself, with its trial number and target."""
    out, flags = sweep(tmp_path, fail_on="2")
    first = run_harness(*flags, "--repeat", "2", *target)
    assert first.returncode == 1, first.stderr
    cut = only_report(out)
    trials = [(r["config"]["devices"], r.get("trial"), r["status"]) for r in runs_of(cut)]
    # (every configuration's first trial, then every second: trials interleave)
    assert trials == [(n, t, "failed" if n == 2 else "ok") for t in (1, 2) for n in (1, 2, 4)]
    (tmp_path / "fail_on").write_text("")
    second = run_harness("--resume", str(cut), "--quiet", *typed(flags))
    assert second.returncode == 0, second.stderr
    for n in (1, 4):
        for t in (1, 2):
            assert (
                f"[torch scratch x{n} trial {t}] kept from {cut}: finished there" in second.stderr
            )
    resumed = runs_of(only_report(out, {cut}))
    assert [(r["config"]["devices"], r.get("trial"), r["status"]) for r in resumed] == [
        (n, t, "ok") for t in (1, 2) for n in (1, 2, 4)
    ]
    assert all(r["config"]["target_accuracy"] == (0.4 if target else None) for r in resumed)
    kept = [r for r in runs_of(cut) if r["status"] == "ok"]
    assert kept == [r for r in resumed if r["config"]["devices"] != 2]  # byte for byte


def test_what_cannot_be_resumed_is_refused_in_one_line(tmp_path):
    out, flags = sweep(tmp_path, fail_on="4")
    assert run_harness(*flags).returncode == 1
    report = only_report(out)
    doc = json.loads((report / "results.json").read_text())

    def refused(folder, *extra) -> str:
        result = run_harness("--resume", str(folder), *extra)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, (
            result.stderr
        )
        return lines[0]

    assert "give no other flag than --quiet" in refused(report, "--gpus", "2")
    assert "not a report this harness can read" in refused(tmp_path / "nowhere")
    for name, change, said in (
        ("parity", {"command": "python -m harness parity --backend torch"}, "a report of `parity`"),
        (
            "other-code",
            {"provenance": {**doc["provenance"], "commit": "0" * 40}},
            "other code made it",
        ),
    ):
        other = tmp_path / name
        other.mkdir()
        (other / "results.json").write_text(json.dumps({**doc, **change}))
        assert said in refused(other)
    assert [p for p in out.iterdir() if not p.name.startswith(".")] == [report]  # nothing made


def edited(report: Path, to: Path, **change) -> Path:
    """A copy of `report`'s results.json in `to`, with `change` made to it: a report someone else made."""
    to.mkdir()
    doc = json.loads((report / "results.json").read_text())
    (to / "results.json").write_text(json.dumps({**doc, **change}))
    return to


def test_a_report_is_data_its_commands_python_is_never_run(tmp_path):
    """An edited report naming --python torch=EVIL: the resume never runs EVIL (it drops the report's --python, says
    so in one line, and runs with the --python typed with --resume)."""
    out, flags = sweep(tmp_path, fail_on="4")
    assert run_harness(*flags).returncode == 1
    report = only_report(out)
    (tmp_path / "fail_on").write_text("")
    marker = tmp_path / "evil-ran"
    evil = fake_python(tmp_path, f"touch {marker}", name="evil")
    command = json.loads((report / "results.json").read_text())["command"]
    python = typed(flags)[1]
    assert python in command
    other = edited(report, tmp_path / "other", command=command.replace(python, f"torch={evil}"))
    result = run_harness("--resume", str(other), "--quiet", *typed(flags))
    assert result.returncode == 0, result.stderr
    assert not marker.exists()
    assert (
        "its command's --python is not taken from a report: the --python given here"
        in result.stderr
    )
    assert [r["status"] for r in runs_of(only_report(out, {report, other}))] == ["ok"] * 3


def test_a_stored_command_that_does_not_parse_is_refused_in_one_line(tmp_path):
    out, flags = sweep(tmp_path, fail_on="4")
    assert run_harness(*flags).returncode == 1
    report = only_report(out)
    for name, command in (
        ("quote", "python -m harness --backend 'torch"),
        ("flag", "python -m harness --no-such-flag"),
    ):
        result = harness_in_process(
            "--resume", str(edited(report, tmp_path / name, command=command))
        )
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, (
            result.stderr
        )
        assert "its command does not parse" in lines[0]


def test_a_run_edited_to_ok_without_its_figures_is_not_kept(tmp_path):
    """A failed run whose status was edited to ok holds no figures: it is not kept; it runs again, said in one line."""
    out, flags = sweep(tmp_path, fail_on="4")
    assert run_harness(*flags).returncode == 1
    report = only_report(out)
    doc = json.loads((report / "results.json").read_text())
    assert doc["runs"][2]["status"] == "failed"
    runs = [*doc["runs"][:2], {**doc["runs"][2], "status": "ok"}]
    other = edited(report, tmp_path / "other", runs=runs)
    earlier = resume.read(str(other))
    assert len(earlier.results) == 2 and "recorded as ok without" in earlier.said[0]
    (tmp_path / "fail_on").write_text("")
    result = run_harness("--resume", str(other), "--quiet", *typed(flags))
    assert result.returncode == 0, result.stderr
    assert f"[torch scratch x4] not kept from {other}: recorded as ok without" in result.stderr
    resumed = runs_of(only_report(out, {report, other}))
    assert [r["status"] for r in resumed] == ["ok"] * 3 and resumed[2]["epochs"]
    assert resumed[:2] == doc["runs"][:2]


def test_a_kept_runs_log_that_cannot_be_copied_is_said_and_the_run_stays_kept(
    tmp_path, monkeypatch
):
    """A full disk while copying a kept run's log: one line says so; the record is kept all the same."""
    import shutil

    earlier = resume.Earlier(tmp_path / "old", [], {}, None, None)
    (tmp_path / "old" / "logs").mkdir(parents=True)
    (tmp_path / "old" / "logs" / "a.log").write_text("x")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copy2", full)
    said = resume.copy_records({"log": "logs/a.log"}, earlier, tmp_path / "new")
    assert said == "its log could not be copied: No space left on device"
    assert resume.copy_records({"log": "../outside.log"}, earlier, tmp_path / "new") is None


# ------------------------------------------------------------------ a stop signal at each stage, then --resume

# A worker whose every finished run has figures of its own (a run done twice could not repeat them), that notes
# each run it finished and each check it finished in $FAKE_STATE, and that hangs with a child of its own, its pids
# in $FAKE_STATE/pids, in the check (FAKE_HANG=check) or in the run on FAKE_HANG devices: the stage's marker.
STAGED_WORKER = r"""
import json, os, random, subprocess, sys, time
from common.worker import watch_lifeline   # as every real worker does first
watch_lifeline()
state = os.environ["FAKE_STATE"]

def note(name):
    with open(os.path.join(state, name), "a") as f:
        f.write("1\n")

def hang():
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(state, "pids.tmp"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(os.path.join(state, "pids.tmp"), os.path.join(state, "pids"))
    time.sleep(1000)

if "--check" in sys.argv:
    if os.environ.get("FAKE_HANG") == "check":
        hang()
    note("checked")
    sys.exit("no check here")
cfg = json.load(open(sys.argv[sys.argv.index("--config") + 1]))
if os.environ.get("FAKE_HANG") == str(cfg["devices"]):
    hang()
seconds = random.uniform(1.0, 2.0)
epochs = [{"epoch": 1, "time_s": seconds, "steps": 2, "images": 64, "images_per_s": 64 / seconds,
           "train_loss": random.random(), "train_acc": 0.5, "test_acc": 0.5}]
json.dump({"schema_version": 3, "status": "ok", "config": cfg, "environment": {}, "epochs": epochs,
           "final_test_acc": 0.5, "compile_s": 0.1, "params": 1, "weights_hash": "w" * 64, "data_hash": "d" * 64,
           "error": None, "memory": {}}, open(sys.argv[sys.argv.index("--result") + 1], "w"))
note(f"finished-x{cfg['devices']}")
"""

# Each stage, and the statuses on 1, 2 and 4 devices of the report it stops, then of its resume stopped on 4 devices.
STAGES = {
    "check": (["interrupted"] * 3, ["ok", "ok", "interrupted"]),
    "mid-run": (["ok", "interrupted", "interrupted"], ["ok", "ok", "interrupted"]),
    "between-runs": (["ok", "interrupted", "interrupted"], ["ok", "ok", "interrupted"]),
    "report": (["ok"] * 3, None),  # its resume has nothing to run: it writes nothing
}


def staged_sweep(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    """The sweep the stage tests stop: torch scratch on 1, 2 and 4 devices after its check; (--out, state, flags)."""
    script = tmp_path / "staged_worker.py"
    script.write_text(STAGED_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    out, state = tmp_path / "reports", tmp_path / "state"
    state.mkdir()
    flags = [*BASE, "--gpus", "1,2,4", "--python", f"torch={python}", "--out", str(out)]
    return out, state, flags


def stopped_by_its_worker(state: Path, *args: str, hang: str) -> tuple[int | None, str]:
    """`python -m harness ARGS`, sent SIGTERM once its worker hangs at `hang` (the check, or a device count); or
    its own end if no worker hangs there (every run it would hang in was kept): its exit status and stderr."""
    (state / "pids").unlink(missing_ok=True)
    proc = start_harness(*args, env={"FAKE_STATE": str(state), "FAKE_HANG": hang})
    while not (state / "pids").exists() and proc.poll() is None:
        time.sleep(0.05)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    code, stderr = finish(proc)
    assert_none_survive(
        [int(p) for p in (state / "pids").read_text().split()] if (state / "pids").exists() else []
    )
    return code, stderr


def stopped_in_process(monkeypatch, state: Path, stage: str, *args: str) -> int:
    """`python -m harness ARGS` in this process, sent SIGTERM between its first and second run, or while its
    report is written: points no worker marks."""
    monkeypatch.setenv("FAKE_STATE", str(state))
    if stage == "between-runs":
        real_run, calls = runner.run, []

        def run_stopped_before_the_second(*a, **k):
            calls.append(1)
            if len(calls) == 2:
                signal.raise_signal(
                    signal.SIGTERM
                )  # its handler runs here, before the second run starts
            return real_run(*a, **k)

        monkeypatch.setattr(runner, "run", run_stopped_before_the_second)
    else:
        real_write = document.write

        def write_stopped(*a, **k):
            signal.raise_signal(signal.SIGTERM)
            return real_write(*a, **k)

        monkeypatch.setattr(document, "write", write_stopped)
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a fresh process has it
    try:
        return cli.main(list(args))
    finally:
        signal.signal(signal.SIGTERM, previous)
        monkeypatch.undo()


def reports_in(out: Path, but: set[Path]) -> Path:
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no staging folder left behind
    return only_report(out, but)


@pytest.mark.parametrize("stage", STAGES)
def test_a_sweep_stopped_at_any_stage_and_resumed_twice_keeps_every_finished_figure(
    tmp_path, monkeypatch, stage
):
    """SIGTERM during the check, mid-run, between runs or while the report is written; the resume stopped again in
    its run on 4 devices (where it still has one to run); resumed again: every run is there and finished, every
    finished run's record is the one it first finished with, byte for byte, and no finished run or check ran twice."""
    out, state, flags = staged_sweep(tmp_path)
    if stage in ("check", "mid-run"):
        code, _ = stopped_by_its_worker(state, *flags, hang="check" if stage == "check" else "2")
    else:
        code = stopped_in_process(monkeypatch, state, stage, *flags)
    assert code == 128 + signal.SIGTERM
    reports = [reports_in(out, set())]
    code, stderr = stopped_by_its_worker(
        state, "--resume", str(reports[0]), "--quiet", *typed(flags), hang="4"
    )
    assert (
        code == (0 if stage == "report" else 128 + signal.SIGTERM) and "Traceback" not in stderr
    ), stderr
    if stage == "report":  # nothing left to run: nothing written
        assert "nothing to resume, no report written" in stderr, stderr
        assert [p for p in out.iterdir()] == reports
        assert [(state / f"finished-x{n}").read_text() for n in (1, 2, 4)] == ["1\n"] * 3
        return
    reports.append(reports_in(out, set(reports)))
    assert [[r["status"] for r in runs_of(report)] for report in reports] == list(STAGES[stage])
    code, stderr = stopped_by_its_worker(
        state, "--resume", str(reports[1]), "--quiet", *typed(flags), hang=""
    )
    assert code == 0, stderr
    reports.append(reports_in(out, set(reports)))
    final = {r["config"]["devices"]: r for r in runs_of(reports[-1])}
    assert {n: r["status"] for n, r in final.items()} == {1: "ok", 2: "ok", 4: "ok"}
    for report in reports:
        for run in runs_of(report):
            if run["status"] == "ok":
                assert json.dumps(run, sort_keys=True) == json.dumps(
                    final[run["config"]["devices"]], sort_keys=True
                )
    assert [(state / f"finished-x{n}").read_text() for n in (1, 2, 4)] == ["1\n"] * 3
    assert (state / "checked").read_text() == "1\n"
    checks = [json.loads((r / "results.json").read_text()).get("equivalence") for r in reports]
    assert all(c == checks[-1] for c in checks if c and "rows" in c)
    assert json.loads((reports[-1] / "results.json").read_text())["resumed"]["from"] == str(
        reports[1]
    )


# ------------------------------------------------------------------ kill -9 during a resume, then --resume


def refused(*args: str) -> str:
    """`python -m harness ARGS` (in this process) refused in one line, exit 2: the line."""
    result = harness_in_process(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, (
        result.stderr
    )
    return lines[0]


@pytest.mark.parametrize(
    "hang", ["2", "4"], ids=["after-the-kept-runs-are-staged", "after-a-new-run"]
)
def test_a_resume_killed_with_sigkill_at_any_stage_keeps_every_finished_figure(tmp_path, hang):
    """A sweep stopped in its run on 2 devices; its resume killed with SIGKILL once its kept run is staged (hanging
    in the run on 2 devices) or once a new run finished too (hanging on 4): the next run's -killed report holds every
    run that finished, kept and new, with its log, says the harness was killed and names the run it killed as
    interrupted; resumed, no finished run or check runs twice, and every finished record is the first one, byte for
    byte. Meanwhile a second resume of the same report, and a resume of the staging folder, are refused in one line,
    and the killed resume holds no lock."""
    out, state, flags = staged_sweep(tmp_path)
    code, _ = stopped_by_its_worker(state, *flags, hang="2")
    assert code == 128 + signal.SIGTERM
    first = reports_in(out, set())
    (state / "pids").unlink()
    proc = start_harness(
        "--resume",
        str(first),
        "--quiet",
        *typed(flags),
        env={"FAKE_STATE": str(state), "FAKE_HANG": hang},
    )
    while not (state / "pids").exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    (staging,) = [p for p in out.iterdir() if p.name.startswith(".tmp-")]
    assert "another resume of it is running" in refused(
        "--resume", str(first), "--quiet", *typed(flags)
    )
    assert "the staging folder of a harness still running" in refused("--resume", str(staging))
    proc.kill()
    proc.communicate()
    assert_none_survive([int(p) for p in (state / "pids").read_text().split()])
    line = refused("--resume", str(staging))
    assert f"the next run with --out {out} keeps it as {staging.parent}/" in line, line
    with resume.one_at_a_time(first):  # its killed holder keeps no lock
        pass

    (said,) = leftovers.keep_left_behind(out, document.write)  # what the next run into --out does
    killed = out / (staging.name[len(".tmp-") :] + "-killed")
    assert str(killed) in said
    expected = (
        [("ok", 1), ("interrupted", 2)]
        if hang == "2"
        else [("ok", 1), ("ok", 2), ("interrupted", 4)]
    )
    assert [(r["status"], r["config"]["devices"]) for r in runs_of(killed)] == expected
    assert runs_of(killed)[0] == runs_of(first)[0]
    assert "the harness was killed" in (killed / "report.md").read_text()
    assert runs_of(killed)[-1]["error"] == "interrupted: the harness was killed while it ran"
    for run in runs_of(killed)[:-1]:
        assert (killed / run["log"]).is_file()

    code, stderr = stopped_by_its_worker(
        state, "--resume", str(killed), "--quiet", *typed(flags), hang=""
    )
    assert code == 0, stderr
    final = reports_in(out, {first, killed})
    assert [r["status"] for r in runs_of(final)] == ["ok"] * 3
    assert runs_of(final)[: len(expected) - 1] == runs_of(killed)[:-1]  # byte for byte
    for run in runs_of(final):
        assert (final / run["log"]).is_file()
    assert [(state / f"finished-x{n}").read_text() for n in (1, 2, 4)] == ["1\n"] * 3
    assert (state / "checked").read_text() == "1\n"
    check = json.loads((first / "results.json").read_text())["equivalence"]
    assert json.loads((final / "results.json").read_text())["equivalence"] == check


def test_a_finished_report_is_not_resumed_and_nothing_is_written(tmp_path):
    """Every run finished there: a resume would write the same report again; it says so in one line, exit 0."""
    out, flags = sweep(tmp_path, fail_on="")
    assert run_harness(*flags).returncode == 0
    report = only_report(out)
    result = harness_in_process("--resume", str(report), "--quiet", *typed(flags))
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"--resume {report}: every run it plans finished there: nothing to resume, no report written"
    )
    assert list(out.iterdir()) == [report]


# ------------------------------------------------------------------ parity, stopped and resumed

# A strategy worker and an idiom in one: each trial's step times drawn from its side and trial alone (an
# uninterrupted parity gets the very same ones), each finished trial noted in $FAKE_STATE, and a hang, with the
# pids in $FAKE_STATE/pids, in the trial FAKE_HANG names (strategy-3, idiom-4). The strategy's step is 1.10 times
# its idiom's: on the line, so the sequential rule adds trials up to its cap.
PARITY_WORKER = r"""
import json, os, re, subprocess, sys, time
import numpy as np
from common import weights
from common.config import RunConfig
from common.after_training import step_statistics
from common.worker import watch_lifeline
watch_lifeline()
state = os.environ["FAKE_STATE"]
config_path = sys.argv[sys.argv.index("--config") + 1]
side = "idiom" if "benchmarks.idioms" in " ".join(sys.argv) else "strategy"
trial = int(re.search(r"trial(\d+)", config_path).group(1))
if os.environ.get("FAKE_HANG") == f"{side}-{trial}":
    child = subprocess.Popen(["sleep", "1000"])
    with open(os.path.join(state, "pids.tmp"), "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    os.rename(os.path.join(state, "pids.tmp"), os.path.join(state, "pids"))
    time.sleep(1000)
doc = json.load(open(config_path))
cfg = RunConfig.from_dict(doc)
median = 0.1 * (1.10 if side == "strategy" else 1.0)
steps = list(median * np.random.default_rng(trial + (100 if side == "idiom" else 0)).uniform(0.9, 1.1, cfg.timed_steps))
if side == "idiom":
    known = os.path.join(os.path.dirname(__file__), "weights_hash")  # the same weights in every trial
    if not os.path.exists(known):
        with open(known + ".tmp", "w") as f:
            f.write(weights.fingerprint(weights.for_run(cfg)))
        os.rename(known + ".tmp", known)
    result = {"framework": "torch 0.0", "warmup_s": 0.1, "steps_s": steps, "weights_hash": open(known).read()}
else:
    epochs = [{"epoch": 1, "time_s": 1.0, "steps": 2, "images": 64, "images_per_s": 64.0, "train_loss": 1.0,
               "train_acc": 0.5, "test_acc": 0.5}]
    result = {"schema_version": 3, "status": "ok", "config": doc, "environment": {}, "epochs": epochs,
              "final_test_acc": 0.5, "compile_s": 0.1, "params": 1, "weights_hash": "w" * 64,
              "data_hash": "d" * 64, "error": None, "memory": {}, "step_time": step_statistics(steps, cfg.batch_size)}
json.dump(result, open(sys.argv[sys.argv.index("--result") + 1], "w"))
with open(os.path.join(state, f"{side}-{trial}"), "a") as f:
    f.write("1\n")
"""


def parity_of(report: Path) -> tuple[list[dict], dict]:
    doc = json.loads((report / "results.json").read_text())
    return doc["runs"], doc["parity"]


def test_parity_stopped_twice_and_resumed_continues_its_sequential_rule_from_the_trials_it_has(
    tmp_path,
):
    """parity stopped in its strategy's third trial, resumed and stopped again in its idiom's fourth, resumed again:
    the rule took every trial it would have uninterrupted, each trial that finished is kept byte for byte (each
    trial's steps are its own, so the figures are an uninterrupted parity's), and none ran twice. What cannot be
    resumed is refused in one line."""
    script = tmp_path / "parity_worker.py"
    script.write_text(PARITY_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {script} "$@"')
    flags = [
        "parity",
        *"--backend torch --strategy scratch --dataset synthetic --device cpu".split(),
    ]
    flags += [*"--timed-steps 3 --repeat 2 --max-trials 4 --profile 0 --quiet".split()]
    flags += ["--python", f"torch={python}"]
    cut = tmp_path / "state"
    cut.mkdir()
    out = tmp_path / "reports"
    code, _ = stopped_by_its_worker(cut, *flags, "--out", str(out), hang="strategy-3")
    assert code == 128 + signal.SIGTERM
    reports = [only_report(out)]
    code, _ = stopped_by_its_worker(
        cut, "parity", "--resume", str(reports[0]), *typed(flags), hang="idiom-4"
    )
    assert code == 128 + signal.SIGTERM
    reports.append(only_report(out, set(reports)))
    code, stderr = stopped_by_its_worker(
        cut, "parity", "--resume", str(reports[1]), *typed(flags), hang=""
    )
    assert code == 0, stderr
    reports.append(only_report(out, set(reports)))
    trials = [(parity_of(r)[0], [i["trial"] for i in parity_of(r)[1]["idioms"]]) for r in reports]
    assert [([(r["trial"], r["status"]) for r in runs], idioms) for runs, idioms in trials] == [
        ([(1, "ok"), (2, "ok"), (3, "interrupted")], [1, 2, 3]),
        ([(1, "ok"), (2, "ok"), (3, "ok"), (4, "ok")], [1, 2, 3]),
        ([(1, "ok"), (2, "ok"), (3, "ok"), (4, "ok")], [1, 2, 3, 4]),
    ]
    runs, figures = parity_of(reports[-1])
    # every trial the rule may take, each the one it first finished as: an uninterrupted parity's figures
    assert figures["rows"][0]["trials"] == [4, 4] and figures["rows"][0]["verdict"].startswith(
        "inconclusive"
    )
    assert figures == {
        **paired.figures(runs, figures["idioms"], figures["alpha"]),
        "repeat": 2,
        "max_trials": 4,
    }
    finished = {
        (side, r["trial"]): r
        for side, records in (("strategy", runs), ("idiom", figures["idioms"]))
        for r in records
    }
    for report in reports[:-1]:
        earlier_runs, earlier_figures = parity_of(report)
        for side, records in (("strategy", earlier_runs), ("idiom", earlier_figures["idioms"])):
            for r in records:
                assert r["status"] != "ok" or r == finished[side, r["trial"]]  # kept byte for byte
    assert sorted(p.name for p in cut.iterdir() if p.name != "pids") == sorted(
        f"{side}-{n}" for side in ("idiom", "strategy") for n in (1, 2, 3, 4)
    )
    assert all(p.read_text() == "1\n" for p in cut.iterdir() if p.name != "pids")  # none ran twice

    def refused(*args) -> str:
        result = run_harness(*args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, (
            result.stderr
        )
        return lines[0]

    assert "a report of `parity`; take it up with `python -m harness parity --resume" in refused(
        "--resume", str(reports[0])
    )
    assert "give no other flag than --quiet" in refused(
        "parity", "--resume", str(reports[0]), "--repeat", "3"
    )
    run_report = tmp_path / "run-report"
    run_report.mkdir()
    doc = json.loads((reports[0] / "results.json").read_text())
    (run_report / "results.json").write_text(
        json.dumps({**doc, "command": "python -m harness --backend torch"})
    )
    assert "a report of `run`; take it up with `python -m harness run --resume" in refused(
        "parity", "--resume", str(run_report)
    )


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"steps_s": [0.1, 0.1, 0.1]},
        {"steps_s": [0.1, 0.1, 0.1, -1.0]},
        {"framework": None},
        {"trial": 2},
    ],
    ids=["finished", "too-few-steps", "negative-step", "no-framework", "another-trial"],
)
def test_an_idiom_trial_is_kept_only_as_a_finished_one_of_the_same_trial(tmp_path, changes):
    """An idiom's record in the report resumed is untrusted input: kept (with its log) only if it holds the run's
    step times; otherwise the trial runs again."""
    from tests.harness.test_parity import config

    cfg = config("torch", "scratch")  # 4 timed steps
    (tmp_path / "old" / "logs").mkdir(parents=True)
    (tmp_path / "old" / "logs" / "idiom-torch-trial1.log").write_text("its log")
    record = {
        "idiom": "torch",
        "backend": "torch",
        "trial": 1,
        "status": "ok",
        "framework": "torch 0.0",
    }
    record = {**record, "warmup_s": 0.1, "steps_s": [0.1, 0.2, 0.3, 0.4], **changes}
    earlier = resume.Earlier(tmp_path / "old", [], {}, None, None, (record,))
    job = idioms.IdiomRun(idioms.idiom_of(cfg), cfg)
    kept = idioms.kept_idiom(job, 1, earlier, tmp_path / "new", print)
    assert kept == (record if not changes else None)
    assert (tmp_path / "new" / "logs" / "idiom-torch-trial1.log").exists() == (not changes)
