"""DDP's processes on torch's own engine, the one `torchrun` runs: this node process is the elastic agent
(torch.distributed.launcher.api.elastic_launch, in process) that starts cfg.local_devices ranks (gloo on the
CPU, NCCL on GPUs) and joins the other nodes at a static rendezvous at cfg.nodes.coordinator, where node_rank decides
the node's ranks (torchrun --node-rank --master-addr --master-port): global rank = node_rank * local_devices +
local_rank, so global rank 0 is on node 0. launch_ddp returns the node's first rank's value (every rank holds
the global figures); a failing rank fails the run with the first failure torch's error files record. The
jobs: common/backend.py's training run and equivalence probe (common.trainer.PROBES), which `launch` sends to
ddp's ranks."""

from __future__ import annotations

import atexit
import datetime
import itertools
import multiprocessing
import os
import pickle
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from backends.torch.environment import configure_precision, configure_threads, host_processes
from common.config import RunConfig
from common.errors import Diverged
from common.network import free_port
from common.worker import scratch_dir

# Every node runs the same launches in the same order (a run, or the probes of a check), so the n-th launch
# has the same run id on every node: its keys in the coordinator's store are its own.
_launches = itertools.count()
# The ranks are forked from a forkserver that has imported torch once, instead of each rank starting a fresh
# interpreter and importing torch again ("spawn"): a launch then costs a rendezvous rather than two imports, which
# matters where one process launches many times (a check, the equivalence tests). The server is a clean,
# single-threaded process started at the first launch (not a fork of this one), so the ranks inherit no thread
# or CUDA state; it takes this process's environment at that moment, which every later launch shares.
START_METHOD = "forkserver"
PRELOADED = ["torch", "torch.distributed", "torch.nn.parallel"]
# Node 0's store server, kept for the process's life: every launch's rendezvous shares it (multi-tenant), so a
# faster node starting the next launch cannot reach the server of the last one as it shuts down.
_coordinator_store = None


def join_timeout(cfg: RunConfig) -> int:
    """Seconds the rendezvous waits for the other nodes: a quarter of the run's timeout, since a store client
    tries its connection twice (with a pause between) before giving up, and its error must still reach the
    result before the run's timeout."""
    return max(1, int(cfg.timeout / 4))


def collective_timeout(cfg: RunConfig) -> float:
    """Seconds a collective waits on a rank before it fails: across nodes the run's engine bound (a lost host is
    named by the harness first), else the run's timeout (a rank of this host that dies fails its peers'
    collectives at once: gloo sees the closed connection), at least a minute."""
    return cfg.engine_timeout if cfg.nodes.count > 1 else max(60, cfg.timeout)


def rendezvous_address(cfg: RunConfig) -> tuple[str, int]:
    """cfg.nodes.coordinator; one node: a free loopback port of its own."""
    if cfg.nodes.count > 1:
        return cfg.nodes.coordinator_address
    return "127.0.0.1", free_port()


def gpu_index(cfg: RunConfig, local_rank: int) -> int:
    """Loopback nodes share this host's GPUs: node r uses [r*L, (r+1)*L); a node on its own host uses [0, L)."""
    return cfg.first_gpu + local_rank


def join(cfg: RunConfig) -> None:
    """Nothing to join for the session (common/backend.py): torch's elastic agent starts the ranks at each
    launch_ddp, and each rank joins its process group there."""


def leave(clean: bool = True) -> None:
    """Nothing to leave: a launch's ranks have ended when it returns."""


# The strategies with a process per device, started by torch's elastic agent (launch_ddp).
RANKED = ("ddp", "fsdp")


def launch(cfg: RunConfig, job, payload=None):
    """job(cfg, rank, payload) where the strategy runs (common/backend.py's runs and probes): ddp and fsdp in their
    ranks (launch_ddp), the others in this process, with its CPU threads (--threads, else every usable core)."""
    if cfg.strategy in RANKED:
        return launch_ddp(cfg, job, payload)
    configure_threads(cfg, processes=1)
    return job(cfg, 0, payload)


