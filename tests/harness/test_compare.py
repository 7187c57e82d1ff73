"""Comparing runs (`harness compare`), re-rendering and exporting reports (`harness report`), and repeated trials
(`--repeat`): synthetic result sets with known differences, no framework."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from common.after_training import step_statistics
from common.config import RunConfig
from common.results import Result, new_result, result_problem
from harness import compare
from harness.cli import build_plan, parse
from harness.reporting import comparison, provenance, trials
from harness.reporting.tables import summary_table, with_scaling
from tests.harness.helpers import fake_python, run_harness
from tests.harness.test_machine import AVX2_ONLY, ZEN4
from tests.harness.test_results import COMMITTED

ROWS = [("torch", "scratch", 1), ("torch", "scratch", 2), ("jax", "pmap", 2)]
STEP_S = {1: 0.100, 2: 0.060}
ENVIRONMENT = {
    "torch": {"framework": "torch", "framework_version": "2.13.0+cpu"},
    "jax": {"framework": "jax", "framework_version": "0.10.2"},
}


def run_dict(backend, strategy, devices, samples, trial=None, **fields) -> dict:
    """An ok result of a LeNet run whose timed steps took `samples` seconds."""
    cfg = RunConfig(
        backend=backend,
        strategy=strategy,
        devices=devices,
        model="lenet",
        batch_size=32,
        train_size=256,
        test_size=64,
    ).to_dict()
    epoch_s = 8 * float(np.mean(samples))
    env = {
        **ENVIRONMENT[backend],
        "devices": [f"cpu (simulated device {i})" for i in range(devices)],
        "precision": {"mode": "fp32"},
    }
    stats = step_statistics(list(samples), 32)
    result = {
        **new_result(cfg, "ok"),
        "environment": env,
        "weights_hash": "w" * 64,
        "data_hash": "d" * 64,
        "epochs": [
            {
                "epoch": 1,
                "time_s": epoch_s,
                "steps": 8,
                "images": 256,
                "images_per_s": 256 / epoch_s,
                "train_loss": 2.0,
                "train_acc": 0.3,
                "test_acc": 0.5,
            }
        ],
        "final_test_acc": 0.5,
        "step_time": stats,
        "trial": trial,
    }
    return {**result, **fields}


def samples_of(rng, row, slowdown=1.0, n=20) -> list[float]:
    """n step times around the row's step time, with 3% noise."""
    return list(STEP_S[row[2]] * slowdown * (1 + 0.03 * rng.standard_normal(n)))


NO_MACHINE = {"version": "0.1.0", "commit": "a" * 40, "uncommitted_changes": False, "host": "alpha"}
PROVENANCE = {**NO_MACHINE, "machine": ZEN4}


def write_runs(path: Path, runs: list[dict], provenance: dict | None = PROVENANCE) -> Path:
    """A results.json of `runs`: schema v3 with `provenance`, or v2 (which has none) if it is None."""
    path.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema_version": 2 if provenance is None else 3,
        "run_id": path.name,
        "command": "python -m harness",
        "started": "then",
        "preset": "quick",
        "data_source": "synthetic",
        **({} if provenance is None else {"provenance": provenance}),
        "runs": runs,
    }
    (path / "results.json").write_text(json.dumps(doc))
    return path


def two_sets(
    tmp_path,
    slow_row=None,
    repeat=3,
    fast_row=None,
    provenance=(PROVENANCE, PROVENANCE),
    **new_fields,
) -> tuple[Path, Path]:
    """OLD and NEW result sets of ROWS, `repeat` trials each; NEW's `slow_row` 20% slower and its `fast_row` 20%
    faster, `new_fields` set on NEW's jax row; `provenance` OLD's and NEW's."""
    rng = np.random.default_rng(0)
    pace = {slow_row: 1.2, fast_row: 0.8}
    old, new = [], []
    for trial in range(1, repeat + 1):
        for row in ROWS:
            old.append(run_dict(*row, samples_of(rng, row), trial))
            extra = new_fields if row[0] == "jax" else {}
            new.append(run_dict(*row, samples_of(rng, row, pace.get(row, 1.0)), trial, **extra))
    return (
        write_runs(tmp_path / "old", old, provenance[0]),
        write_runs(tmp_path / "new", new, provenance[1]),
    )


