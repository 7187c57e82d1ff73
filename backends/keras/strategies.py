"""Keras 3 strategies, each a common.trainer.Trainer for common/loop.py (common/backend.py builds, runs and
probes them; ddp's ranks are started by distributed.launch).

Same math in all three: one plain SGD step on the mean cross-entropy of the *global* batch of B examples.
  ddp           the Keras guide's recipe ("Multi-GPU distributed training with PyTorch"): every rank imports
                Keras on torch (KERAS_BACKEND=torch), so the Keras model is a torch.nn.Module, wrapped in torch
                DistributedDataParallel; one process per device (gloo on the CPU, NCCL on GPUs), each feeding its
                shard of the global batch; torch's cross-entropy (mean), DDP's gradient average, torch.optim.SGD.
                The ranks start as torch's ddp's do (distributed.py).
  distribution  Keras on jax: keras.distribution.DataParallel over the devices (variables replicated, batches
                split along their first axis), and one jax.jit-compiled stateless train step: model.stateless_call,
                jax.grad of the global mean loss (XLA all-reduces the gradients of the replicated variables),
                keras.optimizers.SGD.stateless_apply. The state lives outside the Keras variables.
  fsdp          Keras on jax, ZeRO-3 in Keras's distribution API: keras.distribution.ModelParallel over a mesh of
                one axis, the batch axis, whose LayoutMap shards every trainable variable over the same devices
                that split the batch (programs.fully_sharded); distribution's step, in which XLA all-gathers each
                variable where the model reads it and reduce-scatters its gradient, the update on the shards.
                canonical() and canonical_gradients() read the shards whole.
BatchNorm (models.BatchNorm, torch's running statistics): ddp normalises on each rank's shard and all-reduces the
running statistics before evaluation; distribution's and fsdp's step sees the global batch in one call, so BatchNorm
normalises each device's slice of it (local) or the whole of it (sync). fsdp shards no running statistics.
dtype "float64" (the equivalence API): the dtype policy float64, with Keras's floatx and jax_enable_x64 for the call.
Levers: --precision bf16 is the dtype policy mixed_bfloat16; --compile is torch.compile of the DDP-wrapped model (ddp)
or inherent (distribution, fsdp). The models are channels_last, Keras's default (environment.DATA_FORMAT), the batches
transposed to it; --channels-last changes nothing.
"""

from __future__ import annotations

import warnings

import jax
import keras
import numpy as np
import torch
import torch.distributed as dist
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from torch.nn import functional as F

from backends import xla
from backends.keras import models, programs
from backends.keras.distributed import RankCollectives, exchange_gradients_as_asked, rank_device
from backends.keras.environment import DATA_FORMAT
from backends.keras.parallel import devices
from backends.torch.models import compiled_graphs
from backends.torch.parallel import CopyStreams, OnDevice, PinnedBatches
from common.config import RunConfig
from common.data import check_divisible
from common.trainer import Trainer


class KerasTrainer(Trainer):
    """What the strategies share: `model` is the Keras model, built with the run's dtype policy and data format."""

    model: keras.Model

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self.np_dtype = np.dtype(dtype)
        self.data_format = DATA_FORMAT
        self.policy = models.policy(cfg.levers.precision, dtype)

    def param_count(self) -> int:
        return models.count_params(self.model)

    def _inputs(self, x):
        """A global numpy batch's images in the model's dtype and data format."""
        return models.to_data_format(np.asarray(x, dtype=self.np_dtype), self.data_format)


