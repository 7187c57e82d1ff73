"""MXNet/Gluon backend: the backend interface (docs/ARCHITECTURE.md) in mxnet 1.9.1.

resnet18, lenet,       models.py (and predict's network)
resnet50
devices, split,        parallel.py
allreduce, stage
TRAINERS, and what     strategies.py (scratch, gluon, each a common.trainer.Trainer)
the entry points call
(BatchNorm)            batchnorm.py: its layers, torch's running-statistics rule
environment            environment.py (and what MXNet cannot run here: refusal)
(several nodes)        distributed.py: ps-lite scheduler, server and worker, one dist_sync kvstore per process
(mxnet itself)         compat.py: numpy aliases, threads, precision, then `import mxnet`
run, the probes,       common/backend.py: written once for every backend
predict, ...
"""

from backends.mxnet import distributed, models, strategies
from backends.mxnet.environment import environment, refusal
from backends.mxnet.models import lenet, resnet18, resnet50
from backends.mxnet.parallel import allreduce, devices, split
from backends.mxnet.strategies import TRAINERS
from common.backend import ENTRY_POINTS, Backend

NAME = "mxnet"
BACKEND = Backend(NAME, models, strategies, distributed, refusal)
# The backend interface (common/backend.py's INTERFACE): its own names, then the entry points, which
# __getattr__ below gives as backends.mxnet.<entry point>.
__all__ = [
    "NAME",
    "resnet18",
    "lenet",
    "resnet50",
    "devices",
    "split",
    "allreduce",
    "environment",
    "TRAINERS",
    "array",
    "to_numpy",
    "device_of",
    "BACKEND",
    *ENTRY_POINTS,
]


def __getattr__(name: str):
    return BACKEND.entry_point(name)


def to_numpy(a):
    return a.asnumpy()


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    import numpy as np

    from backends.mxnet.compat import mx

    values = np.asarray(values)
    return mx.nd.array(values, ctx=device, dtype=values.dtype)


def device_of(a):
    return a.context