def marks(stdout: str) -> dict[tuple, str]:
    """{(backend, strategy, devices): mark} from compare's table."""
    out = {}
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) > 4 and cells[1] in ("torch", "jax"):
            out[(cells[1], cells[2], int(cells[3]))] = cells[0]
    return out


# ------------------------------------------------------------------------ the test


def test_the_interval_spans_1_for_the_same_distribution_and_not_for_a_shift():
    rng = np.random.default_rng(0)
    old = [list(0.1 * (1 + 0.03 * rng.standard_normal(30))) for _ in range(3)]
    same = [list(0.1 * (1 + 0.03 * rng.standard_normal(30))) for _ in range(3)]
    slower = [list(0.12 * (1 + 0.03 * rng.standard_normal(30))) for _ in range(3)]
    low, high = comparison.ratio_interval(old, same, 0.05)
    assert low < 1 < high and high - low < 0.05
    low, high = comparison.ratio_interval(old, slower, 0.05)
    assert 1.15 < low < 1.2 < high < 1.25
    assert comparison.ratio_interval(old, slower, 0.05) == (
        low,
        high,
    )  # seeded: the same verdict every time


def test_the_spread_between_trials_counts_not_only_the_steps_within_them():
    """Each process of a shared host runs at its own pace: three OLD trials at 45, 55 and 65 ms and three NEW ones
    at 44, 50 and 56 ms, each with 30 steady steps. Pooled, the steps would make the 10% difference look certain;
    resampling the trials shows it is within what the processes vary by."""
    rng = np.random.default_rng(0)
    trials = lambda paces: [list(pace * (1 + 0.01 * rng.standard_normal(30))) for pace in paces]
    old, new = trials([0.045, 0.055, 0.065]), trials([0.044, 0.050, 0.056])
    low, high = comparison.ratio_interval(old, new, 0.05)
    assert low < 1 < high
    # one "trial" each: steps only
    pooled = comparison.ratio_interval([sum(old, [])], [sum(new, [])], 0.05)
    assert pooled[1] < 1


# ------------------------------------------------------------------------ compare, end to end


def test_a_20_percent_slowdown_in_one_row_is_marked_plus_as_asv_does_and_exits_1(tmp_path):
    """asv's marks: a longer step time is worse, `+`; a shorter one better, `-`."""
    old, new = two_sets(tmp_path, slow_row=("jax", "pmap", 2), fast_row=("torch", "scratch", 1))
    out = run_harness("compare", str(old), str(new))
    assert out.returncode == 1, out.stderr
    assert marks(out.stdout) == {
        ("torch", "scratch", 1): "-",  # 20% faster
        ("torch", "scratch", 2): "~",
        ("jax", "pmap", 2): "+",  # 20% slower
    }
    assert (
        "REGRESSION: jax pmap on 2 device(s): step time +2" in out.stdout
        and "(interval 1.1" in out.stdout
    )
    assert out.stdout.count("REGRESSION") == 1
    # the other way round the slow row is an improvement and the fast one a regression
    back = run_harness("compare", str(new), str(old))
    assert back.returncode == 1 and marks(back.stdout) == {
        ("torch", "scratch", 1): "+",
        ("torch", "scratch", 2): "~",
        ("jax", "pmap", 2): "-",
    }
    assert "REGRESSION: torch scratch on 1 device(s)" in back.stdout


