"""DDP's processes: launch_ddp runs a job in one process per device (gloo on the CPU, NCCL on GPUs) and
returns rank 0's value; a failing rank fails the run with the first failure's traceback. The jobs: a
training run, and an equivalence probe (common.trainer.PROBES)."""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import sys
import tempfile
import time
import traceback
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from common import data as datalib
from common.config import RunConfig
from common.loop import Diverged, run_training
from common.trainer import PROBES
from common.weights import for_run as weights_for_run
from common.worker import scratch_dir

from backends.torch.environment import configure_precision, configure_threads


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


# The jobs (strategies imports this module, so they import it when they run, in the rank).

def train_job(cfg: RunConfig, rank: int, payload) -> dict:
    """One rank of `run`: train as the run config says."""
    from backends.torch.strategies import make_trainer
    return run_training(make_trainer(cfg, weights_for_run(cfg)), cfg, datalib.load(cfg))


def probe_job(cfg: RunConfig, rank: int, payload):
    """One rank of an equivalence call: payload (weights, batches, probe name, dtype)."""
    from backends.torch.strategies import make_trainer
    weights, batches, probe, dtype = payload
    return PROBES[probe](make_trainer(cfg, weights, dtype), batches)
