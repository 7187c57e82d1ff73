"""JAX strategies, each a common.trainer.Trainer for common/loop.py.

Same math in all three: one plain SGD step (optax.sgd, no momentum) on the mean cross-entropy
of the *global* batch of B examples: each device sums the losses of its B/k examples,
the gradient is the sum over devices divided by B.
  pmap      jax.pmap of the whole step over a leading device axis; every device keeps its
            own copy of parameters and optimizer state; the gradients are added with lax.psum.
  sharding  jax.jit over a device Mesh: parameters replicated (NamedSharding P()), the batch
            split along its first axis (P("devices")). The forward pass is a jax.shard_map,
            so each device computes on its own shard; the loss is lax.psum'ed there, and
            jax.grad through the shard_map yields the global gradient (XLA inserts the
            all-reduce); the optax update runs on the replicated parameters.
  fsdp      sharding's step with ZeRO-3's layout: each parameter, its gradient and the optimizer
            state split over the mesh along their largest dimension the device count divides
            (replicated where it divides none). The shard_map body all-gathers the parameters
            whole for the forward pass; autodiff turns each all-gather into a reduce-scatter of
            its gradient, and the optax update runs on the shards, which stay sharded between steps.
BatchNorm (--bn): "local", inside pmap and shard_map every device normalises with its own shard's
statistics (plain jit over a batch-sharded array would use the global batch's). "sync",
BatchNorm(axis_name=AXIS) (models.py) lax.pmean's the batch statistics over the devices, so
k-device training is 1-device training. The running statistics (torch's update) are kept per
device, with a leading device axis (fsdp shards none of them), and averaged with lax.pmean
before evaluation and in `canonical`.
Gradients: each strategy's step is its `reduce_gradients` half (the reduced gradient of the
global mean loss, as that strategy computes it) followed by the same optax update (`update`);
`step` runs the two fused in one compiled call. The equivalence API (`gradients`, `train_trace`,
`train_steps`: common.trainer's probes) runs them in float32 or, with dtype="float64", the same
code with jax_enable_x64 set for the call: everything, psum / pmean and SGD included, in float64.
Timing: the step is compiled on its first call (the loop's warm-up step); `step` only
queues work and returns device arrays, `sync` blocks on them; it donates the state it replaces.
`put` (--prefetch) and `stage` (--resident-data) place batches on the devices as `step` would,
and `step` takes such batches as they are. `allreduce_op` is the strategy's own collective
alone: a pmapped lax.psum, or a lax.psum in a jax.shard_map under jax.jit over the strategy's mesh
(fsdp: a reduce-scatter then an all-gather, an allreduce's volume in the two collectives it makes).
Several nodes (distributed.py): each process places its own devices' rows of the global batch; collect() and
slowest() reduce over the processes; canonical() and evaluate() read this process's first device (fsdp's
shards gathered there first, a collective every process calls).
Levers: --precision bf16 builds the modules with dtype bfloat16 (parameters, gradients,
BatchNorm statistics and SGD in float32); tf32 sets jax_default_matmul_precision (refused on
CPU devices by common.levers); --compile changes nothing (every step is compiled already);
--channels-last is refused (XLA chooses layouts itself). A float64 call takes no lever (Unsupported).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from backends import xla
from backends.jax import distributed, models, programs
from backends.jax.environment import DTYPES
from backends.jax.models import local_loss, sgd
from backends.jax.parallel import (
    AXIS,
    check_batch,
    device_axis_sharding,
    local_sum,
    mesh,
    node_rows,
    on_device,
    per_device,
    replicated_sharding,
    stack_on_devices,
    stacked,
)
from common.config import RunConfig
from common.trainer import Trainer


class JaxTrainer(Trainer):
    """What the strategies share. `state` is (params, batch_stats, opt_state) on the devices;
    subclasses decide their shardings (`_lay_out`) and compiled programs (`_programs`, shared: programs.py),
    how it is laid out (`_place_state`), how a batch is laid out (`place`, and
    `_is_placed` to recognise one), how a step runs (`_step`, fused; `_gradients` and `_update` its
    halves), how the BatchNorm statistics are averaged (`_pmean`), how gradients are summed over the
    devices (`_allreduce`), and where device 0's copy of the parameters is (`_params_on_device_0`).
    `put` is the base's place(): jax.device_put returns before the copies finish (as the flax examples'
    prefetch_to_device). `dtype` "float64" (the equivalence API, under jax_enable_x64) makes every
    parameter, statistic, batch and result float64; runs are float32."""

    label_ndim: int  # of a placed batch's labels: tells a placed batch from a numpy one

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self._np_dtype = np.dtype(DTYPES[dtype])  # of parameters, statistics, batches and results
        self.devs = distributed.run_devices(cfg)
        self.local_devs = [
            d for d in self.devs if d.process_index == jax.process_index()
        ]  # this node's
        self.batch_sharding = device_axis_sharding(self.devs)  # batches: split along axis 0
        self.state = None
        self._last = None  # the latest step's (loss sums, correct), for sync
        # the steps queued ahead of the devices, bounded on simulated CPU devices (xla.StepQueue)
        self._queued = xla.StepQueue.for_devices(cfg.device_kind)
        # reduce_gradients()' reduced gradients, for update() and canonical_gradients()
        self._grads = None
        self._new_stats = None  # reduce_gradients()' new BatchNorm statistics, for update()
        self._lay_out()  # the subclass's shardings, which its programs are built on
        # The net, the optimizer and the subclass's compiled programs, made once per process for what they are
        # built for (programs.py)
        self.net, self.tx, compiled = programs.shared(
            type(self).__name__, cfg, dtype, self.devs, self._programs
        )
        for name, program in compiled.items():
            setattr(self, name, program)
        # numpy, flax layouts, the net's dtype
        self._initial = models.from_canonical(self.net, weights)

    def reset(self) -> None:
        params = self._initial["params"]
        self.state = self._place_state(params, self._initial["batch_stats"], self.tx.init(params))
        self._last = self._grads = self._new_stats = None

    def stage(self, batches: list) -> list:
        """--resident-data: every batch put, the copies finished (sync() waits for the steps, not device_put)."""
        staged = [self.put(x, y) for x, y in batches]
        jax.block_until_ready(staged)
        return staged

    def step(self, x, y):
        """reduce_gradients() and update() fused in one compiled call. It overrides the base's two calls for
        speed (one dispatch a step, the update scheduled by XLA with the backward pass, the state donated);
        the same math: test_contract proves the same weights."""
        params, stats, opt_state, metrics = self._step(*self.state, *self._on_devices(x, y))
        self.state, self._last = (params, stats, opt_state), metrics
        self._queued.add(metrics)
        self._grads = self._new_stats = None
        return metrics

    def reduce_gradients(self, x, y):
        """The gradient half of the step at the current state; the reduced gradients and the new BatchNorm
        statistics are kept for update() (and canonical_gradients()); returns (loss sums, correct)."""
        params, stats, _ = self.state
        grads, (new_stats, loss_sum, correct) = self._gradients(
            params, stats, *self._on_devices(x, y)
        )
        self._grads, self._new_stats, self._last = grads, new_stats, (loss_sum, correct)
        return loss_sum, correct

    def update(self) -> None:
        """The SGD half: the kept gradients applied to the parameters, the kept statistics made the state's."""
        if self._new_stats is None:
            raise RuntimeError(
                "update() needs the gradients of a reduce_gradients() not applied yet"
            )
        params, _, opt_state = self.state
        params, opt_state = self._update(params, opt_state, self._grads)
        self.state, self._new_stats = (params, self._new_stats, opt_state), None

    def collect(self, handles) -> tuple[float, float]:
        """Per-device (loss sum, correct) of every step, read back and added up over the devices of every node."""
        local = [
            sum(local_sum(loss) for loss, _ in handles),
            sum(local_sum(correct) for _, correct in handles),
        ]
        loss_sum, correct = distributed.across_processes(local, "sum")
        return float(loss_sum), float(correct)

    def sync(self) -> None:
        jax.block_until_ready((self.state, self._last, self._grads))

    def slowest(self, seconds: float) -> float:
        return float(distributed.across_processes([seconds], "max")[0])

    def summed(self, values: list[float]) -> list[float]:
        return [float(v) for v in distributed.across_processes(values, "sum")]

    def allreduce_op(self, values: int):
        """A sum over the devices of a float32 buffer of `values` elements per device (made here, once),
        reduced as this strategy reduces its gradients (`_allreduce`); the call waits for the sum and returns it."""
        buffer = self._allreduce_buffer(values)
        return lambda: jax.block_until_ready(self._allreduce(buffer))

    def average_bn_statistics(self) -> None:
        params, _, opt_state = self.state
        self.state = (params, self._averaged_bn_statistics(), opt_state)

    def canonical(self) -> dict[str, np.ndarray]:
        """Device 0's parameters with the running statistics averaged over the devices (as evaluated),
        leaving the per-device statistics in the training state as they are."""
        params, _, _ = self.state
        return models.to_canonical(
            {
                "params": self._params_on_device_0(params),
                "batch_stats": self._stats_on_device_0(self._averaged_bn_statistics()),
            },
            dtype=self._np_dtype,
        )

    def canonical_gradients(self) -> dict[str, np.ndarray]:
        """Device 0's copy of the reduced gradient of the global mean loss (reduce_gradients()'), by canonical name."""
        if self._grads is None:
            raise RuntimeError(
                "canonical_gradients() reads the gradients of reduce_gradients(); there are none"
            )
        return models.to_canonical(
            {"params": self._params_on_device_0(self._grads)}, dtype=self._np_dtype
        )

    def evaluate(self, batches) -> tuple[int, int]:
        self.average_bn_statistics()
        params, stats = self._replica_0()
        correct = total = 0
        for x, y in batches:
            classes = self._predict(
                params,
                stats,
                jax.device_put(np.asarray(x, dtype=self._np_dtype), self.local_devs[0]),
            )
            correct += int(np.sum(np.asarray(classes) == np.asarray(y)))
            total += len(y)
        return correct, total

    def param_count(self) -> int:
        return models.count_params(self.net)

    def memory(self) -> dict:
        if self.cfg.device_kind != "gpu":
            return {}
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in self.local_devs]
        peaks = [p for p in peaks if p is not None]
        return {"peak_device_mb": max(peaks) / 2**20} if peaks else {}

    def compiles(self) -> int:
        return xla.compiled()

    def _on_devices(self, x, y):
        """The batch as the step takes it: a placed one as it is, a numpy one copied to the devices now."""
        return (x, y) if self._is_placed(x, y) else self.put(x, y)

    def _is_placed(self, x, y) -> bool:
        """Whether (x, y) is a batch `place` made (the layout `label_ndim` tells apart)."""
        return (
            all(isinstance(a, jax.Array) and a.sharding == self.batch_sharding for a in (x, y))
            and y.ndim == self.label_ndim
        )

    def _allreduce_buffer(self, values: int) -> jax.Array:
        """(devices, values) float32, the row of run device i on it and filled with i + 1; made on the devices
        (pmap's: this node's rows)."""
        rows = list(self.batch_sharding.mesh.devices.flat)
        first = self.devs.index(rows[0]) + 1
        make = jax.jit(
            lambda: jnp.broadcast_to(
                jnp.arange(first, first + len(rows), dtype=jnp.float32)[:, None],
                (len(rows), values),
            ),
            out_shardings=self.batch_sharding,
        )
        return make()

    def _averaged_bn_statistics(self):
        """The running statistics with every device's replaced by their mean over the devices (the state
        is left as it is)."""
        _, stats, _ = self.state
        return self._pmean(stats) if jax.tree.leaves(stats) else stats  # (LeNet has none)

    def _replica_0(self):
        params, stats, _ = self.state
        return self._params_on_device_0(params), self._stats_on_device_0(stats)

    def _stats_on_device_0(self, stats):
        """BatchNorm statistics carry a leading device axis in every strategy."""
        return jax.tree.map(lambda a: per_device(a, self.local_devs)[0], stats)


