"""PyTorch strategies, each a Trainer for common/loop.py.

Same math in all three: one SGD step on the mean cross-entropy of the *global* batch.
  scratch  k replicas; per-shard summed loss, gradients summed by the hand-written
           allreduce, then p -= lr / B * g on every replica (d2l's from-scratch chapter)
  dp       nn.DataParallel: mean loss on the gathered output, torch.optim.SGD (CUDA only)
  ddp      DistributedDataParallel, one process per device: per-shard mean loss, DDP
           averages gradients across ranks, torch.optim.SGD
BatchNorm: each device normalises with its own shard's statistics in training (as the
seeds do); before evaluation the running statistics are averaged across replicas, so
every replica evaluates the same model (dp keeps device 0's, which is how
DataParallel works).

dtype (the equivalence API only): "float64" runs the same strategy code, its split, reduction,
BatchNorm and SGD step, with every tensor in float64, so that two paths can be proven the same
math to float64 rounding; the benchmark itself always runs float32.

Levers (RunConfig): precision (fp32 / tf32 / bf16 autocast around forward and loss),
compile (torch.compile of what runs the forward; `module` stays the plain nn.Module whose
weights are read and written), channels_last (model and batches in NHWC), resident_data
(stage(): batches placed on the devices before the timer starts).
"""

from __future__ import annotations

import contextlib
import datetime
import os
import pickle
import shutil
import socket
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn import functional as F

from common import data as datalib
from common import levers as leverlib
from common.config import RunConfig
from common.loop import Diverged, Unsupported, feed, run_training, time_calls
from common.weights import for_run as weights_for_run
from common.worker import scratch_dir

from backends.torch import models
from backends.torch.environment import autocast_device, configure_precision, configure_threads
from backends.torch.parallel import allreduce, as_tensor, check_divisible, convert_sync_batchnorm, devices, split


def initial_weights(cfg: RunConfig) -> dict[str, np.ndarray]:
    """The canonical weights this run starts from (the seeded init, or --load-weights)."""
    return weights_for_run(cfg)


def _step_metrics(logits: torch.Tensor, y: torch.Tensor, loss_sum: torch.Tensor):
    """(loss sum, correct) as detached device tensors: read back later, after the timer."""
    return loss_sum.detach(), (logits.argmax(dim=1) == y).sum()


def _accuracy_counts(net: nn.Module, batches, device) -> tuple[int, int]:
    correct = total = 0
    net.eval()
    with torch.no_grad():
        for x, y in batches:
            logits = net(as_tensor(x).to(device))
            correct += int((logits.argmax(dim=1).cpu() == as_tensor(y).long()).sum())
            total += len(y)
    net.train()
    return correct, total


