"""`python -m harness parity`: its bad input, the interleaved schedule, the idiom's result read as untrusted input,
the figures read off the interval, and the report's section. No framework: the idioms' own proof (they take the
suite's steps, in float64) is the contract suite's `test_the_idiom_takes_the_suites_steps_in_float64`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from common import weights as weightslib
from common.after_training import step_statistics
from common.config import RunConfig
from harness.planning.plan import Plan
from harness.processes import runner
from harness.reporting import document, reasons, sections
from harness.session import benchmark, idioms, paired
from tests.harness.helpers import assert_refused, fake_python
from tests.harness.test_report import result


@pytest.mark.parametrize(
    "args, match",
    [
        (("--gpus", "2"), "--gpus 2: parity measures one-device loops: --gpus 1"),
        (("--gpus", "1,2"), "parity measures one-device loops"),
        (("--timed-steps", "2"), "--timed-steps must be at least 3"),
        (("--repeat", "0"), "--repeat must be between 1 and"),
        (("--backend", "tensorflow"), "tensorflow"),
        (("--strategy", "pmap", "--backend", "torch"), "pmap"),
        (("--batch-size", "0"), "--batch-size"),
        (("--python", "torch=/nonexistent/python"), "/nonexistent/python"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, match):
    assert_refused(
        tmp_path, *args, "--out", str(tmp_path / "reports"), command=("parity",), match=match
    )
    assert not (tmp_path / "reports").exists()


def config(backend: str, strategy: str, **fields) -> RunConfig:
    return RunConfig(
        backend=backend,
        strategy=strategy,
        devices=1,
        batch_size=8,
        dataset="synthetic",
        train_size=16,
        test_size=8,
        timed_steps=4,
        **fields,
    ).validate()


def test_the_sides_are_interleaved_and_reversed_every_other_trial():
    """Per trial each backend's idioms and strategies, the order reversed every other trial; Keras's two
    strategies each beside Keras on the framework it runs on."""
    configs = [config("torch", "scratch"), config("torch", "ddp"), config("keras", "ddp")]
    configs.append(config("keras", "distribution"))
    plan = Plan(backends={"torch": None, "keras": None}, configs=configs, repeat=2)
    names = [
        (t, s.idiom.name if isinstance(s, idioms.IdiomRun) else f"{s.backend} {s.strategy}")
        for t, s in paired.schedule(plan)
    ]
    first = [
        "keras on torch",
        "keras on jax",
        "keras ddp",
        "keras distribution",
        "torch",
        "torch scratch",
        "torch ddp",
    ]
    second = first[3::-1] + first[:3:-1]
    assert names == [(1, n) for n in first] + [(2, n) for n in second]


def write_idiom_result(path, cfg: RunConfig, **changes) -> None:
    doc = {
        "framework": "torch 2.x",
        "weights_hash": weightslib.fingerprint(weightslib.for_run(cfg)),
        "warmup_s": 0.5,
        "steps_s": [0.1] * cfg.timed_steps,
        **changes,
    }
    path.write_text(json.dumps(doc) if not isinstance(changes.get("raw"), str) else changes["raw"])


@pytest.mark.parametrize(
    "changes, reason",
    [
        ({"raw": "{not json"}, "cannot be read"),
        ({"raw": "[1, 2]"}, "holds no 4 step times"),
        ({"steps_s": [0.1, 0.1, 0.1]}, "holds no 4 step times"),
        ({"steps_s": [0.1, 0.1, 0.1, -1]}, "holds no 4 step times"),
        ({"steps_s": [0.1, 0.1, 0.1, "0.1"]}, "holds no 4 step times"),
        ({"steps_s": [0.1, 0.1, 0.1, True]}, "holds no 4 step times"),
        ({"weights_hash": "0" * 64}, "did not start from the run's canonical weights"),
        ({"framework": 3}, "lacks its framework or warm-up time"),
        ({"warmup_s": float("nan")}, "lacks its framework or warm-up time"),
    ],
)
def test_an_idiom_result_is_untrusted_input(tmp_path, changes, reason):
    cfg = config("torch", "scratch")
    write_idiom_result(tmp_path / "r.json", cfg)
    assert idioms.checked_result(tmp_path / "r.json", cfg)["steps_s"] == [0.1] * 4
    write_idiom_result(tmp_path / "bad.json", cfg, **changes)
    with pytest.raises(idioms.IdiomFailed, match=reason):
        idioms.checked_result(tmp_path / "bad.json", cfg)


def test_an_idiom_that_fails_is_a_failed_record_with_its_output(tmp_path):
    cfg = config("torch", "scratch")
    python = fake_python(tmp_path, "echo 'RuntimeError: out of memory'; exit 3")
    job = idioms.IdiomRun(idioms.idiom_of(cfg), cfg)
    record = idioms.run_idiom(job, 1, python, tmp_path / "work")
    assert record["status"] == "failed" and record["idiom"] == "torch" and record["trial"] == 1
    assert record["error"] == "exited 3: RuntimeError: out of memory"
    assert (tmp_path / "work" / "logs" / "idiom-torch-trial1.log").exists()


def test_an_idiom_that_writes_a_bad_result_is_a_failed_record(tmp_path):
    cfg = config("torch", "scratch")
    body = 'while [ "$1" != --result ]; do shift; done; echo \'{"steps_s": [1]}\' > "$2"'
    job = idioms.IdiomRun(idioms.idiom_of(cfg), cfg)
    record = idioms.run_idiom(job, 2, fake_python(tmp_path, body), tmp_path / "work")
    assert record["status"] == "failed" and "holds no 4 step times" in record["error"]


def suite_trial(steps: list[float], strategy: str = "scratch") -> dict:
    r = result(strategy=strategy)
    return {**r, "step_time": step_statistics(steps, 32)}


def idiom_trial(steps: list[float], trial: int) -> dict:
    return {
        "idiom": "torch",
        "backend": "torch",
        "trial": trial,
        "status": "ok",
        "framework": "torch 2.x",
        "warmup_s": 0.1,
        "steps_s": steps,
    }


def noisy(median: float, seed: int, n: int = 20) -> list[float]:
    return list(median * np.random.default_rng(seed).uniform(0.97, 1.03, n))


@pytest.mark.parametrize(
    "factor, verdict",
    [
        (1.0, "at parity (within 1.10)"),
        (0.8, "faster than the idiom"),
        (1.3, "slower than 1.10"),
        (1.1, "inconclusive: more trials narrow the interval"),
    ],
)
def test_the_verdict_is_read_off_the_interval(factor, verdict):
    suite = [suite_trial(noisy(0.1 * factor, seed)) for seed in range(6)]
    idioms = [idiom_trial(noisy(0.1, 10 + seed), seed + 1) for seed in range(6)]
    (row,) = paired.figures(suite, idioms)["rows"]
    assert row["verdict"] == verdict
    assert row["ratio"] == pytest.approx(factor, rel=0.03)
    low, high = row["interval"]
    assert low <= row["ratio"] <= high and high - low < 0.1
    assert row["trials"] == [6, 6] and row["idiom"] == "torch"
    faster = sections.faster_idioms(paired.figures(suite, idioms)["rows"])
    assert faster == ([("torch", row["ratio"])] if low > 1 else [])


def test_an_idiom_faster_on_too_few_trials_is_not_said_to_be_faster():
    """A cut-off row (fewer trials than --repeat) has no verdict, so the report never says its idiom is faster."""
    suite = [suite_trial(noisy(0.13, seed)) for seed in range(2)]
    idioms = [idiom_trial(noisy(0.1, 10 + seed), seed + 1) for seed in range(2)]
    (row,) = paired.figures(suite, idioms, repeat=6)["rows"]
    assert row["verdict"] == "too few trials (2 of 6)" and row["interval"][0] > 1
    assert sections.faster_idioms([row]) == []


def test_a_strategy_or_idiom_without_a_finished_trial_is_not_measured():
    failed = {**idiom_trial([], 1), "status": "failed", "error": "boom"}
    rows = paired.figures([suite_trial([0.1, 0.1, 0.1])], [failed])["rows"]
    assert rows[0]["verdict"] == "not measured: the idiom finished no trial"
    assert "ratio" not in rows[0]
    rows = paired.figures([result(status="failed")], [idiom_trial([0.1] * 3, 1)])["rows"]
    assert rows[0]["verdict"] == "not measured: the strategy finished no trial"


def test_the_report_has_a_speed_parity_section_and_plot(tmp_path):
    suite = [suite_trial(noisy(0.13, seed)) for seed in range(6)]
    idioms = [idiom_trial(noisy(0.1, 10 + seed), seed + 1) for seed in range(6)]
    meta = {
        "run_id": "x",
        "command": "python -m harness parity",
        "started": "now",
        "preset": "quick",
        "data_source": "synthetic",
        "parity": paired.figures(suite, idioms),
    }
    document.write(tmp_path, suite, meta)
    text = (tmp_path / "report.md").read_text()
    section = text.split("## Speed parity")[1].split("\n## ")[0]
    assert "| torch | scratch | torch (torch 2.x) | 130 | 100 | 1.30 | [1.2" in section
    assert (
        "slower than 1.10 |" in section
        and "![Strategy step over idiom step](parity.png)" in section
    )
    assert (
        "- **torch: the framework's own loop is faster than every strategy** (the fastest strategy "
        "takes 1.3" in section
    )
    assert (tmp_path / "parity.png").stat().st_size > 1000
    stored = json.loads((tmp_path / "results.json").read_text())["parity"]
    assert stored["rows"][0]["ratio"] == pytest.approx(1.3, rel=0.03) and len(stored["idioms"]) == 6


@pytest.mark.parametrize(
    "parity_field",
    [
        "not a dict",
        {"rows": "no"},
        {"rows": [{"backend": "torch"}, 3, {"backend": "torch", "strategy": "scratch"}]},
        {"limit": "x", "rows": [{"backend": "t", "strategy": "s", "idiom": "i", "verdict": "v"}]},
        {
            "rows": [
                {
                    "backend": "t",
                    "strategy": "s",
                    "idiom": "i",
                    "verdict": "v",
                    "ratio": 1.0,
                    "suite_step_s": 1,
                    "idiom_step_s": 1,
                    "interval": ["a", "b"],
                }
            ]
        },
    ],
)
def test_a_malformed_parity_field_in_results_json_still_renders(tmp_path, parity_field):
    """results.json is untrusted when read back (`python -m harness report DIR`): malformed rows are left out."""
    meta = {"run_id": "x", "command": "c", "started": "s", "preset": "p", "data_source": "d"}
    document.write(tmp_path, [result()], {**meta, "parity": parity_field})
    assert "## Speed parity" in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "parity.png").exists()


def test_an_undecided_strategy_gets_more_trials_until_its_interval_clears_a_line_or_the_cap(
    monkeypatch, tmp_path
):
    """The sequential rule: after --repeat trials, only the strategies whose interval straddles a line run again,
    with their idioms, one trial at a time, up to --max-trials; every look's interval is at 1 - 0.05 / looks."""

    # torch's scratch is clearly at parity; its ddp sits on the 1.10 line and never decides
    medians = {"scratch": 1.0, "ddp": 1.10}
    trials: dict = {}

    def run_one(cfg, trial, pythons, workdir, console, keep):
        trials.setdefault(cfg.strategy, []).append(trial)
        steps = noisy(0.1 * medians[cfg.strategy], trial * 7 + len(cfg.strategy))
        result = {**suite_trial(steps, cfg.strategy), "trial": trial}
        keep(result)
        return result

    def run_idiom(job, trial, python, workdir):
        trials.setdefault("idiom", []).append(trial)
        return idiom_trial(noisy(0.1, 100 + trial), trial)

    monkeypatch.setattr(paired, "run_one", run_one)
    monkeypatch.setattr(paired, "run_idiom", run_idiom)
    monkeypatch.setattr(paired, "Pythons", lambda plan, say: lambda name: "python")
    plan = Plan(configs=[config("torch", "scratch"), config("torch", "ddp")], repeat=3)
    plan.backends = {"torch": None}
    meta: dict = {}
    paired.Trials(6).carry_out(
        benchmark.Session(plan, None, runner.Console(quiet=True), meta, tmp_path)
    )
    assert trials["scratch"] == [1, 2, 3]
    assert trials["ddp"] == [1, 2, 3, 4, 5, 6] and trials["idiom"] == [1, 2, 3, 4, 5, 6]
    figures = meta["parity"]
    assert figures["alpha"] == pytest.approx(0.05 / 4) and figures["max_trials"] == 6
    by_strategy = {r["strategy"]: r for r in figures["rows"]}
    assert by_strategy["scratch"]["verdict"] == "at parity (within 1.10)"
    assert by_strategy["ddp"]["verdict"].startswith("inconclusive") and by_strategy["ddp"][
        "trials"
    ] == [6, 6]