def summed_over_devices(gradient: jax.Array, grad_dtype: str) -> jax.Array:
    """lax.psum of one device's gradient over the pmap axis; with --grad-dtype bf16 exchanged in bfloat16 and cast
    back (the gradients compressed, as DDP's bf16 hook does)."""
    if grad_dtype == "bf16":
        return lax.psum(gradient.astype(jnp.bfloat16), AXIS).astype(gradient.dtype)
    return lax.psum(gradient, AXIS)


class PmapTrainer(JaxTrainer):
    """jax.pmap: the batch, parameters, optimizer state and BatchNorm statistics all carry a
    leading device axis; gradients are summed with lax.psum inside the step."""

    label_ndim = 2  # a placed batch is stacked as (devices, batch / devices, ...)

    def _lay_out(self) -> None:
        # pmap over several processes takes (and returns) each process's rows of the device axis only
        self.batch_sharding = device_axis_sharding(self.local_devs)

    def _programs(self, net, tx, cfg: RunConfig) -> dict:
        over_devices = functools.partial(jax.pmap, axis_name=AXIS, devices=self.devs)
        return {
            "_step": over_devices(
                functools.partial(
                    self._device_step, net, tx, cfg.batch_size, cfg.levers.grad_dtype
                ),
                donate_argnums=programs.DONATED,
            ),
            "_gradients": over_devices(
                functools.partial(
                    self._device_gradients, net, cfg.batch_size, cfg.levers.grad_dtype
                )
            ),
            "_update": over_devices(
                functools.partial(sgd, tx), donate_argnums=programs.UPDATE_DONATED
            ),
            "_pmean": over_devices(functools.partial(lax.pmean, axis_name=AXIS)),
            # The gradients' collective alone: lax.psum over the pmap axis, row i of the input on device i.
            "_allreduce": over_devices(functools.partial(lax.psum, axis_name=AXIS)),
        }

    def place(self, x, y):
        check_batch(np.asarray(x), np.asarray(y), self.n_devices)
        return stack_on_devices(*node_rows(x, y, self.cfg), self.local_devs, self._np_dtype)

    @staticmethod
    def _device_gradients(net, batch_size, grad_dtype, params, stats, x, y):
        """One device's gradient of its loss sum, psum'ed over the devices (in `grad_dtype`) and divided by the
        global batch: every device holds the gradient of the global mean loss. (grads, (new stats, loss sum,
        correct))."""
        grads, aux = jax.grad(local_loss, argnums=1, has_aux=True)(net, params, stats, x, y)
        return jax.tree.map(lambda g: summed_over_devices(g, grad_dtype) / batch_size, grads), aux

    @staticmethod
    def _device_step(net, tx, batch_size, grad_dtype, params, stats, opt_state, x, y):
        """One device's part: the reduced gradients, then the same SGD step everywhere."""
        grads, (stats, loss_sum, correct) = PmapTrainer._device_gradients(
            net, batch_size, grad_dtype, params, stats, x, y
        )
        params, opt_state = sgd(tx, params, opt_state, grads)
        return params, stats, opt_state, (loss_sum, correct)

    def _place_state(self, params, stats, opt_state):
        return stacked((params, stats, opt_state), self.local_devs)

    def _params_on_device_0(self, tree):
        """Every device holds its own copy along the leading device axis (this node's first device's)."""
        return jax.tree.map(lambda a: per_device(a, self.local_devs)[0], tree)


