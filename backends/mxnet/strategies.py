"""MXNet strategies, each a Trainer for common/loop.py.

Same math in both: one SGD step on the mean cross-entropy of the *global* batch.
  scratch  the network's parameters copied to every context (one replica per context);
           per-shard summed loss, gradients summed by the hand-written allreduce, then
           p -= lr / B * g on every context (d2l's from-scratch chapter)
  gluon    one network initialised on every context (net.initialize(ctx=devices)),
           split_and_load, autograd.record, gluon.Trainer.step(B) over a kvstore
           (option kvstore: device or local) (d2l's concise chapter)
Both load the canonical initial weights into every context first, and both can run
hybridized (option hybridize). BatchNorm: each context normalises with its own shard's
statistics in training (as the seeds do); before evaluation the running statistics are
averaged across contexts, so every context evaluates the same model.
Nothing is read back to the host inside a step: it returns NDArrays, read by collect().
"""

from __future__ import annotations

import numpy as np

from backends.mxnet import models
from backends.mxnet.compat import mx
from backends.mxnet.environment import NO_GPU_BUILD, has_cuda, hybridized, option, visible_gpus
from backends.mxnet.parallel import allreduce, as_ndarray, devices, split
from common import data as datalib
from common.config import RunConfig
from common.loop import Unsupported, run_training
from common.weights import init_canonical
from mxnet import autograd, gluon

LOSS = gluon.loss.SoftmaxCrossEntropyLoss()   # per example; summed per shard


def initial_weights(cfg: RunConfig) -> dict[str, np.ndarray]:
    """The canonical initial weights every run of this config starts from."""
    return init_canonical(models.spec(models.build(cfg.model)), cfg.seed)


def network(cfg: RunConfig, ctx) -> gluon.HybridBlock:
    """The model initialised on ctx (a context or a list of them), hybridized if the run says so.
    Gluon's own initial values are overwritten with the canonical ones by reset()."""
    net = models.build(cfg.model)
    net.initialize(ctx=ctx)
    if hybridized(cfg):
        net.hybridize()
    return net


def trainable(net: gluon.Block) -> list:
    return [p for p in net.collect_params().values() if p.grad_req != "null"]


def running_statistics(net: gluon.Block) -> list:
    return [p for p in net.collect_params().values() if p.grad_req == "null"]


def average(arrays: list) -> None:
    """Every array becomes the mean of them all (the hand-written allreduce, then / k)."""
    for a in allreduce(arrays):
        a[:] /= len(arrays)


def forward_backward(net, x, y):
    """Summed loss of one shard, its gradients left in the network; (loss sum, correct) handles."""
    with autograd.record():
        logits = net(x)
        loss = LOSS(logits, y).sum()
    loss.backward()
    return loss, (logits.argmax(axis=1).astype(y.dtype) == y).sum()


def accuracy_counts(net, batches, ctx) -> tuple[int, int]:
    correct = total = 0
    for x, y in batches:
        predicted = net(as_ndarray(x, ctx)).argmax(axis=1).asnumpy()   # outside record: inference mode
        correct += int((predicted.astype(np.int64) == y).sum())
        total += len(y)
    return correct, total


class MXNetTrainer:
    """What the strategies share: `module` is the network evaluated and reported, `devs` its contexts."""

    cfg: RunConfig
    module: gluon.HybridBlock
    devs: list

    def sync(self) -> None:
        mx.nd.waitall()

    def collect(self, handles) -> tuple[float, float]:
        loss = sum(float(l.asscalar()) for step in handles for l, _ in step)
        correct = sum(int(c.asscalar()) for step in handles for _, c in step)
        return loss, correct

    def slowest(self, seconds: float) -> float:
        return seconds

    def param_count(self) -> int:
        return models.count_params(self.module)

    def memory(self) -> dict:
        return {}   # MXNet 1.x exposes no peak memory for CPU contexts

    def canonical(self) -> dict[str, np.ndarray]:
        return models.to_canonical(self.module)