def test_a_strategy_with_fewer_trials_kept_than_repeat_gets_no_verdict(monkeypatch, tmp_path):
    """A run cut off after its first trials (or trials that failed) keeps fewer than --repeat of a side: the
    row shows its ratio and interval, but says "too few trials (N of M)", in results.json, the table and the
    report, never a verdict."""

    def run_one(cfg, trial, pythons, workdir, console, keep):
        if trial > 1:
            raise KeyboardInterrupt("SIGTERM")
        result = {**suite_trial(noisy(0.1, trial), cfg.strategy), "trial": trial}
        keep(result)
        return result

    monkeypatch.setattr(paired, "run_one", run_one)
    monkeypatch.setattr(
        paired, "run_idiom", lambda job, trial, *_: idiom_trial(noisy(0.1, 100 + trial), trial)
    )
    monkeypatch.setattr(paired, "Pythons", lambda plan, say: lambda name: "python")
    plan = Plan(configs=[config("torch", "scratch")], repeat=3)
    plan.backends = {"torch": None}
    meta: dict = {}
    paired.Trials(3).carry_out(
        benchmark.Session(plan, None, runner.Console(quiet=True), meta, tmp_path)
    )
    (row,) = meta["parity"]["rows"]
    assert row["trials"] == [1, 1] and row["verdict"] == "too few trials (1 of 3)"
    assert row["ratio"] == pytest.approx(1.0, rel=0.05) and len(row["interval"]) == 2
    assert "too few trials (1 of 3)" in paired.table(meta["parity"]["rows"])[-1]
    document.write(
        tmp_path,
        [result()],
        {
            "run_id": "x",
            "command": "c",
            "started": "s",
            "preset": "p",
            "data_source": "d",
            "parity": meta["parity"],
        },
    )
    section = (tmp_path / "report.md").read_text().split("## Speed parity")[1]
    assert "too few trials (1 of 3)" in section and "at parity" not in section.split("\n\n")[1]


