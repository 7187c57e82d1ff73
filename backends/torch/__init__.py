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
from common.backend import ENTRY_POINTS, Backend

NAME = "torch"
BACKEND = Backend(NAME, models, strategies, distributed, refusal)
# The backend interface (common/backend.py's INTERFACE): its own names, then the entry points, which
# __getattr__ below gives as backends.torch.<entry point>.
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
    return a.detach().cpu().numpy()


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    import torch

    return torch.tensor(values).to(device)


def device_of(a):
    return a.device
