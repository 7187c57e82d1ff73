"""What the keras worker runs on, and the settings that must be the same for every backend: the float32 math
mode of the framework under Keras (torch's TF32 switches in the ddp ranks, JAX's matmul precision otherwise),
float64 for the equivalence API's float64 calls, and the run's environment record."""

from __future__ import annotations

import contextlib
import os
import shutil

import keras

from backends.keras.parallel import devices

# (by name: the torch package's `environment` is its environment function)
from backends.torch.environment import configure_precision as configure_torch_precision
from backends.torch.environment import engine_details, host_processes, threads_per_process
from backends.torch.environment import input_copies as torch_input_copies
from backends.torch.environment import precision_settings as torch_precision_settings
from common import loop, sysinfo
from common.errors import Unsupported

DTYPES = ("float32", "float64")  # of the equivalence API's runs
# The models' data format: Keras's own default (keras.config.image_data_format()), whatever --channels-last says.
# The canonical NCHW batches are transposed before their step. channels_first cost Keras on jax 13% of a ResNet-18
# step on the CPU (harness parity) and gained Keras on torch nothing.
DATA_FORMAT = "channels_last"

# jax_default_matmul_precision per --precision (as the jax backend's): fp32 means no TF32 in matmuls and convolutions.
MATMUL_PRECISION = {"fp32": "highest", "tf32": "tensorfloat32", "bf16": "highest"}
POLICIES = {
    "fp32": "float32",
    "tf32": "float32",
    "bf16": "mixed_bfloat16",
}  # --precision -> dtype policy
# what Keras runs on, per strategy
FRAMEWORK = {"ddp": "torch", "distribution": "jax", "fsdp": "jax"}
JITTED = "inherent: the stateless train step is jax.jit-compiled whether or not --compile is given"
COMPILE = {
    "ddp": "torch.compile of the DistributedDataParallel-wrapped Keras model (jit_compile on Keras's torch "
    "backend)",
    "distribution": JITTED,
    "fsdp": JITTED,
}
BATCHNORM = {
    "local": "local: each device normalises with its own shard's statistics (distribution, fsdp: each device's "
    "slice of the global batch); running statistics (torch's update: momentum 0.1, unbiased variance) averaged "
    "across devices before evaluation",
    "sync": "sync (distribution, fsdp): BatchNorm over the whole batch-sharded global batch, XLA all-reduces its "
    "statistics",
}
COLLECTIVE = {
    "ddp": {"cpu": "gloo", "gpu": "nccl"},
    "distribution": "XLA all-reduce of the replicated variables' gradients (jax.jit over "
    "keras.distribution.DataParallel's mesh)",
    "fsdp": "XLA all-gathers of the sharded variables and reduce-scatters of their gradients (jax.jit over "
    "keras.distribution.ModelParallel's one-axis mesh; on the CPU XLA reduce-scatters as an all-reduce and a slice)",
}
SGD_UPDATE = {
    "ddp": "torch.optim.SGD on the Keras model's variables",
    "distribution": "keras.optimizers.SGD.stateless_apply inside the compiled step",
    "fsdp": "keras.optimizers.SGD.stateless_apply inside the compiled step, on the variables' shards",
}


def refusal(cfg, dtype: str = "float32") -> str | None:
    """Why Keras cannot run this configuration here (one line), or None, beyond what backend.toml states
    (common/backend.py checks that first): what the framework each strategy runs on sees."""
    if cfg.strategy == "ddp":
        return torch_refusal(cfg)
    try:
        devices(cfg.devices, cfg.device_kind)
    except Unsupported as e:  # too few devices
        return str(e)
    return None


def torch_refusal(cfg) -> str | None:
    """What the ddp ranks' torch needs: the GPUs, and a C++ compiler for torch.compile on the CPU."""
    import torch

    gpu = cfg.device_kind == "gpu"
    if gpu and torch.cuda.device_count() < host_processes(cfg):
        return (
            f"{host_processes(cfg)} GPU(s) requested, torch ({torch.__version__}) sees "
            f"{torch.cuda.device_count()}"
        )
    if cfg.levers.compile and not gpu and not shutil.which(os.environ.get("CXX", "g++")):
        return "torch.compile on the CPU needs a C++ compiler for TorchInductor; none found"
    return None


def configure_precision(cfg) -> None:
    """fp32 means fp32 (the same in every backend), in the framework this process runs Keras on."""
    if keras.backend.backend() == "torch":
        configure_torch_precision(cfg)
    else:
        import jax

        jax.config.update("jax_default_matmul_precision", MATMUL_PRECISION[cfg.levers.precision])


