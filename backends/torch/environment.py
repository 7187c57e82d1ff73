"""What the torch worker runs on, and the settings that must be the same for every backend."""

from __future__ import annotations

import torch

from common import loop, sysinfo


def configure_threads(cfg, processes: int) -> int:
    """CPU threads per process: --threads, else the usable cores shared among the processes."""
    threads = cfg.threads or max(1, sysinfo.usable_cpus() // processes)
    torch.set_num_threads(threads)
    return threads


def configure_precision(cfg) -> dict:
    """Set the float32 math mode of --precision (and cuDNN autotuning on GPUs); return the settings as torch
    reads them back.

    fp32 means fp32: TF32 off for matmuls and convolutions, set explicitly (the same in every backend).
    tf32: both on. bf16: TF32 off, so that what runs outside autocast (the SGD update, BatchNorm
    statistics) stays float32; the strategies open torch.autocast(bfloat16) around forward and loss.
    """
    tf32 = cfg.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    # The matching setting of the newer API: torch refuses to read a mix of the two.
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    # GPU runs let cuDNN time its convolution algorithms for each shape once and keep the fastest,
    # as XLA autotunes its kernels; CPU runs have no cuDNN.
    torch.backends.cudnn.benchmark = cfg.device_kind == "gpu"
    return {"mode": cfg.precision, "weights_dtype": "float32",
            "tf32_matmul": torch.backends.cuda.matmul.allow_tf32, "tf32_cudnn": torch.backends.cudnn.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "autocast": {"device_type": autocast_device(cfg), "dtype": "bfloat16"} if cfg.precision == "bf16" else None}


def autocast_device(cfg) -> str:
    return "cuda" if cfg.device_kind == "gpu" else "cpu"


def compile_target(cfg) -> str | None:
    """What --compile hands to torch.compile, per strategy (None without --compile)."""
    if not cfg.compile:
        return None
    return {"scratch": "every replica", "dp": "the module given to nn.DataParallel",
            "ddp": "the DistributedDataParallel-wrapped module"}.get(cfg.strategy)


def input_copies(cfg) -> str:
    if cfg.device_kind != "gpu":
        none = "no copy (the CPU devices read the numpy batch's memory)"
        return loop.input_copies(cfg, ahead=none, in_step=none)
    return loop.input_copies(cfg, ahead="pinned host memory, one copy stream per GPU, the step's stream waits on "
                                        "the copy's event", in_step="copied from pageable memory before the forward")


def sgd_update(cfg) -> str:
    if cfg.strategy == "scratch":
        return "torch._foreach_sub_ (p -= lr/B * g), one call per replica"
    return f"torch.optim.SGD(foreach={cfg.device_kind == 'gpu'})"


def device_names(cfg) -> list[str]:
    if cfg.device_kind == "gpu":   # (too few GPUs: the run is reported unavailable)
        return [torch.cuda.get_device_name(i) for i in range(min(cfg.devices, torch.cuda.device_count()))]
    return [f"cpu (simulated device {i})" for i in range(cfg.devices)]


def environment(cfg) -> dict:
    processes = cfg.devices if cfg.strategy == "ddp" else 1
    threads = cfg.threads or max(1, sysinfo.usable_cpus() // processes)
    return {
        **sysinfo.host(),
        "framework": "torch",
        "framework_version": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "devices": device_names(cfg),
        "framework_gpus": torch.cuda.device_count(),   # what torch itself sees, whatever the harness found
        "processes": processes,
        "threads_per_process": threads,
        "precision": configure_precision(cfg),
        "compile": ({"backend": "inductor", "mode": cfg.compile_mode, "target": compile_target(cfg)}
                    if cfg.compile else None),
        "input_copies": input_copies(cfg),
        "sgd_update": sgd_update(cfg),
        "memory_format": "channels_last" if cfg.channels_last else "contiguous_format",
        "resident_data": cfg.resident_data,
        "collective": {"ddp": "nccl" if cfg.device_kind == "gpu" else "gloo",
                       "scratch": "hand-written allreduce (copy to device 0, sum, copy back)",
                       "dp": "nn.DataParallel scatter/gather + reduce"}.get(cfg.strategy),
    }
