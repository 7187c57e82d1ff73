"""Time to accuracy through the harness, and MLPerf's log (common/mllog.py): a worker's `:::MLLOG` lines copied into
logs/<run>.mllog, read back by MLCommons' own parser (mlperf-logging), malformed lines dropped."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mlperf_logging.compliance_checker.mlp_parser import parse_file

from common import mllog
from tests.harness.helpers import fake_python, run_harness
from tests.harness.test_runner import BASE, only_report

# Trains as a run with a target does: its accuracy after epoch e is 0.5 + 0.1 e, 0.1 more on the batch order of
# seed 1; it stops at the first epoch that reaches the target, and prints MLPerf's lines (one malformed, one
# behind a launcher's prefix) as rank 0 does.
TARGET_WORKER = r"""
import json, sys
sys.path.insert(0, ROOT)
from common import mllog
args = sys.argv[sys.argv.index("--config") + 1], sys.argv[sys.argv.index("--result") + 1]
cfg = json.load(open(args[0]))
order = cfg["order_seed"] if cfg.get("order_seed") is not None else cfg["seed"]
mllog.event("seed", cfg["seed"])
print(":::MLLOG {not json", flush=True)
print("[rank0]: " + mllog.line("global_batch_size", cfg["batch_size"]), flush=True)
mllog.start("run_start")
epochs = []
for e in range(cfg["epochs"]):
    acc = 0.5 + 0.1 * e + 0.1 * order
    epochs.append({"epoch": e + 1, "time_s": 2.0, "steps": 2, "images": 64, "images_per_s": 32.0,
                   "train_loss": 1.0, "train_acc": 0.5, "test_acc": acc})
    mllog.event("eval_accuracy", acc, epoch_num=e + 1)
    if acc >= cfg["target_accuracy"] - 1e-9:
        break
n = len(epochs)
target = {"accuracy": cfg["target_accuracy"], "reached": True, "epoch": n, "train_s": 2.0 * n, "wall_s": 2.5 * n}
mllog.end("run_stop", status="success")
json.dump({"schema_version": 1, "status": "ok", "config": cfg, "environment": {}, "epochs": epochs,
           "final_test_acc": epochs[-1]["test_acc"], "target": target, "compile_s": 0.5, "params": 129068,
           "weights_hash": "w" * 64, "data_hash": "d" * 64, "error": None, "memory": {}}, open(args[1], "w"))
"""


def test_time_to_target_is_a_column_and_each_trial_trains_on_its_own_batch_order(tmp_path):
    """--target-accuracy 0.6 --repeat 2: trial 1 (seed 0) gets there at epoch 2, trial 2 (order seed 1) at epoch 1,
    from the same initial weights; one row with the median and the range, the plot, and each run's MLPerf log."""
    worker = tmp_path / "worker.py"
    worker.write_text(TARGET_WORKER.replace("ROOT", repr(str(Path(__file__).parents[2]))))
    python = fake_python(tmp_path, f'exec {sys.executable} {worker} "$@"')
    out = tmp_path / "reports"
    result = run_harness(
        *BASE,
        "--epochs",
        "3",
        "--target-accuracy",
        "0.6",
        "--repeat",
        "2",
        "--gpus",
        "1",
        "--python",
        f"torch={python}",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    report = only_report(out)
    text = (report / "report.md").read_text()
    assert "| time to target | trials kept |" in text
    assert "| 3.0 s (epoch 1.5) [2.0-4.0 s, epochs 1-2] | 2 of 2 |" in text
    assert (report / "time_to_accuracy.png").stat().st_size > 1000
    runs = json.loads((report / "results.json").read_text())["runs"]
    assert [r["config"]["order_seed"] for r in runs] == [None, 1]
    assert {r["config"]["seed"] for r in runs} == {0}
    for r in runs:
        lines, errors = parse_file(str(report / r["mllog"]), ruleset="5.0.0")
        assert errors == []
        assert [line.key for line in lines] == ["seed", "global_batch_size", "run_start"] + [
            "eval_accuracy"
        ] * r["target"]["epoch"] + ["run_stop"]
        assert lines[-1].value["metadata"] == {"status": "success"}


def test_mlcommons_parser_reads_every_kind_of_line_the_workers_write(tmp_path, capsys):
    mllog.event("opt_base_learning_rate", 0.1)
    mllog.start("epoch_start", epoch_num=1)
    mllog.end("epoch_stop", epoch_num=1)
    mllog.event(mllog.PREFIX + "variant", "gluon[kvstore=device]")
    path = tmp_path / "run.mllog"
    path.write_text(capsys.readouterr().out)
    lines, errors = parse_file(str(path), ruleset="5.0.0")
    assert errors == []
    assert [(line.key, line.value["value"]) for line in lines] == [
        ("opt_base_learning_rate", 0.1),
        ("epoch_start", None),
        ("epoch_stop", None),
        ("dpbench_variant", "gluon[kvstore=device]"),
    ]
    assert lines[1].value["metadata"] == {"epoch_num": 1}
    assert all(lines[i].timestamp <= lines[i + 1].timestamp for i in range(3))


@pytest.mark.parametrize(
    "text",
    [
        ":::MLLOG {not json",
        ':::MLLOG ["a list"]',
        ':::MLLOG {"time_ms": 1, "event_type": "POINT_IN_TIME", "value": 1, "metadata": {}}',
        ':::MLLOG {"time_ms": true, "event_type": "POINT_IN_TIME", "key": "k", "metadata": {}}',
        ':::MLLOG {"time_ms": NaN, "event_type": "POINT_IN_TIME", "key": "k", "metadata": {}}',
        ':::MLLOG {"time_ms": 1, "event_type": "SOMETIME", "key": "k", "metadata": {}}',
        ':::MLLOG {"time_ms": 1, "event_type": "POINT_IN_TIME", "key": "k", "metadata": 3}',
        "an ordinary line of output",
    ],
)
def test_a_malformed_line_is_not_copied(tmp_path, text):
    log = tmp_path / "run.log"
    log.write_text(text + "\n")
    assert mllog.extract(log, tmp_path / "run.mllog") == 0
    assert not (tmp_path / "run.mllog").exists()


def test_a_disk_that_cannot_take_the_log_leaves_no_file_and_no_error(tmp_path, monkeypatch):
    log = tmp_path / "run.log"
    log.write_text(mllog.line("seed", 0) + "\n")

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    assert mllog.extract(log, tmp_path / "run.mllog") == 0
    assert not (tmp_path / "run.mllog").exists()
