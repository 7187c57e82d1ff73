"""What the jax worker runs on (and what JAX cannot run here: refusal), and the settings that must be the
same for every backend: the matmul precision, the modules' dtypes, and float64 (jax_enable_x64) for the
equivalence API's float64 calls."""

from __future__ import annotations

import contextlib
import importlib
import os

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from backends.jax import distributed
from backends.jax.parallel import devices, gpu_count
from common import loop, sysinfo
from common.errors import Unsupported

# jax_default_matmul_precision per --precision. fp32: float32 passes on GPUs, no TF32 in matmuls and
# convolutions (XLA would otherwise use TF32 on Ampere and later GPUs). tf32: TF32 tensor-core passes.
# bf16: the operands are bfloat16 already (the modules compute in bfloat16), so the setting only
# governs what float32 matmuls remain, and they stay float32.
MATMUL_PRECISION = {"fp32": "highest", "tf32": "tensorfloat32", "bf16": "highest"}
COMPUTE_DTYPE = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16"}
COMPILE = "inherent: jax.pmap / jax.jit compile every step whether or not --compile is given"
DTYPES = {"float32": np.float32, "float64": np.float64}  # of the equivalence API's runs


def refusal(cfg, dtype: str = "float32") -> str | None:
    """What JAX cannot run here beyond backend.toml's refusals (common/backend.py): too few devices. With
    several nodes the devices are counted once joined (distributed.run_devices), as jax cannot list them
    before it joins."""
    if cfg.nodes.count > 1:
        return None
    try:
        devices(cfg.devices, cfg.device_kind)
    except Unsupported as e:
        return str(e)
    return None


def configure_precision(cfg) -> None:
    """fp32 means fp32 (the same in every backend); tf32 and bf16 as --precision asks (see MATMUL_PRECISION)."""
    jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION[cfg.levers.precision])


def module_dtypes(precision: str, dtype: str) -> dict:
    """The flax modules' compute and parameter dtypes: float64 throughout for a float64 run, else
    float32 parameters computing in float32 or, with --precision bf16, bfloat16."""
    if dtype == "float64":
        return {"dtype": jnp.float64, "param_dtype": jnp.float64}
    return {"dtype": jnp.bfloat16 if precision == "bf16" else None, "param_dtype": jnp.float32}


@contextlib.contextmanager
def computing_in(dtype: str):
    """jax_enable_x64 while a float64 computation lasts (without it JAX makes float64 arrays float32),
    restored afterwards, so that float32 work later in the process computes exactly as before."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    previous = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", previous or dtype == "float64")
    try:
        yield
    finally:
        jax.config.update("jax_enable_x64", previous)


def threads_per_process(cfg) -> int:
    """XLA's CPU thread pool spans the usable cores; JAX offers no switch to resize it, so --threads
    is not applied and the report records what XLA uses."""
    return sysinfo.usable_cpus()


def device_names(cfg) -> list[str]:
    # (too few GPUs: the run raises Unsupported, reported as unavailable)
    if cfg.device_kind == "gpu":
        return [d.device_kind for d in jax.devices("gpu")[: cfg.devices]] if gpu_count() else []
    return [f"cpu (simulated device {i})" for i in range(cfg.devices)]


def cuda_versions() -> tuple[str | None, str | None]:
    """(CUDA runtime, cuDNN) versions of the installed CUDA plugin, or (None, None) without one."""
    for plugin in ("jax_cuda13_plugin", "jax_cuda12_plugin", "jaxlib.cuda"):
        try:
            versions = importlib.import_module(f"{plugin}._versions")
            return str(versions.cuda_runtime_get_version()), str(versions.cudnn_get_version())
        except Exception:  # absent, or present without a usable driver
            continue
    return None, None


BATCHNORM = {
    "local": "local: each device normalises with its own shard's statistics; running statistics (torch's "
    "update: momentum 0.1, unbiased variance) averaged across devices before evaluation",
    "sync": "sync: BatchNorm(axis_name) lax.pmean's the batch statistics over the devices, "
    "so every device normalises with the global batch's (running variance unbiased over it)",
}


def input_copies(cfg) -> str:
    where = "the GPUs" if cfg.device_kind == "gpu" else "the simulated CPU devices"
    return loop.input_copies(
        cfg,
        ahead=f"jax.device_put to {where}, not waited for",
        in_step=f"jax.device_put to {where} just before the step",
    )


COLLECTIVE = {
    "pmap": "lax.psum of the gradients inside jax.pmap (XLA all-reduce)",
    "sharding": "XLA all-reduce from autodiff through jax.shard_map (jit over a NamedSharding mesh)",
}


def collective(cfg) -> str | None:
    """The strategy's reduction, and with several nodes the transport between the processes."""
    if cfg.strategy not in COLLECTIVE or cfg.nodes.count == 1:
        return COLLECTIVE.get(cfg.strategy)
    return f"{COLLECTIVE[cfg.strategy]}, across the {cfg.nodes.count} processes over {distributed.transport(cfg)}"


def details(cfg) -> dict:
    """XLA_FLAGS (the CPU devices XLA simulates, __init__.py, and any flag of the user's); the engine's settings."""
    engine = (
        {}
        if cfg.nodes.count == 1
        else {
            "engine": distributed.ENGINE,
            "coordinator": cfg.nodes.coordinator,
            "node_rank": cfg.nodes.rank,
            "cpu_collectives": distributed.transport(cfg) if cfg.device_kind == "cpu" else None,
            "heartbeat_timeout_s": max(1, int(cfg.engine_timeout)),
            "interface": f"{cfg.nodes.interface} (this node's address {cfg.nodes.local_addr})",
        }
    )
    return {"XLA_FLAGS": os.environ.get("XLA_FLAGS", ""), **engine}


def environment(cfg) -> dict:
    """The run's record. With several nodes it asks jax for its devices: the worker calls it inside the
    session, once jax.distributed is joined."""
    cuda, cudnn = cuda_versions() if cfg.device_kind == "gpu" else (None, None)
    return sysinfo.environment(
        cfg,
        sysinfo.EnvironmentRecord(
            framework="jax",
            version=jax.__version__,
            libraries={"flax": flax.__version__, "optax": optax.__version__},
            cuda=cuda,
            cudnn=cudnn,
            devices=device_names(cfg),
            framework_gpus=gpu_count(),  # what JAX itself sees, whatever the harness found
            processes=cfg.nodes.count,
            threads=threads_per_process(cfg),
            precision={
                "dtype": COMPUTE_DTYPE[cfg.levers.precision],
                "param_dtype": "float32",
                "jax_default_matmul_precision": MATMUL_PRECISION[cfg.levers.precision],
                "tf32_matmul": cfg.levers.precision == "tf32",
                "tf32_cudnn": cfg.levers.precision == "tf32",
            },
            compile=COMPILE if cfg.levers.compile else None,
            input_copies=input_copies(cfg),
            sgd_update="optax.sgd inside the compiled step, (params, batch_stats, opt_state) donated",
            collective=collective(cfg),
            batchnorm=BATCHNORM[cfg.bn],
            layout="NHWC",  # flax's convolutions; the NCHW batches are transposed in the step (models.py)
            details=details(cfg),
        ),
    )