def rank_device(cfg: RunConfig) -> torch.device:
    """This rank's device: the GPU _rank_main selected, or the CPU."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if cfg.device_kind == "gpu"
        else torch.device("cpu")
    )


class RankCollectives:
    """What one rank of DistributedDataParallel reduces across the ranks with torch.distributed, the same for
    torch's ddp and Keras's (a Keras model on torch): the steps' figures, the slowest rank's seconds, the timed
    allreduce, and the BatchNorm running statistics. A trainer mixes it in before its Trainer base; it needs
    the trainer's `device` and `n_devices` (the ranks)."""

    device: torch.device
    n_devices: int

    def collect(self, handles) -> tuple[float, float]:
        loss, correct = self._all_reduce(
            [sum(float(l) for l, _ in handles), sum(float(c) for _, c in handles)]
        )
        return loss, correct

    def slowest(self, seconds: float) -> float:
        return self._all_reduce([seconds], op=dist.ReduceOp.MAX)[0]

    def summed(self, values: list[float]) -> list[float]:
        return self._all_reduce(values)

    def allreduce_op(self, values: int):
        """torch.distributed.all_reduce (sum) of one flat float32 tensor on this rank's device."""
        buffer = torch.ones(values, dtype=torch.float32, device=self.device)
        return lambda: dist.all_reduce(buffer)

    def _average_over_ranks(self, buffers: list[torch.Tensor]) -> None:
        """Every rank's copy of each buffer replaced, in place, by their mean (the BatchNorm statistics)."""
        with torch.no_grad():
            for b in buffers:
                dist.all_reduce(b)
                b.div_(self.n_devices)

    def _all_reduce(self, values: list[float], op=dist.ReduceOp.SUM) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=op)
        return t.tolist()


def exchange_gradients_as_asked(
    ddp: torch.nn.parallel.DistributedDataParallel, cfg: RunConfig
) -> None:
    """--grad-dtype bf16 on a DistributedDataParallel module (torch's ddp, Keras's): each bucket all-reduced in
    bfloat16 and cast back, by DDP's own compression hook."""
    if cfg.levers.grad_dtype == "bf16":
        ddp.register_comm_hook(None, bf16_compressed)


def bf16_compressed(process_group, bucket):
    """DDP's bf16_compress_hook, its own body (the bucket cast to bfloat16 and divided by the ranks, all-reduced,
    cast back): DDP refuses the hook by its name off NCCL, though its all-reduce runs on gloo as well."""
    return default_hooks._compress_hook(torch.bfloat16, process_group, bucket)


def launch_ddp(cfg: RunConfig, job, payload=None, preload: tuple[str, ...] = ()):
    """Run job(cfg, rank, payload) in every rank of every node; return this node's first rank's value.
    `preload`: modules the ranks' forkserver imports besides torch's (read at the process's first launch).

    A rank that raises fails the run with the first failure on this node (its message and traceback); the
    agent stops this node's other ranks, so no process is left behind."""
    host, port = rendezvous_address(cfg)
    run_id = f"dpbench-{next(_launches)}"
    multiprocessing.get_context(START_METHOD).set_forkserver_preload([*PRELOADED, *preload])
    # before the first launch starts the forkserver, whose environment every rank has
    bind_transport(cfg)
    if cfg.nodes.count > 1 and cfg.nodes.rank == 0:
        _serve_coordinator(cfg, host, port)
    # The ranks' error files in the worker's scratch directory, which the harness removes: a run killed by a
    # signal cannot clean up.
    with tempfile.TemporaryDirectory(dir=scratch_dir()) as log_dir:
        config = LaunchConfig(
            min_nodes=cfg.nodes.count,
            max_nodes=cfg.nodes.count,
            nproc_per_node=cfg.local_devices,
            run_id=run_id,
            rdzv_backend="static",
            rdzv_endpoint=f"{host}:{port}",
            rdzv_configs={"rank": cfg.nodes.rank, "timeout": join_timeout(cfg)},
            max_restarts=0,
            local_addr=cfg.nodes.local_addr if cfg.nodes.count > 1 else None,
            start_method=START_METHOD,
            logs_specs=DefaultLogsSpecs(log_dir=log_dir),
        )
        try:
            values = elastic_launch(config, _rank_main)(cfg.to_dict(), job, payload)
        except ChildFailedError as e:
            raise RuntimeError(first_failure(cfg, e, log_dir)) from None
        except dist.DistError as e:
            raise RuntimeError(_rendezvous_failure(cfg, host, port, e)) from None
    status, value = pickle.loads(values[cfg.nodes.rank * cfg.local_devices])
    if status == "diverged":
        raise Diverged(value)
    return value


def bind_transport(cfg: RunConfig) -> None:
    """Several nodes: gloo (and NCCL) bind to the interface the harness found for this node (cfg.nodes.interface),
    unless the user set their own. Left alone, gloo takes the address the host's name resolves to, often
    127.0.0.1, and the other hosts cannot reach it."""
    if cfg.nodes.count > 1 and cfg.nodes.interface:
        for variable in TRANSPORT_INTERFACE[cfg.device_kind]:
            os.environ.setdefault(variable, cfg.nodes.interface)


# The variables that choose the interface of each transport's sockets.
TRANSPORT_INTERFACE = {
    "cpu": ("GLOO_SOCKET_IFNAME",),
    "gpu": ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"),
}


def _serve_coordinator(cfg: RunConfig, host: str, port: int) -> None:
    """Node 0: start the coordinator's store server once (each launch's rendezvous then joins it)."""
    global _coordinator_store
    if _coordinator_store is None:
        _coordinator_store = dist.TCPStore(
            host,
            port,
            None,
            True,
            datetime.timedelta(seconds=join_timeout(cfg)),
            wait_for_workers=False,
            multi_tenant=True,
        )


