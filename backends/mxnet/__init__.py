"""MXNet/Gluon backend: the backend interface (docs/ARCHITECTURE.md) in mxnet 1.9.1.

  resnet18, lenet,       models.py
  resnet50
  devices, split,        parallel.py
  allreduce, stage
  run, train_steps,      strategies.py (TRAINERS: scratch, gluon, each a common.trainer.Trainer)
  gradients, train_trace
  (BatchNorm)            batchnorm.py: its layers, torch's running-statistics rule
  environment            environment.py
  (several nodes)        distributed.py: ps-lite scheduler, server and worker, one dist_sync kvstore per process
  (mxnet itself)         compat.py: numpy aliases, threads, precision, then `import mxnet`
"""

from backends.mxnet.compat import mx
from backends.mxnet.environment import environment
from backends.mxnet.models import build, count_params, lenet, load_canonical, resnet18, resnet50, spec
from backends.mxnet.parallel import allreduce, devices, split
from backends.mxnet.strategies import TRAINERS, float64_gradients, gradients, run, train_steps, train_trace
from mxnet import autograd

NAME = "mxnet"

# The backend interface (docs/ARCHITECTURE.md): the same names in every backend.
__all__ = ["NAME", "resnet18", "lenet", "resnet50", "initial_weights", "param_count", "devices", "split", "allreduce",
           "predict", "run", "environment", "gradients", "train_trace", "train_steps", "float64_gradients",
           "TRAINERS", "array", "to_numpy", "device_of"]


def initial_weights(model: str, seed: int = 0):
    """The canonical initial weights of `model` (common/weights.py), as every run starts from."""
    from common.weights import init_canonical
    return init_canonical(spec(build(model)), seed)


def param_count(model: str) -> int:
    return count_params(build(model))


def predict(model: str, weights, x, train: bool = False):
    """Logits (numpy) of `model` with canonical `weights` on a numpy batch, on one context.

    train=False: inference mode (BatchNorm uses the running statistics). train=True: training
    mode without recording, so BatchNorm normalises with the batch's own statistics and nothing
    changes (MXNet's BatchNorm writes its running statistics in the backward pass)."""
    net = build(model)
    net.initialize(ctx=mx.cpu())
    load_canonical(net, weights)
    with autograd.train_mode() if train else autograd.predict_mode():
        return net(mx.nd.array(x, dtype="float32")).asnumpy()


def to_numpy(a):
    return a.asnumpy()


def array(values, device):
    """A framework array holding numpy `values` on `device` (for tests of split/allreduce)."""
    import numpy as np
    values = np.asarray(values)
    return mx.nd.array(values, ctx=device, dtype=values.dtype)


def device_of(a):
    return a.context
