"""PyTorch strategies, each a common.trainer.Trainer for common/loop.py (common/backend.py builds, runs and
probes them; ddp's and fsdp's ranks are started by distributed.launch).

Same math in all four: one SGD step on the mean cross-entropy of the *global* batch.
  scratch  k replicas; per-shard summed loss, gradients summed by the hand-written
           allreduce, then p -= lr / B * g on every replica (d2l's from-scratch chapter)
  dp       nn.DataParallel: mean loss on the gathered output, torch.optim.SGD (CUDA only)
  ddp      DistributedDataParallel, one process per device on every node, started by torchrun's elastic
           agent (distributed.py): per-shard mean loss, DDP averages gradients across ranks, torch.optim.SGD
  fsdp     FSDP2's fully_shard, one process per device as ddp's: per-shard mean loss, each parameter and its
           gradient sharded over the ranks, a block's weights all-gathered for its forward and backward, the
           gradients reduce-scattered (a mean over the ranks), torch.optim.SGD on each rank's shards
BatchNorm: each device normalises with its own shard's statistics in training; before evaluation the
running statistics are averaged across replicas (dp keeps device 0's, as DataParallel does).
dtype "float64" (the equivalence API only) runs the same strategy code with every tensor in float64.
Levers (RunConfig): precision (fp32 / tf32 / bf16 autocast around forward and loss), compile (torch.compile
of what runs the forward; `module` stays the plain nn.Module whose weights are read and written),
channels_last (model and batches in NHWC), resident_data (stage(): batches placed before the timer).
"""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

from backends.torch import models
from backends.torch.distributed import RankCollectives, exchange_gradients_as_asked, rank_device
from backends.torch.environment import MANIFEST, autocast_device
from backends.torch.parallel import (
    CopyStreams,
    OnDevice,
    PinnedBatches,
    allreduce,
    as_tensor,
    convert_sync_batchnorm,
    devices,
    fully_sharded,
    local_megabytes,
    split,
    whole,
)
from common.config import RunConfig
from common.data import check_divisible
from common.trainer import Trainer