def _bn_buffers(net: nn.Module) -> list[torch.Tensor]:
    return [m.running_mean for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)] + \
           [m.running_var for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def _sync(kind: str, devs) -> None:
    if kind == "gpu":
        for d in sorted(set(devs), key=str):
            torch.cuda.synchronize(d)


def _peak_memory(kind: str, devs) -> dict:
    if kind != "gpu":
        return {}
    return {"peak_device_mb": max(torch.cuda.max_memory_allocated(d) for d in set(devs)) / 2**20}


class OnDevice:
    """An input put() or stage() has already placed where backward() takes it (sharded, in the memory
    format). `ready`: {device: CUDA event} its copies record on their copy streams (none on the CPU)."""

    __slots__ = ("value", "ready")

    def __init__(self, value, ready: dict | None = None):
        self.value, self.ready = value, ready or {}

    def take(self):
        """The value, once the step's streams wait for its copies (the CPU thread does not wait)."""
        for device, event in self.ready.items():
            torch.cuda.current_stream(device).wait_event(event)
        for t in (self.value if isinstance(self.value, list) else [self.value]):
            if t.is_cuda:   # the copy stream allocated it; the compute stream uses it (caching allocator)
                t.record_stream(torch.cuda.current_stream(t.device))
        return self.value


class CopyStreams:
    """Host-to-device copies that overlap compute (CUDA): the numpy batch pinned, then copied by one
    side stream per device; each copy records an event that the step's stream waits for."""

    def __init__(self, devs: list):
        self.streams = {d: torch.cuda.Stream(d) for d in sorted(set(devs), key=str)}

    def put(self, place, x, y) -> tuple[OnDevice, OnDevice]:
        """place(x, y) run on the copy streams, from pinned host memory (so the copies are asynchronous)."""
        x, y = as_tensor(x).pin_memory(), as_tensor(y).pin_memory()
        with contextlib.ExitStack() as on_copy_streams:
            for stream in self.streams.values():
                on_copy_streams.enter_context(torch.cuda.stream(stream))
            placed = place(x, y)
            ready = {d: stream.record_event() for d, stream in self.streams.items()}
        return OnDevice(placed[0], ready), OnDevice(placed[1], ready)


def compile_options(cfg: RunConfig) -> dict:
    """torch.compile's arguments for --compile-mode (none for the default mode)."""
    return {} if cfg.compile_mode == "default" else {"mode": cfg.compile_mode}


def sgd(params, cfg: RunConfig) -> torch.optim.SGD:
    """torch.optim.SGD, its update one multi-tensor (foreach) kernel per step on CUDA."""
    return torch.optim.SGD(params, lr=cfg.lr, foreach=cfg.device_kind == "gpu")


def _prepare_model(net: nn.Module, cfg: RunConfig) -> nn.Module:
    """--channels-last: the 4-d weights in NHWC (values and canonical names unchanged)."""
    return net.to(memory_format=torch.channels_last) if cfg.channels_last else net


class TorchTrainer:
    """What the strategies share: `module` is the model evaluated and reported, `devs` its devices.
    Each takes a `dtype` for its parameters and BatchNorm statistics (float32; float64 in the checks)."""

    cfg: RunConfig
    module: nn.Module
    devs: list
    _copies: CopyStreams | None = None

    @property
    def copies(self) -> CopyStreams:
        if self._copies is None:
            self._copies = CopyStreams(self.devs)
        return self._copies

    def step(self, x, y):
        handle = self.backward(x, y)
        self.update()
        return handle

    def autocast(self):
        """--precision bf16: autocast(bfloat16) around forward and loss; weights, gradients and SGD stay float32."""
        if self.cfg.precision == "bf16":
            return torch.autocast(device_type=autocast_device(self.cfg), dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def memory_format(self, x: torch.Tensor) -> torch.Tensor:
        return x.contiguous(memory_format=torch.channels_last) if self.cfg.channels_last else x

    def placed(self, x, y):
        """The inputs of backward() on their devices: as put() or stage() left them, else placed now."""
        if isinstance(x, OnDevice):
            return x.take(), y.take()
        return self.place(x, y)

    def put(self, x, y):
        """One batch placed ahead of its step: on CUDA copied from pinned memory on copy streams, not waited
        for; on the CPU placed now (the shards are views of the numpy batch: nothing to copy)."""
        if self.cfg.device_kind == "gpu":
            return self.copies.put(self.place, x, y)
        return tuple(OnDevice(v) for v in self.place(x, y))

    def stage(self, batches: list) -> list:
        """--resident-data: the numpy batches placed as backward() takes them; step() then copies nothing."""
        staged = [self.put(x, y) for x, y in batches]
        self.sync()
        return staged

    def allreduce_seconds(self, values: int, repeats: int) -> list[float]:
        """The strategy's gradient reduction of `values` float32 per device, timed `repeats` times
        (after one untimed call), each between two barriers; the slowest rank's seconds for each."""
        return time_calls(self, self.allreduce_op(values), repeats)

    def sync(self) -> None:
        _sync(self.cfg.device_kind, self.devs)

    def slowest(self, seconds: float) -> float:
        return seconds

    def param_count(self) -> int:
        return models.count_params(self.module)

    def memory(self) -> dict:
        return _peak_memory(self.cfg.device_kind, self.devs)

    def canonical(self) -> dict[str, np.ndarray]:
        return models.to_canonical(self.module)

    def averaged_canonical(self) -> dict[str, np.ndarray]:
        """canonical() with BatchNorm running statistics averaged across replicas (the evaluation policy)."""
        self.average_bn_statistics()
        return self.canonical()

    def average_bn_statistics(self) -> None:
        """Nothing to do with one copy of the model (DataParallel keeps device 0's)."""


class ScratchTrainer(TorchTrainer):
    """k replicas in one process; gradients reduced with the hand-written allreduce."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], rank: int = 0, dtype=torch.float32):
        self.cfg, self.weights, self.rank = cfg, weights, 0
        self.n_devices = cfg.devices
        self.devs = devices(cfg.devices, cfg.device_kind)
        self.replicas = [_prepare_model(models.build(cfg.model).to(d, dtype), cfg) for d in self.devs]
        self.module = self.replicas[0]
        # What runs each replica's forward: the replica, or its compiled wrapper (same parameters).
        self.forwards = self.replicas
        if cfg.compile:
            # One forward code, compiled once per device: room for every device before dynamo falls back to eager.
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * cfg.devices)
            self.forwards = [torch.compile(net, **compile_options(cfg)) for net in self.replicas]

    def reset(self) -> None:
        for net in self.replicas:
            models.load_canonical(net, self.weights)
            net.zero_grad(set_to_none=True)
            net.train()

    def place(self, x, y):
        """One shard per replica device (d2l's split_batch)."""
        xs, ys = split(x, y, self.devs)
        return [self.memory_format(xi) for xi in xs], ys

    def backward(self, x, y):
        """Per-shard summed loss and its gradients on every replica, then the hand-written allreduce."""
        xs, ys = self.placed(x, y)
        metrics = []
        for net, forward, xi, yi in zip(self.replicas, self.forwards, xs, ys):
            net.zero_grad(set_to_none=True)
            with self.autocast():
                logits = forward(xi)
                loss = F.cross_entropy(logits, yi, reduction="sum")
            loss.backward()
            metrics.append(_step_metrics(logits, yi, loss))
        params = [list(net.parameters()) for net in self.replicas]
        with torch.no_grad():
            for i in range(len(params[0])):
                allreduce([replica[i].grad for replica in params])
        return metrics

    def update(self) -> None:
        """d2l's sgd: p -= lr * g / B on every replica (g is the gradient of the summed loss)."""
        scale = self.cfg.lr / self.cfg.batch_size
        with torch.no_grad():
            for net in self.replicas:   # one multi-tensor kernel per replica on CUDA, not one per parameter
                params = list(net.parameters())
                torch._foreach_sub_(params, [p.grad for p in params], alpha=scale)

    def gradient_dict(self) -> dict[str, np.ndarray]:
        """The gradient of the global mean loss, as replica 0 holds it after the allreduce."""
        return {n: np.ascontiguousarray((p.grad / self.cfg.batch_size).cpu().numpy())
                for n, p in self.module.named_parameters()}

    def allreduce_op(self, values: int):
        """One float32 buffer per replica device, summed in place by the hand-written allreduce."""
        buffers = [torch.ones(values, dtype=torch.float32, device=d) for d in self.devs]
        return lambda: allreduce(buffers)

    def collect(self, handles) -> tuple[float, float]:
        loss = sum(float(l) for step in handles for l, _ in step)
        correct = sum(int(c) for step in handles for _, c in step)
        return loss, correct

    def average_bn_statistics(self) -> None:
        buffers = [_bn_buffers(net) for net in self.replicas]
        with torch.no_grad():
            for i in range(len(buffers[0])):
                allreduce([b[i] for b in buffers])
                for b in buffers:
                    b[i].div_(len(self.replicas))

    def evaluate(self, batches) -> tuple[int, int]:
        self.average_bn_statistics()
        return _accuracy_counts(self.module, batches, self.devs[0])


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
        xi, yi = self.inputs(x, y)
        return self.memory_format(xi), yi

    def backward(self, x, y):
        xi, yi = self.placed(x, y)
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            logits = self.net(xi)
            loss = F.cross_entropy(logits, yi)
        loss.backward()
        return _step_metrics(logits, yi, loss * len(yi))

    def update(self) -> None:
        self.optimizer.step()

    def gradient_dict(self) -> dict[str, np.ndarray]:
        """The gradient of the global mean loss, after the framework's reduction."""
        return {n: np.ascontiguousarray(p.grad.detach().cpu().numpy()) for n, p in self.module.named_parameters()}


class DataParallelTrainer(OptimizerTrainer):
    """nn.DataParallel over cuda:0..k-1 (d2l's concise PyTorch version)."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], rank: int = 0, dtype=torch.float32):
        require_cuda(cfg)
        self.cfg, self.weights, self.rank = cfg, weights, 0
        self.n_devices = cfg.devices
        self.devs = devices(cfg.devices, "gpu")
        self.module = _prepare_model(models.build(cfg.model).to(self.devs[0], dtype), cfg)
        replicated = self.module
        if cfg.precision == "bf16":
            replicated = AutocastForward(replicated, "cuda")
        if cfg.compile:
            replicated = torch.compile(replicated, **compile_options(cfg))
        self.net = nn.DataParallel(replicated, device_ids=list(range(cfg.devices)))
        self.optimizer = sgd(self.net.parameters(), cfg)

    def inputs(self, x, y):
        """The whole batch goes to device 0; DataParallel scatters it."""
        return (as_tensor(x).to(self.devs[0], non_blocking=True),
                as_tensor(y).to(self.devs[0], non_blocking=True).long())

    def collect(self, handles) -> tuple[float, float]:
        return sum(float(l) for l, _ in handles), sum(int(c) for _, c in handles)

    def evaluate(self, batches) -> tuple[int, int]:
        return _accuracy_counts(self.module, batches, self.devs[0])

    def allreduce_op(self, values: int):
        """DataParallel's reduction: the replicas' gradients summed onto device 0 (its backward), the
        result broadcast to every device (as its next forward's replicate broadcasts the weights)."""
        from torch.cuda import comm
        buffers = [torch.ones(values, dtype=torch.float32, device=d) for d in self.devs]
        targets = list(range(self.n_devices))
        return lambda: comm.broadcast(comm.reduce_add(buffers, destination=0), devices=targets)


class AutocastForward(nn.Module):
    """dp with bf16: autocast opened inside each replica's forward. DataParallel runs replicas in their
    own threads, where autocast is re-entered with the thread's default dtype (float16 on CUDA)."""

    def __init__(self, inner: nn.Module, device_type: str):
        super().__init__()
        self.inner, self.device_type = inner, device_type

    def forward(self, x):
        with torch.autocast(device_type=self.device_type, dtype=torch.bfloat16):
            return self.inner(x)


class DDPTrainer(OptimizerTrainer):
    """One rank of DistributedDataParallel; the process group is set up by launch_ddp."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], rank: int, dtype=torch.float32):
        self.cfg, self.weights, self.rank = cfg, weights, rank
        self.n_devices = cfg.devices
        self.device = devices(cfg.devices, cfg.device_kind)[rank]
        self.devs = [self.device]
        self.module = models.build(cfg.model)
        if cfg.bn == "sync":
            self.module = convert_sync_batchnorm(self.module, cfg.device_kind)
        # Parameters and BatchNorm statistics in `dtype` before DDP builds its gradient buckets,
        # so the all-reduce, the synchronised BatchNorm's all-reduces and the step run in it too.
        self.module = _prepare_model(self.module.to(self.device, dtype), cfg)
        models.load_canonical(self.module, weights)
        # broadcast_buffers=False: every rank keeps its own BatchNorm statistics (averaged before
        # evaluation), the same policy as scratch, instead of copying rank 0's at every forward.
        # (torch's deprecation notice for it says to keep it while rank-local buffers are wanted.)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
            self.net = nn.parallel.DistributedDataParallel(
                self.module, device_ids=[self.device.index] if cfg.device_kind == "gpu" else None,
                broadcast_buffers=False, gradient_as_bucket_view=True)
        if cfg.compile:   # the DDP-wrapped module (dynamo's DDPOptimizer splits the graph at the buckets)
            self.net = torch.compile(self.net, **compile_options(cfg))
        self.optimizer = sgd(self.net.parameters(), cfg)

    def _shard(self, a):
        m = len(a) // self.n_devices
        return as_tensor(a[self.rank * m:(self.rank + 1) * m]).to(self.device, non_blocking=True)

    def inputs(self, x, y):
        """This rank's shard of the global batch."""
        return self._shard(x), self._shard(y).long()

    def _all_reduce(self, values: list[float], op=dist.ReduceOp.SUM) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()

    def collect(self, handles) -> tuple[float, float]:
        local = [sum(float(l) for l, _ in handles), sum(float(c) for _, c in handles)]
        loss, correct = self._all_reduce(local)
        return loss, correct

    def average_bn_statistics(self) -> None:
        with torch.no_grad():
            for b in _bn_buffers(self.module):
                dist.all_reduce(b)
                b.div_(self.n_devices)

    def evaluate(self, batches) -> tuple[int, int]:
        """Each rank evaluates its slice of every test batch; the counts are summed."""
        self.average_bn_statistics()
        mine = ((x[self.rank::self.n_devices], y[self.rank::self.n_devices]) for x, y in batches)
        correct, total = _accuracy_counts(self.module, mine, self.device)
        correct, total = self._all_reduce([correct, total])
        return int(correct), int(total)

    def slowest(self, seconds: float) -> float:
        return self._all_reduce([seconds], op=dist.ReduceOp.MAX)[0]

    def allreduce_op(self, values: int):
        """torch.distributed.all_reduce (sum) of one flat float32 tensor on this rank's device."""
        buffer = torch.ones(values, dtype=torch.float32, device=self.device)
        return lambda: dist.all_reduce(buffer)


TRAINERS = {"scratch": ScratchTrainer, "dp": DataParallelTrainer, "ddp": DDPTrainer}


def require_cuda(cfg: RunConfig) -> None:
    if not torch.cuda.is_available():
        raise Unsupported(f"strategy {cfg.strategy!r} (nn.DataParallel) needs CUDA GPUs; none is visible to torch")


def check_supported(cfg: RunConfig) -> None:
    if cfg.strategy not in TRAINERS:
        raise Unsupported(f"torch has no strategy {cfg.strategy!r}; it has {', '.join(TRAINERS)}")
    if cfg.strategy == "dp":
        require_cuda(cfg)
    if cfg.bn == "sync" and cfg.strategy != "ddp":
        raise Unsupported(f"torch {cfg.strategy} has no synchronised BatchNorm (--bn sync runs with ddp)")
    if cfg.device_kind == "gpu":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise Unsupported(f"GPU run requested but torch ({torch.__version__}, {build}) sees no CUDA device")
        if torch.cuda.device_count() < cfg.devices:
            raise Unsupported(f"{cfg.devices} GPUs requested, torch sees {torch.cuda.device_count()}")
    check_levers(cfg)


def check_levers(cfg: RunConfig) -> None:
    if reason := leverlib.check(cfg):   # what backend.toml declares
        raise Unsupported(reason)
    gpu = cfg.device_kind == "gpu"
    if cfg.precision == "tf32":
        if not gpu:
            raise Unsupported("TF32 is a mode of NVIDIA tensor cores; there is none on the CPU")
        major, minor = torch.cuda.get_device_capability(0)
        if major < 8:
            raise Unsupported(f"TF32 needs an Ampere or newer GPU (compute capability 8.0); "
                              f"this one is {major}.{minor}")
    if cfg.precision == "bf16" and gpu and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise Unsupported("this GPU has no native bfloat16 arithmetic")
    if cfg.compile:
        if cfg.strategy == "dp" and cfg.devices > 1:
            raise Unsupported("torch.compile does not survive nn.DataParallel's replication: every replica "
                              "would call device 0's compiled module (use ddp, or dp on one GPU)")
        if not gpu and not shutil.which(os.environ.get("CXX", "g++")):
            raise Unsupported("torch.compile on the CPU needs a C++ compiler for TorchInductor; none found")


# ------------------------------------------------------------------- multi-process

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, cfg_dict: dict, port: int, job, payload, out_dir: str) -> None:
    """Body of one DDP process: join the group, run the job; rank 0 reports, a failing rank leaves its error."""
    cfg = RunConfig.from_dict(cfg_dict)
    # CPU 1x1-conv gradients differ from DDP's buckets only in the strides of size-1 dims,
    # which address the same memory: the warning is a false alarm here.
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    configure_threads(cfg, processes=cfg.devices)
    configure_precision(cfg)
    try:
        if cfg.device_kind == "gpu":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            "nccl" if cfg.device_kind == "gpu" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
            rank=rank, world_size=cfg.devices, timeout=datetime.timedelta(seconds=max(60, cfg.timeout)))
        try:
            outcome = ("ok", job(cfg, rank, payload))
        except Diverged as e:  # every rank sees the same all-reduced loss, so all stop together
            outcome = ("diverged", str(e))
        except BaseException:
            _record_failure(out_dir, rank)  # before tearing down the group wakes the other ranks
            raise
        finally:
            dist.destroy_process_group()
        if rank == 0:
            with open(os.path.join(out_dir, "rank0.pkl"), "wb") as f:
                pickle.dump(outcome, f)
    except BaseException:
        _record_failure(out_dir, rank)
        raise
    # Done and reported: leave without running C++ static destructors, where gloo's background
    # threads can still be joinable and abort the process ("terminate called without an active
    # exception"), intermittently failing a run that has already succeeded.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _record_failure(out_dir: str, rank: int) -> None:
    """When one rank fails, the others fail next in their collectives; the time stamp lets
    the parent report the first failure, the cause, rather than its echoes."""
    path = os.path.join(out_dir, f"rank{rank}.error")
    if not os.path.exists(path):
        with open(path, "w") as f:
            f.write(f"{time.time()}\n{traceback.format_exc()}")


def _first_failure(out_dir: str) -> str | None:
    errors = []
    for name in os.listdir(out_dir):
        if name.endswith(".error"):
            with open(os.path.join(out_dir, name)) as f:
                stamp, _, text = f.read().partition("\n")
            errors.append((float(stamp), name[4:-6], text.strip()))
    if not errors:
        return None
    errors.sort()
    _, rank, text = errors[0]
    others = "".join(f"\n(then rank {r} failed too: {t.splitlines()[-1]})" for _, r, t in errors[1:])
    return f"DDP rank {rank} failed: {text}{others}"


def launch_ddp(cfg: RunConfig, job, payload=None):
    """Run job(cfg, rank, payload) in cfg.devices processes; return rank 0's value.

    A rank that raises fails the whole run with that rank's traceback; torch's spawn
    terminates the other ranks, so no process is left behind.
    """
    # In the worker's scratch directory, which the harness removes: a run killed by a signal cannot clean up.
    with tempfile.TemporaryDirectory(dir=scratch_dir()) as out_dir:
        try:
            mp.start_processes(_rank_main, args=(cfg.to_dict(), _free_port(), job, payload, out_dir),
                               nprocs=cfg.devices, join=True, start_method="spawn")
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as e:
            raise RuntimeError(_first_failure(out_dir) or f"DDP rank {e.error_index} failed: {e}") from None
        with open(os.path.join(out_dir, "rank0.pkl"), "rb") as f:
            status, value = pickle.load(f)
    if status == "diverged":
        raise Diverged(value)
    return value


def _train_job(cfg: RunConfig, rank: int, payload):
    trainer = DDPTrainer(cfg, initial_weights(cfg), rank)
    return run_training(trainer, cfg, datalib.load(cfg))


def _probe(trainer, batches: list, kind: str):
    """What the equivalence checks read: the first batch's (mean loss, gradients), or a
    trace of SGD steps: the weights after the first and the last, and every step's mean loss.
    With resident_data the batches go through stage() first, else through the loop's feed (--prefetch)."""
    size = len(batches[0][1])
    if trainer.cfg.resident_data:
        batches = trainer.stage(batches)
    trainer.reset()
    batches = feed(trainer, batches, trainer.cfg)   # put ahead of their steps, as in training (--prefetch)
    if kind == "gradients":
        loss_sum, _ = trainer.collect([trainer.backward(*next(batches))])
        return loss_sum / size, trainer.gradient_dict()
    losses, first = [], None
    for x, y in batches:
        losses.append(trainer.collect([trainer.step(x, y)])[0] / size)
        if first is None:
            first = trainer.averaged_canonical()
    return {"first": first, "final": trainer.averaged_canonical(), "losses": losses}


def _probe_job(cfg: RunConfig, rank: int, payload):
    weights, batches, kind, dtype = payload
    return _probe(DDPTrainer(cfg, weights, rank, getattr(torch, dtype)), batches, kind)


def _probe_run(strategy, model, n_devices, weights, batches, lr, device_kind, bn, kind, dtype, levers):
    """`levers`: RunConfig lever fields (precision, compile, channels_last, resident_data)."""
    cfg = RunConfig(backend="torch", strategy=strategy, devices=n_devices, device_kind=device_kind,
                    model=model, batch_size=len(batches[0][1]), lr=lr, bn=bn, **levers).validate()
    leverlib.check_dtype(dtype, cfg)
    check_supported(cfg)
    batches = [(np.asarray(x, dtype=dtype), y) for x, y in batches]   # float32 -> float64 is exact
    if strategy == "ddp":
        return launch_ddp(cfg, _probe_job, (weights, batches, kind, dtype))
    configure_precision(cfg)
    return _probe(TRAINERS[strategy](cfg, weights, dtype=getattr(torch, dtype)), batches, kind)


# ----------------------------------------------------------------------- entry points

def run(cfg: RunConfig) -> dict:
    """Train as the run config says; the metrics part of a result."""
    check_supported(cfg)
    if cfg.strategy == "ddp":
        return launch_ddp(cfg, _train_job)
    configure_threads(cfg, processes=1)
    configure_precision(cfg)
    trainer = TRAINERS[cfg.strategy](cfg, initial_weights(cfg))
    return run_training(trainer, cfg, datalib.load(cfg))


def train_trace(strategy: str, model: str, n_devices: int, weights: dict[str, np.ndarray], batches: list,
                lr: float, bn: str = "local", device_kind: str = "cpu", dtype: str = "float32", **levers) -> dict:
    """SGD steps from `weights`: {"first": weights after step 1, "final": after the last, "losses": per step}.
    Weights are canonical, BatchNorm running statistics included and averaged across replicas. `dtype`:
    "float32", or "float64" for the same strategy code entirely in float64 (arrays returned in it).
    `levers`: RunConfig's precision, compile, channels_last, resident_data (default: the plain fp32 eager
    run; with float64 only resident_data)."""
    return _probe_run(strategy, model, n_devices, weights, batches, lr, device_kind, bn, "trace", dtype, levers)


def train_steps(strategy: str, model: str, n_devices: int, weights: dict[str, np.ndarray], batches: list,
                lr: float, bn: str = "local", device_kind: str = "cpu", dtype: str = "float32",
                **levers) -> dict[str, np.ndarray]:
    """The canonical weights after len(batches) SGD steps from `weights` (for tests and checks)."""
    return train_trace(strategy, model, n_devices, weights, batches, lr, bn, device_kind, dtype, **levers)["final"]


def gradients(strategy: str, model: str, n_devices: int, weights: dict[str, np.ndarray], x, y,
              bn: str = "local", device_kind: str = "cpu", dtype: str = "float32",
              **levers) -> tuple[float, dict[str, np.ndarray]]:
    """(mean loss of the global batch, its gradient per trainable canonical parameter), as the strategy
    computes it: every device on its shard, then the strategy's own reduction; replica 0's copy.
    `dtype` as in train_trace."""
    return _probe_run(strategy, model, n_devices, weights, [(x, y)], 1.0, device_kind, bn, "gradients", dtype,
                      levers)


def float64_reference(model: str, n_devices: int, weights: dict[str, np.ndarray], batches: list, lr: float,
                      bn: str = "local") -> tuple[float, dict[str, np.ndarray], dict]:
    """The math every strategy implements, computed in float64 on the CPU by scratch: (mean loss, gradients)
    of the first batch and the trace of SGD steps. `local` BatchNorm: k shards, each normalised with its own
    statistics; `sync`: statistics over the global batch, which is 1-device training.

    `harness check` measures each float32 implementation's distance from this, so that rounding
    (float32 sums in a different order) can be told apart from different math."""
    k = 1 if bn == "sync" else n_devices
    loss, grads = gradients("scratch", model, k, weights, *batches[0], dtype="float64")
    return loss, grads, train_trace("scratch", model, k, weights, batches, lr, dtype="float64")


def float64_gradients(model: str, weights: dict[str, np.ndarray], x, y) -> tuple[float, dict[str, np.ndarray]]:
    """(mean loss, canonical gradients) of one batch on one CPU device, computed in float64."""
    return gradients("scratch", model, 1, weights, x, y, dtype="float64")