def _rendezvous_failure(cfg: RunConfig, host: str, port: int, error: Exception) -> str:
    waited = f"within {join_timeout(cfg)} s (a quarter of --timeout)"
    if cfg.nodes.rank == 0:
        return f"node 0: not every node joined the rendezvous at {host}:{port} {waited}: {error}"
    return (
        f"node {cfg.nodes.rank} could not reach the coordinator at {host}:{port} {waited}: {error}"
    )


def first_failure(cfg: RunConfig, error: ChildFailedError, log_dir: str) -> str:
    """When one rank fails, the others fail next in their collectives: the first failure, the cause, rather
    than its echoes, as "DDP rank R (node N) failed: <message>" with its traceback. The agent reports the
    failure of whichever rank it saw end first, which may be an echo, so every error file in `log_dir` counts."""
    failures = sorted(
        {**_recorded_failures(cfg, log_dir), **error.failures}.items(),
        key=lambda item: _failed_at(item[1]),
    )
    rank, first = failures[0]
    message, trace = _message_and_trace(first)
    others = "".join(
        f"\n(then DDP rank {r} failed too: {_message_and_trace(f)[0].strip().splitlines()[-1]})"
        for r, f in failures[1:]
    )
    return f"DDP rank {rank} (node {cfg.nodes.rank}) failed: {message}\n{trace}".rstrip() + others


def _recorded_failures(cfg: RunConfig, log_dir: str) -> dict[int, ProcessFailure]:
    """{global rank: its failure} of every rank of this node that left an error file (DefaultLogsSpecs' layout:
    <log_dir>/<run>/attempt_<n>/<local rank>/error.json)."""
    failures = {}
    for path in Path(log_dir).glob("*/attempt_*/*/error.json"):
        local_rank = int(path.parent.name)
        try:
            failures[cfg.nodes.rank * cfg.local_devices + local_rank] = ProcessFailure(
                local_rank, -1, 1, str(path)
            )
        # a rank still writing its file (killed meanwhile): the agent's own record names it
        except ValueError:
            continue
    return failures


def _message_and_trace(failure) -> tuple[str, str]:
    """A rank's failure as its error file holds it (a message and the traceback; a killed rank: a message)."""
    if isinstance(failure.message, dict):
        return failure.message.get("message", ""), failure.message.get("extraInfo", {}).get(
            "py_callstack", ""
        )
    return str(failure.message) or f"exit code {failure.exitcode}", ""


def _failed_at(failure) -> float:
    """A rank's error file's time of writing; the agent's stamp (whole seconds, rounded down: its end) for a
    rank that left none (killed by a signal)."""
    if os.path.isfile(failure.error_file):
        return os.path.getmtime(failure.error_file)
    return failure.timestamp + 1.0


def _rank_main(cfg_dict: dict, job, payload) -> bytes:
    """Body of one rank, started by the agent: join the process group, run the job, return its outcome
    (pickled here, so that handing it to the agent cannot fail after the run succeeded)."""
    cfg = RunConfig.from_dict(cfg_dict)
    local_rank, rank = int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"])
    # CPU 1x1-conv gradients differ from DDP's buckets only in the strides of size-1 dims,
    # which address the same memory: the warning is a false alarm here.
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    configure_threads(cfg, processes=host_processes(cfg))
    configure_precision(cfg)
    if cfg.device_kind == "gpu":
        torch.cuda.set_device(gpu_index(cfg, local_rank))
    dist.init_process_group(
        "nccl" if cfg.device_kind == "gpu" else "gloo",
        store=_rank_store(cfg),
        rank=rank,
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=datetime.timedelta(seconds=collective_timeout(cfg)),
    )
    # A failing rank raises with its group still up: the agent's error file is written before the others
    # see this rank go, so the cause is the first failure.
    try:
        outcome = ("ok", job(cfg, rank, payload))
    except Diverged as e:  # every rank sees the same all-reduced loss, so all stop together
        outcome = ("diverged", str(e))
    dist.destroy_process_group()
    atexit.register(_exit_now)
    return pickle.dumps(outcome)


def _rank_store(cfg: RunConfig) -> dist.Store:
    """The agent's store (node 0's), under this launch's run id: the coordinator's server outlives a launch."""
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=datetime.timedelta(seconds=join_timeout(cfg)),
    )
    return dist.PrefixStore(f"{os.environ['TORCHELASTIC_RUN_ID']}/ranks", store)


def _exit_now() -> None:
    """A finished rank, its value handed to the agent, leaves without running C++ static destructors, where
    gloo's background threads can still be joinable and abort the process ("terminate called without an
    active exception"), intermittently failing a run that has already succeeded."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