@pytest.mark.parametrize(
    "args, match",
    [
        (("--max-trials", "99999999999999999999"), "--max-trials must be between 1 and 100"),
        (("--repeat", "101", "--max-trials", "101"), "--repeat must be between 1 and 100"),
        (("--timed-steps", "1e20"), "--timed-steps: invalid int value: '1e20'"),
        (
            ("--timed-steps", "100000000000000000000"),
            "--timed-steps must be at least 3 for an interval and at most 10000",
        ),
        (("--profile", "51"), "--profile must be between 0 and 50"),
        (("--profile", "-1"), "--profile must be between 0 and 50"),
    ],
)
def test_absurd_counts_are_refused_up_front(tmp_path, args, match):
    assert_refused(
        tmp_path, *args, "--out", str(tmp_path / "reports"), command=("parity",), match=match
    )


def test_max_trials_below_repeat_is_refused(tmp_path):
    assert_refused(
        tmp_path,
        *("--repeat", "4", "--max-trials", "3", "--out", str(tmp_path / "reports")),
        command=("parity",),
        match="--max-trials 3 is fewer than the --repeat 4 trials every side runs",
    )


class FakeIdiom:
    """An idiom without a framework: a step that takes no time, and a profiler that writes a one-op trace."""

    FRAMEWORK = "fake 1.0"

    def __init__(self):
        self.recorded = 0

    def training_step(self, weights, lr, dtype, device_kind):
        return iter, (lambda batch: 2.3)

    def record(self, cfg, folder):
        import contextlib

        from common.profiling import Recording

        @contextlib.contextmanager
        def recorded():
            recording = Recording("torch")
            yield recording
            self.recorded += 1
            recording.path = folder / "rank0.trace.json"
            event = {"ph": "X", "name": "aten::conv2d", "ts": 0, "dur": 10, "pid": 1, "tid": 1}
            recording.path.write_text(json.dumps([event]))

        return recorded()


