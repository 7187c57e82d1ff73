"""The trainer: what every strategy of every backend is, in one vocabulary.

Each backend's strategies.py holds only subclasses of `Trainer`. Their public methods are the ones
below, defined in this order (helpers are private, with a leading underscore); a test compares every
backend's classes with `METHODS`. The ones every strategy must define are abstract: a trainer that lacks
one cannot be made. The glossary (docs/ARCHITECTURE.md) says the same in prose:

  __init__(cfg, weights, dtype)  build the replicas / the wrapped model; `dtype` "float32", or "float64"
                                 for the equivalence checks (the same strategy code with every
                                 parameter, statistic, batch and result in float64)
  reset()                        load the run's initial weights (the loop calls it after the warm-up)
  place(x, y)                    a global numpy batch laid out on the devices as the step takes it
                                 (one shard per device, or the whole batch where the framework scatters)
  pin(batches)                   an epoch's numpy batches made ready, before its timer, for put()'s
                                 asynchronous copies: in page-locked host memory where the framework copies
                                 from it (torch on CUDA, as DataLoader's pin_memory does), else as they are
  put(x, y)                      place(), queued ahead of its step: asynchronous copies where the device
                                 has them, not waited for (--prefetch); nothing but the copies
  stage(batches)                 put() every batch and wait for the copies (--resident-data)
  step(x, y)                     one synchronous SGD step on a global batch (numpy, or from put/stage);
                                 returns the step's handles, (loss sum, correct) not yet read back
  reduce_gradients(x, y)         the step's first half: forward and backward of every device on its
                                 shard, then the strategy's reduction; returns the step's handles
  update()                       the step's second half: SGD with the reduced gradients
  collect(handles)               (loss sum, correct) over a list of steps' handles, every device and rank
  sync()                         device barrier: returns when every queued operation is done
  slowest(seconds)               the largest `seconds` across ranks (one process: itself)
  allreduce_seconds(v, r)        the strategy's gradient reduction of `v` float32 per device, timed `r` times
  allreduce_op(values)           that reduction as a call on buffers made once, ahead of the timing
  average_bn_statistics()        every replica's BatchNorm running statistics replaced by their mean
                                 (the evaluation policy: every replica evaluates the same model)
  canonical()                    the weights as canonical numpy arrays, device 0's parameters with the
                                 running statistics averaged across replicas (as evaluated); every process
                                 calls it (a sharded strategy gathers its shards, a collective)
  canonical_gradients()          the reduced gradient of the global *mean* loss, device 0's copy (a sharded
                                 strategy's shards gathered whole), by canonical name (trainable
                                 parameters), after reduce_gradients()
  evaluate(batches)              (correct, total) on the test batches, after average_bn_statistics()
  param_count()                  trainable and statistic values of the model
  memory()                       peak device memory where the framework exposes it ({} otherwise); a
                                 sharded strategy adds the parameters one device holds (parameters_mb)
  compiles()                     programs the framework has compiled in this process so far (None where it
                                 does not count them): the loop tells a compile inside a timed epoch by it

Below the class: the two probes of the equivalence API, the same for every backend.
"""

from __future__ import annotations

import abc
import collections
import time
from typing import Any, Iterable

import numpy as np

from common.config import RunConfig

# The public methods of a trainer, in the order every strategies.py defines them.
METHODS = (
    "__init__",
    "reset",
    "place",
    "pin",
    "put",
    "stage",
    "step",
    "reduce_gradients",
    "update",
    "collect",
    "sync",
    "slowest",
    "summed",
    "allreduce_seconds",
    "allreduce_op",
    "average_bn_statistics",
    "canonical",
    "canonical_gradients",
    "evaluate",
    "param_count",
    "memory",
    "compiles",
)


class Trainer(abc.ABC):
    """The base every strategy subclasses: the shared state and the methods that are the same everywhere.
    A subclass supplies what its framework does differently (the abstract methods) and nothing else."""

    rank = 0  # the process's rank; only multi-process strategies change it, and only rank 0 reports

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        self.cfg, self.weights, self.dtype = cfg, weights, dtype
        self.n_devices = cfg.devices

    @abc.abstractmethod
    def reset(self) -> None: ...

    @abc.abstractmethod
    def place(self, x, y): ...

    def pin(self, batches: list) -> list:
        """As they are: a framework whose copies need page-locked host memory overrides it."""
        return batches

    def put(self, x, y):
        """place() now: a backend with asynchronous copies overrides it."""
        return self.place(x, y)

    def stage(self, batches: list) -> list:
        staged = [self.put(x, y) for x, y in batches]
        self.sync()
        return staged

    def step(self, x, y) -> Any:
        handles = self.reduce_gradients(x, y)
        self.update()
        return handles

    @abc.abstractmethod
    def reduce_gradients(self, x, y) -> Any: ...

    @abc.abstractmethod
    def update(self) -> None: ...

    @abc.abstractmethod
    def collect(self, handles: list) -> tuple[float, float]: ...

    @abc.abstractmethod
    def sync(self) -> None: ...

    def slowest(self, seconds: float) -> float:
        return seconds

    def summed(self, values: list[float]) -> list[float]:
        """`values` added over the run's processes, the same on every one (the energy each process read)."""
        return list(values)

    def allreduce_seconds(self, values: int, repeats: int) -> list[float]:
        """After one untimed call, `repeats` reductions each between two barriers; the slowest rank's seconds."""
        return time_calls(self, self.allreduce_op(values), repeats)

    @abc.abstractmethod
    def allreduce_op(self, values: int): ...

    def average_bn_statistics(self) -> None:
        """Nothing to average with one copy of the model."""

    @abc.abstractmethod
    def canonical(self) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def canonical_gradients(self) -> dict[str, np.ndarray]: ...

    @abc.abstractmethod
    def evaluate(self, batches: Iterable) -> tuple[int, int]: ...

    @abc.abstractmethod
    def param_count(self) -> int: ...

    def memory(self) -> dict:
        return {}

    def compiles(self) -> int | None:
        """Not counted: a framework that compiles says how often (common/loop.py records it)."""
        return None


