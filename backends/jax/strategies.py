"""JAX strategies, each a Trainer for common/loop.py.

Same math in both: one plain SGD step (optax.sgd, no momentum) on the mean cross-entropy
of the *global* batch of B examples: each device sums the losses of its B/k examples,
the gradient is the sum over devices divided by B.
  pmap      jax.pmap of the whole step over a leading device axis; every device keeps its
            own copy of parameters and optimizer state; the gradients are added with lax.psum.
  sharding  jax.jit over a device Mesh: parameters replicated (NamedSharding P()), the batch
            split along its first axis (P("devices")). The forward pass is a jax.shard_map,
            so each device computes on its own shard; the loss is lax.psum'ed there, and
            jax.grad through the shard_map yields the global gradient (XLA inserts the
            all-reduce); the optax update runs on the replicated parameters.
BatchNorm (--bn): "local", inside pmap and shard_map every device normalises with its own
shard's statistics (as the seeds do; plain jit over a batch-sharded array would normalise
over the global batch instead). "sync", BatchNorm(axis_name=AXIS) (models.py) lax.pmean's the
batch statistics over the pmap axis / the shard_map mesh axis, so they are the global
batch's and k-device training is 1-device training. Either way the running statistics
(torch's update: momentum 0.1, unbiased variance) are kept per device, with a leading device
axis, and averaged with lax.pmean before evaluation and in `canonical`, so every replica
evaluates the same model.
Gradients: each strategy's step is its `gradients` part (the reduced gradient of the
global mean loss, as that strategy computes it) followed by the same optax update; the
equivalence API (`gradients`, `train_trace`, `train_steps`) runs those same parts, in float32
or, with dtype="float64", the same code with jax_enable_x64 set for the call: parameters,
BatchNorm statistics, batches, activations, loss, psum / pmean and the SGD update in float64.
Timing: the step is compiled on its first call (the loop's warm-up step); `step` only
queues work and returns device arrays, `sync` blocks on them; it donates the state it replaces.
`put` (--prefetch) and `stage` (--resident-data) place batches on the devices as `step` would,
and `step` takes such batches as they are.
`allreduce_seconds` times the strategy's own collective alone: a pmapped lax.psum, or a
lax.psum in a jax.shard_map under jax.jit over the strategy's mesh.
Levers: --precision bf16 builds the modules with dtype bfloat16 (parameters, gradients,
BatchNorm statistics and SGD in float32); tf32 sets jax_default_matmul_precision and is
refused on CPU devices; --compile changes nothing (every step is compiled already);
--channels-last is refused (XLA chooses layouts itself). A float64 call takes no lever (Unsupported).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import PartitionSpec as P

from backends.jax import models
from backends.jax.environment import configure_precision
from backends.jax.parallel import (AXIS, check_batch, device_axis_sharding, devices, mesh, per_device,
                                   replicated_sharding, stack_on_devices)
from common import data as datalib
from common import levers as leverlib
from common.config import RunConfig
from common.loop import Unsupported, feed, run_training, time_calls
from common.weights import for_run as weights_for_run

DTYPES = {"float32": np.float32, "float64": np.float64}   # of the equivalence API's runs

# The step's (params, batch_stats, opt_state) arguments are donated: XLA writes the new state into the old
# one's buffers instead of allocating a second copy of the model every step (the state is replaced by the
# step's outputs and never read again).
DONATED = (0, 1, 2)


# ------------------------------------------------------------------ per-device math

def local_loss(net, params, stats, x, y):
    """Sum of the cross-entropy over this device's examples; (new BatchNorm stats, loss sum, correct) as aux."""
    logits, new_stats = models.forward(net, {"params": params, "batch_stats": stats}, x, train=True)
    loss_sum = optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()
    correct = jnp.sum(jnp.argmax(logits, axis=-1) == y)
    return loss_sum, (new_stats, loss_sum, correct)


def stacked(tree, devs: list):
    """One copy of every leaf per device, along a leading device axis."""
    k = len(devs)
    return jax.device_put(jax.tree.map(lambda a: np.broadcast_to(a, (k, *np.shape(a))), tree),
                          device_axis_sharding(devs))


def _on_device(a: jax.Array, device) -> jax.Array:
    """The copy of a replicated array that lives on `device`."""
    return next(shard.data for shard in a.addressable_shards if shard.device == device)


