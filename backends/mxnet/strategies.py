"""MXNet strategies, each a Trainer for common/loop.py.

Same math in both: one SGD step on the mean cross-entropy of the *global* batch.
  scratch  the network's parameters copied to every context (one replica per context);
           per-shard summed loss, gradients summed by the hand-written allreduce, then
           p -= lr / B * g on every context (d2l's from-scratch chapter)
  gluon    one network initialised on every context (net.initialize(ctx=devices)),
           split_and_load, autograd.record, a gluon.Trainer over a kvstore (option
           kvstore: device or local) sums the gradients, each context applies SGD with
           1 / B (d2l's concise chapter)
A step is reduce_gradients (each context on its shard, then the strategy's own reduction)
followed by update; gradients() and train_trace() run the same two halves (common/trainer.py's probes).
Several nodes (gluon only, --nodes): each node's worker takes its consecutive share of the global batch
over its own contexts, and the Trainer's kvstore is dist_sync (distributed.py), which sums every node's
gradients; collect, slowest, evaluate and the BatchNorm average go through it too (parallel.AcrossNodes).
Both load the run's weights into every context first, and both can run hybridized
(option hybridize). BatchNorm (--bn): "local", each context normalises with its own
shard's statistics in training (as the seeds do) and the running statistics are averaged
across contexts before evaluation; "sync" (gluon only), SyncBatchNorm layers normalise
with the statistics of the global batch, so k contexts train as one: GPU contexts only
(on several CPU contexts it deadlocks, see environment.SYNC_BN_ON_CPU), which no build here has.
BatchNorm's running statistics follow torch's convention (unbiased variance): batchnorm.py,
around each step's forward and backward passes (RunningStatistics.step).
Nothing is read back to the host inside a step: it returns NDArrays, read by collect().
place() split_and_loads a batch onto the contexts (parallel.Shards), queued on the engine, and a
step takes it as it is (put() for --prefetch, stage() for --resident-data).
--compile is hybridize(static_alloc=True, static_shape=True) (environment.STATIC).
allreduce_op() is the strategy's own reduction of one gradient-sized buffer: the hand-written
allreduce (scratch), a kvstore of the run's type (gluon).
dtype (the equivalence API only): "float64" runs the same strategy code, its split, reduction,
SGD update and BatchNorm, with parameters, statistics, inputs and arithmetic in float64
(net.cast("float64"); the kvstore and the hand-written allreduce reduce arrays in their own dtype).
Two differences, neither in the math: gluon's Trainer steps with Float64SGD, because MXNet's sgd
kernels take the learning rate and gradient scale as float32 operator parameters; and the contexts
compute one after the other (MXNetTrainer._forward_backward: MXNet's OpenBLAS can hang otherwise).
"""

from __future__ import annotations

import numpy as np

from backends.mxnet import distributed, models
from backends.mxnet.batchnorm import RunningStatistics
from backends.mxnet.compat import mx
from backends.mxnet.environment import kvstore
from backends.mxnet.parallel import (
    AcrossNodes,
    Reduction,
    Shards,
    allreduce,
    average,
    devices,
    examples,
    node_shard,
    split,
    stage,
    zeros_per_context,
)
from common.config import RunConfig
from common.trainer import Trainer

from mxnet import gluon


