"""PyTorch backend: the backend interface (docs/ARCHITECTURE.md) in torch.

resnet18, lenet,       models.py (and predict's network)
resnet50
devices, split,        parallel.py
allreduce
TRAINERS, and what     strategies.py (scratch, dp, ddp; ddp's processes in distributed.py)
the entry points call
environment            environment.py
run, the probes,       common/backend.py: written once for every backend
predict, ...
"""

from backends.torch import distributed, models, strategies
from backends.torch.environment import environment, refusal
from backends.torch.models import lenet, resnet18, resnet50
from backends.torch.parallel import allreduce, devices, split
from backends.torch.strategies import TRAINERS
from common.backend import Backend

NAME = "torch"
BACKEND = Backend(NAME, models, strategies, distributed, refusal)
# Its entry points, as module names (the worker, the check and the tests call backends.<name>.<entry point>).
(
    initial_weights,
    param_count,
    predict,
    run,
    gradients,
    train_trace,
    train_steps,
    float64_gradients,
    float64_reference,
    check_supported,
    session,
) = BACKEND.entry_points()

# The backend interface (common/backend.py's INTERFACE): the same names, in the same order, in every backend.
__all__ = [
    "NAME",
    "resnet18",
    "lenet",
    "resnet50",
    "initial_weights",
    "param_count",
    "devices",
    "split",
    "allreduce",
    "predict",
    "run",
    "environment",
    "gradients",
    "train_trace",
    "train_steps",
    "float64_gradients",
    "float64_reference",
    "check_supported",
    "session",
    "TRAINERS",
    "array",
    "to_numpy",
    "device_of",
    "BACKEND",
]


def to_numpy(a):
    return a.detach().cpu().numpy()


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    import torch

    return torch.tensor(values).to(device)


def device_of(a):
    return a.device
