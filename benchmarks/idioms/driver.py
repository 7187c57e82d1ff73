"""What every idiom shares: the run config read, the same weights and batches as the suite's run, and the
timing rule. Framework-free; each framework's file (torch.py, jax.py, mxnet.py, keras.py) holds only its
network, its feeding and its training step, written the way that framework's own examples write them.

    python -m benchmarks.idioms.<name> --config run.json --result idiom.json [--trace N --dtype float64]

An idiom module provides `FRAMEWORK` (its name and version, for the report),
`training_step(weights, lr, dtype, device_kind) -> (feed, step)`: `feed(batches)` takes a list of numpy (x, y)
batches and returns an iterable of them on the device, in that order, fed the way that framework's examples feed
their steps (a torch DataLoader, flax's prefetch to the device, a Gluon DataLoader, Keras's tensors), `step(batch)`
takes one SGD step on one of them and returns its loss as a Python float (the host reading the loss is the step's
sync, as in every example's loop); and `record(cfg, folder)`, its framework's profiler (profilers/), the one the
backend's runs are recorded with. The driver checks that the feed yields exactly one batch per batch it was given.

Timed like the suite's steps (common/loop.py's time_steps): one warm-up step (compilation), then `timed_steps`
steps on the batches the suite's timed steps take, each batch taken from the feed (put) before its timer starts and
each step timed alone; then, where the run config asks (`profile`: parity asks it of the first trial), as many more
steps as a suite run profiles, on the batches that follow, inside the framework's profiler: their trace and
breakdown are read as a suite run's are (common/profiling.py), for parity's reasons. `--trace N` instead takes N
steps on the first batches of epoch 0 and records their losses: the test that the idiom computes what the suite
computes (tests/backends/test_contract.py).
"""

from __future__ import annotations

import argparse
import json
import time

from common import data as datalib
from common import profiling
from common import weights as weightslib
from common.after_training import batches_after_training
from common.config import RunConfig
from common.files import write_atomic


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description="One idiomatic training loop, timed as the suite's steps."
    )
    p.add_argument("--config", required=True, help="the run config (JSON) of the suite's run")
    p.add_argument("--result", required=True, help="where to write the idiom's result (JSON)")
    p.add_argument(
        "--trace", type=int, default=0, help="take N steps and record their losses instead"
    )
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    return p.parse_args(argv)


def timed_batches(cfg: RunConfig, dataset: datalib.Dataset) -> list:
    """The batches of the suite's timed steps: those of the epochs after its training, in order."""
    return batches_after_training(cfg, dataset, 0, cfg.timed_steps)


def time_steps(feed, step, batches: list) -> tuple[list[float], list[float]]:
    """Each step's seconds and loss, its batch taken from the idiom's feed before its timer starts; a feed that
    yields more or fewer batches than it was given is an error (strict zip)."""
    seconds, losses = [], []
    for _, batch in zip(batches, feed(batches), strict=True):
        start = time.perf_counter()
        losses.append(step(batch))
        seconds.append(time.perf_counter() - start)
    return seconds, losses


def measure(idiom, cfg: RunConfig) -> dict:
    """The idiom's timed steps on the suite run's weights and batches."""
    dataset = datalib.load(cfg)
    weights = weightslib.for_run(cfg)
    batches = timed_batches(cfg, dataset)
    feed, step = idiom.training_step(weights, cfg.lr, "float32", cfg.device_kind)
    warmup = time_steps(feed, step, batches[:1])[0][0]
    seconds, losses = time_steps(feed, step, batches)
    return {
        "framework": idiom.FRAMEWORK,
        "weights_hash": weightslib.fingerprint(weights),
        "warmup_s": warmup,
        "steps_s": seconds,
        "losses": losses,
        "profile": profile(idiom, cfg, feed, step, dataset),
    }


def profile(idiom, cfg: RunConfig, feed, step, dataset: datalib.Dataset) -> dict | None:
    """cfg.profile more steps after the timed ones, inside the framework's profiler, their batches those a suite
    run profiles: the record a suite run makes (common/profiling.py summary), or None without `profile`."""
    if not cfg.profile:
        return None
    folder = profiling.traces_folder()
    batches = batches_after_training(cfg, dataset, cfg.timed_steps, cfg.profile)
    with idiom.record(cfg, folder) as recording:
        start = time.perf_counter()
        time_steps(feed, step, batches)
        wall = time.perf_counter() - start
    return profiling.summary(recording, folder, wall, len(batches))


def trace(idiom, cfg: RunConfig, steps: int, dtype: str) -> dict:
    """The losses of `steps` SGD steps from the run's weights on the first batches of epoch 0, in `dtype`."""
    dataset = datalib.load(cfg)
    weights = weightslib.for_run(cfg)
    batches = datalib.train_batches(dataset, cfg.batch_size, cfg.seed, 0)[:steps]
    weights = {k: v.astype(dtype) for k, v in weights.items()}
    batches = [(x.astype(dtype), y) for x, y in batches]
    feed, step = idiom.training_step(weights, cfg.lr, dtype, cfg.device_kind)
    return {"framework": idiom.FRAMEWORK, "losses": time_steps(feed, step, batches)[1]}


def main(idiom, argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = RunConfig.load(args.config)
    if args.trace:
        result = trace(idiom, cfg, args.trace, args.dtype)
    else:
        result = measure(idiom, cfg)
    write_atomic(args.result, lambda f: json.dump(result, f))
    return 0