def test_an_idiom_records_its_profiled_steps_after_the_timed_ones_when_the_run_asks(
    tmp_path, monkeypatch
):
    from benchmarks.idioms import driver

    monkeypatch.setenv("DPBENCH_TRACES", str(tmp_path))
    idiom = FakeIdiom()
    plain = driver.measure(idiom, config("torch", "scratch"))
    assert plain["profile"] is None and idiom.recorded == 0
    profiled = driver.measure(idiom, config("torch", "scratch", profile=2))
    assert idiom.recorded == 1 and len(profiled["steps_s"]) == 4
    assert profiled["profile"]["steps"] == 2 and profiled["profile"]["trace"] == "rank0.trace.json"
    assert (
        profiled["profile"]["error"] is None and profiled["profile"]["seconds"]["conv_matmul"] > 0
    )


def test_a_strategy_slower_than_its_idiom_says_where_from_both_breakdowns():
    """Above 1.05, a row without a measured reason gets one from the two profiled steps: the categories where the
    strategy spends the most extra time."""
    mine = {"conv_matmul": 0.080, "bn_elementwise": 0.020, "other_ops": 0.015, "untraced": 0.005}
    theirs = {"conv_matmul": 0.080, "bn_elementwise": 0.018, "other_ops": 0.002, "untraced": 0.000}

    def trials(median: float, seconds: dict | None) -> tuple[list, list]:
        suite = [suite_trial(noisy(median, seed)) for seed in range(6)]
        if seconds:
            suite[0]["profile"] = {
                "steps": 3,
                "step_s": sum(seconds.values()),
                "seconds": seconds,
                "error": None,
            }
        idioms = [idiom_trial(noisy(0.1, 10 + seed), seed + 1) for seed in range(6)]
        idioms[0]["profile"] = {"steps": 3, "step_s": 0.1, "seconds": theirs, "error": None}
        return suite, idioms

    (slow,) = paired.figures(*trials(0.12, mine))["rows"]
    assert slow["reason"] == (
        "profiled (docs/profiling.md): a step takes +20 ms against its idiom's; more in other ops +13 ms, "
        "untraced +5 ms"
    )
    assert slow["breakdown"] == {"strategy": mine, "idiom": theirs}
    # a first trial's profile faster than the idiom's does not explain a slower median: it says so
    (unexplained,) = paired.figures(*trials(0.12, {"conv_matmul": 0.05}))["rows"]
    assert unexplained["reason"] == (
        "profiled (docs/profiling.md): its profiled step is not longer than its idiom's (50 vs 100 ms): the "
        "first trial's profiled steps do not show the difference the trials measure"
    )
    (close,) = paired.figures(*trials(0.101, mine))["rows"]
    assert close["reason"] is None
    (unprofiled,) = paired.figures(*trials(0.12, None))["rows"]
    assert unprofiled["reason"] is None and unprofiled["breakdown"] is None


