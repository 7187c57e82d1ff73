"""Devices, split and allreduce in PyTorch (d2l's split_batch and allreduce), and tensors as the tests read
them; batches pinned before the timer and placed ahead of their step (PinnedBatches, OnDevice, CopyStreams);
the synchronised BatchNorm of DDP on the CPU."""

from __future__ import annotations

import contextlib

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from common.data import check_divisible


def devices(n: int, kind: str = "cpu") -> list[torch.device]:
    """n data-parallel devices: cuda:0..n-1, or n simulated replicas on the one CPU device."""
    if kind == "gpu":
        return [torch.device(f"cuda:{i}") for i in range(n)]
    return [torch.device("cpu")] * n


def as_tensor(a) -> torch.Tensor:
    return a if isinstance(a, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(a))


def split(X, y, devs: list[torch.device]):
    """Shard a global batch into len(devs) equal parts along axis 0, part i on devs[i].

    Uneven shards would weight examples differently in the averaged gradient, so a
    batch that does not divide evenly is refused with ValueError (common.data.check_divisible).
    """
    X, y = as_tensor(X), as_tensor(y)
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X has {X.shape[0]} examples but y has {y.shape[0]}")
    check_divisible(X.shape[0], len(devs))
    xs = [part.to(d, non_blocking=True) for part, d in zip(X.chunk(len(devs)), devs)]
    ys = [part.to(d, non_blocking=True).long() for part, d in zip(y.chunk(len(devs)), devs)]
    return xs, ys


def allreduce(data: list[torch.Tensor]) -> list[torch.Tensor]:
    """Hand-written allreduce, as d2l: sum onto the first device, then copy the sum back.

    In place: afterwards every tensor holds the elementwise sum. Returns the list.
    """
    with torch.no_grad():
        for i in range(1, len(data)):
            data[0] += data[i].to(data[0].device)
        for i in range(1, len(data)):
            data[i].copy_(data[0].to(data[i].device))
    return data


# Tensors as the tests make and read them (common/backend.py's Parallel).


def array(values: np.ndarray, device: torch.device) -> torch.Tensor:
    return torch.tensor(values).to(device)


def to_numpy(a: torch.Tensor) -> np.ndarray:
    return a.detach().cpu().numpy()


def device_of(a: torch.Tensor) -> torch.device:
    return a.device


class OnDevice:
    """An input put() or stage() has already placed where reduce_gradients() takes it (sharded, in the memory
    format). `ready`: {device: CUDA event} its copies record on their copy streams (none on the CPU)."""

    __slots__ = ("value", "ready")

    def __init__(self, value, ready: dict | None = None):
        self.value, self.ready = value, ready or {}

    def take(self):
        """The value, once the step's streams wait for its copies (the CPU thread does not wait)."""
        for device, event in self.ready.items():
            torch.cuda.current_stream(device).wait_event(event)
        for t in self.value if isinstance(self.value, list) else [self.value]:
            # the copy stream allocated it; the compute stream uses it (caching allocator)
            if t.is_cuda:
                t.record_stream(torch.cuda.current_stream(t.device))
        return self.value


class PinnedBatches:
    """Page-locked host memory for a timed part's batches (CUDA), allocated once and refilled before each timer
    starts, as DataLoader's pin_memory thread fills pinned batches off the training loop's path. The copies from
    it are asynchronous, and no step allocates page-locked memory, which CUDA makes a synchronisation point of
    the device. The labels are widened to int64 here, so the step's copy is the only work left on them. Refilling
    is safe: every timed part ends at a barrier, so no copy still reads the memory."""

    def __init__(self):
        self.x = self.y = None

    def fill(self, batches: list) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The batches as slices of the page-locked buffers, in order."""
        if not batches:
            return batches
        rows = sum(len(y) for _, y in batches)
        first = as_tensor(batches[0][0])
        self.x = self._fitting(self.x, (rows, *first.shape[1:]), first.dtype)
        self.y = self._fitting(self.y, (rows,), torch.int64)
        pinned, at = [], 0
        for x, y in batches:
            xs, ys = self.x[at : at + len(y)], self.y[at : at + len(y)]
            xs.copy_(as_tensor(x))
            ys.copy_(as_tensor(y))
            pinned.append((xs, ys))
            at += len(y)
        return pinned

    @staticmethod
    def _fitting(buffer, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        """`buffer` where it holds `shape` of `dtype` (its first axis may be longer), else a new one."""
        if buffer is not None and buffer.dtype == dtype and buffer.shape[1:] == shape[1:]:
            if buffer.shape[0] >= shape[0]:
                return buffer
        return torch.empty(shape, dtype=dtype, pin_memory=True)


class CopyStreams:
    """Host-to-device copies that overlap compute (CUDA): a pinned batch copied by one side stream per
    device; each copy records an event that the step's stream waits for."""

    def __init__(self, devs: list):
        self.streams = {d: torch.cuda.Stream(d) for d in sorted(set(devs), key=str)}

    def put(self, place, x, y) -> tuple[OnDevice, OnDevice]:
        """place(x, y) run on the copy streams, from pinned host memory (so the copies are asynchronous). The
        loop's batches come pinned (PinnedBatches); a batch that does not (a test's) is pinned here."""
        x, y = (t if t.is_pinned() else t.pin_memory() for t in (as_tensor(x), as_tensor(y)))
        with contextlib.ExitStack() as on_copy_streams:
            for stream in self.streams.values():
                on_copy_streams.enter_context(torch.cuda.stream(stream))
            placed = place(x, y)
            ready = {d: stream.record_event() for d, stream in self.streams.items()}
        return OnDevice(placed[0], ready), OnDevice(placed[1], ready)