def _global_mean(loss_sums, batch_size: int) -> float:
    """The mean loss of a global batch from the per-device loss sums (added in float64)."""
    return float(np.sum(np.asarray(loss_sums), dtype=np.float64)) / batch_size


def _predict_classes(net):
    @jax.jit
    def predict(params, stats, x):
        logits = models.forward(net, {"params": params, "batch_stats": stats}, x, train=False)
        return jnp.argmax(logits, axis=-1)
    return predict


class JaxTrainer:
    """What the strategies share. `state` is (params, batch_stats, opt_state) on the devices;
    subclasses decide how it is laid out (`place`), how a batch is laid out (`place_batch`, and
    `is_placed` to recognise one), how one step runs (`_step`, of which `_gradients` is the
    gradient part), how the BatchNorm statistics are averaged (`_pmean`), how gradients are
    summed over the devices (`allreduce`), and where device 0's copy of the parameters is
    (`params_on_device_0`). `dtype` "float64" (the equivalence API, under jax_enable_x64) makes
    every parameter, statistic, batch and result float64; runs are float32."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], rank: int = 0, dtype: str = "float32"):
        self.cfg, self.weights, self.rank = cfg, weights, 0
        self.dtype = np.dtype(DTYPES[dtype])
        self.n_devices = cfg.devices
        self.devs = devices(cfg.devices, cfg.device_kind)
        self.batch_sharding = device_axis_sharding(self.devs)   # batches: split along axis 0
        self.net = models.build(cfg.model, bn_axis=AXIS if cfg.bn == "sync" else None,
                                **module_dtypes(cfg.precision, dtype))
        self.tx = optax.sgd(cfg.lr)
        self.state = None
        self.last = None          # the latest step's outputs, for sync
        self.predict = _predict_classes(self.net)
        self.initial = models.from_canonical(self.net, weights)   # numpy, flax layouts, self.dtype

    def reset(self) -> None:
        params = self.initial["params"]
        self.state = self.place(params, self.initial["batch_stats"], self.tx.init(params))
        self.last = None

    def step(self, x, y):
        params, stats, opt_state, metrics = self._step(*self.state, *self.on_devices(x, y))
        self.state, self.last = (params, stats, opt_state), metrics
        return metrics

    def on_devices(self, x, y):
        """The batch as the step takes it: a staged one as it is, a numpy one copied to the devices now."""
        if self.is_placed(x, y):
            return x, y
        return self.put(x, y)

    def is_placed(self, x, y) -> bool:
        """Whether (x, y) is a batch `place_batch` made (the layout `label_ndim` tells apart)."""
        return all(isinstance(a, jax.Array) and a.sharding == self.batch_sharding for a in (x, y)) and \
            y.ndim == self.label_ndim

    def put(self, x, y):
        """One batch placed on the devices as the step takes it; jax.device_put returns before the copies
        finish (the flax examples' prefetch_to_device does the same)."""
        return self.place_batch(np.asarray(x), np.asarray(y))

    def stage(self, batches: list) -> list:
        """--resident-data: every (x, y) batch placed on the devices as the step takes it, the copies
        finished when this returns."""
        staged = [self.put(x, y) for x, y in batches]
        jax.block_until_ready(staged)
        return staged

    def allreduce_seconds(self, values: int, repeats: int) -> list[float]:
        """Seconds of each of `repeats` sums over the devices of a float32 buffer of `values` elements per
        device, reduced as this strategy reduces its gradients (see `allreduce`); one untimed call first."""
        buffer = self.allreduce_buffer(values)
        return time_calls(self, lambda: jax.block_until_ready(self.allreduce(buffer)), repeats)

    def allreduce_buffer(self, values: int) -> jax.Array:
        """(devices, values) float32, row i on device i and filled with i + 1; made on the devices."""
        make = jax.jit(lambda: jnp.broadcast_to(jnp.arange(1, self.n_devices + 1, dtype=jnp.float32)[:, None],
                                                (self.n_devices, values)),
                       out_shardings=self.batch_sharding)
        return make()

    def sync(self) -> None:
        jax.block_until_ready((self.state, self.last))

    def gradients(self, x, y) -> tuple[float, dict[str, np.ndarray]]:
        """(global mean loss, canonical gradients) at the current state: the gradient part of the
        step, reduced across the devices as the step reduces it, read from device 0."""
        params, stats, _ = self.state
        grads, (_, loss_sum, _) = self._gradients(params, stats, *self.on_devices(x, y))
        return _global_mean(loss_sum, len(y)), models.to_canonical({"params": self.params_on_device_0(grads)},
                                                                   dtype=self.dtype)

    def collect(self, handles) -> tuple[float, float]:
        """Per-device (loss sum, correct) of every step, read back and added up."""
        host = jax.device_get(handles)
        return (float(sum(np.sum(loss, dtype=np.float64) for loss, _ in host)),
                float(sum(np.sum(correct) for _, correct in host)))

    def averaged_bn_statistics(self):
        """The running statistics with every device's replaced by their mean over the devices."""
        _, stats, _ = self.state
        return self._pmean(stats) if jax.tree.leaves(stats) else stats   # (LeNet has none)

    def average_bn_statistics(self) -> None:
        params, _, opt_state = self.state
        self.state = (params, self.averaged_bn_statistics(), opt_state)

    def evaluate(self, batches) -> tuple[int, int]:
        self.average_bn_statistics()
        params, stats = self.replica_0()
        correct = total = 0
        for x, y in batches:
            classes = self.predict(params, stats, jax.device_put(np.asarray(x, dtype=self.dtype), self.devs[0]))
            correct += int(np.sum(np.asarray(classes) == np.asarray(y)))
            total += len(y)
        return correct, total

    def slowest(self, seconds: float) -> float:
        return seconds

    def param_count(self) -> int:
        return models.count_params(self.net)

    def memory(self) -> dict:
        if self.cfg.device_kind != "gpu":
            return {}
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in self.devs]
        peaks = [p for p in peaks if p is not None]
        return {"peak_device_mb": max(peaks) / 2**20} if peaks else {}

    def canonical(self) -> dict[str, np.ndarray]:
        """Device 0's parameters with the running statistics averaged over the devices (as evaluated),
        leaving the per-device statistics in the training state as they are."""
        params, _, _ = self.state
        return models.to_canonical({"params": self.params_on_device_0(params),
                                    "batch_stats": self.stats_on_device_0(self.averaged_bn_statistics())},
                                   dtype=self.dtype)

    def replica_0(self):
        params, stats, _ = self.state
        return self.params_on_device_0(params), self.stats_on_device_0(stats)

    def stats_on_device_0(self, stats):
        """BatchNorm statistics carry a leading device axis in both strategies."""
        return jax.tree.map(lambda a: per_device(a, self.devs)[0], stats)


