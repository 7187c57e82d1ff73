"""Results as typed dataclasses: v1, v2 and v3 dicts in, attributes out, v3 out; report directories read back,
their provenance (v3) checked as untrusted input."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from common.config import RunConfig
from common.files import write_json_atomic
from common.results import (
    SCHEMA_VERSION,
    Allreduce,
    Epoch,
    Memory,
    Result,
    StepTime,
    failed_result,
    load_result,
    load_results_json,
    new_result,
    result_problem,
)

REPORTS = Path(__file__).parents[2] / "reports"
COMMITTED = next(p for p in sorted(REPORTS.glob("*")) if (p / "results.json").exists())

CONFIG = RunConfig(
    backend="torch", strategy="ddp", devices=2, batch_size=64, train_size=2048
).to_dict()
EPOCH = {
    "epoch": 1,
    "time_s": 2.0,
    "steps": 32,
    "images": 2048,
    "images_per_s": 1024.0,
    "train_loss": 1.5,
    "train_acc": 0.5,
    "test_acc": 0.7,
}


def ok_result(**fields) -> dict:
    result = {
        **new_result(CONFIG, "ok"),
        "epochs": [EPOCH, {**EPOCH, "epoch": 2, "test_acc": 0.75}],
        "final_test_acc": 0.75,
        "compile_s": 3.0,
        "params": 1000,
        "weights_hash": "a" * 64,
        "step_time": {
            "steps": 10,
            "median_s": 0.01,
            "p10_s": 0.009,
            "p90_s": 0.012,
            "min_s": 0.008,
            "max_s": 0.02,
            "images_per_s": 6400.0,
        },
        "allreduce": {
            "values": 1000,
            "bytes": 4000,
            "repeats": 10,
            "median_s": 0.001,
            "p10_s": 0.001,
            "p90_s": 0.002,
            "gb_per_s": 4.0,
            "share_of_step": 0.1,
        },
        "memory": {"peak_host_rss_mb": 900.0},
        "saved_weights": None,
        "test_examples": 1000,
        "train_examples": 2048,
    }
    return {**result, **fields}


def test_a_result_dict_reads_by_attribute():
    r = Result.from_dict(ok_result())
    assert r.ok and r.status == "ok" and isinstance(r.config, RunConfig) and r.config.devices == 2
    assert r.epochs[1] == Epoch(**{**EPOCH, "epoch": 2, "test_acc": 0.75})
    assert r.step_time == StepTime(10, 0.01, 0.009, 0.012, 0.008, 0.02, 6400.0)
    assert isinstance(r.allreduce, Allreduce) and r.allreduce.bytes == 4000
    assert r.memory == Memory(peak_host_rss_mb=900.0) and r.memory.peak_device_mb is None
    assert r.log is None and r.error is None and r.extra == {}
    assert r.summary() == pytest.approx(
        {"sec_per_epoch": 2.0, "images_per_s": 1024.0, "test_acc": 0.75, "train_loss": 1.5}
    )


def test_to_dict_writes_schema_v3_and_round_trips():
    r = Result.from_dict({**ok_result(), "log": "logs/x.log", "custom": {"kept": True}})
    d = r.to_dict()
    assert SCHEMA_VERSION == 3 and d["schema_version"] == 3
    assert d["config"] == CONFIG and d["log"] == "logs/x.log" and d["custom"] == {"kept": True}
    assert d["memory"] == {
        "peak_device_mb": None,
        "peak_host_rss_mb": 900.0,
        "parameters_mb": None,
    }  # every field, null where none
    assert Result.from_dict(d) == r
    assert Result.from_dict(json.loads(json.dumps(d))) == r


def test_non_finite_numbers_survive_the_file(tmp_path):
    """common.files.finite writes NaN as "nan": a diverged run's epochs read back as floats."""
    diverged = {
        **failed_result(CONFIG, "diverged", "loss is nan"),
        "epochs": [{**EPOCH, "train_loss": math.nan}],
    }
    write_json_atomic(tmp_path / "r.json", diverged)
    r = Result.from_dict(json.loads((tmp_path / "r.json").read_text()))
    assert (
        r.status == "diverged" and math.isnan(r.epochs[0].train_loss) and r.error == "loss is nan"
    )


