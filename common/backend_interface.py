"""What a backend provides, said once: a Protocol for each module a backend package hands common/backend.py's
`Backend`, in the same module names everywhere, and `Switches`, the framework's process-wide switches. What differs
between frameworks stays in these modules, and in the framework's profiler, which its idiom (benchmarks/idioms/)
records with too:

  models.py       build(model), count_params(net), predict(model, weights, x, train, dtype)
  parallel.py     devices, split, allreduce (d2l's vocabulary); array, to_numpy, device_of (for the tests)
  strategies.py   TRAINERS (one common.trainer.Trainer per strategy), REFERENCE (the strategy of the float64
                  reference)
  environment.py  environment(cfg) (the run's record), refusal(cfg, dtype) (the refusals backend.toml cannot
                  state)
  distributed.py  join(cfg) and leave(clean): the engine across processes and nodes, which `session` holds for
                  as long as a run or a check lasts; launch(cfg, job, payload): where a strategy runs
  profilers/<name>.py
                  record(cfg, folder, rank): the framework's profiler around the --profile steps;
                  matmul(cfg, n, dtype): one matrix product to time, the host's measured peak
and, where the framework has process-wide switches, `Switches`: configure(cfg) before a trainer is built (its
precision), computing_in(dtype) while a probe computes in a dtype.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from common.config import RunConfig
from common.profiling import Recording
from common.trainer import Trainer

Weights = dict[str, np.ndarray]  # canonical weights: torch's names and layouts, numpy arrays
# A run or a probe as a strategy's process runs it: job(cfg, rank, payload) -> its value.
Job = Callable[[RunConfig, int, Any], Any]


# (runtime_checkable: tests/backends/test_contract.py holds every backend's modules to them)


@runtime_checkable
class Models(Protocol):
    """models.py: the networks, by the names common/architectures.py gives them."""

    def build(self, model: str) -> Any: ...

    def count_params(self, net: Any) -> int: ...

    def predict(
        self, model: str, weights: Weights, x: np.ndarray, train: bool, dtype: str
    ) -> np.ndarray: ...


@runtime_checkable
class Parallel(Protocol):
    """parallel.py: d2l's vocabulary, and a framework array as the tests make and read one."""

    def devices(self, n: int, kind: str = "cpu") -> list: ...

    def split(self, X: np.ndarray, y: np.ndarray, devs: list) -> tuple[list, list]: ...

    def allreduce(self, data: list) -> list: ...

    def array(self, values: np.ndarray, device: Any) -> Any: ...

    def to_numpy(self, a: Any) -> np.ndarray: ...

    def device_of(self, a: Any) -> Any: ...


@runtime_checkable
class Strategies(Protocol):
    """strategies.py: the trainer class of each strategy, and the strategy of the float64 reference."""

    TRAINERS: dict[str, type[Trainer]]
    REFERENCE: str


@runtime_checkable
class Environment(Protocol):
    """environment.py: what a run runs on, and what the framework cannot run here."""

    def environment(self, cfg: RunConfig) -> dict: ...

    def refusal(self, cfg: RunConfig, dtype: str = "float32") -> str | None: ...


@runtime_checkable
class Distributed(Protocol):
    """distributed.py: the engine across processes and nodes, and where each strategy runs."""

    def join(self, cfg: RunConfig) -> None: ...

    def leave(self, clean: bool = True) -> None: ...

    def launch(self, cfg: RunConfig, job: Job, payload: Any = None) -> Any: ...


@runtime_checkable
class Profiling(Protocol):
    """profilers/<name>.py: the framework's own profiler, and its matrix product (common/profiling.py,
    common/loop.py)."""

    def record(
        self, cfg: RunConfig, folder: Path, rank: int
    ) -> AbstractContextManager[Recording]: ...

    def matmul(self, cfg: RunConfig, n: int, dtype: str) -> Callable[[], None]: ...


def no_switch(cfg: RunConfig) -> None:
    """A framework with nothing to set for a trainer (MXNet settles its own before it is imported)."""


@dataclass(frozen=True)
class Switches:
    """A framework's process-wide switches, where it has them: `configure(cfg)` before a trainer of `cfg` is
    built (float32 math as --precision says), `computing_in(dtype)` around a probe that computes in `dtype`
    (a framework that makes float64 arrays float32 unless told)."""

    configure: Callable[[RunConfig], None] = no_switch
    computing_in: Callable[[str], AbstractContextManager] = contextlib.nullcontext
