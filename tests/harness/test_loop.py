"""The one training loop's timing rule, on a trainer that records what happens in which order (no framework)."""

from __future__ import annotations

import numpy as np
import pytest

from common import after_training, loop
from common import data as datalib
from common import energy as energylib
from common import trainer as trainerlib
from common.config import RunConfig


class RecordingArray(np.ndarray):
    """Training images that log every gather (indexing with an array), as the epoch's shuffle does."""

    events: list

    def __getitem__(self, index):
        if isinstance(index, np.ndarray):
            self.events.append("gather")
        return super().__getitem__(index)


class Pinned(np.ndarray):
    """A batch that RecordingTrainer.pin() made ready (page-locked, in a real backend)."""

    def __new__(cls, a):
        return np.asarray(a).view(cls)


class RecordingTrainer:
    """Just enough of loop.Trainer: logs each barrier and step, so the order of events shows what the
    epoch timer (started right after a barrier, stopped right after one) encloses."""

    n_devices, rank = 1, 0

    def __init__(self, events: list):
        self.events, self.weights = events, {"w": np.zeros(1, np.float32)}
        self.stepped = []  # the labels of every batch step() received, in order

    def pin(self, batches):
        self.events.append("pin")
        return [(Pinned(x), Pinned(y)) for x, y in batches]

    def put(self, x, y):
        # the loop's put() takes what pin() made: anything else is feeding work left to the timed step
        self.events.append(
            "put" if isinstance(x, Pinned) and isinstance(y, Pinned) else "put unpinned"
        )
        return ("placed", x), ("placed", y)

    def reset(self):
        pass

    def step(self, x, y):
        self.events.append("step")
        if isinstance(y, tuple):  # put() made it
            x, y = x[1], y[1]
        self.stepped.append(y.tobytes())
        return (float(len(y)), 0.0)

    def sync(self):
        self.events.append("sync")

    def collect(self, handles):
        return sum(h[0] for h in handles), sum(h[1] for h in handles)

    def evaluate(self, batches):
        self.events.append("evaluate")
        return 0, sum(len(y) for _, y in batches)

    def slowest(self, seconds):
        return seconds

    def summed(self, values):
        return list(values)

    def param_count(self):
        return 1

    def memory(self):
        return {}

    def stage(self, batches):
        return batches

    def allreduce_seconds(self, values, repeats):
        return [1.0] * repeats

    def compiles(self):
        return None  # not counted


def recording_dataset(events: list) -> datalib.Dataset:
    data = datalib.synthetic(48, 8, 0)
    x = data.x_train.view(RecordingArray)
    x.events = events
    return datalib.Dataset(data.name, data.source, x, data.y_train, data.x_test, data.y_test)


def timed_epochs(events: list) -> list[list[str]]:
    """The events between each epoch's opening barrier and its closing one: sync, step..., sync."""
    epochs, i = [], 0
    while True:
        try:
            first_step = events.index("step", i)
        except ValueError:
            return epochs
        start = max(j for j in range(i, first_step) if events[j] == "sync")
        end = events.index("sync", first_step)
        epochs.append(events[start : end + 1])
        i = end + 1


def config(**overrides) -> RunConfig:
    values = dict(
        backend="fake",
        strategy="fake",
        devices=1,
        model="lenet",
        epochs=2,
        batch_size=8,
        timed_steps=0,
        dataset="synthetic",
    )
    return RunConfig.from_dict({**values, **overrides}).validate()


def test_an_epochs_batches_are_assembled_before_its_timer_starts():
    events = []
    loop.run_training(RecordingTrainer(events), config(prefetch=0), recording_dataset(events))
    epochs = timed_epochs(events)
    assert len(epochs) == 3  # the warm-up step, then two epochs
    # no gather inside a timed interval
    assert epochs[1] == epochs[2] == ["sync"] + ["step"] * 6 + ["sync"]
    assert events.count("gather") >= 3  # each epoch's shuffle happened, outside