def test_a_stored_paritys_breakdowns_and_reasons_follow_its_profiles_once_re_read():
    """`harness report --reread-traces`: once the strategy's profile is read again from its trace (its idle time
    had been read as BN time), the row's breakdown and the reason read off it are the new profile's; the
    figures, the verdict and a known reason stay."""
    theirs = {"conv_matmul": 0.080, "bn_elementwise": 0.018, "other_ops": 0.002, "untraced": 0.0}
    suite = [suite_trial(noisy(0.12, seed)) for seed in range(6)]
    suite[0]["profile"] = {
        "steps": 3,
        "step_s": 0.12,
        "seconds": {"conv_matmul": 0.080, "bn_elementwise": 0.038, "untraced": 0.002},
        "error": None,
    }
    idioms = [idiom_trial(noisy(0.1, 10 + seed), seed + 1) for seed in range(6)]
    idioms[0]["profile"] = {"steps": 3, "step_s": 0.1, "seconds": theirs, "error": None}
    stored = paired.figures(suite, idioms)
    (before,) = stored["rows"]
    assert before["reason"].endswith("more in BN & element-wise +20 ms, untraced +2 ms")
    re_read = {"conv_matmul": 0.080, "bn_elementwise": 0.018, "untraced": 0.022}
    suite[0]["profile"] = {**suite[0]["profile"], "seconds": re_read}
    reasons.reread_breakdowns(stored, document.as_results(suite))
    (after,) = stored["rows"]
    assert after["reason"] == (
        "profiled (docs/profiling.md): a step takes +20 ms against its idiom's; more in untraced +22 ms"
    )
    assert after["breakdown"] == {"strategy": re_read, "idiom": theirs}
    assert (after["ratio"], after["verdict"]) == (before["ratio"], before["verdict"])
    after["reason"] = "a known cost"
    reasons.reread_breakdowns(stored, document.as_results(suite))
    assert stored["rows"][0]["reason"] == "a known cost"


