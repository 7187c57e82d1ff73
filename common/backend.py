"""A backend's entry points, written once for every framework.

A backend package builds one `Backend` from its own modules and exports its bound methods: the worker's
`run`, the equivalence probes (`gradients`, `train_trace`, `train_steps`, `float64_gradients`,
`float64_reference`), `predict`, `initial_weights`, `param_count`, `check_supported` and `session`. What differs
between frameworks stays in the backend, in the same names everywhere:

  models.py      build(model), count_params(net), predict(model, weights, x, train, dtype)
  strategies.py  TRAINERS, REFERENCE (the strategy the float64 gradients run), make_trainer(cfg, weights,
                 dtype), train(cfg) (a run), measure(cfg, weights, batches, probe, dtype) (a probe: in this
                 process, or in the strategy's own processes)
  environment.py environment(cfg) (the run's record), refusal(cfg, dtype) (the refusals backend.toml cannot
                 state)
  distributed.py join(cfg) and leave(clean): the engine across processes and nodes, which `session` holds
                 for as long as a run or a check lasts

Refusals that backend.toml states (an unknown strategy, a CUDA-only strategy on the CPU, a BatchNorm mode
or several nodes a strategy does not run, a speed lever the backend does not offer) are read from it here,
by the same function the harness's planner uses (common.manifest.strategy_refusal), so the two never
disagree.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import ModuleType

import numpy as np

from common import architectures, manifest
from common import levers as leverlib
from common.config import RunConfig, datasets_for
from common.errors import Unsupported
from common.weights import init_canonical


@dataclass(frozen=True)
class Probe:
    """One equivalence measurement: `strategy` training `model` on `devices` devices (global), with its
    BatchNorm mode, device kind and dtype ("float32", or "float64": the same strategy code with every
    parameter, statistic and batch in float64). `options`: backend options (backend.toml's [options]);
    `levers`: RunConfig's other fields (precision, compile, channels_last, resident_data, prefetch, and
    nodes, node_rank, coordinator for one node of several)."""

    strategy: str
    model: str
    devices: int
    bn: str = "local"
    device_kind: str = "cpu"
    dtype: str = "float32"
    options: dict = field(default_factory=dict)
    levers: dict = field(default_factory=dict)

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
            **(self.levers or {}),
        ).validate()


def check_supported(cfg: RunConfig, own_refusal=None, dtype: str = "float32") -> None:
    """Unsupported with one line if `cfg` cannot run: first what backend.toml says, then the dtype rule of
    the equivalence probes (common.levers.check_dtype), then `own_refusal(cfg, dtype)`, the backend's own
    refusals (what its framework sees here: GPUs, a compiler, a GPU's capabilities)."""
    declared = manifest.load(cfg.backend)
    if reason := manifest.strategy_refusal(
        declared, cfg.strategy, cfg.device_kind, cfg.bn, cfg.nodes
    ):
        raise Unsupported(reason)
    if reason := leverlib.check(cfg):  # the levers backend.toml declares; TF32 on the CPU
        raise Unsupported(reason)
    leverlib.check_dtype(dtype, cfg)
    if own_refusal is not None and (reason := own_refusal(cfg, dtype)):
        raise Unsupported(reason)


# The entry points a Backend gives its backend package, as backends.<name>.<entry point> (the package's
# module __getattr__ asks Backend.entry_point for them).
ENTRY_POINTS = (
    "initial_weights",
    "param_count",
    "predict",
    "run",
    "gradients",
    "train_trace",
    "train_steps",
    "float64_gradients",
    "float64_reference",
    "check_supported",
    "session",
)
# What a backend package exports (its __all__), in this order: its own names, then the entry points.
# tests/backends/test_contract.py holds every backend to it.
INTERFACE = (
    "NAME",
    "resnet18",
    "lenet",
    "resnet50",
    "devices",
    "split",
    "allreduce",
    "environment",
    "TRAINERS",
    "array",
    "to_numpy",
    "device_of",
    "BACKEND",
    *ENTRY_POINTS,
)


class Backend:
    """The entry points of one backend, from its modules (see the module's doc)."""

    def __init__(
        self,
        name: str,
        models: ModuleType,
        strategies: ModuleType,
        distributed: ModuleType,
        refusal,
    ):
        self.name = name
        self.models = models
        self.strategies = strategies
        self.distributed = distributed
        # environment.py's refusal: what the framework cannot run here that backend.toml cannot say
        self.refusal = refusal
        # The sessions open in this process: a probe inside a run's session joins nothing again.
        self._sessions = 0

    def entry_point(self, name: str):
        """The bound method `name`, one of ENTRY_POINTS: a backend package's module __getattr__ (PEP 562)."""
        if name not in ENTRY_POINTS:
            raise AttributeError(f"module 'backends.{self.name}' has no attribute {name!r}")
        return getattr(self, name)

    def check_supported(self, cfg: RunConfig, dtype: str = "float32") -> None:
        check_supported(cfg, self.refusal, dtype)

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

    def run(self, cfg: RunConfig) -> dict:
        """Train as the run config says, inside the engine's session; the metrics part of a result."""
        self.check_supported(cfg)  # before the weights are read or an engine is joined
        with self.session(cfg):
            return self.strategies.train(cfg)

    # ---------------------------------------------------------------- the equivalence probes

    def gradients(
        self, probe: Probe, weights: dict[str, np.ndarray], x, y
    ) -> tuple[float, dict[str, np.ndarray]]:
        """(mean loss of the global batch, its gradient per trainable canonical parameter) at `weights`, as
        the strategy computes it: every device on its shard, then the strategy's own reduction; device 0's
        copy."""
        cfg = probe.config(self.name, len(y), 1.0)  # (the learning rate is not used)
        return self._measure(cfg, weights, [(x, y)], "gradients", probe.dtype)

    def train_trace(
        self, probe: Probe, weights: dict[str, np.ndarray], batches: list, lr: float
    ) -> dict:
        """SGD steps from `weights`: {"first": canonical weights after step 1, "final": after the last step,
        "losses": each step's global mean loss, from its own forward pass (before its update)}. The weights
        hold the BatchNorm running statistics too, averaged across replicas."""
        cfg = probe.config(self.name, len(batches[0][1]), lr)
        return self._measure(cfg, weights, batches, "trace", probe.dtype)

    def train_steps(
        self, probe: Probe, weights: dict[str, np.ndarray], batches: list, lr: float
    ) -> dict[str, np.ndarray]:
        """The canonical weights after len(batches) SGD steps from `weights` (train_trace's "final")."""
        return self.train_trace(probe, weights, batches, lr)["final"]

    def float64_gradients(
        self, model: str, weights: dict[str, np.ndarray], x, y
    ) -> tuple[float, dict]:
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
        weights: dict[str, np.ndarray],
        batches: list,
        lr: float,
        bn: str = "local",
        device_kind: str = "cpu",
    ) -> tuple[float, dict, dict]:
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

    def _measure(self, cfg: RunConfig, weights: dict, batches: list, probe: str, dtype: str):
        self.check_supported(cfg, dtype)
        batches = [
            (np.asarray(x, dtype=dtype), y) for x, y in batches
        ]  # float32 -> float64 is exact
        with self.session(cfg):
            return self.strategies.measure(cfg, weights, batches, probe, dtype)

    # ---------------------------------------------------------------- models

    def predict(
        self,
        model: str,
        weights: dict[str, np.ndarray],
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

    def initial_weights(self, model: str, seed: int = 0) -> dict[str, np.ndarray]:
        """The canonical initial weights of `model` (common/weights.py), as every run starts from. Every
        backend's network takes them under the same names and shapes (its load_canonical refuses others)."""
        return init_canonical(architectures.spec(model), seed)

    def param_count(self, model: str) -> int:
        """Trainable parameters of `model` as the framework's network counts them."""
        return self.models.count_params(self.models.build(model))