# ----------------------------------------------------------------------- driving a trainer


def ready(trainer: Trainer, batches: list, cfg) -> list:
    """A timed part's batches made ready before its timer starts: staged on the devices (--resident-data), else
    pinned for put()'s asynchronous copies (--prefetch N), else as they are (--prefetch 0: step() copies them).
    So the timer covers the copies and the steps, and no feeding work besides."""
    if cfg.levers.resident_data:
        return trainer.stage(batches)
    if cfg.levers.prefetch:
        return trainer.pin(batches)
    return batches


def feed(trainer: Trainer, batches: list, cfg, clock: "FeedClock | None" = None) -> Iterable:
    """The batches as step() takes them: staged ones (--resident-data) as they are, numpy ones put on the
    devices cfg.levers.prefetch batches ahead of their step (0: as they are, step() copies them itself). `clock`
    adds up the host's seconds in put()."""
    if cfg.levers.resident_data or not cfg.levers.prefetch:
        return iter(batches)
    return prefetched(trainer, batches, cfg.levers.prefetch, clock)


class FeedClock:
    """The host's seconds spent putting batches (trainer.put) inside a timed part: what feeding costs the host
    between the steps, the figure that shows a slow input path (common/loop.py records it per epoch)."""

    def __init__(self):
        self.seconds = 0.0

    def put(self, trainer: Trainer, x, y):
        start = time.perf_counter()
        placed = trainer.put(x, y)
        self.seconds += time.perf_counter() - start
        return placed


def prefetched(
    trainer: Trainer, batches: Iterable, depth: int, clock: FeedClock | None = None
) -> Iterable:
    """Each batch trainer.put() `depth` batches before it is yielded: when the step of batch i is queued,
    the copies of batches i+1..i+depth are queued too, so the device copies while it computes."""
    clock = clock or FeedClock()
    ahead = collections.deque()
    for x, y in batches:
        ahead.append(clock.put(trainer, x, y))
        if len(ahead) > depth:
            yield ahead.popleft()
    while ahead:
        yield ahead.popleft()


def time_calls(trainer: Trainer, call, repeats: int) -> list[float]:
    """`call()` once untimed (allocation, compilation), then `repeats` times, each between two device
    barriers; the slowest rank's seconds for each. The timing rule of the allreduce figure; `call`
    must leave its work where `trainer.sync()` waits for it (or wait for it itself)."""
    call()
    seconds = []
    for _ in range(repeats):
        trainer.sync()
        start = time.perf_counter()
        call()
        trainer.sync()
        seconds.append(trainer.slowest(time.perf_counter() - start))
    return seconds


# ----------------------------------------------------------------------- the equivalence probes


def fed(trainer: Trainer, batches: list) -> Iterable:
    """The batches as training feeds them to step(): staged (--resident-data), else pinned and put --prefetch
    ahead."""
    return feed(trainer, ready(trainer, batches, trainer.cfg), trainer.cfg)


def first_gradients(trainer: Trainer, batches: list) -> tuple[float, dict[str, np.ndarray]]:
    """(mean loss, canonical gradients) of the first batch, as the strategy reduces them, from a reset trainer."""
    x, y = next(iter(fed(trainer, batches[:1])))
    loss_sum, _ = trainer.collect([trainer.reduce_gradients(x, y)])
    return loss_sum / len(batches[0][1]), trainer.canonical_gradients()


def trace(trainer: Trainer, batches: list) -> dict:
    """SGD steps from a reset trainer: {"first": canonical weights after step 1, "final": after the last,
    "losses": every step's global mean loss, from its own forward pass (before its update)}. After one step the
    last weights are the first, the same arrays: a process that sends them back, and the measurement file, carry
    them once."""
    size = len(batches[0][1])
    losses, first = [], None
    for x, y in fed(trainer, batches):
        losses.append(trainer.collect([trainer.step(x, y)])[0] / size)
        if first is None:
            first = trainer.canonical()
    final = first if len(losses) == 1 else trainer.canonical()
    return {"first": first, "final": final, "losses": losses}


PROBES = {"gradients": first_gradients, "trace": trace}