def test_a_schema_v1_result_still_loads(tmp_path):
    """v1: config without the fields added since (prefetch predates: 0), no memory/step/allreduce fields."""
    old_config = {k: v for k, v in CONFIG.items() if k not in ("prefetch", "compile_mode")}
    v1 = {
        "schema_version": 1,
        "status": "ok",
        "config": old_config,
        "environment": {},
        "epochs": [EPOCH],
        "compile_s": None,
        "params": None,
        "weights_hash": None,
        "data_hash": None,
        "error": None,
    }
    (tmp_path / "r.json").write_text(json.dumps(v1))
    assert load_result(tmp_path / "r.json", old_config) == v1
    r = Result.from_dict(v1)
    assert r.config.levers.prefetch == 0 and r.config.levers.compile_mode == "default"
    assert (
        r.step_time is None
        and r.allreduce is None
        and r.memory is None
        and r.final_test_acc is None
    )


def test_load_result_stays_strict(tmp_path):
    path = tmp_path / "r.json"
    for bad, reason in [
        ([], "not a result of schema"),
        ({**ok_result(), "schema_version": 4}, "not a result of schema v1, v2 or v3"),
        (ok_result(status="fine"), "unknown status"),
        (ok_result(epochs=[{**EPOCH, "time_s": "2"}]), "an epoch record lacks"),
        (ok_result(step_time={"median_s": 1}), "step_time lacks a field"),
        (ok_result(log=3), "log is a int"),
        (ok_result(params=True), "params is not a number"),
    ]:
        path.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=reason):
            load_result(path, CONFIG)
    path.write_text(json.dumps(ok_result()))
    with pytest.raises(ValueError, match="not the one this run was given"):
        load_result(path, {**CONFIG, "devices": 4})
    assert load_result(path, CONFIG) == ok_result()


def test_load_results_json_reads_a_committed_report():
    results, meta = load_results_json(COMMITTED)
    runs = json.loads((COMMITTED / "results.json").read_text())["runs"]
    assert len(results) == len(runs) > 0 and all(isinstance(r, Result) for r in results)
    assert meta["schema_version"] == 1 and meta["run_id"] == COMMITTED.name and "runs" not in meta
    ok = [r for r in results if r.ok]
    assert ok and all(r.epochs and r.step_time and r.config.levers.prefetch == 0 for r in ok)
    assert {r.status for r in results} <= {"ok", "unavailable"}
    # and what v3 writes reads back the same
    assert [Result.from_dict(r.to_dict()) for r in results] == results


def test_load_results_json_round_trips_through_the_report(tmp_path):
    from harness.reporting import document

    results, meta = load_results_json(COMMITTED)
    document.write(tmp_path, results, {k: v for k, v in meta.items() if k != "equivalence"})
    again, meta2 = load_results_json(tmp_path / "results.json")
    assert again == results and meta2["schema_version"] == 3
    assert meta2["provenance"] is None  # a v1 file's meta has none: written as unknown
    assert "(schema v3)" in (tmp_path / "report.md").read_text()


PROVENANCE = {
    "version": "0.1.0",
    "commit": "0123abc" * 5 + "de01f",
    "uncommitted_changes": True,
    "host": "h1",
}


def test_a_v3_results_json_keeps_its_provenance(tmp_path):
    from harness.reporting import document

    results, meta = load_results_json(COMMITTED)
    document.write(tmp_path, results, {**meta, "provenance": PROVENANCE})
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["schema_version"] == 3 and doc["provenance"] == PROVENANCE
    assert load_results_json(tmp_path)[1]["provenance"] == PROVENANCE


def test_a_committed_schema_v2_report_loads_with_its_provenance_unknown():
    v2 = next(
        p
        for p in sorted(REPORTS.glob("*"))
        if (p / "results.json").exists()
        and json.loads((p / "results.json").read_text())["schema_version"] == 2
    )
    results, meta = load_results_json(v2)
    assert results and meta["schema_version"] == 2 and "provenance" not in meta