class PmapTrainer(JaxTrainer):
    """jax.pmap: the batch, parameters, optimizer state and BatchNorm statistics all carry a
    leading device axis; gradients are summed with lax.psum inside the step."""

    label_ndim = 2   # a placed batch is stacked as (devices, batch / devices, ...)

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], rank: int = 0, dtype: str = "float32"):
        super().__init__(cfg, weights, rank, dtype)
        self._step = jax.pmap(functools.partial(self.device_step, self.net, self.tx, cfg.batch_size),
                              axis_name=AXIS, devices=self.devs, donate_argnums=DONATED)
        self._gradients = jax.pmap(functools.partial(self.device_gradients, self.net, cfg.batch_size),
                                   axis_name=AXIS, devices=self.devs)
        self._pmean = jax.pmap(functools.partial(lax.pmean, axis_name=AXIS), axis_name=AXIS, devices=self.devs)
        # The gradients' collective alone: lax.psum over the pmap axis, row i of the input on device i.
        self.allreduce = jax.pmap(functools.partial(lax.psum, axis_name=AXIS), axis_name=AXIS, devices=self.devs)

    @staticmethod
    def device_gradients(net, batch_size, params, stats, x, y):
        """One device's gradient of its loss sum, psum'ed over the devices and divided by the global batch:
        every device holds the gradient of the global mean loss. (grads, (new stats, loss sum, correct))."""
        grads, aux = jax.grad(local_loss, argnums=1, has_aux=True)(net, params, stats, x, y)
        return jax.tree.map(lambda g: lax.psum(g, AXIS) / batch_size, grads), aux

    @staticmethod
    def device_step(net, tx, batch_size, params, stats, opt_state, x, y):
        """One device's part: the reduced gradients, then the same SGD step everywhere."""
        grads, (stats, loss_sum, correct) = PmapTrainer.device_gradients(net, batch_size, params, stats, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, (loss_sum, correct)

    def place(self, params, stats, opt_state):
        return stacked((params, stats, opt_state), self.devs)

    def place_batch(self, x, y):
        return stack_on_devices(x, y, self.devs, self.dtype)

    def params_on_device_0(self, tree):
        """Every device holds its own copy along the leading device axis."""
        return jax.tree.map(lambda a: per_device(a, self.devs)[0], tree)


class ShardingTrainer(JaxTrainer):
    """jax.jit over a Mesh with NamedSharding: replicated parameters, a batch-sharded global
    batch, and the per-device part of the step (forward, BatchNorm) in a jax.shard_map."""

    label_ndim = 1   # a placed batch is the global one, split along its first axis

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], rank: int = 0, dtype: str = "float32"):
        super().__init__(cfg, weights, rank, dtype)
        self.mesh = mesh(self.devs)
        self.replicated = replicated_sharding(self.devs)
        self.split_rows = device_axis_sharding(self.devs)
        loss = self.sharded_loss(self.net, self.mesh, cfg.batch_size)
        r, s = self.replicated, self.split_rows
        self._step = jax.jit(functools.partial(self.global_step, loss, self.tx),
                             out_shardings=(r, s, r, (s, s)), donate_argnums=DONATED)
        self._gradients = jax.jit(functools.partial(self.global_gradients, loss), out_shardings=(r, (s, s, s)))
        self._pmean = jax.jit(jax.shard_map(functools.partial(lax.pmean, axis_name=AXIS), mesh=self.mesh,
                                            in_specs=P(AXIS), out_specs=P(AXIS)))
        # The gradients' collective alone: lax.psum in a shard_map over the mesh, each device contributing its
        # row, the sum replicated (as the gradients of the replicated parameters are).
        self.allreduce = jax.jit(jax.shard_map(lambda a: lax.psum(a[0], AXIS), mesh=self.mesh,
                                               in_specs=P(AXIS), out_specs=P()))

    @staticmethod
    def sharded_loss(net, mesh, batch_size):
        """The global mean loss as a function of global arrays; the body runs once per device, on its shard.

        BatchNorm statistics come in and go out with a leading device axis of length 1 per device.
        """
        def per_device(params, stats, x, y):
            unstacked = jax.tree.map(lambda a: a[0], stats)
            _, (new_stats, loss_sum, correct) = local_loss(net, params, unstacked, x, y)
            restacked = jax.tree.map(lambda a: a[None], new_stats)
            return lax.psum(loss_sum, AXIS) / batch_size, (restacked, loss_sum[None], correct[None])

        return jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(AXIS), P(AXIS), P(AXIS)),
                             out_specs=(P(), (P(AXIS), P(AXIS), P(AXIS))))

    @staticmethod
    def global_gradients(loss, params, stats, x, y):
        """The gradient of the global mean loss with respect to the replicated parameters: autodiff
        through the shard_map adds the devices' contributions. (grads, (new stats, loss sums, correct))."""
        return jax.grad(loss, has_aux=True)(params, stats, x, y)

    @staticmethod
    def global_step(loss, tx, params, stats, opt_state, x, y):
        grads, (stats, loss_sum, correct) = ShardingTrainer.global_gradients(loss, params, stats, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), stats, opt_state, (loss_sum, correct)

    def place(self, params, stats, opt_state):
        return (jax.device_put(params, self.replicated), stacked(stats, self.devs),
                jax.device_put(opt_state, self.replicated))

    def place_batch(self, x, y):
        check_batch(x, y, self.n_devices)
        return jax.device_put((np.asarray(x, dtype=self.dtype), np.asarray(y, dtype=np.int32)), self.split_rows)

    def params_on_device_0(self, tree):
        """Parameters (and gradients) are replicated: device 0's copy."""
        return jax.tree.map(lambda a: _on_device(a, self.devs[0]), tree)


