"""What the torch worker runs on: what torch cannot run here beyond backend.toml's refusals (refusal), the
settings that must be the same for every backend, and the run's environment record.

configure_threads and configure_precision set torch's global switches (distributed.py's launch sets the threads;
the Backend calls configure_precision before it makes a trainer); environment() only describes a run, computing
the switches from the run config: it changes nothing.
"""

from __future__ import annotations

import os
import shutil

import torch

from backends.torch import models
from common import loop, manifest, sysinfo

MANIFEST = manifest.load("torch")  # backend.toml: the options and their defaults

BATCHNORM = {
    "local": "local: each device normalises with its own shard's statistics; running statistics (momentum 0.1, "
    "unbiased variance) averaged across replicas before evaluation (dp keeps device 0's, as "
    "nn.DataParallel does)",
    "sync": "sync (ddp, fsdp): nn.SyncBatchNorm on GPUs, an all-reduce BatchNorm (CPUSyncBatchNorm) over gloo on the "
    "CPU, so every rank normalises with the global batch's statistics",
}


def refusal(cfg, dtype: str = "float32") -> str | None:
    """Why torch cannot run this configuration here (one line), or None, beyond what backend.toml states
    (common/backend.py checks that first): the GPUs torch sees, and what this GPU and host have."""
    gpu = cfg.device_kind == "gpu"
    if gpu and not torch.cuda.is_available():
        build = (
            "a CPU-only build"
            if torch.version.cuda is None
            else f"built for CUDA {torch.version.cuda}"
        )
        return f"GPU run requested but torch ({torch.__version__}, {build}) sees no CUDA device"
    if gpu and torch.cuda.device_count() < host_processes(cfg):
        return f"{host_processes(cfg)} GPUs needed on this host, torch sees {torch.cuda.device_count()}"
    if cfg.levers.precision == "tf32":
        major, minor = torch.cuda.get_device_capability(0)
        if major < 8:
            return f"TF32 needs an Ampere or newer GPU (compute capability 8.0); this one is {major}.{minor}"
    if (
        cfg.levers.precision == "bf16"
        and gpu
        and not torch.cuda.is_bf16_supported(including_emulation=False)
    ):
        return "this GPU has no native bfloat16 arithmetic"
    if cfg.levers.compile and cfg.strategy == "dp" and cfg.devices > 1:
        return (
            "torch.compile does not survive nn.DataParallel's replication: every replica "
            "would call device 0's compiled module (use ddp, or dp on one GPU)"
        )
    if cfg.levers.compile and not gpu and not shutil.which(os.environ.get("CXX", "g++")):
        return "torch.compile on the CPU needs a C++ compiler for TorchInductor; none found"
    return None


def host_processes(cfg) -> int:
    """The processes (or GPUs) of the run on this host: every node's when they are loopback nodes."""
    return cfg.devices if cfg.nodes.loopback or cfg.nodes.count == 1 else cfg.local_devices