def test_with_prefetch_each_batch_is_put_ahead_of_its_step_inside_the_timer():
    """--prefetch 2: the copies of batches i+1 and i+2 are queued before step i (they overlap it on a GPU);
    every put of an epoch is inside its timed interval, and no gather is."""
    events = []
    loop.run_training(RecordingTrainer(events), config(prefetch=2), recording_dataset(events))
    epochs = timed_epochs(events)
    assert len(epochs) == 3
    expected = ["sync"] + ["put"] * 3 + ["step", "put"] * 3 + ["step"] * 3 + ["sync"]
    assert epochs[1] == epochs[2] == expected
    assert epochs[0] == ["sync", "put", "step", "sync"]  # the warm-up step goes through put() too


def test_each_batch_is_pinned_before_its_timer_and_the_timed_put_only_copies_it():
    """The feeding work beside the copy (pinning host memory, where the framework copies from it) is done before
    each timed part's opening barrier, so an epoch's timer holds its copies and its steps and nothing else."""
    events = []
    loop.run_training(
        RecordingTrainer(events), config(prefetch=1, timed_steps=2), recording_dataset(events)
    )
    assert "put unpinned" not in events
    opening = [i for i, e in enumerate(events) if e == "sync" and "step" in events[i + 1 : i + 3]]
    # the warm-up, the two epochs, the timed steps: each part pinned its batches before its opening barrier
    assert events.count("pin") == 4
    for timed in timed_epochs(events):
        assert set(timed) <= {"sync", "put", "step"}
    assert all("pin" in events[:i] for i in opening)


def test_each_epoch_records_the_hosts_seconds_spent_feeding(monkeypatch):
    """feed_s: the host's seconds in put() inside the timer, here 1 s a put on a fake clock (6 steps an epoch);
    prepare_s: the seconds before it, the gather and the pinning."""
    clock = FakeClock()

    class SlowPut(RecordingTrainer):
        def put(self, x, y):
            clock.now += 1.0
            return super().put(x, y)

    monkeypatch.setattr(trainerlib, "time", clock)
    metrics = loop.run_training(SlowPut([]), config(prefetch=2), datalib.synthetic(48, 8, 0))
    assert [e["feed_s"] for e in metrics["epochs"]] == [6.0, 6.0]
    assert all(e["prepare_s"] >= 0 for e in metrics["epochs"])
    unfed = loop.run_training(RecordingTrainer([]), config(prefetch=0), datalib.synthetic(48, 8, 0))
    assert [e["feed_s"] for e in unfed["epochs"]] == [0.0, 0.0]