TRAINERS = {"pmap": PmapTrainer, "sharding": ShardingTrainer}


def check_supported(cfg: RunConfig) -> None:
    if cfg.strategy not in TRAINERS:
        raise Unsupported(f"jax has no strategy {cfg.strategy!r}; it has {', '.join(TRAINERS)}")
    if reason := leverlib.check(cfg):   # backend.toml: no channels-last
        raise Unsupported(reason)
    if cfg.precision == "tf32" and cfg.device_kind != "gpu":
        raise Unsupported("TF32 is a mode of NVIDIA tensor cores; there is none on the CPU")
    devices(cfg.devices, cfg.device_kind)   # Unsupported when JAX sees too few


def module_dtypes(precision: str, dtype: str) -> dict:
    """The flax modules' compute and parameter dtypes: float64 throughout for a float64 run, else
    float32 parameters computing in float32 or, with --precision bf16, bfloat16."""
    if dtype == "float64":
        return {"dtype": jnp.float64, "param_dtype": jnp.float64}
    return {"dtype": jnp.bfloat16 if precision == "bf16" else None, "param_dtype": jnp.float32}


@contextlib.contextmanager
def computing_in(dtype: str):
    """jax_enable_x64 while a float64 computation lasts (without it JAX makes float64 arrays float32),
    restored afterwards, so that float32 work later in the process computes exactly as before."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", previous or dtype == "float64")
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def _trainer(strategy: str, model: str, n_devices: int, weights: dict[str, np.ndarray], batch_size: int,
             lr: float, bn: str, device_kind: str, dtype: str, levers: dict):
    """A trainer for the equivalence API, at `weights` (reset); call it inside computing_in(dtype).
    `levers`: RunConfig's precision, compile, channels_last, resident_data."""
    cfg = RunConfig(backend="jax", strategy=strategy, devices=n_devices, device_kind=device_kind,
                    model=model, batch_size=batch_size, lr=lr, bn=bn, **levers).validate()
    check_supported(cfg)
    leverlib.check_dtype(dtype, cfg)
    configure_precision(cfg)
    trainer = TRAINERS[strategy](cfg, weights, dtype=dtype)
    trainer.reset()
    return trainer