# --bucket-mb on a jit strategy: XLA's combine thresholds, the most bytes one combined collective of the step carries
# (the GPU compiler's options: XLA's CPU pipeline combines a step's collectives by its own rule and ignores them).
COMBINE_THRESHOLDS = (
    "xla_gpu_all_reduce_combine_threshold_bytes",
    "xla_gpu_reduce_scatter_combine_threshold_bytes",
    "xla_gpu_all_gather_combine_threshold_bytes",
)


def combine_thresholds(bucket_mb: int) -> dict | None:
    """The step's compiler options for --bucket-mb (0: XLA's own thresholds)."""
    return {name: bucket_mb * 2**20 for name in COMBINE_THRESHOLDS} if bucket_mb else None


class ShardingTrainer(JaxTrainer):
    """jax.jit over a Mesh with NamedSharding: replicated parameters, a batch-sharded global
    batch, and the per-device part of the step (forward, BatchNorm) in a jax.shard_map."""

    label_ndim = 1  # a placed batch is the global one, split along its first axis

    def _lay_out(self) -> None:
        self.mesh = mesh(self.devs)
        self.replicated = replicated_sharding(self.devs)

    def _programs(self, net, tx, cfg: RunConfig) -> dict:
        shapes = models.native_shapes(net)["params"]
        loss = self._sharded_loss(net, self.mesh, cfg.batch_size, self._param_specs(shapes))
        # the gradients are laid out as the parameters they update
        params, opt_state = self._laid_out(shapes), self._laid_out(jax.eval_shape(tx.init, shapes))
        s = self.batch_sharding
        return {
            "_step": jax.jit(
                functools.partial(self._global_step, loss, tx),
                out_shardings=(params, s, opt_state, (s, s)),
                donate_argnums=programs.DONATED,
                compiler_options=combine_thresholds(cfg.levers.bucket_mb),
            ),
            "_gradients": jax.jit(
                functools.partial(self._global_gradients, loss),
                out_shardings=(params, (s, s, s)),
                compiler_options=combine_thresholds(cfg.levers.bucket_mb),
            ),
            "_update": jax.jit(
                functools.partial(sgd, tx),
                out_shardings=(params, opt_state),
                donate_argnums=programs.UPDATE_DONATED,
            ),
            "_pmean": jax.jit(
                jax.shard_map(
                    functools.partial(lax.pmean, axis_name=AXIS),
                    mesh=self.mesh,
                    in_specs=P(AXIS),
                    out_specs=P(AXIS),
                )
            ),
            # The gradients' collective alone: lax.psum in a shard_map over the mesh, each device contributing its
            # row, the sum replicated (as the gradients of the replicated parameters are).
            "_allreduce": jax.jit(
                jax.shard_map(
                    lambda a: lax.psum(a[0], AXIS), mesh=self.mesh, in_specs=P(AXIS), out_specs=P()
                )
            ),
        }

    def place(self, x, y):
        x, y = np.asarray(x), np.asarray(y)
        check_batch(x, y, self.n_devices)
        # this node's rows only: the global array is made of every node's; np.asarray copies nothing where the
        # batch is in the step's dtype already (astype would copy every batch on the host, inside the timer)
        xs, ys = node_rows(x, y, self.cfg)
        return (
            jax.make_array_from_process_local_data(
                self.batch_sharding, np.asarray(xs, dtype=self._np_dtype), x.shape
            ),
            jax.make_array_from_process_local_data(
                self.batch_sharding, np.asarray(ys, dtype=np.int32), y.shape
            ),
        )

    @staticmethod
    def _sharded_loss(net, mesh, batch_size, param_specs):
        """The global mean loss as a function of global arrays; the body runs once per device, on its shard.

        The parameters come in as `param_specs` splits them and are used whole (`whole`). BatchNorm statistics
        come in and go out with a leading device axis of length 1 per device.
        """

        def per_device(params, stats, x, y):
            unstacked = jax.tree.map(lambda a: a[0], stats)
            _, (new_stats, loss_sum, correct) = local_loss(
                net, whole(params, param_specs), unstacked, x, y
            )
            restacked = jax.tree.map(lambda a: a[None], new_stats)
            return lax.psum(loss_sum, AXIS) / batch_size, (restacked, loss_sum[None], correct[None])

        return jax.shard_map(
            per_device,
            mesh=mesh,
            in_specs=(param_specs, P(AXIS), P(AXIS), P(AXIS)),
            out_specs=(P(), (P(AXIS), P(AXIS), P(AXIS))),
        )

    @staticmethod
    def _global_gradients(loss, params, stats, x, y):
        """The gradient of the global mean loss with respect to the replicated parameters: autodiff
        through the shard_map adds the devices' contributions. (grads, (new stats, loss sums, correct))."""
        return jax.grad(loss, has_aux=True)(params, stats, x, y)

    @staticmethod
    def _global_step(loss, tx, params, stats, opt_state, x, y):
        grads, (stats, loss_sum, correct) = ShardingTrainer._global_gradients(
            loss, params, stats, x, y
        )
        params, opt_state = sgd(tx, params, opt_state, grads)
        return params, stats, opt_state, (loss_sum, correct)

    def _param_specs(self, tree):
        """How the parameters (their gradients) and the optimizer state are split over the mesh, for a tree of
        arrays or shape structs: replicated whole (P(), a prefix of any tree)."""
        return P()

    def _laid_out(self, tree):
        """The NamedShardings of `_param_specs`."""
        return jax.tree.map(lambda spec: NamedSharding(self.mesh, spec), self._param_specs(tree))

    def _place_state(self, params, stats, opt_state):
        return (
            jax.device_put(params, self._laid_out(params)),
            stacked(stats, self.devs),
            jax.device_put(opt_state, self._laid_out(opt_state)),
        )

    def _params_on_device_0(self, tree):
        """Parameters (and gradients) are replicated: this node's first device's copy."""
        return jax.tree.map(lambda a: on_device(a, self.local_devs[0]), tree)


