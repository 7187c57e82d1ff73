"""A backend: what every framework does the same way, written once (`Backend`), on what each framework provides,
said once (common/backend_interface.py's Protocols), in the same module names everywhere.

A backend package builds one object from its own modules and its framework's profiler, and nothing else:

    BACKEND = Backend(name, models, parallel, strategies, environment, distributed, profiler, switches)

The worker (`python -m backends.<name>`, common/worker.py), the check worker (common/measurements.py) and the
tests take that object. It holds what is the same everywhere: the refusals, the engine's session, a trainer
set up for a run (`make_trainer`), a run (`train`) and the equivalence probes, each a job that runs where its
strategy runs (`distributed.launch`: in this process, or in the strategy's own processes), `predict`, the
initial weights. What differs between frameworks stays in the backend's modules (models.py, parallel.py,
strategies.py, environment.py, distributed.py), in its framework's profiler, which the framework's idiom
(benchmarks/idioms/) records with too, and in its `Switches`: common/backend_interface.py says what each provides.

Refusals that backend.toml states (an unknown strategy, a CUDA-only strategy on the CPU, a BatchNorm mode
or several nodes a strategy does not run, a speed lever the backend does not offer) are read from it here,
by the same function the harness's planner uses (common.manifest.strategy_refusal), so the two never
disagree. A run or a probe is checked once, where it enters (the worker, a probe), before any engine joins.
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field

import numpy as np

from common import architectures, manifest
from common import data as datalib
from common import levers as leverlib
from common.after_training import exchange_rounding
from common.backend_interface import (
    Distributed,
    Environment,
    Models,
    Parallel,
    Profiling,
    Strategies,
    Switches,
    Weights,
)
from common.config import RunConfig, datasets_for
from common.errors import Unsupported
from common.levers import Levers
from common.loop import run_training
from common.nodes import NodeSpec
from common.trainer import PROBES, Trainer
from common.weights import for_run as weights_for_run
from common.weights import init_canonical

# ---------------------------------------------------------------- what every backend does the same way


@dataclass(frozen=True)
class Probe:
    """One equivalence measurement: `strategy` training `model` on `devices` devices (global), with its
    BatchNorm mode, device kind and dtype ("float32", or "float64": the same strategy code with every
    parameter, statistic and batch in float64). `options`: backend options (backend.toml's [options]);
    `levers`: the run's speed levers; `nodes`: one node of several, where it is one."""

    strategy: str
    model: str
    devices: int
    bn: str = "local"
    device_kind: str = "cpu"
    dtype: str = "float32"
    options: dict = field(default_factory=dict)
    levers: Levers = Levers()
    nodes: NodeSpec = NodeSpec()

    def config(self, backend: str, batch_size: int, lr: float) -> RunConfig:
        """The run config of this probe on `backend`, validated (bad values raise ConfigError)."""
        # The batches are the caller's: the config names a dataset of the images the model takes.
        dataset = datasets_for(self.model)[0]
        return RunConfig(
            backend=backend,
            strategy=self.strategy,
            devices=self.devices,
            device_kind=self.device_kind,
            model=self.model,
            dataset=dataset,
            batch_size=batch_size,
            lr=lr,
            bn=self.bn,
            options=dict(self.options or {}),
            levers=self.levers,
            nodes=self.nodes,
        ).validate()


def check_supported(cfg: RunConfig, own_refusal=None, dtype: str = "float32") -> None:
    """Unsupported with one line if `cfg` cannot run: first what backend.toml says, then the dtype rule of
    the equivalence probes (common.levers.check_dtype), then `own_refusal(cfg, dtype)`, the backend's own
    refusals (what its framework sees here: GPUs, a compiler, a GPU's capabilities)."""
    declared = manifest.load(cfg.backend)
    if reason := manifest.strategy_refusal(
        declared, cfg.strategy, cfg.device_kind, cfg.bn, cfg.nodes.count
    ):
        raise Unsupported(reason)
    if reason := leverlib.check(cfg):  # the levers backend.toml declares; TF32 on the CPU
        raise Unsupported(reason)
    leverlib.check_dtype(dtype, cfg)
    if own_refusal is not None and (reason := own_refusal(cfg, dtype)):
        raise Unsupported(reason)


class Backend:
    """One framework's backend: its modules (common/backend_interface.py's Protocols), its switches, and the entry
    points that are the same for every framework."""

    def __init__(
        self,
        name: str,
        models: Models,
        parallel: Parallel,
        strategies: Strategies,
        environment: Environment,
        distributed: Distributed,
        profiling: Profiling,
        switches: Switches = Switches(),
    ):
        self.name = name
        self.models = models
        self.parallel = parallel
        self.strategies = strategies
        self._environment = environment
        self.distributed = distributed
        self.profiling = profiling
        self.configure = switches.configure
        self.computing_in = switches.computing_in
        # The sessions open in this process. The check worker holds one around its whole job and every probe
        # of the job opens its own inside it, which must join nothing again.
        self._sessions = 0

    def __reduce__(self):
        # A job sent to a strategy's own processes is a bound method of this object: they find the object by
        # its package, as they find any function of a backend, rather than receive a copy of its modules.
        return backend_named, (self.name,)

    def check_supported(self, cfg: RunConfig, dtype: str = "float32") -> None:
        check_supported(cfg, self._environment.refusal, dtype)

    def environment(self, cfg: RunConfig) -> dict:
        """What the run runs on: its environment record (common.sysinfo.environment), described without
        setting anything."""
        return self._environment.environment(cfg)

    @contextlib.contextmanager
    def session(self, cfg: RunConfig):
        """The strategy's engine joined while the block runs (jax.distributed, MXNet's ps-lite; torch's ranks
        join their process group at each launch), and left when the outermost session ends: cleanly, or
        dropped after a failure, when the peers may be gone. Nothing joins anywhere else: not in
        environment(), not in a trainer's constructor."""
        if self._sessions == 0:
            self.distributed.join(cfg)
        self._sessions += 1
        clean = False
        try:
            yield
            clean = True
        finally:
            self._sessions -= 1
            if self._sessions == 0:
                self.distributed.leave(clean)

    def train(self, cfg: RunConfig) -> dict:
        """Train as the run config says, where the strategy runs; the metrics part of a result. The caller
        has checked `cfg` and holds its session (the worker records the environment in between)."""
        return self.distributed.launch(cfg, self.train_job)

    def make_trainer(self, cfg: RunConfig, weights: Weights, dtype: str = "float32") -> Trainer:
        """The trainer of a checked `cfg` in this process (ddp: this rank's, inside its process group), with
        the framework's switches set, reset to `weights`; a float64 one is used inside computing_in(dtype)."""
        self.configure(cfg)
        trainer = self.strategies.TRAINERS[cfg.strategy](cfg, weights, dtype)
        trainer.reset()
        return trainer

    # ---------------------------------------------------------------- the equivalence probes

    def gradients(self, probe: Probe, weights: Weights, x, y) -> tuple[float, Weights]:
        """(mean loss of the global batch, its gradient per trainable canonical parameter) at `weights`, as
        the strategy computes it: every device on its shard, then the strategy's own reduction; device 0's
        copy."""
        cfg = probe.config(self.name, len(y), 1.0)  # (the learning rate is not used)
        return self._measure(cfg, weights, [(x, y)], "gradients", probe.dtype)

    def train_trace(self, probe: Probe, weights: Weights, batches: list, lr: float) -> dict:
        """SGD steps from `weights`: {"first": canonical weights after step 1, "final": after the last step,
        "losses": each step's global mean loss, from its own forward pass (before its update)}. The weights
        hold the BatchNorm running statistics too, averaged across replicas."""
        cfg = probe.config(self.name, len(batches[0][1]), lr)
        return self._measure(cfg, weights, batches, "trace", probe.dtype)

    def train_steps(self, probe: Probe, weights: Weights, batches: list, lr: float) -> Weights:
        """The canonical weights after len(batches) SGD steps from `weights` (train_trace's "final")."""
        return self.train_trace(probe, weights, batches, lr)["final"]

    def float64_gradients(self, model: str, weights: Weights, x, y) -> tuple[float, Weights]:
        """(mean loss, canonical gradients) of one batch on one CPU device, computed in float64 by the
        backend's reference strategy: `harness check` compares it with torch's, and agreement to ~1e-12
        shows the model, loss and BatchNorm are the same math, whatever float32 rounding does on top."""
        return self.gradients(
            Probe(self.strategies.REFERENCE, model, 1, dtype="float64"), weights, x, y
        )

    def float64_reference(
        self,
        model: str,
        devices: int,
        weights: Weights,
        batches: list,
        lr: float,
        bn: str = "local",
        device_kind: str = "cpu",
    ) -> tuple[float, Weights, dict]:
        """The math every strategy implements, in float64 by the reference strategy (on the CPU unless
        `device_kind` says otherwise): (mean loss, gradients) of the first batch and the trace of SGD steps
        (`sync` BatchNorm: 1-device training). `harness check` measures each float32 implementation's
        distance from it, to tell rounding apart from different math, and its own float64 rounding with it
        (common/measurements.py's float64 floor, on the devices the strategies ran on)."""
        probe = Probe(
            self.strategies.REFERENCE,
            model,
            1 if bn == "sync" else devices,
            device_kind=device_kind,
            dtype="float64",
        )
        loss, grads = self.gradients(probe, weights, *batches[0])
        return loss, grads, self.train_trace(probe, weights, batches, lr)

    def run_probes(self, probe: Probe, weights: Weights, runs: list, lr: float) -> list:
        """Several probes of one configuration in one launch of its processes (a strategy with ranks of its own
        starts them once, not once per probe): `runs` is a list of (probe name, dtype, batches), each on a fresh
        trainer from `weights`; their values in order. Every dtype is checked before anything runs."""
        cfg = probe.config(self.name, len(runs[0][2][0][1]), lr)
        for dtype in dict.fromkeys(dtype for _, dtype, _ in runs):
            self.check_supported(cfg, dtype)
        runs = [(name, dtype, as_dtype(batches, dtype)) for name, dtype, batches in runs]
        with self.session(cfg):
            return self.distributed.launch(cfg, self.probes_job, (weights, runs))

    def _measure(self, cfg: RunConfig, weights: Weights, batches: list, probe: str, dtype: str):
        """common.trainer's PROBES[probe] of a fresh trainer, checked, inside the engine's session."""
        self.check_supported(cfg, dtype)  # before the weights are read or an engine is joined
        batches = as_dtype(batches, dtype)
        with self.session(cfg):
            return self.distributed.launch(cfg, self.probe_job, (weights, batches, probe, dtype))

    # ---------------------------------------------------------------- the jobs, where the strategy runs

    def train_job(self, cfg: RunConfig, rank: int, payload=None) -> dict:
        """One process of a run: train as the run config says."""
        weights, dataset = weights_for_run(cfg), datalib.load(cfg)
        trainer = self.make_trainer(cfg, weights)
        metrics = run_training(trainer, cfg, dataset, self.profiling)
        if cfg.epochs and cfg.levers.grad_dtype != leverlib.PLAIN["grad_dtype"]:
            exact = self.make_trainer(
                cfg.with_levers(grad_dtype=leverlib.PLAIN["grad_dtype"]), weights
            )
            metrics["rounding"] = exchange_rounding(trainer, exact, cfg, dataset)
        return metrics

    def probe_job(self, cfg: RunConfig, rank: int, payload: tuple):
        """One process of an equivalence probe: payload (weights, batches, probe name, dtype), computed in
        `dtype`."""
        weights, batches, probe, dtype = payload
        with self.computing_in(dtype):
            return PROBES[probe](self.make_trainer(cfg, weights, dtype), batches)

    def probes_job(self, cfg: RunConfig, rank: int, payload: tuple) -> list:
        """One process of several probes (run_probes): payload (weights, [(probe name, dtype, batches)])."""
        weights, runs = payload
        return [
            self.probe_job(cfg, rank, (weights, batches, name, dtype))
            for name, dtype, batches in runs
        ]

    # ---------------------------------------------------------------- models

    def predict(
        self,
        model: str,
        weights: Weights,
        x,
        train: bool = False,
        dtype: str = "float32",
    ) -> np.ndarray:
        """Logits (numpy) of `model` with canonical `weights` on a numpy NCHW batch, on one CPU device.
        train=True normalises with the batch's own statistics (BatchNorm in training mode; the running
        statistics it would update are dropped), else with the running ones. dtype "float64" computes in
        float64."""
        if dtype not in leverlib.DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(leverlib.DTYPES)}")
        return self.models.predict(model, weights, x, train, dtype)

    def initial_weights(self, model: str, seed: int = 0) -> Weights:
        """The canonical initial weights of `model` (common/weights.py), as every run starts from. Every
        backend's network takes them under the same names and shapes (its load_canonical refuses others)."""
        return init_canonical(architectures.spec(model), seed)

    def param_count(self, model: str) -> int:
        """Trainable parameters of `model` as the framework's network counts them."""
        return self.models.count_params(self.models.build(model))


def as_dtype(batches: list, dtype: str) -> list:
    """The batches' images in `dtype` (float32 -> float64 is exact), labels as they are."""
    return [(np.asarray(x, dtype=dtype), y) for x, y in batches]


def backend_named(name: str) -> Backend:
    """backends.<name>.BACKEND: the object a job sent to a strategy's process belongs to (Backend.__reduce__)."""
    return importlib.import_module(f"backends.{name}").BACKEND