class TorchTrainer(Trainer):
    """What the strategies share: `module` is the model evaluated and reported, `devs` its devices.
    Each takes a `dtype` for its parameters and BatchNorm statistics ("float32"; "float64" in the checks)."""

    module: nn.Module
    devs: list
    _streams: CopyStreams | None = None
    _pinned: PinnedBatches | None = None
    # Averaged since the last training forward: canonical() needs no collective (rank 0 alone saves weights).
    _statistics_averaged = False

    def pin(self, batches: list) -> list:
        """On CUDA, the batches in page-locked host memory, one buffer reused by every timed part; on the CPU as
        they are (the devices read the numpy batch's memory)."""
        if self.cfg.device_kind != "gpu":
            return batches
        if self._pinned is None:
            self._pinned = PinnedBatches()
        return self._pinned.fill(batches)

    def put(self, x, y):
        """One batch placed ahead of its step: on CUDA copied from pinned memory on copy streams, not waited
        for; on the CPU placed now (the shards are views of the numpy batch: nothing to copy)."""
        if self.cfg.device_kind == "gpu":
            if self._streams is None:
                self._streams = CopyStreams(self.devs)
            return self._streams.put(self.place, x, y)
        return tuple(OnDevice(v) for v in self.place(x, y))

    def sync(self) -> None:
        if self.cfg.device_kind == "gpu":
            for d in sorted(set(self.devs), key=str):
                torch.cuda.synchronize(d)

    def canonical(self) -> dict[str, np.ndarray]:
        self._average_statistics_once()
        return models.to_canonical(self.module)

    def param_count(self) -> int:
        return models.count_params(self.module)

    def memory(self) -> dict:
        if self.cfg.device_kind != "gpu":
            return {}
        return {
            "peak_device_mb": max(torch.cuda.max_memory_allocated(d) for d in set(self.devs))
            / 2**20
        }

    def compiles(self) -> int:
        return models.compiled_graphs(self.cfg)

    def _average_statistics_once(self) -> None:
        """average_bn_statistics(), unless no training forward ran since it last did."""
        if not self._statistics_averaged:
            self.average_bn_statistics()
            self._statistics_averaged = True

    def _autocast(self):
        """--precision bf16: autocast(bfloat16) around forward and loss; weights, gradients and SGD stay float32."""
        if self.cfg.levers.precision == "bf16":
            return torch.autocast(device_type=autocast_device(self.cfg), dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _memory_format(self, x: torch.Tensor) -> torch.Tensor:
        return models.laid_out(x, self.cfg)

    def _placed(self, x, y):
        """The inputs of reduce_gradients() on their devices: as put() or stage() left them, else placed now."""
        self._statistics_averaged = False  # the training forward that follows updates them
        if isinstance(x, OnDevice):
            return x.take(), y.take()
        return self.place(x, y)


class ScratchTrainer(TorchTrainer):
    """k replicas in one process; gradients reduced with the hand-written allreduce."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self.devs = devices(cfg.devices, cfg.device_kind)
        self.replicas = [
            models.prepare(models.build(cfg.model).to(d, getattr(torch, dtype)), cfg)
            for d in self.devs
        ]
        self.module = self.replicas[0]
        # What runs each replica's forward: the replica, or its compiled wrapper (same parameters).
        self.forwards = self.replicas
        if cfg.levers.compile:
            # One forward code, compiled once per device: room for every device before dynamo falls back to eager.
            torch._dynamo.config.recompile_limit = max(
                torch._dynamo.config.recompile_limit, 2 * cfg.devices
            )
            self.forwards = [
                torch.compile(net, **models.compile_options(cfg)) for net in self.replicas
            ]

    def reset(self) -> None:
        for net in self.replicas:
            models.load_canonical(net, self.weights)
            net.zero_grad(set_to_none=True)
            net.train()

    def place(self, x, y):
        """One shard per replica device (d2l's split_batch)."""
        xs, ys = split(x, y, self.devs)
        return [self._memory_format(xi) for xi in xs], ys

    def reduce_gradients(self, x, y):
        """Per-shard summed loss and its gradients on every replica, then the hand-written allreduce."""
        xs, ys = self._placed(x, y)
        metrics = []
        for net, forward, xi, yi in zip(self.replicas, self.forwards, xs, ys):
            net.zero_grad(set_to_none=True)
            with self._autocast():
                logits = forward(xi)
                loss = F.cross_entropy(logits, yi, reduction="sum")
            loss.backward()
            metrics.append(models.step_metrics(logits, yi, loss))
        params = [list(net.parameters()) for net in self.replicas]
        with torch.no_grad():
            for i in range(len(params[0])):
                allreduce([replica[i].grad for replica in params])
        return metrics

    def update(self) -> None:
        """d2l's sgd: p -= lr * g / B on every replica (g is the gradient of the summed loss)."""
        scale = self.cfg.lr / self.cfg.batch_size
        with torch.no_grad():
            # one multi-tensor kernel per replica on CUDA, not one per parameter
            for net in self.replicas:
                params = list(net.parameters())
                torch._foreach_sub_(params, [p.grad for p in params], alpha=scale)

    def collect(self, handles) -> tuple[float, float]:
        loss = sum(float(l) for step in handles for l, _ in step)
        correct = sum(int(c) for step in handles for _, c in step)
        return loss, correct

    def allreduce_op(self, values: int):
        """One float32 buffer per replica device, summed in place by the hand-written allreduce."""
        buffers = [torch.ones(values, dtype=torch.float32, device=d) for d in self.devs]
        return lambda: allreduce(buffers)

    def average_bn_statistics(self) -> None:
        buffers = [models.bn_buffers(net) for net in self.replicas]
        with torch.no_grad():
            for i in range(len(buffers[0])):
                allreduce([b[i] for b in buffers])
                for b in buffers:
                    b[i].div_(len(self.replicas))

    def canonical_gradients(self) -> dict[str, np.ndarray]:
        """The gradient of the global mean loss, as replica 0 holds it after the allreduce."""
        return {
            n: np.ascontiguousarray((p.grad / self.cfg.batch_size).cpu().numpy())
            for n, p in self.module.named_parameters()
        }

    def evaluate(self, batches) -> tuple[int, int]:
        self._average_statistics_once()
        return models.accuracy_counts(self.module, batches, self.devs[0])


class OptimizerTrainer(TorchTrainer):
    """dp and ddp: the mean loss of the inputs this process sees, gradients reduced by the
    framework (DataParallel's gather, DDP's all-reduce average), torch.optim.SGD."""

    optimizer: torch.optim.Optimizer
    net: nn.Module

    def reset(self) -> None:
        models.load_canonical(self.module, self.weights)
        self.optimizer.zero_grad(set_to_none=True)
        self.net.train()

    def place(self, x, y):
        check_divisible(len(y), self.n_devices)
        xi, yi = self._inputs(x, y)
        return self._memory_format(xi), yi

    def reduce_gradients(self, x, y):
        xi, yi = self._placed(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        with self._autocast():
            logits = self.net(xi)
            loss = F.cross_entropy(logits, yi)
        loss.backward()
        return models.step_metrics(logits, yi, loss * len(yi))

    def update(self) -> None:
        self.optimizer.step()

    def canonical_gradients(self) -> dict[str, np.ndarray]:
        """The gradient of the global mean loss, after the framework's reduction."""
        return {
            n: np.ascontiguousarray(p.grad.detach().cpu().numpy())
            for n, p in self.module.named_parameters()
        }


class DataParallelTrainer(OptimizerTrainer):
    """nn.DataParallel over cuda:0..k-1 (d2l's concise PyTorch version)."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self.devs = devices(cfg.devices, "gpu")
        self.module = models.prepare(
            models.build(cfg.model).to(self.devs[0], getattr(torch, dtype)), cfg
        )
        replicated = self.module
        if cfg.levers.precision == "bf16":
            replicated = models.AutocastForward(replicated, "cuda")
        if cfg.levers.compile:
            replicated = torch.compile(replicated, **models.compile_options(cfg))
        self.net = nn.DataParallel(replicated, device_ids=list(range(cfg.devices)))
        self.optimizer = models.sgd(self.net.parameters(), cfg)

    def collect(self, handles) -> tuple[float, float]:
        return sum(float(l) for l, _ in handles), sum(int(c) for _, c in handles)

    def allreduce_op(self, values: int):
        """DataParallel's reduction: the replicas' gradients summed onto device 0 (its backward), the
        result broadcast to every device (as its next forward's replicate broadcasts the weights)."""
        from torch.cuda import comm

        buffers = [torch.ones(values, dtype=torch.float32, device=d) for d in self.devs]
        targets = list(range(self.n_devices))
        return lambda: comm.broadcast(comm.reduce_add(buffers, destination=0), devices=targets)

    def evaluate(self, batches) -> tuple[int, int]:
        return models.accuracy_counts(self.module, batches, self.devs[0])

    def _inputs(self, x, y):
        """The whole batch goes to device 0; DataParallel scatters it."""
        return (
            as_tensor(x).to(self.devs[0], non_blocking=True),
            as_tensor(y).to(self.devs[0], non_blocking=True).long(),
        )


class RankTrainer(RankCollectives, OptimizerTrainer):
    """One rank of a strategy with a process per device (ddp, fsdp), in the process group launch_ddp set up
    (distributed.py): its shard of every global batch (by its global rank), its slice of the test batches, and its
    own BatchNorm statistics, averaged over the ranks before evaluation."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self.rank = dist.get_rank()
        self.device = rank_device(cfg)
        self.devs = [self.device]

    def average_bn_statistics(self) -> None:
        self._average_over_ranks(models.bn_buffers(self.module))

    def evaluate(self, batches) -> tuple[int, int]:
        """Each rank evaluates its slice of every test batch; the counts are summed."""
        self._average_statistics_once()
        mine = (
            (x[self.rank :: self.n_devices], y[self.rank :: self.n_devices]) for x, y in batches
        )
        correct, total = models.accuracy_counts(self.module, mine, self.device)
        correct, total = self._all_reduce([correct, total])
        return int(correct), int(total)

    def _module_on_rank(self, dtype: str) -> nn.Module:
        """The model on this rank's device in `dtype` (parameters and BatchNorm statistics, so the reductions,
        the synchronised BatchNorm's all-reduces and the step run in it too), --bn sync's BatchNorm in place."""
        module = models.build(self.cfg.model)
        if self.cfg.bn == "sync":
            module = convert_sync_batchnorm(module, self.cfg.device_kind)
        return models.prepare(module.to(self.device, getattr(torch, dtype)), self.cfg)

    def _shard(self, a):
        m = len(a) // self.n_devices
        return as_tensor(a[self.rank * m : (self.rank + 1) * m]).to(self.device, non_blocking=True)

    def _inputs(self, x, y):
        """This rank's shard of the global batch."""
        return self._shard(x), self._shard(y).long()


class DDPTrainer(RankTrainer):
    """One rank of DistributedDataParallel: the whole model on every rank, gradients averaged by DDP's bucketed
    all-reduce during the backward."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        # in `dtype` before DDP builds its gradient buckets, so the all-reduce runs in it too
        self.module = self._module_on_rank(dtype)
        models.load_canonical(self.module, weights)
        # broadcast_buffers=False: every rank keeps its own BatchNorm statistics (averaged before
        # evaluation), the same policy as scratch, instead of copying rank 0's at every forward.
        # (torch's deprecation notice for it says to keep it while rank-local buffers are wanted.)
        with warnings.catch_warnings():
            warnings.filterwarnings(
                "ignore", message=".*broadcast_buffers.*", category=FutureWarning
            )
            self.net = nn.parallel.DistributedDataParallel(
                self.module,
                device_ids=[self.device.index] if cfg.device_kind == "gpu" else None,
                broadcast_buffers=False,
                gradient_as_bucket_view=True,
                bucket_cap_mb=cfg.levers.bucket_mb or None,  # --bucket-mb; 0: DDP's default (25)
            )
        exchange_gradients_as_asked(self.net, cfg)
        # the DDP-wrapped module (dynamo's DDPOptimizer splits the graph at the buckets)
        if cfg.levers.compile:
            self.net = torch.compile(self.net, **models.compile_options(cfg))
        self.optimizer = models.sgd(self.net.parameters(), cfg)


class FSDPTrainer(RankTrainer):
    """One rank of FSDP2 (fully_shard): each parameter and its gradient sharded over the ranks, a block's weights
    all-gathered for its forward (again for its backward with reshard_after_forward=true, ZeRO-3; kept from the
    forward with false, ZeRO-2), its gradients reduce-scattered to their shards, the SGD step on the shards. The
    weights are read whole (canonical(), canonical_gradients()) by gathering the shards: a collective every rank
    calls."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        reshard = MANIFEST.option(cfg.options, "reshard_after_forward") == "true"
        self.module = fully_sharded(
            self._module_on_rank(dtype), cfg.device_kind, reshard, reduce_dtype(cfg)
        )
        models.load_canonical(self.module, weights)
        self.net = self.module
        if cfg.levers.compile:
            self.net = torch.compile(self.module, **models.compile_options(cfg))
        self.optimizer = models.sgd(self.module.parameters(), cfg)

    def allreduce_op(self, values: int):
        """FSDP's exchange of `values` gradient values: reduce-scatter to the shards, then the all-gather of the
        updated shards the next forward makes (an all-reduce's volume, in FSDP's two collectives)."""
        padded = -(-values // self.n_devices) * self.n_devices
        whole_buffer = torch.ones(padded, dtype=torch.float32, device=self.device)
        shard = torch.empty(padded // self.n_devices, dtype=torch.float32, device=self.device)

        # (torch 2.13 names them *_single; torch 2.11's are *_tensor and *_into_tensor)
        reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        all_gather = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

        def exchange():
            reduce_scatter(shard, whole_buffer)
            all_gather(whole_buffer, shard)

        return exchange

    def canonical_gradients(self) -> dict[str, np.ndarray]:
        """The gradient of the global mean loss, its reduce-scattered shards gathered whole."""
        return {
            n: np.ascontiguousarray(whole(p.grad.detach()).cpu().numpy())
            for n, p in self.module.named_parameters()
        }

    def memory(self) -> dict:
        """Beside the device's peak, the parameters this rank holds: its shards."""
        return {**super().memory(), "parameters_mb": local_megabytes(self.module.parameters())}


def reduce_dtype(cfg: RunConfig) -> torch.dtype | None:
    """--grad-dtype bf16: the dtype FSDP reduce-scatters the gradients in (None: theirs)."""
    return torch.bfloat16 if cfg.levers.grad_dtype == "bf16" else None


TRAINERS = {
    "scratch": ScratchTrainer,
    "dp": DataParallelTrainer,
    "ddp": DDPTrainer,
    "fsdp": FSDPTrainer,
}

# The strategy of the float64 reference (float64_gradients, and the check's float32 floor): one process, no engine.
REFERENCE = "scratch"