def test_the_legend_says_what_each_mark_means(tmp_path):
    old, new = two_sets(tmp_path)
    out = run_harness("compare", str(old), str(new), "--factor", "1.2", "--alpha", "0.1")
    (legend,) = [line for line in out.stdout.splitlines() if line.startswith("Marks:")]
    assert legend == (
        "Marks: + slower, - faster (median step time beyond x1.2, and the bootstrap's 90% interval of the "
        "step-time ratio, over trials and their steps, excludes 1), ~ no significant change, "
        "x not comparable (another recipe, framework version, device, precision or machine: the note names it), "
        "? in one run only."
    )


def verdicts_of(old: Path, new: Path) -> dict[tuple, str]:
    """comparison.compare's marks, in this process: {(backend, strategy, devices): mark}."""
    limits = compare.thresholds(parse(["compare", str(old), str(new)]))
    results = [compare.load(str(p))[0] for p in (old, new)]
    return {v.key[:3]: v.mark for v in comparison.compare(*results, limits)}


def test_the_marks_are_asvs_in_the_verdicts_themselves(tmp_path):
    old, new = two_sets(tmp_path, slow_row=("jax", "pmap", 2), fast_row=("torch", "scratch", 2))
    assert (comparison.SLOWER, comparison.FASTER, comparison.NOT_COMPARABLE) == ("+", "-", "x")
    assert verdicts_of(old, new) == {
        ("torch", "scratch", 1): "~",
        ("torch", "scratch", 2): "-",
        ("jax", "pmap", 2): "+",
    }


def test_the_same_samples_shuffled_across_trials_are_no_change(tmp_path):
    old, _ = two_sets(tmp_path)
    runs = json.loads((old / "results.json").read_text())["runs"]
    rng = np.random.default_rng(1)
    for row in ROWS:  # every step time of the row's trials, dealt out again in another order
        mine = [
            r
            for r in runs
            if (r["config"]["backend"], r["config"]["strategy"], r["config"]["devices"]) == row
        ]
        pooled = rng.permutation([s for r in mine for s in r["step_time"]["samples_s"]])
        for r, part in zip(mine, np.split(pooled, len(mine))):
            r["step_time"] = step_statistics(list(part), 32)
    shuffled = write_runs(tmp_path / "shuffled", runs)
    out = run_harness("compare", str(old), str(shuffled))
    assert out.returncode == 0, out.stdout
    assert set(marks(out.stdout).values()) == {"~"} and "REGRESSION" not in out.stdout


# ------------------------------------------------------------------------ provenance


def test_a_line_above_the_table_names_other_commits_uncommitted_changes_and_hosts(tmp_path):
    other = {**PROVENANCE, "commit": "b" * 40, "uncommitted_changes": True, "host": "beta"}
    old, new = two_sets(tmp_path, provenance=(PROVENANCE, other))
    out = run_harness("compare", str(old), str(new))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    (note,) = [i for i, line in enumerate(lines) if line.startswith("Code")]
    assert lines[note] == (
        "Code or host differ: commits aaaaaaa vs bbbbbbb; uncommitted changes in NEW; hosts alpha vs beta"
    )
    assert lines[note - 2].startswith("## ") and lines[note + 2].startswith("|  | backend |")


def test_runs_of_the_same_code_and_host_get_no_line(tmp_path):
    out = run_harness("compare", *map(str, two_sets(tmp_path)))
    assert out.returncode == 0 and "Code" not in out.stdout, out.stdout


@pytest.mark.parametrize(
    "old,new,line",
    [
        (PROVENANCE, PROVENANCE, None),
        (PROVENANCE, {**PROVENANCE, "host": "beta"}, "Code or host differ: hosts alpha vs beta"),
        (
            PROVENANCE,
            {**PROVENANCE, "commit": "c" * 40},
            "Code or host differ: commits aaaaaaa vs ccccccc",
        ),
        (
            {**PROVENANCE, "uncommitted_changes": True},
            {**PROVENANCE, "uncommitted_changes": True},
            "Code or host differ: uncommitted changes in OLD and NEW",
        ),
        (
            {**PROVENANCE, "commit": None},
            {**PROVENANCE, "version": "0.2.0"},
            "Code or host differ: dpbench 0.1.0 vs 0.2.0; commits unknown vs aaaaaaa",
        ),
        (None, PROVENANCE, "Code and host: unknown for OLD"),
        (None, None, "Code and host: unknown for OLD and NEW"),
    ],
)
def test_the_provenance_line_says_what_differs_or_nothing(old, new, line):
    assert provenance.difference(old, new) == line


