"""What the mxnet worker runs on, its options, and the settings that must be the same for every backend.

Threads and precision are set in compat.py, because MXNet reads them when it is imported.
"""

from __future__ import annotations

import os

from backends.mxnet.compat import THREADS, mx
from backends.mxnet.distributed import KVSTORE
from common import loop, manifest, sysinfo

MANIFEST = manifest.load("mxnet")  # backend.toml: the options and their defaults
NO_GPU_BUILD = (
    "the installed mxnet has no CUDA, and mxnet 1.9.1, MXNet's final release, has GPU wheels "
    "only up to CUDA 11.x, none for Hopper"
)


SYNC_BN_ON_CPU = (
    "--bn sync needs SyncBatchNorm across contexts, and mxnet 1.9.1's SyncBatchNorm deadlocks on several "
    "CPU contexts: its backward holds a temporary-space resource while it waits at a barrier for the other "
    "contexts, and all CPU contexts share one small round-robin pool of those resources "
    "(MXNET_CPU_TEMP_COPY), so two contexts can wait on each other forever"
)


SYNC_BN_IN_FLOAT64 = (
    "mxnet 1.9.1's SyncBatchNorm operator fails on float64 inputs: it reads its batch statistics "
    "as float32 arrays"
)


DIST_FLOAT64 = (
    "mxnet 1.9.1's dist kvstore carries float32 only: a float64 array pushed or pulled through "
    "ps-lite comes back rounded to float32 (1/3 -> 0.33333334), so several nodes cannot run in float64"
)


def refusal(cfg, dtype: str = "float32") -> str | None:
    """Why MXNet cannot run this configuration here (one line), or None, beyond what backend.toml states
    (common/backend.py checks that first): the kvstore the node count needs, SyncBatchNorm's limits in
    mxnet 1.9.1, float64 through them, and a GPU build."""
    if reason := kvstore_refusal(cfg):
        return reason
    if cfg.bn == "sync" and cfg.device_kind == "cpu" and cfg.devices > 1:
        return SYNC_BN_ON_CPU
    if dtype == "float64" and cfg.nodes.count > 1:
        return DIST_FLOAT64
    if dtype == "float64" and cfg.bn == "sync" and cfg.devices > 1:
        return SYNC_BN_IN_FLOAT64
    if cfg.device_kind == "gpu" and not has_cuda():
        return f"GPU run requested, but no MXNet GPU build can run here: {NO_GPU_BUILD}"
    if cfg.device_kind == "gpu" and visible_gpus() < cfg.devices:
        return f"{cfg.devices} GPUs requested, MXNet sees {visible_gpus()}"
    return None


def kvstore_refusal(cfg) -> str | None:
    """gluon's kvstore and the node count: dist_sync on several nodes, and only there."""
    if cfg.strategy != "gluon":
        return None
    kind = kvstore(cfg)
    if cfg.nodes.count > 1 and kind != KVSTORE:
        return (
            f"kvstore '{kind}' reduces within one process; --nodes {cfg.nodes.count} needs kvstore '{KVSTORE}' "
            "(the default with several nodes)"
        )
    if cfg.nodes.count == 1 and kind == KVSTORE:
        return (
            f"kvstore '{kind}' needs several nodes (a ps-lite scheduler at --coordinator); one process "
            "reduces with 'device' or 'local'"
        )
    return None


def hybridized(cfg) -> bool:
    """--compile is hybridize(), whatever the hybridize option says."""
    return bool(cfg.levers.compile) or MANIFEST.option(cfg.options, "hybridize") == "on"


# --compile hybridizes as MXNet's performance guide and GluonCV's training scripts do: the cached graph's memory
# allocated once and reused, its shapes taken as fixed (a new shape, such as a smaller last test batch, still runs,
# re-planned). The hybridize option alone is d2l's plain hybridize().
STATIC = {"static_alloc": True, "static_shape": True}
STATIC_CALL = f"hybridize({', '.join(f'{k}={v}' for k, v in STATIC.items())})"


def hybridize_flags(cfg) -> dict:
    """The arguments of the run's hybridize() call."""
    return dict(STATIC) if cfg.levers.compile else {}


def has_cuda() -> bool:
    return mx.runtime.Features().is_enabled("CUDA")


def visible_gpus() -> int:
    return mx.context.num_gpus() if has_cuda() else 0


def kvstore(cfg) -> str:
    """The gluon Trainer's kvstore type: the one asked for, else the default for the run's node count."""
    option = MANIFEST.options["kvstore"]
    return cfg.options.get("kvstore") or (
        option.nodes_default if cfg.nodes.count > 1 else option.default
    )