class FSDPTrainer(ShardingTrainer):
    """sharding's step with ZeRO-3's layout: every trainable parameter, its gradient and the optimizer state split
    over the mesh along one dimension (`_shard_spec`); the batch and the BatchNorm statistics as sharding's. The
    shard_map body takes each device's shards and all-gathers them whole for the forward (`whole`); autodiff
    transposes each all-gather into a reduce-scatter, so the gradients come back as shards, where the optax update
    runs; the step's out_shardings keep the parameters sharded between steps. The gathers are explicit: given
    replicated parameters (in_specs P()), XLA's CPU pipeline all-reduces their gradients whole and slices out the
    shards, with no reduce-scatter. canonical(), canonical_gradients() and evaluate() gather the shards whole
    (`_gather`: a collective every process calls)."""

    def _programs(self, net, tx, cfg: RunConfig) -> dict:
        return {
            **super()._programs(net, tx, cfg),
            # fsdp's exchange of a gradient buffer: reduce-scattered to the shards (the step's), then the summed
            # shards all-gathered whole (the next step's), an allreduce's volume in its two collectives
            "_allreduce": jax.jit(
                jax.shard_map(
                    self._reduce_scatter_then_gather,
                    mesh=self.mesh,
                    in_specs=P(AXIS),
                    out_specs=P(),
                    check_vma=False,  # the all-gather leaves every device the same sum: jax cannot infer it
                )
            ),
            "_gather": jax.jit(lambda tree: tree, out_shardings=self.replicated),
        }

    def memory(self) -> dict:
        """Beside the devices' peak, the MiB of trainable parameters this node's first device holds: its shards,
        and whole the parameters the devices divide no dimension of."""
        params, _, _ = self.state
        first = self.local_devs[0]
        held = sum(
            shard.data.nbytes
            for a in jax.tree.leaves(params)
            for shard in a.addressable_shards
            if shard.device == first
        )
        return {**super().memory(), "parameters_mb": held / 2**20}

    @staticmethod
    def _reduce_scatter_then_gather(row):
        """One device's row (1, values): the sum over the devices reduce-scattered (zero-padded to a multiple of
        the devices), then all-gathered whole on every device."""
        values, devices = row.shape[1], lax.axis_size(AXIS)
        padded = jnp.pad(row[0], (0, -values % devices))
        shard = lax.psum_scatter(padded, AXIS, tiled=True)
        return lax.all_gather(shard, AXIS, tiled=True)[:values]

    def _param_specs(self, tree):
        """Each leaf split by `_shard_spec` of its shape."""
        return jax.tree.map(lambda a: self._shard_spec(a.shape), tree)

    def _shard_spec(self, shape: tuple) -> P:
        """The largest dimension the devices divide split along the mesh axis. A parameter with none stays
        replicated, as the usual JAX FSDP recipes leave what they cannot split evenly (a small bias or BatchNorm
        scale whose length the device count does not divide)."""
        divisible = [d for d, size in enumerate(shape) if size % len(self.devs) == 0]
        if not divisible:
            return P()
        split = max(divisible, key=lambda d: shape[d])
        return P(*(AXIS if d == split else None for d in range(len(shape))))

    def _params_on_device_0(self, tree):
        """The sharded parameters (or gradients) gathered whole, then this node's first device's copy."""
        return super()._params_on_device_0(self._gather(tree))


def whole(params, specs):
    """Inside a shard_map, the parameters whole: each split one all-gathered along the dimension its spec splits
    (the transpose of which reduce-scatters its gradient), a replicated one as it is (P(), also as a prefix of the
    whole tree)."""

    def gathered(spec, shard):
        if AXIS not in spec:
            return shard
        return lax.all_gather(shard, AXIS, axis=spec.index(AXIS), tiled=True)

    return jax.tree.map(gathered, specs, params)


TRAINERS = {"pmap": PmapTrainer, "sharding": ShardingTrainer, "fsdp": FSDPTrainer}


# The strategy of float64_gradients: the one whose step is a plain pmap, without a mesh.
REFERENCE = "pmap"