class ScratchTrainer(MXNetTrainer):
    """One replica per context; gradients reduced with the hand-written allreduce, SGD by hand."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], rank: int = 0):
        self.cfg, self.weights, self.rank = cfg, weights, 0
        self.n_devices = cfg.devices
        self.devs = devices(cfg.devices, cfg.device_kind)
        self.replicas = [network(cfg, ctx) for ctx in self.devs]
        self.module = self.replicas[0]

    def reset(self) -> None:
        for net in self.replicas:
            models.load_canonical(net, self.weights)

    def step(self, x, y):
        xs, ys = split(x, y, self.devs)
        metrics = [forward_backward(net, xi, yi) for net, xi, yi in zip(self.replicas, xs, ys)]
        params = [trainable(net) for net in self.replicas]
        for i in range(len(params[0])):
            allreduce([replica[i].grad() for replica in params])
        scale = self.cfg.lr / len(y)
        for replica in params:
            for p in replica:
                w = p.data()
                w[:] = w - scale * p.grad()
        return metrics

    def evaluate(self, batches) -> tuple[int, int]:
        stats = [running_statistics(net) for net in self.replicas]
        for i in range(len(stats[0])):
            average([replica[i].data() for replica in stats])
        return accuracy_counts(self.module, batches, self.devs[0])


class GluonTrainer(MXNetTrainer):
    """net.initialize(ctx=devices), split_and_load, autograd.record, Trainer.step(B) over a kvstore."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], rank: int = 0):
        self.cfg, self.weights, self.rank = cfg, weights, 0
        self.n_devices = cfg.devices
        self.devs = devices(cfg.devices, cfg.device_kind)
        self.module = network(cfg, self.devs)
        # Only the trainable parameters: the kvstore's set-up copies device 0's values to every
        # device, which must not overwrite the per-device BatchNorm statistics.
        # update_on_kvstore=False: the kvstore sums the gradients and each context applies SGD.
        # With the update on the kvstore, its copy of the weights would be re-made after reset(),
        # inside the first timed step; this way the kvstore is set up once, in the warm-up step.
        self.trainer = gluon.Trainer(trainable(self.module), "sgd", {"learning_rate": cfg.lr},
                                     kvstore=option(cfg, "kvstore"), update_on_kvstore=False)

    def reset(self) -> None:
        models.load_canonical(self.module, self.weights)   # SGD without momentum keeps no state

    def step(self, x, y):
        xs, ys = split(x, y, self.devs)
        metrics = [forward_backward(self.module, xi, yi) for xi, yi in zip(xs, ys)]
        self.trainer.step(len(y))   # gradients are of summed losses: rescale by 1 / global batch
        return metrics

    def evaluate(self, batches) -> tuple[int, int]:
        for p in running_statistics(self.module):
            average(p.list_data())
        return accuracy_counts(self.module, batches, self.devs[0])


TRAINERS = {"scratch": ScratchTrainer, "gluon": GluonTrainer}


def check_supported(cfg: RunConfig) -> None:
    if cfg.strategy not in TRAINERS:
        raise Unsupported(f"mxnet has no strategy {cfg.strategy!r}; it has {', '.join(TRAINERS)}")
    if cfg.device_kind == "gpu":
        if not has_cuda():
            raise Unsupported(f"GPU run requested, but no MXNet GPU build can run here: {NO_GPU_BUILD}")
        if visible_gpus() < cfg.devices:
            raise Unsupported(f"{cfg.devices} GPUs requested, MXNet sees {visible_gpus()}")


def _apply_steps(trainer, batches) -> dict[str, np.ndarray]:
    trainer.reset()
    for x, y in batches:
        trainer.step(x, y)
    trainer.sync()
    return trainer.canonical()


# ----------------------------------------------------------------------- entry points

def run(cfg: RunConfig) -> dict:
    """Train as the run config says; the metrics part of a result."""
    check_supported(cfg)
    trainer = TRAINERS[cfg.strategy](cfg, initial_weights(cfg))
    return run_training(trainer, cfg, datalib.load(cfg))


def train_steps(strategy: str, model: str, n_devices: int, weights: dict[str, np.ndarray],
                batches: list, lr: float, device_kind: str = "cpu", options: dict | None = None) -> dict[str, np.ndarray]:
    """Apply len(batches) SGD steps from `weights`; the canonical weights afterwards (for tests and checks).
    `options`: backend options (kvstore, hybridize); the declared defaults otherwise."""
    cfg = RunConfig(backend="mxnet", strategy=strategy, devices=n_devices, device_kind=device_kind,
                    model=model, batch_size=len(batches[0][1]), lr=lr, options=dict(options or {})).validate()
    check_supported(cfg)
    return _apply_steps(TRAINERS[strategy](cfg, weights), batches)
