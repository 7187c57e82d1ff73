"""The ddp strategy's processes, started by the torch backend's launcher (backends/torch/distributed.py:
torchrun's elastic agent in this node's process, a static rendezvous at cfg.coordinator, gloo on the CPU and NCCL
on GPUs, the first failing rank's error as the run's), so that the two DDP strategies start, meet and fail alike.
Every rank imports Keras on torch (KERAS_BACKEND=torch, as the Keras guide's recipe sets it): the model each
rank builds is then a torch.nn.Module that DistributedDataParallel can wrap. The jobs: a training run, and an
equivalence probe (common.trainer.PROBES)."""

from __future__ import annotations

import contextlib
import os

from backends.torch import distributed as torch_ranks
from backends.torch.distributed import rank_device  # noqa: F401  (the ddp trainer's device, as torch's ddp's)
from common import data as datalib
from common.config import RunConfig
from common.loop import run_training
from common.trainer import PROBES
from common.weights import for_run as weights_for_run

RANKS_FRAMEWORK = "torch"   # what Keras runs on in the ddp ranks


def launch_ddp(cfg: RunConfig, job, payload=None):
    """Run job(cfg, rank, payload) in every rank of every node, Keras on torch in each; this node's first
    rank's value (torch's launch_ddp)."""
    with keras_backend(RANKS_FRAMEWORK):   # the ranks (and their forkserver, Keras on torch imported once) take it
        return torch_ranks.launch_ddp(cfg, job, payload, preload=("keras",))


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


# The jobs (strategies imports this module, so they import it when they run, in the rank).

def train_job(cfg: RunConfig, rank: int, payload) -> dict:
    """One rank of `run`: train as the run config says."""
    from backends.keras.strategies import make_trainer
    return run_training(make_trainer(cfg, weights_for_run(cfg)), cfg, datalib.load(cfg))


def probe_job(cfg: RunConfig, rank: int, payload):
    """One rank of an equivalence call: payload (weights, batches, probe name, dtype), computed in `dtype`
    (Keras's floatx too: it is the dtype of the Python numbers in the layers' arithmetic, BatchNorm's momentum)."""
    from backends.keras.environment import computing_in
    from backends.keras.strategies import make_trainer
    weights, batches, probe, dtype = payload
    with computing_in(dtype):
        return PROBES[probe](make_trainer(cfg, weights, dtype), batches)