def test_a_schema_v2_run_compares_with_a_v3_one_saying_its_provenance_is_unknown(tmp_path):
    old, new = two_sets(tmp_path, provenance=(None, PROVENANCE))
    out = run_harness("compare", str(old), str(new))
    assert out.returncode == 0 and set(marks(out.stdout).values()) == {"~"}, out.stderr
    assert [line for line in out.stdout.splitlines() if line.startswith("Code")] == [
        "Code and host: unknown for OLD"
    ]


def row_cells(stdout: str, backend: str) -> list[str]:
    (line,) = [line for line in stdout.splitlines() if f"| {backend} |" in line]
    return [c.strip() for c in line.strip("|").split("|")]


def test_rows_measured_with_other_vector_sets_are_marked_x_naming_the_difference(tmp_path):
    """NEW 20% slower in its jax row, on a host with AVX2 only: not a regression of the code."""
    avx2 = {**PROVENANCE, "machine": AVX2_ONLY}
    old, new = two_sets(tmp_path, slow_row=("jax", "pmap", 2), provenance=(PROVENANCE, avx2))
    out = run_harness("compare", str(old), str(new))
    assert out.returncode == 0 and "REGRESSION" not in out.stdout, out.stdout
    assert set(marks(out.stdout).values()) == {"x"}
    jax = row_cells(out.stdout, "jax")
    assert jax[-1] == "another machine: AVX-512 AVX512-BF16 -> AVX2 only"
    assert abs(float(jax[6].rstrip("%")) - 20) < 4  # the figures are shown, not judged
    assert (
        "Code or host differ: machine AVX-512 AVX512-BF16 -> AVX2 only" in out.stdout.splitlines()
    )
    accepted = run_harness("compare", str(old), str(new), "--accept", "devices")
    assert accepted.returncode == 1 and marks(accepted.stdout)[("jax", "pmap", 2)] == "+"
    assert row_cells(accepted.stdout, "jax")[-1].startswith("another machine (accepted): AVX-512")


def test_a_report_without_its_machine_keeps_its_marks_saying_the_machine_is_unknown(tmp_path):
    old, new = two_sets(
        tmp_path,
        slow_row=("jax", "pmap", 2),
        provenance=(NO_MACHINE, PROVENANCE),
    )
    out = run_harness("compare", str(old), str(new))
    assert out.returncode == 1, out.stdout
    assert marks(out.stdout) == {
        ("torch", "scratch", 1): "~",
        ("torch", "scratch", 2): "~",
        ("jax", "pmap", 2): "+",
    }
    assert row_cells(out.stdout, "jax")[-1] == "machine unknown for OLD"
    assert "Machine unknown for OLD" in out.stdout.splitlines()


def test_rows_with_other_initial_weights_are_flagged_not_compared(tmp_path):
    old, new = two_sets(tmp_path, slow_row=("jax", "pmap", 2), weights_hash="x" * 64)
    out = run_harness("compare", str(old), str(new))
    assert out.returncode == 0, out.stdout  # the slow row is not comparable: no verdict on it
    assert marks(out.stdout)[("jax", "pmap", 2)] == "x"
    assert "not comparable: initial weights hash wwwwwwwwwwww vs xxxxxxxxxxxx" in out.stdout


