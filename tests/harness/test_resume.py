"""--resume REPORT_DIR: a report taken up again keeps every run that finished there, byte for byte, runs the others,
and says so; a report it cannot take up (unreadable, another command's, other code's) is refused in one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.harness.helpers import fake_python, run_harness

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
    flags = [
        "--backend",
        "torch",
        "--strategy",
        "scratch",
        "--model",
        "lenet",
        "--dataset",
        "synthetic",
    ]
    flags += ["--gpus", "1,2,4", "--device", "cpu", "--no-check", "--quiet"]
    flags += ["--python", f"torch={python}", "--out", str(out)]
    return out, flags


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
    second = run_harness("--resume", str(cut), "--quiet")
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
        "--resume", str(resumed), "--quiet"
    )  # cut off again, taken up again: the same holds
    assert third.returncode == 0, third.stderr
    final = only_report(out, {cut, resumed})
    assert [r["status"] for r in runs_of(final)] == ["ok", "ok", "ok"]
    assert runs_of(final)[:2] == runs[:2]
    meta = json.loads((final / "results.json").read_text())
    assert meta["command"] == json.loads((cut / "results.json").read_text())["command"]


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


def test_a_kept_runs_log_that_cannot_be_copied_is_said_and_the_run_stays_kept(
    tmp_path, monkeypatch
):
    """A full disk while copying a kept run's log: one line says so; the record is kept all the same."""
    import shutil

    from harness.session import resume

    earlier = resume.Earlier(tmp_path / "old", [], {}, None, None)
    (tmp_path / "old" / "logs").mkdir(parents=True)
    (tmp_path / "old" / "logs" / "a.log").write_text("x")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copy2", full)
    said = resume.copy_records({"log": "logs/a.log"}, earlier, tmp_path / "new")
    assert said == "its log could not be copied: No space left on device"
    assert resume.copy_records({"log": "../outside.log"}, earlier, tmp_path / "new") is None