class FakeClock:
    """common.trainer's `time`: perf_counter reads a clock the test moves."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now


def test_prefetch_gives_every_step_the_same_batches_in_the_same_order():
    """Whatever the depth (0 = no put at all, more than an epoch's 6 steps included), the steps receive
    the same batches, in the same order, timed steps included."""

    def stepped(depth):
        trainer = RecordingTrainer([])
        loop.run_training(
            trainer, config(prefetch=depth, timed_steps=5), datalib.synthetic(48, 8, 0)
        )
        return trainer.stepped

    plain = stepped(0)
    assert len(plain) == 1 + 2 * 6 + 5 and len(set(plain[1:7])) == 6
    for depth in (1, 2, 5, 16):
        assert stepped(depth) == plain


def test_prefetched_puts_depth_batches_ahead():
    events = []
    trainer = RecordingTrainer(events)
    batches = [(np.zeros(1), np.full(1, i)) for i in range(4)]
    for x, y in trainerlib.prefetched(trainer, trainer.pin(batches), 1):
        trainer.step(x, y)
    assert events == ["pin", "put", "put", "step", "put", "step", "put", "step", "step"]
    assert trainer.stepped == [batch_y.tobytes() for _, batch_y in batches]


def test_the_input_line_names_what_runs():
    def line(**kw):
        return loop.input_copies(config(**kw), ahead="copied ahead", in_step="copied in the step")

    assert line(prefetch=2) == "2 batches ahead of their step: copied ahead"
    assert line(prefetch=0) == "in the step (--prefetch 0): copied in the step"
    assert line(prefetch=2, resident_data=True).startswith("none timed")


class LayoutCompilingTrainer(RecordingTrainer):
    """Compiles its step once per layout of its state, as jit does per input layout. With `planted`, reset()
    leaves the state in another layout than step() does (the fault Keras's distribution had): the second
    step after every reset compiles again."""

    def __init__(self, events: list, planted: bool):
        super().__init__(events)
        self.planted, self.programs, self.layout = planted, set(), "stepped"

    def reset(self):
        self.layout = "reset" if self.planted else "stepped"

    def step(self, x, y):
        if self.layout not in self.programs:
            self.programs.add(self.layout)
            self.events.append("compile")
        self.layout = "stepped"
        return super().step(x, y)

    def compiles(self):
        return len(self.programs)


def test_a_compile_inside_a_timed_epoch_is_counted_apart_from_the_warm_ups():
    def compiles(planted: bool) -> dict:
        trainer = LayoutCompilingTrainer([], planted)
        metrics = loop.run_training(
            trainer, config(prefetch=0, timed_steps=3), datalib.synthetic(48, 8, 0)
        )
        return metrics["compiles"]

    assert compiles(planted=False) == {"warmup": 1, "epochs": 0, "timed_steps": 0}
    assert compiles(planted=True) == {"warmup": 1, "epochs": 1, "timed_steps": 0}


def test_a_framework_that_counts_no_compiles_records_none():
    metrics = loop.run_training(
        RecordingTrainer([]), config(timed_steps=2), datalib.synthetic(48, 8, 0)
    )
    assert metrics["compiles"] is None


def test_the_run_records_its_mean_epoch_over_its_steps_at_the_median_step():
    metrics = loop.run_training(
        RecordingTrainer([]), config(timed_steps=3), datalib.synthetic(48, 8, 0)
    )
    mean_epoch = sum(e["time_s"] for e in metrics["epochs"]) / 2
    assert metrics["epoch_over_steps"] == mean_epoch / (6 * metrics["step_time"]["median_s"])


HOST_OP = {"ph": "X", "name": "aten::conv2d", "ts": 0, "dur": 10, "pid": 1, "tid": 1}


class RecordingProfiling:
    """A framework's profiler (profilers/<name>.py) that logs when it starts and stops, writes a one-event trace (a
    host op, or the event given), and whose matrix product takes no time at all but advances `clock` by one
    second."""

    def __init__(self, events: list, clock: list, traced: dict = HOST_OP):
        self.events, self.clock, self.traced = events, clock, traced

    def record(self, cfg, folder, rank):
        import contextlib
        import json

        from common.profiling import Recording

        @contextlib.contextmanager
        def recorded():
            self.events.append("profiler on")
            recording = Recording("torch")
            yield recording
            self.events.append("profiler off")
            recording.path = folder / f"rank{rank}.trace.json"
            recording.path.write_text(json.dumps([self.traced]))

        return recorded()

    def matmul(self, cfg, n, dtype):
        def product():
            self.clock[0] += 1.0

        return product


def test_the_profiled_steps_come_after_everything_timed_and_change_none_of_it(
    tmp_path, monkeypatch
):
    """--profile: the profiler runs only after the epochs, the timed steps and the allreduce figure, around steps of
    their own, each between two barriers; whatever ran before it is the run without --profile, event for event."""
    monkeypatch.setenv("DPBENCH_TRACES", str(tmp_path))
    plain, profiled = [], []
    loop.run_training(RecordingTrainer(plain), config(timed_steps=2), datalib.synthetic(48, 8, 0))
    metrics = loop.run_training(
        RecordingTrainer(profiled),
        config(timed_steps=2, profile=3),
        datalib.synthetic(48, 8, 0),
        RecordingProfiling(profiled, [0.0]),
    )
    start = profiled.index("profiler on")
    # the work before it done, and its batches pinned, outside the trace
    assert profiled[:start] == plain + ["pin", "sync"]
    inside = profiled[start + 1 : profiled.index("profiler off")]
    assert inside == ["put"] * 3 + ["sync", "step", "sync"] * 3
    profile = metrics["profile"]
    assert profile["steps"] == 3 and profile["trace"] == "rank0.trace.json"
    assert profile["error"] is None and profile["framework"] == "torch"
    assert metrics["device_busy"] is None  # a host's trace: no device to be busy


def test_profile_epoch_records_the_steps_as_an_epoch_runs_them(tmp_path, monkeypatch):
    """--profile-epoch: no barrier between the profiled steps, each batch put ahead as in an epoch, so the trace
    holds the input path; the record's wall time ends at the barrier after the last step."""
    monkeypatch.setenv("DPBENCH_TRACES", str(tmp_path))
    events = []
    loop.run_training(
        RecordingTrainer(events),
        config(timed_steps=2, profile=3, profile_epoch=True),
        datalib.synthetic(48, 8, 0),
        RecordingProfiling(events, [0.0]),
    )
    inside = events[events.index("profiler on") + 1 : events.index("profiler off")]
    assert inside == ["put"] * 3 + ["step"] * 3 + ["sync"]


def test_a_gpu_run_records_the_share_of_its_epochs_step_the_device_is_busy(tmp_path, monkeypatch):
    """A device trace of 30 us of kernels over the 3 profiled steps: 10 us a step, over the mean epoch's time per
    step (6 steps an epoch)."""
    monkeypatch.setenv("DPBENCH_TRACES", str(tmp_path))
    kernel = {
        "ph": "X",
        "name": "sm90_xmma_fprop",
        "ts": 0,
        "dur": 30,
        "pid": 0,
        "tid": 7,
        "cat": "kernel",
    }
    metrics = loop.run_training(
        RecordingTrainer([]),
        config(timed_steps=2, profile=3),
        datalib.synthetic(48, 8, 0),
        RecordingProfiling([], [0.0], kernel),
    )
    epoch_step_s = sum(e["time_s"] for e in metrics["epochs"]) / 2 / 6
    assert metrics["device_busy"] == pytest.approx(10e-6 / epoch_step_s)


def test_without_profile_no_profiler_runs_and_the_run_says_none(tmp_path, monkeypatch):
    monkeypatch.setenv("DPBENCH_TRACES", str(tmp_path))
    events = []
    metrics = loop.run_training(
        RecordingTrainer(events),
        config(timed_steps=2),
        datalib.synthetic(48, 8, 0),
        RecordingProfiling(events, [0.0]),
    )
    assert "profiler on" not in events and metrics["profile"] is None and metrics["peak"] is None
    assert not list(tmp_path.iterdir())


def test_the_measured_peak_is_the_best_rate_of_the_frameworks_matrix_product(monkeypatch):
    """2 n^3 operations over the fastest timed product, in TFLOP/s, float32 and bfloat16, where the run asks."""
    clock = [0.0]
    monkeypatch.setattr(loop.time, "perf_counter", lambda: clock[0])
    profiling = RecordingProfiling([], clock)
    peak = after_training.measured_peak(config(measure_peak=True), profiling, rank=0)
    n = after_training.PEAK_SIDE["cpu"]
    assert peak == {
        "n": n,
        "tflops": {"float32": 2 * n**3 / 1e12, "bfloat16": 2 * n**3 / 1e12},
        "unmeasured": {},
    }
    assert after_training.measured_peak(config(), profiling, rank=0) is None
    assert after_training.measured_peak(config(measure_peak=True), profiling, rank=1) is None


def test_a_product_the_framework_lacks_leaves_its_peak_unmeasured_with_the_reason():
    class NoBfloat16(RecordingProfiling):
        def matmul(self, cfg, n, dtype):
            if dtype == "bfloat16":
                raise TypeError("data type 'bfloat16' not understood")
            return lambda: None

    peak = after_training.measured_peak(config(measure_peak=True), NoBfloat16([], [0.0]), rank=0)
    assert peak["tflops"]["bfloat16"] is None and peak["tflops"]["float32"] > 0
    assert peak["unmeasured"] == {"bfloat16": "TypeError: data type 'bfloat16' not understood"}


class ImprovingTrainer(RecordingTrainer):
    """A trainer whose test accuracy after epoch k is accuracies[k-1]."""

    def __init__(self, events: list, accuracies: list[float]):
        super().__init__(events)
        self.accuracies, self.evaluations = accuracies, 0

    def evaluate(self, batches):
        total = sum(len(y) for _, y in batches)
        self.evaluations += 1
        return round(self.accuracies[self.evaluations - 1] * total), total


def mllog_lines(text: str) -> list[tuple[str, str, object, dict]]:
    from common import mllog

    return [
        (r["event_type"], r["key"], r["value"], r["metadata"])
        for r in map(mllog.parse, text.splitlines())
        if r is not None
    ]


def test_a_run_stops_at_the_first_epoch_that_reaches_its_target_and_times_the_epochs_up_to_it(
    capsys,
):
    """--target-accuracy 0.75 with accuracies 0.5, 0.75, 0.9: two epochs trained, the time to target is their
    timed seconds, and MLPerf's log says run_start, two epochs, their accuracies and run_stop: success."""
    events = []
    trainer = ImprovingTrainer(events, [0.5, 0.75, 0.9, 0.95])
    metrics = loop.run_training(
        trainer, config(epochs=4, target_accuracy=0.75), recording_dataset(events)
    )
    epochs = metrics["epochs"]
    assert [e["test_acc"] for e in epochs] == [0.5, 0.75]
    target = metrics["target"]
    assert target["reached"] and target["epoch"] == 2 and target["accuracy"] == 0.75
    assert target["train_s"] == epochs[0]["time_s"] + epochs[1]["time_s"]
    # the wall time holds the evaluations too
    assert target["wall_s"] >= target["train_s"]
    # evaluation is outside every epoch's timer
    assert all("evaluate" not in e for e in timed_epochs(events))
    lines = mllog_lines(capsys.readouterr().out)
    keys = [(kind, key) for kind, key, _, _ in lines if not key.startswith("dpbench_")]
    assert keys[keys.index(("INTERVAL_START", "run_start")) :] == [
        ("INTERVAL_START", "run_start"),
        ("INTERVAL_START", "epoch_start"),
        ("INTERVAL_END", "epoch_stop"),
        ("POINT_IN_TIME", "eval_accuracy"),
        ("INTERVAL_START", "epoch_start"),
        ("INTERVAL_END", "epoch_stop"),
        ("POINT_IN_TIME", "eval_accuracy"),
        ("INTERVAL_END", "run_stop"),
    ]
    accuracies = [(v, m["epoch_num"]) for _, k, v, m in lines if k == "eval_accuracy"]
    assert accuracies == [(0.5, 1), (0.75, 2)]
    assert lines[-1][3] == {"status": "success"}
    parameters = {k: v for _, k, v, _ in lines}
    assert parameters["global_batch_size"] == 8 and parameters["opt_base_learning_rate"] == 0.1
    assert parameters["seed"] == 0 and parameters["dpbench_target_accuracy"] == 0.75
    assert parameters["dpbench_time_to_target_s"] == target["train_s"]


def test_a_run_that_never_reaches_its_target_trains_every_epoch_and_says_so(capsys):
    trainer = ImprovingTrainer([], [0.5, 0.6])
    metrics = loop.run_training(
        trainer, config(epochs=2, target_accuracy=0.9), datalib.synthetic(48, 8, 0)
    )
    assert len(metrics["epochs"]) == 2
    assert metrics["target"] == {
        "accuracy": 0.9,
        "reached": False,
        "epoch": None,
        "train_s": None,
        "wall_s": None,
    }
    assert mllog_lines(capsys.readouterr().out)[-1][1:] == ("run_stop", None, {"status": "aborted"})


def test_without_a_target_every_epoch_trains_and_the_run_records_none():
    trainer = ImprovingTrainer([], [0.99, 0.99])
    metrics = loop.run_training(trainer, config(epochs=2), datalib.synthetic(48, 8, 0))
    assert len(metrics["epochs"]) == 2 and metrics["target"] is None


def test_an_order_seed_changes_the_batch_order_and_not_the_initial_weights():
    """A time-to-accuracy trial's own order (harness/planning/plan.py trial_config): other batches, and a batch
    sequence hash that says so, from the same initial weights."""
    stepped, metrics = [], []
    for order_seed in (None, 0, 1):
        trainer = RecordingTrainer([])
        metrics.append(
            loop.run_training(trainer, config(order_seed=order_seed), datalib.synthetic(48, 8, 0))
        )
        stepped.append(trainer.stepped)
    assert stepped[0] == stepped[1] != stepped[2]
    assert metrics[0]["data_hash"] == metrics[1]["data_hash"] != metrics[2]["data_hash"]
    assert metrics[0]["weights_hash"] == metrics[2]["weights_hash"]


def test_a_save_that_fails_names_the_path_and_the_run_keeps_its_figures(tmp_path):
    """--save-weights into a folder that became a file by the end of training: the record names the path and the
    reason instead of failing the run, the result is still a result, and the report says the weights were not
    saved beside the run's figures."""
    from types import SimpleNamespace

    from common.results import Result, result_problem
    from harness.reporting import sections
    from tests.harness.test_results import ok_result

    blocker = tmp_path / "was-a-folder"
    blocker.write_text("")
    path = str(blocker / "weights.npz")
    trainer = SimpleNamespace(rank=0, canonical=lambda: {"w": np.zeros(2, np.float32)})
    saved = loop.save_weights(trainer, SimpleNamespace(save_weights=path))
    assert saved["path"] == path and saved["sha256"] is None
    assert saved["error"].startswith(f"could not write {path}: "), saved
    record = ok_result(saved_weights=saved)
    assert result_problem(record) is None
    (line,) = sections.saved_weights_lines([Result.from_dict(record)])
    assert f"**not saved** to `{path}`: could not write" in line and "figures stand" in line
    # and where it could write, the line names the file and its fingerprint
    good = loop.save_weights(trainer, SimpleNamespace(save_weights=str(tmp_path / "w.npz")))
    (line,) = sections.saved_weights_lines([Result.from_dict(ok_result(saved_weights=good))])
    assert line.endswith(f"saved to `{tmp_path / 'w.npz'}` (`{good['sha256'][:16]}`)")


def test_each_epochs_progress_line_carries_the_workers_peak_resident_set(capsys):
    """The runner reads it as the last peak of a worker that is killed later (harness/processes/deaths.py)."""
    from common import progress

    loop.run_training(
        ImprovingTrainer([], [0.5, 0.6]), config(epochs=2), datalib.synthetic(48, 8, 0)
    )
    records = [progress.parse(line) for line in capsys.readouterr().out.splitlines()]
    peaks = [r["peak_host_rss_mb"] for r in records if r and r["event"] == "epoch"]
    assert len(peaks) == 2 and 0 < peaks[0] <= peaks[1]  # a high-water mark


class RecordingMeter:
    """An energy counter that logs each read and gains `watts` joules by each: an epoch's two reads differ by it."""

    def __init__(self, events: list, watts: float = 50.0):
        self.events, self.watts, self.joules = events, watts, 1000.0

    def read(self) -> float:
        self.events.append("energy")
        self.joules += self.watts
        return self.joules


def test_energy_is_read_at_each_timed_epochs_barriers_and_nowhere_else(monkeypatch):
    """The counters are read right after the barrier that opens an epoch's timer and right after the one that
    closes it: not around the warm-up, the evaluation or the timed steps; the figures come from those reads."""
    events = []
    counter = RecordingMeter(events)
    meter = energylib.Meter(
        "CPU package, RAPL", (energylib.Counter("package-0", counter.read),), 0.001
    )
    monkeypatch.setattr(loop, "run_energy", lambda trainer, cfg: energylib.RunEnergy(meter))
    metrics = loop.run_training(
        RecordingTrainer(events), config(epochs=2, timed_steps=2), recording_dataset(events)
    )
    assert events.count("energy") == 4  # two epochs, two reads each
    reads = [i for i, e in enumerate(events) if e == "energy"]
    assert all(events[i - 1] == "sync" for i in reads)  # each right after a barrier
    opening, closing = reads[::2], reads[1::2]
    assert all(events[i + 1] in ("put", "step") for i in opening)  # then the epoch's first batch
    assert all(events[i - 2] == "step" for i in closing)  # the epoch's last step, then its barrier
    evaluations = [i for i, e in enumerate(events) if e == "evaluate"]
    assert events.index("step") < reads[0]  # after the warm-up's step
    assert closing[0] < evaluations[0] and reads[-1] < evaluations[-1]  # before each evaluation
    assert events[evaluations[-1] :].count("step") == 2  # the timed steps, unread
    energy = metrics["energy"]
    assert energy["measured"] and energy["epochs_j"] == [
        50.0,
        50.0,
    ]  # the second read of each less the first
    seconds = sum(e["time_s"] for e in metrics["epochs"])
    assert energy["average_w"] == pytest.approx(100.0 / seconds)
    assert energy["images_per_joule"] == pytest.approx(2 * 48 / 100.0)
    assert energy["joules_per_epoch"] == 50.0 and energy["to_target_j"] is None


def test_a_run_without_readable_counters_keeps_its_figures_and_says_why(monkeypatch):
    monkeypatch.setattr(
        loop,
        "run_energy",
        lambda trainer, cfg: energylib.RunEnergy(energylib.NotMeasured("no RAPL")),
    )
    metrics = loop.run_training(RecordingTrainer([]), config(epochs=2), datalib.synthetic(48, 8, 0))
    assert metrics["energy"] == {"measured": False, "why": "no RAPL"}
    assert len(metrics["epochs"]) == 2


class TwoRanks(RecordingTrainer):
    """Rank 0 of two, the other rank's numbers added by `summed` as a collective would."""

    def __init__(self, events, other: list[float]):
        super().__init__(events)
        self.other = other

    def summed(self, values):
        return [a + b for a, b in zip(values, self.other)]


def test_the_epochs_energy_is_summed_over_the_processes_that_read(monkeypatch):
    """Rank 0 read 50 J an epoch on one package; another host's first rank 30 J and 40 J on two GPUs."""
    counter = RecordingMeter([])
    meter = energylib.Meter(
        "GPU board, NVML counter", (energylib.Counter("GPU 0", counter.read),), 0.1
    )
    monkeypatch.setattr(loop, "run_energy", lambda trainer, cfg: energylib.RunEnergy(meter))
    other = [30.0, 40.0, 0.0, 1.0, 2.0]  # its epochs' joules, no failure, one reader, two counters
    metrics = loop.run_training(TwoRanks([], other), config(epochs=2), datalib.synthetic(48, 8, 0))
    energy = metrics["energy"]
    assert energy["epochs_j"] == [80.0, 90.0]
    assert (energy["processes"], energy["counters"]) == (2, 3)
    assert energy["per_counter_w"] == pytest.approx(energy["average_w"] / 3)


def test_a_counter_another_process_could_not_read_leaves_the_run_unmeasured(monkeypatch):
    counter = RecordingMeter([])
    meter = energylib.Meter(
        "GPU board, NVML counter", (energylib.Counter("GPU 0", counter.read),), 0.1
    )
    monkeypatch.setattr(loop, "run_energy", lambda trainer, cfg: energylib.RunEnergy(meter))
    other = [0.0, 0.0, 1.0, 1.0, 1.0]  # that process failed to read
    metrics = loop.run_training(TwoRanks([], other), config(epochs=2), datalib.synthetic(48, 8, 0))
    assert metrics["energy"] == {
        "measured": False,
        "why": "another process's counters could not be read",
    }


def test_the_energy_to_the_target_is_the_epochs_up_to_it(monkeypatch):
    counter = RecordingMeter([])
    meter = energylib.Meter(
        "CPU package, RAPL", (energylib.Counter("package-0", counter.read),), 0.001
    )
    monkeypatch.setattr(loop, "run_energy", lambda trainer, cfg: energylib.RunEnergy(meter))
    trainer = ImprovingTrainer([], [0.5, 0.75, 0.9])
    metrics = loop.run_training(
        trainer, config(epochs=3, target_accuracy=0.75), datalib.synthetic(48, 8, 0)
    )
    assert metrics["energy"]["to_target_j"] == 100.0 and metrics["target"]["epoch"] == 2