@pytest.mark.parametrize(
    "field,value,why",
    [
        ("data_hash", "e" * 64, "batch sequence hash"),
        (
            "environment",
            {
                **ENVIRONMENT["jax"],
                "framework_version": "0.11.0",
                "devices": ["cpu (simulated device 0)", "cpu (simulated device 1)"],
                "precision": {"mode": "fp32"},
            },
            "jax 0.10.2 vs 0.11.0",
        ),
        (
            "environment",
            {
                **ENVIRONMENT["jax"],
                "devices": ["NVIDIA H200", "NVIDIA H200"],
                "precision": {"mode": "fp32"},
            },
            "devices cpu",
        ),
        (
            "environment",
            {
                **ENVIRONMENT["jax"],
                "devices": ["cpu (simulated device 0)", "cpu (simulated device 1)"],
                "precision": {"mode": "tf32"},
            },
            "precision fp32 vs tf32",
        ),
    ],
)
def test_each_difference_that_makes_rows_incomparable_is_named(tmp_path, field, value, why):
    old, new = two_sets(tmp_path, **{field: value})
    out = run_harness("compare", str(old), str(new))
    assert out.returncode == 0 and marks(out.stdout)[("jax", "pmap", 2)] == "x", out.stdout
    assert why in out.stdout


def test_accept_versions_compares_a_framework_upgrade(tmp_path):
    env = {
        **ENVIRONMENT["jax"],
        "framework_version": "0.11.0",
        "devices": ["cpu (simulated device 0)", "cpu (simulated device 1)"],
        "precision": {"mode": "fp32"},
    }
    old, new = two_sets(tmp_path, slow_row=("jax", "pmap", 2), environment=env)
    out = run_harness("compare", str(old), str(new), "--accept", "versions")
    assert out.returncode == 1 and marks(out.stdout)[("jax", "pmap", 2)] == "+"


def test_accuracy_drift_is_flagged(tmp_path):
    old, new = two_sets(tmp_path)
    runs = json.loads((new / "results.json").read_text())["runs"]
    for r in runs:
        if r["config"]["backend"] == "jax":
            r["epochs"] = [
                {**run_dict("jax", "pmap", 2, [0.06] * 3)["epochs"][0], "test_acc": 0.45}
            ]
    write_runs(new, runs)
    out = run_harness("compare", str(old), str(new), "--accuracy-tolerance", "0.02")
    assert "accuracy drift 0.5000 -> 0.4500 (beyond 0.02)" in out.stdout


def test_rows_in_one_run_only_are_listed(tmp_path):
    old, new = two_sets(tmp_path)
    runs = [
        r
        for r in json.loads((new / "results.json").read_text())["runs"]
        if r["config"]["backend"] == "torch"
    ]
    out = run_harness("compare", str(old), str(write_runs(new, runs)))
    assert (
        out.returncode == 0
        and marks(out.stdout)[("jax", "pmap", 2)] == "?"
        and "only in OLD" in out.stdout
    )


def test_a_committed_report_of_schema_v1_compares_with_itself(tmp_path):
    """Results written before the step samples were kept: one median per run, too few for the test."""
    out = run_harness("compare", str(COMMITTED), str(COMMITTED / "results.json"))
    assert out.returncode == 0, out.stderr
    assert "too few samples for the test" in out.stdout and "REGRESSION" not in out.stdout


@pytest.mark.parametrize(
    "content,message",
    [
        ("{not json", "not a JSON file"),
        ('{"schema_version": 9, "runs": []}', "not a results.json of schema v1, v2 or v3"),
        (
            '{"schema_version": 3, "run_id": "r", "command": "c", "started": "s", "preset": "p", '
            '"data_source": "d", "provenance": {"host": 7}, "runs": []}',
            "provenance.host is a int",
        ),
        (None, "cannot be read"),
    ],
)
def test_a_corrupt_or_missing_results_file_is_one_line_and_exit_2(tmp_path, content, message):
    old, _ = two_sets(tmp_path)
    bad = tmp_path / "bad.json"
    if content is not None:
        bad.write_text(content)
    out = run_harness("compare", str(old), str(bad))
    assert out.returncode == 2 and out.stdout == ""
    assert (
        out.stderr.startswith("harness: error: ")
        and message in out.stderr
        and len(out.stderr.splitlines()) == 1
    )


