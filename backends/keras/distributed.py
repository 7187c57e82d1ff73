"""The ddp strategy's processes, started by the torch backend's launcher (backends/torch/distributed.py:
torchrun's elastic agent in this node's process, a static rendezvous at cfg.nodes.coordinator, gloo on the CPU and NCCL
on GPUs, the first failing rank's error as the run's), so that the two DDP strategies start, meet and fail alike.
Every rank imports Keras on torch (KERAS_BACKEND=torch, as the Keras guide's recipe sets it): the model each
rank builds is then a torch.nn.Module that DistributedDataParallel can wrap. The jobs the ranks run are
common/backend.py's run and probe."""

from __future__ import annotations

import contextlib
import os

from backends.torch import distributed as torch_ranks

# The ddp trainer's device, collectives and gradient exchange, and the session's join and leave (nothing: the ranks
# join at each launch; distribution and fsdp run in one process), as torch's ddp's.
from backends.torch.distributed import (  # noqa: F401
    RankCollectives,
    exchange_gradients_as_asked,
    join,
    leave,
    rank_device,
)
from common.config import RunConfig

RANKS_FRAMEWORK = "torch"  # what Keras runs on in the ddp ranks


def launch(cfg: RunConfig, job, payload=None):
    """job(cfg, rank, payload) where the strategy runs (common/backend.py's runs and probes): ddp in its ranks
    (launch_ddp), distribution and fsdp in this process."""
    if cfg.strategy == "ddp":
        return launch_ddp(cfg, job, payload)
    return job(cfg, 0, payload)


def launch_ddp(cfg: RunConfig, job, payload=None):
    """Run job(cfg, rank, payload) in every rank of every node, Keras on torch in each; this node's first
    rank's value (torch's launch_ddp)."""
    # the ranks (and their forkserver) take it
    with keras_backend(RANKS_FRAMEWORK):
        return torch_ranks.launch_ddp(cfg, job, payload, preload=preloaded(cfg))


def preloaded(cfg: RunConfig) -> tuple[str, ...]:
    """Keras on torch imported once in the ranks' forkserver, on the CPU only: on a GPU, importing it initialises
    CUDA there (Keras's torch backend places its default device at import), and a rank forked from a process that
    has CUDA cannot use it ("Cannot re-initialize CUDA in forked subprocess"); each rank imports Keras itself."""
    return ("keras",) if cfg.device_kind != "gpu" else ()


@contextlib.contextmanager
def keras_backend(framework: str):
    """KERAS_BACKEND for the processes started meanwhile (this process's Keras, imported already, keeps its own)."""
    previous = os.environ.get("KERAS_BACKEND")
    os.environ["KERAS_BACKEND"] = framework
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("KERAS_BACKEND", None)
        else:
            os.environ["KERAS_BACKEND"] = previous