class DDPTrainer(RankCollectives, KerasTrainer):
    """One rank of DistributedDataParallel around the Keras model (Keras on torch); the process group is set up
    by launch_ddp (distributed.py)."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self.rank = dist.get_rank()
        self.device = rank_device(cfg)
        self.model = models.build(cfg.model, self.policy, self.data_format).to(self.device)
        models.load_canonical(self.model, weights)
        self.trainable = self.model.trainable_variables
        self.statistics = [
            v.value
            for v, kind in models.variables(self.model).values()
            if kind in ("bn_mean", "bn_var")
        ]
        # broadcast_buffers=False: every rank keeps its own BatchNorm statistics (averaged before evaluation),
        # as torch's ddp does. (Keras's non-trainable variables are torch parameters without gradients.)
        # gradient_as_bucket_view=True, as torch's ddp: the gradients become views of DDP's allreduce buckets, so
        # the reduced buckets are not copied back into them after each backward (a copy per variable per step);
        # zero_grad(set_to_none=True) drops the views and the next backward makes them again, and
        # canonical_gradients reads copies of them.
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*broadcast_buffers.*", category=FutureWarning
            )
            self.net = torch.nn.parallel.DistributedDataParallel(
                self.model,
                device_ids=[self.device.index] if cfg.device_kind == "gpu" else None,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
                bucket_cap_mb=cfg.levers.bucket_mb or None,  # --bucket-mb; 0: DDP's default (25)
            )
        exchange_gradients_as_asked(self.net, cfg)
        if cfg.levers.compile:
            self.net = torch.compile(self.net)
        self.optimizer = torch.optim.SGD([v.value for v in self.trainable], lr=cfg.lr)
        self._statistics_averaged = False
        self._pinned: PinnedBatches | None = None  # pin()'s page-locked buffer (CUDA)
        self._streams: CopyStreams | None = None  # put()'s copy stream (CUDA)

    def reset(self) -> None:
        models.load_canonical(self.model, self.weights)
        self.optimizer.zero_grad(set_to_none=True)

    def place(self, x, y):
        """This rank's shard of the global batch, on its device."""
        return self._to_device(*self._shard(x, y))

    def pin(self, batches: list) -> list:
        """On CUDA, this rank's shard of every batch, in the model's dtype and data format, in page-locked host
        memory (torch's PinnedBatches: one buffer, refilled before each timer), so that put() only copies; on
        the CPU as they are."""
        if self.cfg.device_kind != "gpu":
            return batches
        if self._pinned is None:
            self._pinned = PinnedBatches()
        return self._pinned.fill([self._shard(x, y) for x, y in batches])

    def put(self, x, y):
        """A shard pin() made, copied on a copy stream and not waited for (CUDA); a numpy batch placed now."""
        if not isinstance(x, torch.Tensor):
            return self.place(x, y)
        if self._streams is None:
            self._streams = CopyStreams([self.device])
        return self._streams.put(self._to_device, x, y)

    def reduce_gradients(self, x, y):
        if isinstance(x, OnDevice):
            xi, yi = x.take(), y.take()
        else:
            xi, yi = self.place(x, y) if isinstance(x, np.ndarray) else (x, y)
        self._statistics_averaged = False  # the training forward updates them
        self.optimizer.zero_grad(set_to_none=True)
        logits = self.net(xi, training=True)
        # (bf16: the loss in float32)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        loss = F.cross_entropy(logits, yi)
        loss.backward()
        return (loss.detach() * len(yi), (logits.argmax(1) == yi).sum())

    def update(self) -> None:
        self.optimizer.step()

    def sync(self) -> None:
        if self.cfg.device_kind == "gpu":
            torch.cuda.synchronize(self.device)

    def average_bn_statistics(self) -> None:
        self._average_over_ranks(self.statistics)
        self._statistics_averaged = True

    def canonical(self) -> dict[str, np.ndarray]:
        if not self._statistics_averaged:
            self.average_bn_statistics()
        return models.to_canonical(self.model)

    def canonical_gradients(self) -> dict[str, np.ndarray]:
        """The gradient of the global mean loss, after DDP's average."""
        return models.canonical_gradients(self.model, {id(v): v.value.grad for v in self.trainable})

    def evaluate(self, batches) -> tuple[int, int]:
        """Each rank evaluates its slice of every test batch; the counts are summed."""
        if not self._statistics_averaged:
            self.average_bn_statistics()
        correct = total = 0
        with torch.no_grad():
            for x, y in batches:
                x, y = x[self.rank :: self.n_devices], np.asarray(y[self.rank :: self.n_devices])
                xi = torch.from_numpy(np.ascontiguousarray(self._inputs(x)))
                logits = self.model(xi.to(self.device), training=False)
                correct += int((logits.argmax(1).cpu() == torch.from_numpy(y)).sum())
                total += len(y)
        correct, total = self._all_reduce([correct, total])
        return int(correct), int(total)

    def memory(self) -> dict:
        if self.cfg.device_kind != "gpu":
            return {}
        return {"peak_device_mb": torch.cuda.max_memory_allocated(self.device) / 2**20}

    def compiles(self) -> int:
        return compiled_graphs(self.cfg)

    def _shard(self, x, y) -> tuple[np.ndarray, np.ndarray]:
        """This rank's rows of a global numpy batch, the images in the model's dtype and data format."""
        check_divisible(len(y), self.n_devices)
        m = len(y) // self.n_devices
        rows = slice(self.rank * m, (self.rank + 1) * m)
        return np.ascontiguousarray(self._inputs(x[rows])), np.asarray(y[rows])

    def _to_device(self, x, y):
        return (
            torch.as_tensor(x).to(self.device, non_blocking=True),
            torch.as_tensor(y).to(self.device, non_blocking=True).long(),
        )