@pytest.mark.parametrize(
    "flags,message",
    [
        (("--factor", "0.9"), "--factor must be at least 1"),
        (("--alpha", "1.5"), "--alpha must be between 0 and 1"),
        (("--accept", "colours"), "--accept takes versions and/or devices"),
    ],
)
def test_bad_compare_flags_exit_2(tmp_path, flags, message):
    old, new = two_sets(tmp_path)
    out = run_harness("compare", str(old), str(new), *flags)
    assert out.returncode == 2 and message in out.stderr


# ------------------------------------------------------------------------ trials


def results_of(runs: list[dict]) -> list[Result]:
    return [Result.from_dict(r) for r in runs]


def test_trials_drop_the_failed_and_of_five_the_fastest_and_slowest():
    steps = [0.10, 0.11, 0.09, 0.30, 0.05, 0.10]
    runs = [run_dict("torch", "scratch", 1, [s] * 4, trial=i + 1) for i, s in enumerate(steps)]
    runs[1] = {**runs[1], "status": "failed", "error": "boom"}
    (t,) = trials.group(results_of(runs))
    assert [r.trial for r in t.kept] == [1, 3, 6]
    assert {r.trial: why for r, why in t.dropped} == {
        2: "failed",
        4: "the slowest of the finished trials (MLPerf's rule)",
        5: "the fastest of the finished trials (MLPerf's rule)",
    }
    assert t.median("images_per_s") == pytest.approx(256 / (8 * 0.10))
    assert sorted(t.step_samples()) == [0.09] * 4 + [0.10] * 8
    assert t.representative().trial in (1, 6)
    # fewer than five finished trials: only the failed one goes
    (t,) = trials.group(results_of(runs[:4]))
    assert [r.trial for r in t.kept] == [1, 3, 4]


def test_trials_that_differ_only_in_what_runs_after_the_timing_are_one_configuration():
    """The first trial measures the backend's matmul peak (parity's also profiles): still trials of one row."""
    runs = [run_dict("torch", "scratch", 1, [0.1] * 4, trial=i + 1) for i in range(3)]
    runs[0]["config"] = {**runs[0]["config"], "measure_peak": True, "profile": 3}
    (t,) = trials.group(results_of(runs))
    assert [r.trial for r in t.kept] == [1, 2, 3]
    runs[2]["config"] = {**runs[2]["config"], "timed_steps": 7}
    assert len(trials.group(results_of(runs))) == 2


def test_the_summary_gives_the_median_and_range_of_the_trials_kept():
    runs = [
        run_dict("torch", "scratch", 1, [s] * 4, trial=i + 1)
        for i, s in enumerate([0.10, 0.08, 0.125])
    ]
    (row,) = with_scaling(results_of(runs))
    assert row.images_per_s == pytest.approx(320.0) and row.trials and len(row.trials.kept) == 3
    line = summary_table([row])[2]
    assert "| 320.0 (256.0–400.0) |" in line and line.endswith("| 3 of 3 |")
    # one trial: the table is as it always was
    (row,) = with_scaling(results_of(runs[:1]))
    assert "trials" not in summary_table([row])[0]


def test_repeat_interleaves_the_trials_of_every_configuration():
    plan = build_plan(
        parse(
            [
                "--backend",
                "torch",
                "--strategy",
                "scratch",
                "--device",
                "cpu",
                "--gpus",
                "1,2",
                "--dataset",
                "synthetic",
                "--repeat",
                "3",
                "--no-check",
            ]
        )
    )
    assert [(c.devices, t) for c, t in plan.runs] == [
        (1, 1),
        (2, 1),
        (1, 2),
        (2, 2),
        (1, 3),
        (2, 3),
    ]
    single = build_plan(
        parse(
            [
                "--backend",
                "torch",
                "--strategy",
                "scratch",
                "--device",
                "cpu",
                "--gpus",
                "1",
                "--dataset",
                "synthetic",
                "--no-check",
            ]
        )
    )
    assert [t for _, t in single.runs] == [None]