class AllReduceSum(torch.autograd.Function):
    """Sum across ranks, differentiable: each rank's output feeds its own loss and the objective
    is their sum, so the gradient of the input is the sum of every rank's output gradient."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t)
        return t

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        dist.all_reduce(grad)
        return grad


class CPUSyncBatchNorm(nn.BatchNorm2d):
    """BatchNorm over the global batch of all DDP ranks, for CPU (torch's SyncBatchNorm is GPU-only).

    Two differentiable all-reduces per layer (the mean, then the centred sum of squares),
    so autograd carries the gradient through the statistics exactly as for one device
    holding the whole batch. Running statistics follow torch's rule (unbiased variance).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return super().forward(x)
        shape = (1, -1, 1, 1)
        count = torch.tensor(float(x.numel() // x.shape[1]), dtype=x.dtype)
        dist.all_reduce(count)
        mean = AllReduceSum.apply(x.sum(dim=(0, 2, 3))) / count
        centred = x - mean.view(shape)
        var = AllReduceSum.apply((centred * centred).sum(dim=(0, 2, 3))) / count
        with torch.no_grad():
            self.running_mean.mul_(1 - self.momentum).add_(mean.detach(), alpha=self.momentum)
            self.running_var.mul_(1 - self.momentum).add_(
                var.detach() * count / (count - 1), alpha=self.momentum
            )
            self.num_batches_tracked.add_(1)
        y = centred / torch.sqrt(var.view(shape) + self.eps)
        return y * self.weight.view(shape) + self.bias.view(shape)


def convert_sync_batchnorm(module: nn.Module, device_kind: str) -> nn.Module:
    """--bn sync under DDP: torch's SyncBatchNorm on GPUs, CPUSyncBatchNorm on the CPU."""
    if device_kind == "gpu":
        return nn.SyncBatchNorm.convert_sync_batchnorm(module)
    for name, child in module.named_children():
        if isinstance(child, nn.BatchNorm2d):
            sync = CPUSyncBatchNorm(child.num_features, eps=child.eps, momentum=child.momentum)
            sync.load_state_dict(child.state_dict())
            setattr(module, name, sync)
        else:
            convert_sync_batchnorm(child, device_kind)
    return module


# ------------------------------------------------------------------ FSDP2: parameters sharded over the ranks


def fully_sharded(
    module: nn.Module,
    device_kind: str,
    reshard_after_forward: bool,
    reduce_dtype: torch.dtype | None = None,
) -> nn.Module:
    """`module` under FSDP2 over every rank (one mesh axis): each block a unit of its own, whose weights are
    all-gathered for its forward (and, resharded after it, again for its backward) and whose gradients are
    reduce-scattered (in `reduce_dtype` where given), then the root, which holds what is left (the stem, the
    classifier)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh("cuda" if device_kind == "gpu" else "cpu", (dist.get_world_size(),))
    how = {
        "mesh": mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": MixedPrecisionPolicy(reduce_dtype=reduce_dtype),
    }
    for unit in shard_units(module):
        fully_shard(unit, **how)
    return fully_shard(module, **how)


def shard_units(module: nn.Module) -> list[nn.Module]:
    """The units FSDP gathers one at a time: every block of a top-level nn.Sequential (a ResNet stage's residual
    blocks), else every top-level layer with parameters; FSDP's advice, one unit per block, so that only one
    block's weights are whole at a time."""
    units = []
    for child in module.children():
        if isinstance(child, nn.Sequential):
            units += list(child.children())
        elif any(True for _ in child.parameters()):
            units.append(child)
    return units


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded parameter or gradient (a DTensor) gathered whole on every rank, a collective; a plain one as
    it is."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def load_whole(tensor: torch.Tensor, value: torch.Tensor) -> None:
    """`value`, the whole tensor every rank holds alike, copied into `tensor`: a sharded parameter takes its
    rank's shard of it (no communication: every rank has the whole), a plain one all of it."""
    if hasattr(tensor, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        value = distribute_tensor(
            value.to(tensor.device, tensor.dtype),
            tensor.device_mesh,
            tensor.placements,
            src_data_rank=None,
        )
    tensor.copy_(value)


def local_megabytes(tensors) -> float:
    """MiB of `tensors` this rank holds: of a sharded one, its shard."""
    held = (t.to_local() if hasattr(t, "to_local") else t for t in tensors)
    return sum(t.numel() * t.element_size() for t in held) / 2**20