# ----------------------------------------------------------------------- entry points

def run(cfg: RunConfig) -> dict:
    """Train as the run config says, from --load-weights or the seeded init; the metrics part of a result."""
    check_supported(cfg)
    configure_precision(cfg)
    trainer = TRAINERS[cfg.strategy](cfg, weights_for_run(cfg))
    return run_training(trainer, cfg, datalib.load(cfg))


def train_steps(strategy: str, model: str, n_devices: int, weights: dict[str, np.ndarray],
                batches: list, lr: float, bn: str = "local", device_kind: str = "cpu",
                dtype: str = "float32", **levers) -> dict[str, np.ndarray]:
    """Apply len(batches) SGD steps from `weights`; the canonical weights afterwards (for tests and checks)."""
    return train_trace(strategy, model, n_devices, weights, batches, lr, bn, device_kind, dtype, **levers)["final"]


def train_trace(strategy: str, model: str, n_devices: int, weights: dict[str, np.ndarray],
                batches: list, lr: float, bn: str = "local", device_kind: str = "cpu",
                dtype: str = "float32", **levers) -> dict:
    """{"first": canonical weights after step 1, "final": after the last step (BatchNorm running statistics
    averaged over the devices), "losses": each step's global mean loss, from that step's own forward pass
    (before its update)}, all computed in `dtype` ("float32" or "float64")."""
    with computing_in(dtype):
        trainer = _trainer(strategy, model, n_devices, weights, len(batches[0][1]), lr, bn, device_kind, dtype,
                           levers)
        losses, first, size = [], None, len(batches[0][1])
        if trainer.cfg.resident_data:
            batches = trainer.stage(batches)
        for x, y in feed(trainer, batches, trainer.cfg):   # put ahead of their steps, as in training (--prefetch)
            loss_sums, _ = trainer.step(x, y)
            losses.append(_global_mean(loss_sums, size))
            if first is None:
                first = trainer.canonical()
        return {"first": first, "final": trainer.canonical(), "losses": losses}


def gradients(strategy: str, model: str, n_devices: int, weights: dict[str, np.ndarray], x, y,
              bn: str = "local", device_kind: str = "cpu", dtype: str = "float32",
              **levers) -> tuple[float, dict[str, np.ndarray]]:
    """(mean cross-entropy of the global batch, canonical gradients of the trainable parameters) at
    `weights`, as the strategy's step computes and reduces them on n_devices (device 0's copy), in `dtype`."""
    with computing_in(dtype):
        trainer = _trainer(strategy, model, n_devices, weights, len(y), 1.0, bn, device_kind, dtype,
                           levers)   # (lr unused)
        return trainer.gradients(x, y)


def float64_gradients(model: str, weights: dict[str, np.ndarray], x, y) -> tuple[float, dict[str, np.ndarray]]:
    """(mean loss, canonical gradients) of one batch on one CPU device, computed in float64.

    `harness check` compares this with torch's float64 gradient: agreement to ~1e-12 shows the
    model, loss and BatchNorm are the same math, whatever float32 rounding does on top."""
    return gradients("pmap", model, 1, weights, x, y, dtype="float64")
