"""The figures measured after a run's timed epochs, each outside them (common/loop.py): the steps timed one by one
(the step-time median and spread), the strategy's allreduce of a gradient-sized buffer and its share of the step,
the --profile steps recorded with the framework's profiler, and the framework's matmul peak."""

from __future__ import annotations

import itertools
import math
import time

import numpy as np

from common import architectures, progress
from common import data as datalib
from common import profiling as profilinglib
from common.trainer import Trainer, feed, ready


def time_steps(trainer: Trainer, cfg, dataset: datalib.Dataset) -> list[float]:
    """cfg.timed_steps more steps, each between two barriers (the slowest rank's seconds for each).

    They continue training on the batches of the epochs that follow; the results already recorded
    (accuracy, saved weights) are not affected."""
    if not cfg.timed_steps:
        return []
    batches = ready(trainer, batches_after_training(cfg, dataset, 0, cfg.timed_steps), cfg)
    seconds = []
    # a step's batch is put (ahead) before its opening barrier
    for x, y in feed(trainer, batches, cfg):
        trainer.sync()
        start = time.perf_counter()
        trainer.step(x, y)
        trainer.sync()
        seconds.append(trainer.slowest(time.perf_counter() - start))
    if trainer.rank == 0:
        progress.emit("timed_steps", steps=len(seconds))
    return seconds


def batches_after_training(cfg, dataset: datalib.Dataset, skip: int, count: int) -> list:
    """`count` batches of the epochs after the trained ones, after the first `skip` of them."""
    epochs = itertools.count(cfg.epochs)
    batches = itertools.chain.from_iterable(
        datalib.train_batches(dataset, cfg.batch_size, cfg.batch_seed, e) for e in epochs
    )
    return list(itertools.islice(batches, skip, skip + count))


def profile_steps(trainer: Trainer, cfg, dataset: datalib.Dataset, profiling) -> dict | None:
    """--profile: cfg.profile more steps (after the timed steps, on the batches that follow them), each between
    two barriers as a timed step is, or with --profile-epoch as an epoch runs them (a barrier before the first
    and after the last, each batch put ahead: the input path and any wait between the steps in the trace), inside
    the framework's profiler; each rank writes its trace in the traces folder (common/profiling.py's
    traces_folder). Rank 0's record: its trace's name in that folder and its breakdown (common/profiling.py), or
    the reason there is none."""
    if not cfg.profile or profiling is None:
        return None
    folder = profilinglib.traces_folder()
    batches = ready(
        trainer, batches_after_training(cfg, dataset, cfg.timed_steps, cfg.profile), cfg
    )
    trainer.sync()
    with profiling.record(cfg, folder, trainer.rank) as recording:
        start = time.perf_counter()
        for x, y in feed(trainer, batches, cfg):
            if not cfg.profile_epoch:
                trainer.sync()
            trainer.step(x, y)
            if not cfg.profile_epoch:
                trainer.sync()
        if cfg.profile_epoch:
            trainer.sync()
        # this rank's own time, the one its trace shows (the slowest rank's would need a collective, which
        # would land in the trace after the steps)
        wall = time.perf_counter() - start
    if trainer.rank == 0:
        progress.emit("profiled", steps=len(batches))
    return profilinglib.summary(recording, folder, wall, len(batches))


# The matrix products of the measured peak: the side (large enough to be bound by arithmetic on each kind of
# device), the most calls timed and the seconds after which no more are started (a CPU's bfloat16 product can be
# a hundred times slower than its float32 one where the CPU has no bfloat16 arithmetic).
PEAK_SIDE = {"cpu": 512, "gpu": 8192}
PEAK_CALLS = 10
PEAK_SECONDS = 0.5


def measured_peak(cfg, profiling, rank: int) -> dict | None:
    """The framework's matrix-multiply rate on this process's first device, float32 and bfloat16, in TFLOP/s:
    {"n", "tflops": {dtype: rate or None}, "unmeasured": {dtype: why}}; rank 0 measures, where cfg asks."""
    if not cfg.measure_peak or profiling is None or rank != 0:
        return None
    n = PEAK_SIDE[cfg.device_kind]
    tflops, unmeasured = {}, {}
    for dtype in ("float32", "bfloat16"):
        try:
            tflops[dtype] = matmul_tflops(profiling.matmul(cfg, n, dtype), n)
        except Exception as e:  # a framework without a product in this dtype here: said, not fatal
            tflops[dtype] = None
            unmeasured[dtype] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[
                :200
            ]
    return {"n": n, "tflops": tflops, "unmeasured": unmeasured}