class DistributionTrainer(KerasTrainer):
    """keras.distribution.DataParallel (Keras on jax): one process, the variables replicated on every device, each
    global batch split along its first axis, one jitted stateless step over the global batch."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self.devs = devices(cfg.devices, cfg.device_kind)
        # The model, the optimizer and the compiled stateless programs, made once per process for what they are
        # built for (programs.py)
        shared = programs.shared(cfg, dtype, self.devs, self.policy, self.data_format)
        self.distribution, self.model, self.optimizer = (
            shared.distribution,
            shared.model,
            shared.optimizer,
        )
        self.mesh, self.replicated = shared.mesh, shared.replicated
        self.trainable_layout = shared.trainable  # replicated, or each variable's shards (fsdp)
        self._step, self._gradients, self._update = shared.step, shared.gradients, shared.update
        self._predict = shared.predict
        self.state = None  # (trainable, non-trainable, optimizer variables): lists of jax arrays
        self._last = None  # the latest step's (loss sum, correct), for sync
        # the steps queued ahead of the devices, bounded on simulated CPU devices (xla.StepQueue)
        self._queued = xla.StepQueue.for_devices(cfg.device_kind)
        self._grads = None  # reduce_gradients()' gradients, for update() and canonical_gradients()
        self._new_statistics = None

    def reset(self) -> None:
        """The run's weights in the variables, and the state copied from them (the step donates its state).

        The copies are laid out as the step lays out its outputs (the trainable variables as the distribution
        lays them out, the rest replicated): jit compiles a program per input layout, so a state in another layout
        (on one device, a copy is a single-device array) made the second step after every reset compile again,
        inside the timed epoch."""
        models.load_canonical(self.model, self.weights)
        variables = (
            self.model.trainable_variables,
            self.model.non_trainable_variables,
            self.optimizer.variables,
        )
        layouts = (self.trainable_layout, self.replicated, self.replicated)
        self.state = tuple(
            jax.device_put([v.value for v in vs], layout, may_alias=False)
            for vs, layout in zip(variables, layouts)
        )
        self._last = self._grads = self._new_statistics = None

    def place(self, x, y):
        """The global batch laid out as keras.distribution.DataParallel lays out data: split along axis 0."""
        x, y = self._inputs(x), np.asarray(y, dtype=np.int32)
        check_divisible(len(y), self.n_devices)
        return tuple(
            keras.distribution.distribute_tensor(a, self.distribution.get_data_layout(a.shape))
            for a in (x, y)
        )

    def stage(self, batches: list) -> list:
        staged = [self.put(x, y) for x, y in batches]
        jax.block_until_ready(staged)
        return staged

    def step(self, x, y):
        """reduce_gradients() and update() fused in one compiled call (the same math: test_contract proves the same
        weights), the state donated."""
        trainable, statistics, optimizer, metrics = self._step(*self.state, *self._on_devices(x, y))
        self.state, self._last = (trainable, statistics, optimizer), metrics
        self._queued.add(metrics)
        self._grads = self._new_statistics = None
        return metrics

    def reduce_gradients(self, x, y):
        trainable, statistics, _ = self.state
        grads, (new_statistics, loss_sum, correct) = self._gradients(
            trainable, statistics, *self._on_devices(x, y)
        )
        self._grads, self._new_statistics, self._last = grads, new_statistics, (loss_sum, correct)
        return loss_sum, correct

    def update(self) -> None:
        if self._new_statistics is None:
            raise RuntimeError(
                "update() needs the gradients of a reduce_gradients() not applied yet"
            )
        trainable, _, optimizer = self.state
        trainable, optimizer = self._update(optimizer, self._grads, trainable)
        self.state, self._new_statistics = (trainable, self._new_statistics, optimizer), None

    def collect(self, handles) -> tuple[float, float]:
        return (
            float(sum(np.asarray(l, dtype=np.float64) for l, _ in handles)),
            float(sum(np.asarray(c, dtype=np.float64) for _, c in handles)),
        )

    def sync(self) -> None:
        jax.block_until_ready((self.state, self._last, self._grads))

    def allreduce_op(self, values: int):
        """The sum over the devices of a (devices, values) float32 buffer split along its first axis, replicated
        (as the step's gradients of the replicated variables are); the call waits for it."""
        rows = jax.device_put(
            np.ones((self.n_devices, values), np.float32), NamedSharding(self.mesh, P("batch"))
        )
        total = jax.jit(lambda a: a.sum(axis=0), out_shardings=self.replicated)
        return lambda: jax.block_until_ready(total(rows))

    def canonical(self) -> dict[str, np.ndarray]:
        """The state's weights; the one copy of the running statistics moves by the devices' mean update, so it
        is their average already (models.BatchNorm)."""
        trainable, statistics, _ = self.state
        return models.to_canonical(self.model, self._by_variable(trainable, statistics))

    def canonical_gradients(self) -> dict[str, np.ndarray]:
        if self._grads is None:
            raise RuntimeError(
                "canonical_gradients() reads the gradients of reduce_gradients(); there are none"
            )
        return models.canonical_gradients(
            self.model, dict(zip(map(id, self.model.trainable_variables), self._grads))
        )

    def evaluate(self, batches) -> tuple[int, int]:
        """On device 0 (a test batch need not divide among the devices), with the state whole there."""
        trainable, statistics, _ = self.state
        first = self.mesh.devices.flat[0]
        trainable, statistics = (
            [on_device(a, first) for a in arrays] for arrays in (trainable, statistics)
        )
        correct = total = 0
        for x, y in batches:
            classes = self._predict(trainable, statistics, jax.device_put(self._inputs(x), first))
            correct += int(np.sum(np.asarray(classes) == np.asarray(y)))
            total += len(y)
        return correct, total

    def memory(self) -> dict:
        if self.cfg.device_kind != "gpu":
            return {}
        peaks = [(d.memory_stats() or {}).get("peak_bytes_in_use") for d in self.mesh.devices.flat]
        peaks = [p for p in peaks if p is not None]
        return {"peak_device_mb": max(peaks) / 2**20} if peaks else {}

    def compiles(self) -> int:
        return xla.compiled()

    def _on_devices(self, x, y):
        """The batch as the step takes it: a placed one as it is, a numpy one placed now."""
        return (x, y) if isinstance(x, jax.Array) else self.put(x, y)

    def _by_variable(self, trainable, statistics) -> dict:
        variables = self.model.trainable_variables + self.model.non_trainable_variables
        return {id(v): a for v, a in zip(variables, list(trainable) + list(statistics))}


class FSDPTrainer(DistributionTrainer):
    """keras.distribution.ModelParallel as ZeRO-3 (Keras on jax): distribution's trainer and step, with every
    trainable variable, its gradient and its update sharded over the devices that split the batch (programs.py's
    fully_sharded); XLA all-gathers the variables inside the step and reduce-scatters their gradients. canonical()
    and canonical_gradients() read the sharded arrays whole (numpy gathers their shards)."""

    def allreduce_op(self, values: int):
        """fsdp's exchange of `values` gradient values per device: their sum reduce-scattered to the shards (the
        step's), then the shards all-gathered whole (the next step's): an allreduce's volume in its two
        collectives, as torch's fsdp times it; the call waits for it."""
        padded = -(-values // self.n_devices) * self.n_devices
        shards = NamedSharding(self.mesh, P(programs.BATCH_AXIS))
        rows = jax.device_put(np.ones((self.n_devices, padded), np.float32), shards)
        reduce_scatter = jax.jit(lambda a: a.sum(axis=0), out_shardings=shards)
        all_gather = jax.jit(lambda a: a, out_shardings=self.replicated)
        return lambda: jax.block_until_ready(all_gather(reduce_scatter(rows)))

    def memory(self) -> dict:
        """Beside the devices' peak, the MiB of trainable variables device 0 holds: its shards, and whole the
        variables the devices divide no dimension of."""
        trainable, _, _ = self.state
        first = self.mesh.devices.flat[0]
        held = sum(
            shard.data.nbytes
            for a in trainable
            for shard in a.addressable_shards
            if shard.device == first
        )
        return {**super().memory(), "parameters_mb": held / 2**20}


def on_device(a: jax.Array, device) -> jax.Array:
    """The whole of `a` on `device`: its copy there where it is replicated, else its shards gathered there
    (fsdp's variables)."""
    if not a.is_fully_replicated:
        return jax.device_put(a, device)
    return next(shard.data for shard in a.addressable_shards if shard.device == device)


TRAINERS = {"ddp": DDPTrainer, "distribution": DistributionTrainer, "fsdp": FSDPTrainer}


# The strategy of float64_gradients: Keras on jax, in this process.
REFERENCE = "distribution"