@pytest.mark.parametrize(
    "flags,message",
    [
        (("--repeat", "0"), "--repeat must be between 1 and 100"),
        (
            ("--repeat", "2", "--save-weights", "w.npz"),
            "--save-weights needs exactly one run (this request has 2)",
        ),
    ],
)
def test_bad_repeat_requests_exit_2(tmp_path, flags, message):
    out = run_harness(
        "--backend",
        "torch",
        "--strategy",
        "scratch",
        "--device",
        "cpu",
        "--gpus",
        "1",
        "--dataset",
        "synthetic",
        "--out",
        str(tmp_path),
        *flags,
        cwd=tmp_path,
    )
    assert out.returncode == 2 and message in out.stderr


def test_every_trial_runs_in_its_own_process_and_log(tmp_path):
    python = fake_python(tmp_path, 'echo "trial crash" >&2; exit 3')
    out = tmp_path / "reports"
    result = run_harness(
        "--backend",
        "torch",
        "--strategy",
        "scratch",
        "--device",
        "cpu",
        "--gpus",
        "1,2",
        "--dataset",
        "synthetic",
        "--quiet",
        "--no-check",
        "--repeat",
        "2",
        "--python",
        f"torch={python}",
        "--out",
        str(out),
    )
    assert result.returncode == 1
    (report,) = out.iterdir()
    runs = json.loads((report / "results.json").read_text())["runs"]
    assert [(r["config"]["devices"], r["trial"]) for r in runs] == [(1, 1), (2, 1), (1, 2), (2, 2)]
    assert sorted(p.name for p in (report / "logs").iterdir()) == [
        "torch-scratch-x1-trial1.log",
        "torch-scratch-x1-trial2.log",
        "torch-scratch-x2-trial1.log",
        "torch-scratch-x2-trial2.log",
    ]
    text = (report / "report.md").read_text()
    assert (
        "## Trials" in text
        and "**torch scratch**, 2 device(s), trial 2: failed — trial crash" in text
    )


# ------------------------------------------------------------------------ results: the samples


def test_step_statistics_keep_every_sample():
    stats = step_statistics([0.3, 0.1, 0.2], 32)
    assert stats["samples_s"] == [0.3, 0.1, 0.2] and stats["median_s"] == 0.2


@pytest.mark.parametrize(
    "bad,problem",
    [
        (
            {"step_time": {**step_statistics([0.1], 8), "samples_s": [0.1, -1]}},
            "step_time.samples_s is not a list of positive numbers",
        ),
        (
            {"step_time": {**step_statistics([0.1], 8), "samples_s": "0.1"}},
            "step_time.samples_s is not a list of positive numbers",
        ),
        ({"trial": 0}, "trial is not a positive whole number"),
        ({"trial": True}, "trial is not a positive whole number"),
    ],
)
def test_untrusted_samples_and_trial_numbers_are_refused(bad, problem):
    assert result_problem(run_dict("torch", "scratch", 1, [0.1] * 3, **bad)) == problem
    assert result_problem(run_dict("torch", "scratch", 1, [0.1] * 3, trial=2)) is None


# ------------------------------------------------------------------------ report DIR


def test_report_re_renders_from_results_json_and_leaves_it_alone(tmp_path):
    report = tmp_path / "report"
    shutil.copytree(COMMITTED, report)
    raw = (report / "results.json").read_bytes()
    (report / "report.md").unlink()
    out = run_harness("report", str(report))
    assert out.returncode == 0, out.stderr
    text = (report / "report.md").read_text()
    assert (
        text.startswith(f"# Data-parallel training report `{COMMITTED.name}`")
        and "## Summary" in text
    )
    assert (report / "results.json").read_bytes() == raw
    assert not [p for p in report.iterdir() if p.name.startswith(".")]


