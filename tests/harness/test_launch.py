"""Launched as users launch training tools: a dry run before a long sweep, and one machine-readable line on the
standard output (the report's folder, or --json's summary) with everything else on the standard error."""

from __future__ import annotations

import json
import sys

from harness import cli
from harness.processes import envs
from tests.harness.helpers import fake_python, run_harness
from tests.harness.test_runner import BASE, FAKE_WORKER, only_report


def test_a_dry_run_lists_every_run_and_refusal_and_builds_nothing(tmp_path, monkeypatch, capsys):
    def never(*args, **kwargs):
        raise AssertionError("a dry run built an environment")

    monkeypatch.setattr(envs, "ensure", never)
    out = tmp_path / "reports"
    # every torch strategy: dp needs CUDA, so it is a refusal here, not an error
    everything = [a for a in BASE if a not in ("--strategy", "scratch")]
    status = cli.main(
        [*everything, "--gpus", "1,2", "--repeat", "2", "--out", str(out), "--dry-run"]
    )
    text = capsys.readouterr().out
    assert status == 0 and not out.exists()
    runs = [
        line
        for line in text.splitlines()
        if line.startswith("  torch scratch") or line.startswith("  torch ddp")
    ]
    # two configurations of each strategy that runs here, two trials each, interleaved
    assert [line.split(":")[0].strip() for line in runs] == [
        "torch scratch x1 trial 1",
        "torch scratch x2 trial 1",
        "torch ddp x1 trial 1",
        "torch ddp x2 trial 1",
        "torch scratch x1 trial 2",
        "torch scratch x2 trial 2",
        "torch ddp x1 trial 2",
        "torch ddp x2 trial 2",
    ]
    assert "Would run 8 run(s), in this order:" in text
    assert "  torch dp x1: torch dp needs CUDA GPUs; none is present" in text
    assert "Environment of torch: " in text


def test_the_standard_output_is_the_reports_folder_alone_or_one_json_line(tmp_path):
    worker = tmp_path / "fake_worker.py"
    worker.write_text(FAKE_WORKER)
    python = fake_python(tmp_path, f'exec {sys.executable} {worker} "$@"')
    for json_flag in ([], ["--json"]):
        out = tmp_path / f"reports{len(json_flag)}"
        result = run_harness(
            *BASE, "--gpus", "1", "--python", f"torch={python}", "--out", str(out), *json_flag
        )
        assert result.returncode == 0, result.stderr
        report = only_report(out)
        lines = result.stdout.splitlines()
        assert len(lines) == 1
        if not json_flag:
            assert lines == [str(report)]
        else:
            summary = json.loads(lines[0])
            assert summary["report"] == str(report)
            (row,) = summary["runs"]
            assert (row["backend"], row["strategy"], row["devices"], row["status"]) == (
                "torch",
                "scratch",
                1,
                "ok",
            )
            assert row["test_acc"] == 0.5
        # the progress and the human line are on the standard error
        assert f"Report: {report / 'report.md'}" in result.stderr


def test_a_copy_installed_without_e_refuses_in_one_line(tmp_path, monkeypatch, capsys):
    """`dpbench` from a copy in site-packages (pip install . without -e): no checkout beside it, so no backends'
    environments or files; one line that says to install with -e, exit 2."""
    monkeypatch.setattr(envs, "ROOT", tmp_path)
    monkeypatch.setattr(sys, "argv", ["dpbench", "--dry-run"])
    try:
        cli.entry()
    except SystemExit as e:
        assert e.code == 2
    else:
        raise AssertionError("dpbench ran from a copy without its checkout")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install -e ." in err[0]
