"""What the torch worker runs on, and the settings that must be the same for every backend."""

from __future__ import annotations

import torch

from common import sysinfo


def configure_threads(cfg, processes: int) -> int:
    """CPU threads per process: --threads, else the usable cores shared among the processes."""
    threads = cfg.threads or max(1, sysinfo.usable_cpus() // processes)
    torch.set_num_threads(threads)
    return threads


def configure_precision() -> None:
    """fp32 means fp32: TF32 off for matmuls and convolutions, set explicitly (DESIGN: same for all)."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def device_names(cfg) -> list[str]:
    if cfg.device_kind == "gpu" and torch.cuda.is_available():
        return [torch.cuda.get_device_name(i) for i in range(cfg.devices)]
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
        "processes": processes,
        "threads_per_process": threads,
        "precision": {"dtype": "float32", "tf32_matmul": False, "tf32_cudnn": False},
        "collective": {"ddp": "nccl" if cfg.device_kind == "gpu" else "gloo",
                       "scratch": "hand-written allreduce (copy to device 0, sum, copy back)",
                       "dp": "nn.DataParallel scatter/gather + reduce"}.get(cfg.strategy),
    }