@contextlib.contextmanager
def computing_in(dtype: str):
    """A float64 computation's switches while it lasts, restored afterwards: Keras's floatx (its optimizer's
    learning rate is a floatx variable) and, on jax, jax_enable_x64 (without it JAX makes float64 arrays float32)."""
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}")
    previous = keras.config.floatx()
    x64 = keras.backend.backend() == "jax"
    if x64:
        import jax

        previous_x64 = jax.config.jax_enable_x64
        jax.config.update("jax_enable_x64", previous_x64 or dtype == "float64")
    keras.config.set_floatx("float64" if dtype == "float64" else previous)
    try:
        yield
    finally:
        keras.config.set_floatx(previous)
        if x64:
            jax.config.update("jax_enable_x64", previous_x64)


def versions() -> dict:
    """Both frameworks Keras runs on here, whichever this process imported Keras with."""
    import jax
    import torch

    return {"torch": torch.__version__, "jax": jax.__version__}


def cuda_versions(cfg) -> tuple[str | None, str | None]:
    if cfg.device_kind != "gpu" or FRAMEWORK[cfg.strategy] != "torch":
        return None, None
    import torch

    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return torch.version.cuda, None if cudnn is None else str(cudnn)


def framework_gpus(cfg) -> int:
    """The GPUs the strategy's framework sees in this process."""
    if FRAMEWORK[cfg.strategy] == "torch":
        import torch

        return torch.cuda.device_count()
    from backends.keras.parallel import gpu_count

    return gpu_count()


def device_names(cfg) -> list[str]:
    if cfg.device_kind == "gpu":
        return [f"gpu {i}" for i in range(min(cfg.devices, framework_gpus(cfg)))]
    return [f"cpu (simulated device {i})" for i in range(cfg.devices)]


def precision_settings(cfg) -> dict:
    switches = (
        {"jax_default_matmul_precision": MATMUL_PRECISION[cfg.levers.precision]}
        if FRAMEWORK[cfg.strategy] == "jax"
        else torch_precision_settings(cfg)
    )
    switches.pop("autocast", None)  # (Keras's dtype policy, not torch's autocast, makes bf16)
    return {
        "dtype_policy": POLICIES[cfg.levers.precision],
        "variables_dtype": "float32",
        "tf32_matmul": cfg.levers.precision == "tf32",
        "tf32_cudnn": cfg.levers.precision == "tf32",
        **switches,
    }


def input_copies(cfg) -> str:
    if FRAMEWORK[cfg.strategy] == "torch":
        return (
            torch_input_copies(cfg)
            if cfg.device_kind == "gpu"
            else loop.input_copies(
                cfg,
                ahead="this rank's shard as a torch tensor",
                in_step="this rank's shard as a torch tensor",
            )
        )
    return loop.input_copies(
        cfg,
        ahead="keras.distribution.distribute_tensor (jax.device_put), not waited for",
        in_step="keras.distribution.distribute_tensor just before the step",
    )


def collective(cfg) -> str:
    if cfg.strategy == "ddp":
        return f"DistributedDataParallel's bucketed all-reduce over {COLLECTIVE['ddp'][cfg.device_kind]}"
    return COLLECTIVE[cfg.strategy]


def environment(cfg) -> dict:
    """The run's environment record (common.sysinfo.environment); sets nothing."""
    ddp = cfg.strategy == "ddp"
    cuda, cudnn = cuda_versions(cfg)
    return sysinfo.environment(
        cfg,
        sysinfo.EnvironmentRecord(
            framework="keras",
            version=keras.__version__,
            libraries={"keras_backend": FRAMEWORK[cfg.strategy], **versions()},
            cuda=cuda,
            cudnn=cudnn,
            devices=device_names(cfg),
            framework_gpus=framework_gpus(cfg),
            processes=cfg.devices if ddp else 1,
            threads=threads_per_process(cfg, host_processes(cfg)) if ddp else sysinfo.usable_cpus(),
            precision=precision_settings(cfg),
            compile=COMPILE[cfg.strategy] if cfg.levers.compile else None,
            input_copies=input_copies(cfg),
            sgd_update=SGD_UPDATE[cfg.strategy],
            collective=collective(cfg),
            batchnorm=BATCHNORM[cfg.bn],
            layout="NHWC",  # DATA_FORMAT, whatever --channels-last says
            details={
                "keras_backend": FRAMEWORK[cfg.strategy],
                "data_format": DATA_FORMAT,
                **(engine_details(cfg) if ddp else {}),
            },
        ),
    )