@pytest.mark.parametrize(
    "mutate, reason",
    [
        (lambda d: d.update(schema_version=7), "not a results.json of schema v1, v2 or v3"),
        (lambda d: d.update(provenance="abc1234"), "provenance is a str, not an object"),
        (
            lambda d: d.update(provenance={**PROVENANCE, "uncommitted_changes": "no"}),
            "provenance.uncommitted_changes is a str",
        ),
        (lambda d: d.update(provenance={**PROVENANCE, "commit": 7}), "provenance.commit is a int"),
        (
            lambda d: d.update(provenance={**PROVENANCE, "commit": "HEAD; rm"}),
            "provenance.commit is not a git commit id",
        ),
        (
            lambda d: d.update(provenance={**PROVENANCE, "host": "a\nb"}),
            "provenance.host is not one line of printable text",
        ),
        (lambda d: d.pop("runs"), "no list of runs"),
        (lambda d: d.update(run_id=None), "run_id is missing"),
        (lambda d: d["runs"][1].update(status="weird"), "run 2: unknown status"),
        (
            lambda d: d["runs"][0].update(config={"backend": "torch"}),
            "run 1: its config lacks strategy",
        ),
        (lambda d: d["runs"][0]["config"].update(devices="2"), "run 1: config.devices is a str"),
        (lambda d: d["runs"][0]["config"].update(simulated=1), "run 1: config.simulated is a int"),
        (lambda d: d["runs"][2]["epochs"][0].update(test_acc=None), "run 3: an epoch record lacks"),
    ],
)
def test_load_results_json_refuses_what_it_cannot_use(tmp_path, mutate, reason):
    doc = json.loads((COMMITTED / "results.json").read_text())
    mutate(doc)
    (tmp_path / "results.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=reason) as e:
        load_results_json(tmp_path)
    assert "\n" not in str(e.value)


def test_load_results_json_names_unreadable_files(tmp_path):
    with pytest.raises(ValueError, match="cannot be read"):
        load_results_json(tmp_path)
    (tmp_path / "results.json").write_text("{")
    with pytest.raises(ValueError, match="not a JSON file"):
        load_results_json(tmp_path)


def test_epoch_over_steps_is_the_mean_epoch_over_its_steps_at_the_median_step():
    from common.results import epoch_over_steps

    assert epoch_over_steps([3.0, 5.0], 2, 0.5) == 4.0
    assert epoch_over_steps([3.0], 2, None) is None  # no timed steps


def test_a_result_without_the_figure_gets_it_from_its_epochs_and_steps():
    """Results written before the figure was recorded: the same figure from the same fields (2 s epochs of
    32 steps at a 10 ms median step)."""
    assert Result.from_dict(ok_result()).epoch_over_steps == 2.0 / (32 * 0.01)
    assert Result.from_dict(ok_result(epoch_over_steps=1.1)).epoch_over_steps == 1.1


GPU_PROFILE = {
    "device": True,
    "seconds": {"conv_matmul": 0.02, "bn_elementwise": 0.02, "untraced": 0.06},
}


def test_device_busy_is_the_kernels_per_step_over_the_epochs_time_per_step():
    """40 ms of kernels a step, epochs of 64 steps in 3 s and 5 s (62.5 ms a step): busy 64% of it. Without a
    device trace (a CPU's, or no breakdown) there is no such figure."""
    from common.results import device_busy

    assert device_busy([3.0, 5.0], 64, GPU_PROFILE) == pytest.approx(0.64)
    assert device_busy([3.0, 5.0], 64, {**GPU_PROFILE, "device": False}) is None
    assert device_busy([3.0, 5.0], 64, {"device": True, "error": "no trace"}) is None
    assert device_busy([], 64, GPU_PROFILE) is None


def test_a_result_without_device_busy_gets_it_from_its_epochs_and_profile():
    """ok_result's epochs: 2 s of 32 steps, 62.5 ms a step."""
    assert Result.from_dict(ok_result(profile=GPU_PROFILE)).device_busy == pytest.approx(0.64)
    assert Result.from_dict(ok_result(profile=GPU_PROFILE, device_busy=0.5)).device_busy == 0.5
    assert Result.from_dict(ok_result()).device_busy is None


@pytest.mark.parametrize(
    "fields, reason",
    [
        ({"compiles": {"warmup": 1, "epochs": "1"}}, "compiles holds something other than counts"),
        ({"compiles": {"epochs": -1}}, "compiles holds something other than counts"),
        ({"compiles": [1]}, "compiles is a list"),
        ({"epoch_over_steps": "fast"}, "epoch_over_steps is not a number"),
        ({"device_busy": "high"}, "device_busy is not a number"),
    ],
)
def test_a_workers_compile_counts_and_consistency_figure_are_checked(fields, reason):
    assert result_problem(ok_result(**fields)) == reason