class MXNetTrainer(Trainer):
    """What the strategies share: `module` is the network evaluated and reported, `devs` its contexts,
    `dtype` the floating-point type of its parameters, statistics and arithmetic, `statistics` the
    running-statistics update of its BatchNorm layers. A strategy supplies reset, reduce_gradients,
    update, allreduce_op and average_bn_statistics; a step is reduce_gradients, then update."""

    module: gluon.HybridBlock
    statistics: RunningStatistics

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        # loopback nodes share the GPUs
        self.devs = devices(cfg.local_devices, cfg.device_kind, cfg.first_gpu)
        # the examples of the (global) batch reduce_gradients last took
        self._examples = cfg.batch_size
        # Several nodes (gluon only): this node's view of the process's dist kvstore, for the global figures.
        self.kv = distributed.keyed(cfg) if cfg.nodes.count > 1 else None
        self.across = AcrossNodes(self.kv, cfg.nodes.count, cfg.nodes.rank) if self.kv else None

    def place(self, x, y):
        """One batch split_and_load-ed onto the contexts, as step() would; the copies are queued on the
        engine, not waited for (so put() is place())."""
        return stage(*self._local(self._images(x), y), self.devs)

    def collect(self, handles) -> tuple[float, float]:
        """(loss sum, correct) of every device of every node."""
        loss = sum(float(l.asscalar()) for step in handles for l, _ in step)
        correct = sum(int(c.asscalar()) for step in handles for _, c in step)
        if self.across:
            loss, correct = self.across.gather([loss, correct]).sum(axis=0)
            correct = int(round(correct))
        return loss, correct

    def sync(self) -> None:
        mx.nd.waitall()

    def slowest(self, seconds: float) -> float:
        return float(self.across.gather([seconds]).max()) if self.across else seconds

    def summed(self, values: list[float]) -> list[float]:
        if not self.across:
            return list(values)
        return [float(v) for v in self.across.gather(values).sum(axis=0)]

    def canonical(self) -> dict[str, np.ndarray]:
        return models.to_canonical(self.module)

    def canonical_gradients(self) -> dict[str, np.ndarray]:
        """The reduced gradients as context 0 holds them, by canonical name (trainable parameters only),
        divided by the batch's size: the strategies reduce gradients of the *summed* loss."""
        return {
            name: p.list_grad()[0].asnumpy() / self._examples
            for name, p in models.canonical_params(self.module).items()
            if not models.is_statistic(p)
        }

    def evaluate(self, batches) -> tuple[int, int]:
        """(correct, total) on the test batches; with several nodes each evaluates every nodes-th batch."""
        self.average_bn_statistics()
        if not self.across:
            return models.accuracy_counts(self.module, batches, self.devs[0], self.dtype)
        mine = (b for i, b in enumerate(batches) if i % self.cfg.nodes.count == self.cfg.nodes.rank)
        counts = self.across.gather(
            models.accuracy_counts(self.module, mine, self.devs[0], self.dtype)
        )
        correct, total = counts.sum(axis=0)
        return int(round(correct)), int(round(total))

    def param_count(self) -> int:
        return models.count_params(self.module)

    # memory(): the base's {}, as MXNet 1.x exposes no peak memory for CPU contexts

    def _split(self, x, y) -> tuple[list, list]:
        """This node's shards of the global batch, one per context; remembers the global size for update()."""
        self._examples = examples(y) * (self.cfg.nodes.count if isinstance(y, Shards) else 1)
        return split(*self._local(self._images(x), y), self.devs)

    def _local(self, x, y):
        """This node's part of a global numpy batch (a staged one is this node's already)."""
        if self.cfg.nodes.count == 1 or isinstance(y, Shards):
            return x, y
        return node_shard(x, y, self.cfg.nodes.count, self.cfg.nodes.rank)

    def _forward_backward(self, net, x, y):
        """forward_backward of one context's shard. In float64 each context finishes before the next
        starts: float64 convolutions run on mxnet's bundled OpenBLAS 0.3.13 (OpenMP build), whose
        dgemm can hang forever in exec_blas when two contexts' engine threads call it at once (float32
        runs use oneDNN instead). The arithmetic is the same; only the overlap is lost."""
        handles = models.forward_backward(net, x, y)
        if self.dtype == "float64":
            mx.nd.waitall()
        return handles

    def _images(self, x):
        """Numpy images in the trainer's dtype (float32 -> float64 is exact); staged ones as they are."""
        return x if isinstance(x, Shards) else np.asarray(x, self.dtype)


class ScratchTrainer(MXNetTrainer):
    """One replica per context; gradients reduced with the hand-written allreduce, SGD by hand."""

    # Separate networks per context: their BatchNorm layers cannot share the global batch's statistics.

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self.replicas = [models.network(cfg, ctx, dtype) for ctx in self.devs]
        self.module = self.replicas[0]
        self.statistics = RunningStatistics(self.replicas)

    def reset(self) -> None:
        for net in self.replicas:
            models.load_canonical(net, self.weights)

    def reduce_gradients(self, x, y):
        """Forward and backward of each replica on its shard, then the hand-written allreduce of every
        gradient: each context holds the gradients of the global batch's *summed* loss. Returns the
        (loss sum, correct) handles of the shards."""
        xs, ys = self._split(x, y)
        with self.statistics.step(xs[0].shape):
            metrics = [
                self._forward_backward(net, xi, yi) for net, xi, yi in zip(self.replicas, xs, ys)
            ]
        params = [models.trainable(net) for net in self.replicas]
        for i in range(len(params[0])):
            allreduce([replica[i].grad() for replica in params])
        return metrics

    def update(self) -> None:
        """SGD on every context with the reduced gradients, scaled by lr / batch size."""
        scale = self.cfg.lr / self._examples
        for net in self.replicas:
            for p in models.trainable(net):
                w = p.data()
                w[:] = w - scale * p.grad()

    def allreduce_op(self, values: int) -> Reduction:
        """The hand-written allreduce (sum onto context 0, copy back), as each gradient is reduced."""
        buffers = zeros_per_context(values, self.devs)
        return Reduction(buffers, lambda: allreduce(buffers))

    def average_bn_statistics(self) -> None:
        stats = [models.running_statistics(net) for net in self.replicas]
        for i in range(len(stats[0])):
            average([replica[i].data() for replica in stats])

    def canonical(self) -> dict[str, np.ndarray]:
        return models.to_canonical(*self.replicas)