def threads_per_process(cfg, processes: int) -> int:
    """CPU threads per process: --threads, else the usable cores shared among the processes."""
    return cfg.threads or max(1, sysinfo.usable_cpus() // processes)


def configure_threads(cfg, processes: int) -> int:
    threads = threads_per_process(cfg, processes)
    torch.set_num_threads(threads)
    return threads


def _switches(cfg) -> dict:
    """The float32 math switches of --precision, as configure_precision sets them.

    fp32 means fp32: TF32 off for matmuls and convolutions, set explicitly (the same in every backend).
    tf32: both on. bf16: TF32 off, so that what runs outside autocast (the SGD update, BatchNorm
    statistics) stays float32; the strategies open torch.autocast(bfloat16) around forward and loss.
    GPU runs let cuDNN time its convolution algorithms for each shape once and keep the fastest,
    as XLA autotunes its kernels; CPU runs have no cuDNN.
    """
    tf32 = cfg.levers.precision == "tf32"
    return {
        "tf32_matmul": tf32,
        "tf32_cudnn": tf32,
        "float32_matmul_precision": "high" if tf32 else "highest",
        "cudnn_benchmark": cfg.device_kind == "gpu",
    }


def configure_precision(cfg) -> None:
    """Set torch's float32 math mode of --precision and cuDNN autotuning (global state)."""
    switches = _switches(cfg)
    torch.backends.cuda.matmul.allow_tf32 = switches["tf32_matmul"]
    torch.backends.cudnn.allow_tf32 = switches["tf32_cudnn"]
    # The matching setting of the newer API: torch refuses to read a mix of the two.
    torch.set_float32_matmul_precision(switches["float32_matmul_precision"])
    torch.backends.cudnn.benchmark = switches["cudnn_benchmark"]


def precision_settings(cfg) -> dict:
    """The precision record of a run: the switches configure_precision(cfg) sets (computed, not read from
    torch, so that describing a run changes nothing), the weights' dtype and the autocast around forward."""
    autocast = (
        {"device_type": autocast_device(cfg), "dtype": "bfloat16"}
        if cfg.levers.precision == "bf16"
        else None
    )
    return {"weights_dtype": "float32", **_switches(cfg), "autocast": autocast}


def autocast_device(cfg) -> str:
    return "cuda" if cfg.device_kind == "gpu" else "cpu"


def compile_description(cfg) -> str | None:
    """What --compile does, per strategy (None without --compile)."""
    if not cfg.levers.compile:
        return None
    target = {
        "scratch": "every replica",
        "dp": "the module given to nn.DataParallel",
        "ddp": "the DistributedDataParallel-wrapped module",
    }.get(cfg.strategy)
    return f"torch.compile (TorchInductor, mode {cfg.levers.compile_mode}) of {target}"


def input_copies(cfg) -> str:
    if cfg.device_kind != "gpu":
        none = "no copy (the CPU devices read the numpy batch's memory)"
        return loop.input_copies(cfg, ahead=none, in_step=none)
    return loop.input_copies(
        cfg,
        ahead="pinned host memory (one page-locked buffer, filled before each timer starts), one copy stream "
        "per GPU, the step's stream waits on the copy's event",
        in_step="copied from pageable memory before the forward",
    )


def sgd_update(cfg) -> str:
    if cfg.strategy == "scratch":
        return "torch._foreach_sub_ (p -= lr/B * g), one call per replica"
    return f"torch.optim.SGD(foreach={cfg.device_kind == 'gpu'})"


def device_names(cfg) -> list[str]:
    if cfg.device_kind == "gpu":  # (too few GPUs: the run is reported unavailable)
        return [
            torch.cuda.get_device_name(i)
            for i in range(min(cfg.devices, torch.cuda.device_count()))
        ]
    return [f"cpu (simulated device {i})" for i in range(cfg.devices)]


def environment(cfg) -> dict:
    """The run's environment record (common.sysinfo.environment); sets nothing."""
    ranked = cfg.strategy in ("ddp", "fsdp")
    processes = cfg.devices if ranked else 1  # ddp, fsdp: every rank on every node
    return sysinfo.environment(
        cfg,
        sysinfo.EnvironmentRecord(
            framework="torch",
            version=torch.__version__,
            libraries={},
            cuda=torch.version.cuda,
            cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
            devices=device_names(cfg),
            framework_gpus=torch.cuda.device_count(),
            processes=processes,
            threads=threads_per_process(cfg, host_processes(cfg) if ranked else 1),
            precision=precision_settings(cfg),
            compile=compile_description(cfg),
            input_copies=input_copies(cfg),
            sgd_update=sgd_update(cfg),
            collective={
                "ddp": "nccl" if cfg.device_kind == "gpu" else "gloo",
                "fsdp": f"{'nccl' if cfg.device_kind == 'gpu' else 'gloo'}: all-gather and reduce-scatter",
                "scratch": "hand-written allreduce (copy to device 0, sum, copy back)",
                "dp": "nn.DataParallel scatter/gather + reduce",
            }.get(cfg.strategy),
            batchnorm=BATCHNORM[cfg.bn],
            layout=models.layout(cfg),
            details=engine_details(cfg) if ranked else {},
        ),
    )


def engine_details(cfg) -> dict:
    """How ddp's and fsdp's processes start and meet: torchrun's engine, in this node's process."""
    rendezvous = (
        f"static at {cfg.nodes.coordinator} (node_rank {cfg.nodes.rank})"
        if cfg.nodes.count > 1
        else "static at 127.0.0.1 (one node, a free port)"
    )
    return {
        "engine": "torchrun's elastic agent (torch.distributed.launcher.api.elastic_launch, max_restarts 0)",
        "rendezvous": rendezvous,
        "ranks_per_node": cfg.local_devices,
        **transport_interface(cfg),
        **(
            {"collective_timeout_s": cfg.engine_timeout}  # distributed.collective_timeout
            if cfg.nodes.count > 1
            else {}
        ),
    }


# The user's choice, read before distributed.bind_transport can set it.
USERS_GLOO_INTERFACE = os.environ.get("GLOO_SOCKET_IFNAME")


def transport_interface(cfg) -> dict:
    """Several nodes: the interface gloo binds to, and who chose it (distributed.bind_transport)."""
    if cfg.nodes.count == 1:
        return {}
    own = USERS_GLOO_INTERFACE
    return {
        "interface": f"{own} (GLOO_SOCKET_IFNAME, the user's)"
        if own
        else f"{cfg.nodes.interface} (this node's address {cfg.nodes.local_addr})"
    }
