"""The one training loop and timing rule, used by every backend and strategy.

A backend supplies a Trainer (common/trainer.py); this module decides what is timed and how:

* warm-up / compile: one step on the first batch, closed by a device barrier, timed
  apart; then the trainer is reset to the initial weights, so the warm-up changes
  nothing about the training that follows;
* an epoch's time runs from a barrier before its first step to a barrier after its
  last; host->device copies of the batches are inside it (as in d2l), batch assembly
  (one numpy gather of the epoch's permutation) happens before its timer starts, and so
  does the pinning of the host batches where the framework copies from page-locked memory
  (trainer.pin, as DataLoader's pin_memory does off the training loop's path); each epoch
  records both costs: `prepare_s`, the host's seconds to assemble and pin (or stage) its
  batches before the timer, and `feed_s`, the host's seconds inside it spent in put();
* each batch is put on the devices --prefetch batches ahead of the step that takes it
  (trainer.put: asynchronous copies, from pinned host memory on a copy stream where the
  framework has them), so copies overlap the steps before; --prefetch 0 leaves the copy
  to step() itself, one batch at a time;
* loss / accuracy are read back only after the epoch's timer has stopped, so the
  loop never forces a device sync mid-epoch;
* evaluation is outside epoch time;
* with several processes, each epoch's time is the slowest rank's;
* with --resident-data, an epoch's batches are copied to the devices before its timer starts;
* after training (and after --save-weights), step statistics (common/after_training.py): --timed-steps further steps,
  each between two barriers, so each step's time is known (epoch times cannot give a spread);
* then the communication figure: the strategy's own allreduce of a gradient-sized float32
  buffer, timed alone, and its share of the median step;
* two figures say whether the epochs are their steps: what the framework compiled in each timed
  part (only the warm-up should; trainer.compiles()), and the mean epoch over (its steps x the
  median timed step), which the report marks outside common/results.py's CONSISTENCY_LOW to
  CONSISTENCY_LIMIT;
* with --profile on a GPU, the share of an epoch's step the device is busy (common/results.py's
  device_busy): its kernels per step in the trace over the epoch's time per step.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from common import data as datalib
from common import energy as energylib
from common import mllog, progress, sysinfo
from common import weights as weightslib
from common.after_training import (
    allreduce_figure,
    measured_peak,
    profile_steps,
    step_statistics,
    time_steps,
)
from common.errors import Diverged
from common.results import device_busy, epoch_over_steps
from common.trainer import FeedClock, Trainer, feed, ready


def run_training(trainer: Trainer, cfg, dataset: datalib.Dataset, profiling=None) -> dict:
    """Warm up, train cfg.epochs epochs, evaluate after each; return the metrics part of a result. After
    everything timed, `profiling` (the framework's profiler, profilers/<name>.py) records the --profile steps and
    measures the matmul peak where the run config asks.

    With cfg.epochs == 0 (only with --load-weights) the weights are just evaluated."""
    if cfg.epochs == 0:
        return evaluate_only(trainer, cfg, dataset)
    report = trainer.rank == 0

    if report:
        log_parameters(cfg, dataset)
    watch = Watch(CompileCount(trainer), run_energy(trainer, cfg))
    compile_s = warm_up(trainer, cfg, dataset)
    watch.compiles.close("warmup")
    if report:
        progress.emit("warmup", seconds=compile_s)

    epochs, target, energy = train_to_target(trainer, cfg, dataset, watch)
    saved = save_weights(trainer, cfg)
    watch.compiles.open()
    step_time = step_statistics(time_steps(trainer, cfg, dataset), cfg.batch_size)
    watch.compiles.close("timed_steps")
    allreduce = allreduce_figure(trainer, cfg, step_time)
    # nothing timed comes after this line: the profiler and the peak change no timed figure
    profile = profile_steps(trainer, cfg, dataset, profiling)
    peak = measured_peak(cfg, profiling, trainer.rank)
    return {
        "epochs": epochs,
        "final_test_acc": epochs[-1]["test_acc"],
        "target": target,
        "saved_weights": saved,
        "compile_s": compile_s,
        "compiles": watch.compiles.counts,
        "energy": energy,
        "step_time": step_time,
        "epoch_over_steps": epoch_over_steps(
            [e["time_s"] for e in epochs], epochs[0]["steps"], step_time and step_time["median_s"]
        ),
        "device_busy": device_busy([e["time_s"] for e in epochs], epochs[0]["steps"], profile),
        "allreduce": allreduce,
        "profile": profile,
        "peak": peak,
        "params": trainer.param_count(),
        "weights_hash": weightslib.fingerprint(trainer.weights),
        "memory": {**trainer.memory(), "peak_host_rss_mb": sysinfo.peak_rss_mb()},
        "data_hash": datalib.batch_sequence_hash(
            dataset, cfg.batch_size, cfg.batch_seed, cfg.epochs
        ),
        "test_examples": len(dataset.y_test),
        "train_examples": len(dataset.y_train),
    }


def log_parameters(cfg, dataset: datalib.Dataset) -> None:
    """The run's parameters in MLPerf's log (common/mllog.py), before anything is timed."""
    mllog.event("global_batch_size", cfg.batch_size)
    mllog.event("opt_name", "sgd")
    mllog.event("opt_base_learning_rate", cfg.lr)
    mllog.event("seed", cfg.seed)
    mllog.event("train_samples", len(dataset.y_train))
    mllog.event("eval_samples", len(dataset.y_test))
    described = {
        "backend": cfg.backend,
        "strategy": cfg.strategy,
        "devices": cfg.devices,
        "model": cfg.model,
        "precision": cfg.levers.precision,
        "target_accuracy": cfg.target_accuracy,
        "batch_seed": cfg.batch_seed,
        "variant": cfg.variant,
    }
    for name, value in described.items():
        mllog.event(mllog.PREFIX + name, value)


def train_to_target(
    trainer: Trainer, cfg, dataset: datalib.Dataset, watch: Watch
) -> tuple[list, dict | None, dict]:
    """The epochs, each timed, then evaluated (outside its time); with --target-accuracy, up to the first whose
    test accuracy reaches the target. Every rank gets the same accuracy (evaluate() sums the ranks' counts), so
    every rank stops after the same epoch. Returns the epoch records and the target record (None without a
    target): the epoch it was reached at, the timed training seconds to it (the epochs' times summed) and the wall
    seconds from run_start to its evaluation (the evaluations and the batches' assembly included), and the energy
    record of the epochs (common/energy.py)."""
    report = trainer.rank == 0
    watch.energy.note_context("start")
    if report:
        mllog.start("run_start")
    started = time.perf_counter()
    epochs, reached_at = [], None
    for epoch in range(cfg.epochs):
        if report:
            mllog.start("epoch_start", epoch_num=epoch + 1)
        record = train_epoch(trainer, cfg, dataset, epoch, watch)
        if report:
            mllog.end("epoch_stop", epoch_num=epoch + 1)
        record["test_acc"] = evaluated_accuracy(trainer, cfg, dataset)
        wall = time.perf_counter() - started
        epochs.append(record)
        if report:
            mllog.event("eval_accuracy", record["test_acc"], epoch_num=epoch + 1)
            # with the peak resident set so far: what the harness says of a worker killed later (deaths.PeakRSS)
            progress.emit(
                "epoch", **record, epochs=cfg.epochs, peak_host_rss_mb=sysinfo.peak_rss_mb()
            )
        if cfg.target_accuracy is not None and record["test_acc"] >= cfg.target_accuracy:
            reached_at = (epoch + 1, wall)
            break
    target = target_record(cfg, epochs, reached_at)
    watch.energy.note_context("end")
    energy = watch.energy.record(trainer.summed, epochs, target)
    if report:
        log_energy(energy)
        success = target is None or target["reached"]
        if target is not None and target["reached"]:
            mllog.event(mllog.PREFIX + "time_to_target_s", target["train_s"])
        mllog.end("run_stop", status="success" if success else "aborted")
    return epochs, target, energy


def target_record(cfg, epochs: list[dict], reached_at: tuple[int, float] | None) -> dict | None:
    """--target-accuracy's record: {"accuracy", "reached", "epoch", "train_s", "wall_s"}, the last three None
    where the run never reached it (None without a target)."""
    if cfg.target_accuracy is None:
        return None
    record = {"accuracy": cfg.target_accuracy, "reached": reached_at is not None}
    if reached_at is None:
        return {**record, "epoch": None, "train_s": None, "wall_s": None}
    epoch, wall = reached_at
    return {
        **record,
        "epoch": epoch,
        "train_s": sum(e["time_s"] for e in epochs[:epoch]),
        "wall_s": wall,
    }


def evaluated_accuracy(trainer: Trainer, cfg, dataset: datalib.Dataset) -> float:
    correct, total = trainer.evaluate(datalib.test_batches(dataset, cfg.eval_batch_size))
    return correct / total


def warm_up(trainer: Trainer, cfg, dataset: datalib.Dataset) -> float:
    """One step on the first batch, between barriers (the compile, where the framework compiles), then the
    trainer reset to the initial weights: the slowest rank's seconds."""
    trainer.reset()
    first = ready(
        trainer, datalib.train_batches(dataset, cfg.batch_size, cfg.batch_seed, 0)[:1], cfg
    )
    trainer.sync()
    start = time.perf_counter()
    for x0, y0 in feed(trainer, first, cfg):
        trainer.step(x0, y0)
    trainer.sync()
    seconds = trainer.slowest(time.perf_counter() - start)
    trainer.reset()
    return seconds


def train_epoch(trainer: Trainer, cfg, dataset: datalib.Dataset, epoch: int, watch: Watch) -> dict:
    """One timed epoch, then its loss and accuracy read back: its record (the test accuracy is added by the caller).
    `watch` counts what the framework compiled between the epoch's barriers and reads the devices' energy at
    them."""
    report = trainer.rank == 0
    steps = datalib.steps_per_epoch(len(dataset.y_train), cfg.batch_size)
    # before the timer: the epoch's gather, and the batches staged or pinned
    preparing = time.perf_counter()
    batches = ready(
        trainer, datalib.train_batches(dataset, cfg.batch_size, cfg.batch_seed, epoch), cfg
    )
    prepare_s = time.perf_counter() - preparing
    handles = []
    last_emit = 0.0
    clock = FeedClock()
    trainer.sync()
    watch.compiles.open()
    watch.energy.start()
    start = time.perf_counter()
    for i, (x, y) in enumerate(feed(trainer, batches, cfg, clock)):
        handles.append(trainer.step(x, y))
        now = time.perf_counter()
        if report and now - last_emit > 0.5:
            progress.emit("step", epoch=epoch + 1, epochs=cfg.epochs, step=i + 1, steps=steps)
            last_emit = now
    trainer.sync()
    elapsed = time.perf_counter() - start
    watch.energy.stop(elapsed)
    seconds = trainer.slowest(elapsed)
    watch.compiles.close("epochs")

    loss_sum, correct = trainer.collect(handles)
    images = steps * cfg.batch_size
    train_loss = loss_sum / images
    if not math.isfinite(train_loss):
        raise Diverged(f"training loss became {train_loss} in epoch {epoch + 1}")
    return {
        "epoch": epoch + 1,
        "time_s": seconds,
        "steps": steps,
        "images": images,
        "images_per_s": images / seconds,
        "train_loss": train_loss,
        "train_acc": correct / images,
        "prepare_s": prepare_s,
        "feed_s": clock.seconds,
    }


class CompileCount:
    """What the framework compiled in each timed part of a run (trainer.compiles()): {"warmup", "epochs",
    "timed_steps"}, or None where the framework does not count. Only the warm-up should compile: a compile
    in the epochs is paid by their time and never seen by the step time."""

    def __init__(self, trainer: Trainer):
        self.trainer = trainer
        self.counts = None if trainer.compiles() is None else {}
        self.open()

    def open(self) -> None:
        """Start counting a part (the count so far)."""
        self.start = self.trainer.compiles()

    def close(self, part: str) -> None:
        """Add what was compiled since open() to `part`."""
        if self.counts is not None:
            compiled = self.trainer.compiles() - self.start
            self.counts[part] = self.counts.get(part, 0) + compiled


@dataclass(frozen=True)
class Watch:
    """What is read at a timed part's barriers beside the clock: the framework's compiles and the devices'
    energy (common/energy.py)."""

    compiles: CompileCount
    energy: energylib.RunEnergy


def run_energy(trainer: Trainer, cfg) -> energylib.RunEnergy:
    """This process's reading of its host's energy counters (none where another process of the host reads them):
    the run's devices on this host (every loopback node's are this host's)."""
    if not energylib.reads_here(trainer.rank, cfg.nodes.count, cfg.nodes.loopback):
        return energylib.RunEnergy(None)
    here = cfg.devices if cfg.nodes.loopback else cfg.devices // cfg.nodes.count
    return energylib.RunEnergy(energylib.open_meter(cfg.device_kind, here))


def log_energy(energy: dict) -> None:
    """The run's energy in MLPerf's log (its power track's unit: joules), or why there is none."""
    if energy["measured"]:
        mllog.event(mllog.PREFIX + "energy_j", sum(energy["epochs_j"]), scope=energy["scope"])
    else:
        mllog.event(mllog.PREFIX + "energy_j", None, why=energy["why"])


def input_copies(cfg, ahead: str, in_step: str) -> str:
    """The environment's line on how batches reach the devices; `ahead` and `in_step` say how the backend
    copies a batch put ahead of its step (--prefetch N) and one its step copies itself (--prefetch 0)."""
    if cfg.levers.resident_data:
        return "none timed: each epoch's batches placed before its timer starts (--resident-data)"
    if not cfg.levers.prefetch:
        return f"in the step (--prefetch 0): {in_step}"
    return f"{cfg.levers.prefetch} batches ahead of their step: {ahead}"


def save_weights(trainer: Trainer, cfg) -> dict | None:
    """--save-weights: the trained weights, canonical, in one file any backend can load. A save that fails (a full
    disk, a folder gone) is the record's `error`, naming the path and the reason: the run's figures stand."""
    if not cfg.save_weights:
        return None
    weights = (
        trainer.canonical()
    )  # on every rank: a sharded strategy gathers its shards, a collective
    if trainer.rank != 0:
        return None
    try:
        return {"path": cfg.save_weights, "sha256": weightslib.save(cfg.save_weights, weights)}
    except OSError as e:
        why = f"could not write {cfg.save_weights}: {e.strerror or e}"
        print(f"--save-weights: {why}; the run goes on", flush=True)  # (in the worker's log)
        return {"path": cfg.save_weights, "sha256": None, "error": why}


def evaluate_only(trainer: Trainer, cfg, dataset: datalib.Dataset) -> dict:
    trainer.reset()
    correct, total = trainer.evaluate(datalib.test_batches(dataset, cfg.eval_batch_size))
    if trainer.rank == 0:
        progress.emit("evaluated", test_acc=correct / total)
    return {
        "epochs": [],
        "final_test_acc": correct / total,
        "saved_weights": None,
        "params": trainer.param_count(),
        "weights_hash": weightslib.fingerprint(trainer.weights),
        "memory": {**trainer.memory(), "peak_host_rss_mb": sysinfo.peak_rss_mb()},
        "test_examples": len(dataset.y_test),
        "train_examples": 0,
    }