def test_report_exports_the_summary_as_csv_json_and_markdown(tmp_path):
    old, _ = two_sets(tmp_path)
    csv_out = run_harness("report", str(old), "--format", "csv")
    lines = csv_out.stdout.splitlines()
    assert csv_out.returncode == 0 and lines[0].startswith("backend,strategy,devices,nodes,")
    assert len(lines) == 1 + len(ROWS) and lines[1].startswith("jax,pmap,2,1,")
    records = json.loads(run_harness("report", str(old), "--format", "json").stdout)
    assert [(r["backend"], r["devices"], r["trials"], r["trials_kept"]) for r in records] == [
        ("jax", 2, 3, 3),
        ("torch", 1, 3, 3),
        ("torch", 2, 3, 3),
    ]
    assert records[2]["speedup"] == pytest.approx(
        records[2]["images_per_s"] / records[1]["images_per_s"]
    )
    md = run_harness("report", str(old), "--format", "md").stdout
    assert md.startswith("| backend | strategy |") and "trials kept" in md
    assert not (old / "report.md").exists()  # an export writes nothing


def test_report_of_a_corrupt_results_file_is_exit_2(tmp_path):
    (tmp_path / "results.json").write_text('{"schema_version": 2, "runs": "all of them"}')
    out = run_harness("report", str(tmp_path))
    assert (
        out.returncode == 2
        and "it has no list of runs" in out.stderr
        and len(out.stderr.splitlines()) == 1
    )


def target_trials(seconds: list[float]) -> trials.Trials:
    """torch scratch, one trial per time to target (each reached at its only epoch)."""
    rng = np.random.default_rng(0)
    runs = [
        run_dict(
            "torch",
            "scratch",
            1,
            samples_of(rng, ROWS[0]),
            trial=i + 1,
            target={"accuracy": 0.5, "reached": True, "epoch": 1, "train_s": s, "wall_s": s + 1},
        )
        for i, s in enumerate(seconds)
    ]
    assert all(result_problem(r) is None for r in runs)
    (t,) = trials.group([Result.from_dict(r) for r in runs])
    return t


@pytest.mark.parametrize(
    "old, new, says",
    [
        (
            [10, 11, 12],
            [15, 16, 17],
            "time to target 11.0 -> 16.0 s: slower beyond the trials' spread",
        ),
        (
            [15, 16, 17],
            [10, 11, 12],
            "time to target 16.0 -> 11.0 s: faster beyond the trials' spread",
        ),
        ([10, 11, 14], [12, 13, 15], None),  # the ranges overlap: within what rounding alone moves
    ],
)
def test_time_to_target_changes_only_beyond_the_spread_of_the_trials(old, new, says):
    notes = comparison.target_notes(target_trials(old), target_trials(new))
    if says is None:
        assert notes == []
    else:
        assert len(notes) == 1 and says in notes[0], notes


def test_trials_on_orders_of_their_own_are_compared_by_the_first_trials_batch_sequence():
    """Time-to-accuracy trials after the first train on their own batch orders (order_seed), so their batch
    hashes differ between the two runs; the rows still compare, by the first trial's order, which both share."""

    def side(order_hash: str) -> trials.Trials:
        rng = np.random.default_rng(0)
        runs = []
        for trial, pace in (
            (1, 1.2),
            (2, 1.0),
            (3, 0.9),
        ):  # the median trial is an order of its own
            r = run_dict("torch", "scratch", 1, samples_of(rng, ROWS[0], pace), trial=trial)
            if trial > 1:
                r["config"]["order_seed"] = trial - 1
                r["data_hash"] = order_hash * 64
            runs.append(r)
        (t,) = trials.group([Result.from_dict(r) for r in runs])
        assert t.representative().config.order_seed == 1
        return t

    assert comparison.incomparable(side("e"), side("f"), set()) == []