def matmul_tflops(product, n: int) -> float:
    """The best rate of `product` (one n x n matrix product, waited for) over up to PEAK_CALLS timed calls after
    an untimed one, stopping once PEAK_SECONDS are spent."""
    product()
    fastest, spent = math.inf, 0.0
    for _ in range(PEAK_CALLS):
        start = time.perf_counter()
        product()
        seconds = time.perf_counter() - start
        fastest, spent = min(fastest, seconds), spent + seconds
        if spent > PEAK_SECONDS:
            break
    return 2 * n**3 / fastest / 1e12


def step_statistics(seconds: list[float], batch_size: int) -> dict | None:
    """Median and spread (10th and 90th percentiles) of the timed steps, and every step's seconds (the samples
    `harness compare` tests)."""
    if not seconds:
        return None
    median = float(np.median(seconds))
    return {
        "steps": len(seconds),
        "median_s": median,
        "p10_s": float(np.percentile(seconds, 10)),
        "p90_s": float(np.percentile(seconds, 90)),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "images_per_s": batch_size / median,
        "samples_s": [float(s) for s in seconds],
    }


ALLREDUCE_REPEATS = 10


def allreduce_figure(trainer: Trainer, cfg, step_time: dict | None) -> dict | None:
    """The strategy's allreduce of a buffer as large as the model's gradients: time, GB/s, share of a step.

    GB/s is the algorithm bandwidth, gradient bytes / time (NCCL's busbw would multiply it by
    2(k-1)/k). The share is an upper bound on what communication costs a step: DDP overlaps its
    bucketed allreduces with the backward pass, and on one device there is nothing to send."""
    if not cfg.timed_steps:
        return None
    values = trainer.param_count()
    seconds = trainer.allreduce_seconds(values, ALLREDUCE_REPEATS)
    median = float(np.median(seconds))
    figure = {
        "values": values,
        "bytes": 4 * values,
        "repeats": len(seconds),
        "median_s": median,
        "p10_s": float(np.percentile(seconds, 10)),
        "p90_s": float(np.percentile(seconds, 90)),
        "gb_per_s": 4 * values / median / 1e9 if median > 0 else None,
        "share_of_step": median / step_time["median_s"] if step_time else None,
    }
    if trainer.rank == 0:
        progress.emit("allreduce", seconds=median)
    return figure


# The steps a compressed-gradient run's rounding is measured on: few, each taken twice after everything timed.
ROUNDING_STEPS = 3


def exchange_rounding(compressed: Trainer, exact: Trainer, cfg, dataset: datalib.Dataset) -> dict:
    """--grad-dtype bf16 changes the math, so the run measures by how much: the run's trainer (`compressed`, reset
    to the initial weights) and one exchanging its gradients in float32 (`exact`) take the run's first
    ROUNDING_STEPS steps side by side. After each step, the L2 distance between their parameters over the
    distance the exact trainer's parameters moved from the start (BatchNorm's running statistics left out): the
    first is one step's rounding, the later ones how it adds up. Rank 0's record, {"against", "steps"}."""
    compressed.reset()
    names = architectures.trainable_names(cfg.model)
    start = parameters(compressed, names)
    epoch = datalib.train_batches(dataset, cfg.batch_size, cfg.batch_seed, 0)
    distances = []
    for batch in itertools.islice(epoch, ROUNDING_STEPS):
        after = [one_step(trainer, batch, cfg, names) for trainer in (compressed, exact)]
        distances.append(update_distance(start, *after))
    if compressed.rank == 0:
        progress.emit("rounding", first=distances[0], last=distances[-1], steps=len(distances))
    return {"against": f"grad_dtype={exact.cfg.levers.grad_dtype}", "steps": distances}


def one_step(trainer: Trainer, batch, cfg, names: list[str]) -> dict:
    """The trainer's parameters `names` after one more step on `batch`."""
    for x, y in feed(trainer, ready(trainer, [batch], cfg), cfg):
        trainer.step(x, y)
    trainer.sync()
    return parameters(trainer, names)


def parameters(trainer: Trainer, names: list[str]) -> dict:
    """The trainer's canonical arrays `names` (canonical(): a collective, called on every rank)."""
    weights = trainer.canonical()
    return {n: weights[n] for n in names}


def update_distance(start: dict, moved: dict, exact: dict) -> float:
    """|moved - exact| / |exact - start|, L2 over every array, in float64."""
    apart = sum(float(np.sum((moved[n].astype(np.float64) - exact[n]) ** 2)) for n in start)
    travelled = sum(float(np.sum((exact[n].astype(np.float64) - start[n]) ** 2)) for n in start)
    return math.sqrt(apart / travelled)