def test_an_idioms_profile_that_is_not_one_is_dropped_and_its_timed_steps_stand(tmp_path):
    cfg = config("torch", "scratch")
    doc = {
        "framework": "torch 2.x",
        "warmup_s": 0.1,
        "steps_s": [0.1] * cfg.timed_steps,
        "weights_hash": weightslib.fingerprint(weightslib.for_run(cfg)),
        "profile": {
            "steps": 2,
            "step_s": 0.1,
            "trace": "/etc/passwd",
            "error": None,
            "seconds": {},
        },
    }
    (tmp_path / "r.json").write_text(json.dumps(doc))
    record = idioms.checked_result(tmp_path / "r.json", cfg)
    assert record["steps_s"] == doc["steps_s"]
    assert record["profile"] == {
        "error": "its profile is not one: profile.trace is not a path inside the run's traces folder"
    }


def test_an_idioms_feed_must_yield_one_batch_per_batch_it_is_given():
    """The driver times the suite's batches in order: a feed that drops or adds a batch is an error, not a
    shorter run."""
    from benchmarks.idioms import driver

    batches = [(i, i) for i in range(3)]
    seconds, losses = driver.time_steps(iter, lambda batch: float(batch[0]), batches)
    assert losses == [0.0, 1.0, 2.0] and len(seconds) == 3
    for wrong in (lambda b: iter(b[:-1]), lambda b: iter([*b, b[0]])):
        with pytest.raises(ValueError):
            driver.time_steps(wrong, lambda batch: 0.0, batches)