class GluonTrainer(MXNetTrainer):
    """net.initialize(ctx=devices), split_and_load, autograd.record, Trainer over a kvstore."""

    def __init__(self, cfg: RunConfig, weights: dict[str, np.ndarray], dtype: str = "float32"):
        super().__init__(cfg, weights, dtype)
        self.module = models.network(cfg, self.devs, dtype)
        self.statistics = RunningStatistics([self.module], models.statistics_shards(cfg))
        # Only the trainable parameters: the kvstore's set-up copies device 0's values to every
        # device, which must not overwrite the per-device BatchNorm statistics.
        # update_on_kvstore=False: the kvstore sums the gradients and each context applies SGD.
        # With the update on the kvstore, its copy of the weights would be re-made after reset(),
        # inside the first timed step; this way the kvstore is set up once, in the warm-up step.
        sgd = (
            Float64SGD(learning_rate=cfg.lr)
            if dtype == "float64"
            else mx.optimizer.SGD(learning_rate=cfg.lr)
        )
        # Several nodes: the process's dist_sync kvstore, under this trainer's own keys (distributed.py).
        self.trainer = gluon.Trainer(
            models.trainable(self.module),
            sgd,
            kvstore=self.kv or kvstore(cfg),
            update_on_kvstore=False,
        )
        if self.kv:
            self._broadcast_now()

    def _broadcast_now(self) -> None:
        """The Trainer's lazy kvstore set-up (a broadcast: worker 0's weights to the servers, every worker
        pulls them back), done now and waited for. Left to the first allreduce_grads, nothing orders that
        pull before the gradients' pushpull on the same keys: the servers could answer it with the first
        step's summed gradient, which would then overwrite the weights (seen as such on loopback nodes)."""
        self.trainer._init_kvstore()
        self.trainer._init_params()
        mx.nd.waitall()

    def reset(self) -> None:
        models.load_canonical(self.module, self.weights)  # SGD without momentum keeps no state

    def reduce_gradients(self, x, y):
        """Forward and backward of each context on its shard, then the kvstore's sum of the gradients
        onto every context (of the global batch's *summed* loss). Returns the shards' handles."""
        xs, ys = self._split(x, y)
        with self.statistics.step(xs[0].shape):
            metrics = [self._forward_backward(self.module, xi, yi) for xi, yi in zip(xs, ys)]
        self.trainer.allreduce_grads()  # the kvstore sums them onto every context, updates nothing
        return metrics

    def update(self) -> None:
        """SGD on every context with the reduced gradients, scaled by lr / global batch size (a dist
        kvstore sums every worker's gradients, and Trainer.update(B) rescales by 1 / B, not / workers)."""
        self.trainer.update(self._examples)  # allreduce_grads + update(B) is Trainer.step(B)

    def allreduce_op(self, values: int) -> Reduction:
        """A kvstore of the run's type (its own, so its key cannot meet the Trainer's parameter
        keys), reducing the buffers as Trainer.allreduce_grads reduces each gradient: pushpull of
        the per-context arrays in place (for a local kvstore, a push and then a pull). On one
        context Gluon creates no kvstore and reduces nothing (model._create_kvstore), so neither
        does this."""
        buffers = zeros_per_context(values, self.devs)
        if self.n_devices == 1:
            return Reduction(buffers, lambda: None)
        # several nodes: the trainer's keys, "allreduce"
        kv = self.kv or mx.kv.create(kvstore(self.cfg))
        kv.init("allreduce", buffers[0])
        mx.nd.waitall()
        return Reduction(buffers, lambda: kv.pushpull("allreduce", buffers))

    def average_bn_statistics(self) -> None:
        """Each node's contexts averaged, then (several nodes) the nodes' averages."""
        for i, p in enumerate(models.running_statistics(self.module)):
            average(p.list_data())
            if self.across:
                self.across.average(f"statistics{i}", p.list_data())


class Float64SGD(mx.optimizer.SGD):
    """Gluon's SGD (no momentum, no weight decay) with its step size kept in float64, for float64 runs.
    MXNet's sgd kernels take the learning rate and rescale_grad (1 / batch size) as float32 operator
    parameters, so their float64 step is float32(lr) * float32(1 / B) * g: 4.5e-8 relative off for
    lr 0.1, B 12. Here w <- w - (lr / B) * g with the scalar a double, as in scratch's update."""

    def _update_impl(self, indices, weights, grads, states, multi_precision=False):
        as_list = lambda v: v if isinstance(v, (list, tuple)) else [v]
        indices, weights, grads = as_list(indices), as_list(weights), as_list(grads)
        self._update_count(indices)
        for index, weight, grad in zip(indices, weights, grads):
            weight[:] = weight - (self._get_lr(index) * self.rescale_grad) * grad


TRAINERS = {"scratch": ScratchTrainer, "gluon": GluonTrainer}

# The strategy of float64_gradients: one process, no kvstore.
REFERENCE = "scratch"
