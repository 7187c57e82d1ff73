"""PyTorch backend: the backend interface (docs/ARCHITECTURE.md) in torch.

  resnet18, lenet,       models.py
  resnet50
  devices, split,        parallel.py
  allreduce
  run, train_steps,      strategies.py (TRAINERS: scratch, dp, ddp; ddp's processes in distributed.py)
  train_trace,
  gradients
  environment            environment.py
"""

from backends.torch.environment import environment
from backends.torch.models import build, count_params, lenet, load_canonical, resnet18, resnet50, spec
from backends.torch.parallel import allreduce, devices, split
from backends.torch.strategies import (TRAINERS, float64_gradients, float64_reference, gradients, run, train_steps,
                                      train_trace)

NAME = "torch"

# The backend interface (docs/ARCHITECTURE.md): the same names in every backend.
__all__ = ["NAME", "resnet18", "lenet", "resnet50", "initial_weights", "param_count", "devices", "split", "allreduce",
           "predict", "run", "environment", "gradients", "train_trace", "train_steps", "float64_gradients",
           "TRAINERS", "array", "to_numpy", "device_of",
           "float64_reference"]   # torch only: the reference of the check's float32 floor


def initial_weights(model: str, seed: int = 0):
    """The canonical initial weights of `model` (common/weights.py), as every run starts from."""
    from common.weights import init_canonical
    return init_canonical(spec(build(model)), seed)


def param_count(model: str) -> int:
    return count_params(build(model))


def predict(model: str, weights, x, train: bool = False, dtype: str = "float32"):
    """Logits (numpy) of `model` with canonical `weights` on a numpy batch; train=True normalises
    with the batch's own statistics (BatchNorm in training mode), else with the running ones.
    dtype "float64" computes in float64."""
    import torch
    precision = torch.float64 if dtype == "float64" else torch.float32
    net = build(model).to(precision)
    load_canonical(net, weights)
    net.train(train)
    with torch.no_grad():
        return net(torch.from_numpy(x).to(precision)).numpy()


def to_numpy(a):
    return a.detach().cpu().numpy()


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    import torch
    return torch.tensor(values).to(device)


def device_of(a):
    return a.device