def engine_workers() -> int:
    """Operators MXNet runs at once on one CPU context; the simulated devices run side by side."""
    return int(os.environ.get("MXNET_CPU_WORKER_NTHREADS", "1"))


def device_names(cfg) -> list[str]:
    """This node's devices (loopback nodes on a GPU host: node r has GPUs r*L .. r*L+L-1)."""
    if cfg.device_kind == "gpu":  # (too few GPUs: the run is reported unavailable)
        first = cfg.first_gpu
        return [f"gpu({i})" for i in range(first, min(first + cfg.local_devices, visible_gpus()))]
    return [f"cpu({i}) (simulated device {i})" for i in range(cfg.local_devices)]


def collective(cfg) -> str:
    if cfg.strategy == "gluon":
        kind = kvstore(cfg)
        if cfg.nodes.count > 1:
            return (
                f"ps-lite: gluon.Trainer, kvstore '{kind}' (each node's gradients summed over its contexts, "
                "pushed to the servers, the global sum pulled back; update on each device)"
            )
        if cfg.devices == 1:
            return f"gluon.Trainer, kvstore '{kind}' (not created by Gluon for one device)"
        return f"gluon.Trainer, kvstore '{kind}' (gradients summed by the kvstore, update on each device)"
    return "hand-written allreduce (copy to device 0, sum, copy back)"


def batchnorm(cfg) -> str:
    rule = "running statistics with torch's rule (momentum 0.1, unbiased variance)"
    if cfg.bn == "sync":
        return (
            f"sync: gluon.contrib.nn.SyncBatchNorm, statistics over the global batch of "
            f"{cfg.devices} context(s); {rule}"
        )
    return f"local: each context its own shard's statistics; {rule}, averaged before evaluation"


def input_copies(cfg) -> str:
    ahead = (
        "pinned host memory (cpu_pinned), split_and_load's copies queued on the engine"
        if cfg.device_kind == "gpu"
        else "split_and_load onto the CPU contexts, queued on the engine"
    )
    return loop.input_copies(cfg, ahead=ahead, in_step="split_and_load just before the forward")


def sgd_update(cfg) -> str:
    if cfg.strategy == "gluon":
        return "gluon.Trainer.update(B) (update_on_kvstore=False): mxnet's sgd_update kernel on each context"
    return "by hand, w[:] = w - lr/B * g per parameter on each context"


def environment(cfg) -> dict:
    features = mx.runtime.Features()
    return sysinfo.environment(
        cfg,
        sysinfo.EnvironmentRecord(
            framework="mxnet",
            version=mx.__version__,
            libraries={},
            cuda="enabled" if features.is_enabled("CUDA") else None,
            cudnn="enabled" if features.is_enabled("CUDNN") else None,
            devices=device_names(cfg),
            framework_gpus=visible_gpus(),  # what MXNet itself sees, whatever the harness found
            processes=processes(cfg),
            threads=THREADS,
            precision={
                "dtype": "float32",
                "tf32_matmul": False,
                "tf32_cudnn": False,
                "NVIDIA_TF32_OVERRIDE": os.environ.get("NVIDIA_TF32_OVERRIDE"),
            },
            # A refused speed lever (common/levers.py, from backend.toml) makes the run unavailable; NCHW always.
            compile=f"{STATIC_CALL}, whatever the hybridize option" if cfg.levers.compile else None,
            input_copies=input_copies(cfg),
            sgd_update=sgd_update(cfg),
            collective=collective(cfg),
            batchnorm=batchnorm(cfg),
            layout="NCHW",  # Gluon's default; --channels-last is refused
            details={
                "engine": f"threaded engine per device, {engine_workers()} worker thread(s) per context",
                "kvstore": kvstore(cfg) if cfg.strategy == "gluon" else None,
                "hybridize": hybridized(cfg),
                "static_alloc": bool(cfg.levers.compile),
                **ps_lite(cfg),
            },
        ),
    )


def processes(cfg) -> int:
    """Every process of the run: one; with several nodes a worker and a server per node and the scheduler."""
    return 1 if cfg.nodes.count == 1 else 2 * cfg.nodes.count + 1


def ps_lite(cfg) -> dict:
    if cfg.nodes.count == 1:
        return {}
    return {
        "ps_lite": (
            f"scheduler at {cfg.nodes.coordinator} (started by node 0), one server and one worker per "
            f"node: DMLC_NUM_SERVER = DMLC_NUM_WORKER = {cfg.nodes.count}, DMLC_ROLE per process"
        ),
        "rendezvous": f"ps-lite scheduler at {cfg.nodes.coordinator}",
        "heartbeat_timeout_s": max(1, int(cfg.engine_timeout)),  # PS_HEARTBEAT_TIMEOUT
    }
