"""common/trainer.py: the base's shared methods and the equivalence probes, on a framework-free trainer.

The trainer is least squares on one weight vector (loss sum = 1/2 |Xw - y|^2 per example), so the
expected losses and weights are computed here by hand and compared exactly."""

from __future__ import annotations

import numpy as np
import pytest

from common import trainer as trainerlib
from common.backend import Probe
from common.config import RunConfig
from common.levers import Levers


class LeastSquares(trainerlib.Trainer):
    def __init__(self, cfg, weights, dtype="float32"):
        super().__init__(cfg, weights, dtype)
        self.events = []

    def reset(self):
        self.w = self.weights["w"].copy()

    def place(self, x, y):
        self.events.append("place")
        return ("placed", x), ("placed", y)

    def reduce_gradients(self, x, y):
        x, y = (a[1] if isinstance(a, tuple) else a for a in (x, y))
        r = x @ self.w - y
        self.g, self.size = x.T @ r, len(y)
        return float(0.5 * r @ r)

    def update(self):
        self.w = self.w - self.cfg.lr * self.g / self.size

    def collect(self, handles):
        return sum(handles), 0.0

    def sync(self):
        self.events.append("sync")

    def canonical(self):
        return {"w": self.w.copy()}

    def canonical_gradients(self):
        return {"w": self.g / self.size}

    # (what a run needs beside the probes)

    def allreduce_op(self, values):
        return lambda: None

    def evaluate(self, batches):
        return 0, 0

    def param_count(self):
        return len(self.weights["w"])


def make(resident_data=False, prefetch=2):
    cfg = RunConfig(
        backend="torch",
        strategy="scratch",
        devices=1,
        batch_size=4,
        lr=0.1,
        train_size=8,
        levers=Levers(resident_data=resident_data, prefetch=prefetch),
    ).validate()
    t = LeastSquares(cfg, {"w": np.array([0.5, -1.0])})
    t.reset()
    return t


def batches(n=3):
    rng = np.random.default_rng(0)
    return [(rng.random((4, 2)), rng.random(4)) for _ in range(n)]


def by_hand(w, data, lr):
    losses, ws = [], []
    for x, y in data:
        r = x @ w - y
        losses.append(0.5 * r @ r / len(y))
        w = w - lr * (x.T @ r) / len(y)
        ws.append(w)
    return losses, ws


@pytest.mark.parametrize("resident_data, prefetch", [(False, 0), (False, 2), (True, 2)])
def test_trace_is_the_steps_losses_and_weights(resident_data, prefetch):
    t, data = make(resident_data, prefetch), batches()
    out = trainerlib.trace(t, data)
    losses, ws = by_hand(np.array([0.5, -1.0]), data, 0.1)
    assert out["losses"] == losses
    assert np.array_equal(out["first"]["w"], ws[0]) and np.array_equal(out["final"]["w"], ws[-1])
    # resident data: every batch placed, then one barrier, before the first step; prefetch 0: step places nothing
    assert (
        t.events
        == {(False, 0): [], (False, 2): ["place"] * 3, (True, 2): ["place"] * 3 + ["sync"]}[
            (resident_data, prefetch)
        ]
    )


def test_first_gradients_are_of_the_mean_loss_and_leave_the_weights():
    t, (x, y) = make(), batches(1)[0]
    loss, grads = trainerlib.first_gradients(t, [(x, y)])
    r = x @ np.array([0.5, -1.0]) - y
    assert loss == 0.5 * r @ r / 4 and np.array_equal(grads["w"], x.T @ r / 4)
    assert np.array_equal(t.canonical()["w"], [0.5, -1.0])


def test_the_base_step_is_reduce_then_update_and_slowest_is_itself():
    t, (x, y) = make(), batches(1)[0]
    t.step(x, y)
    assert np.array_equal(t.w, by_hand(np.array([0.5, -1.0]), [(x, y)], 0.1)[1][0])
    assert t.slowest(1.5) == 1.5 and t.memory() == {} and t.n_devices == 1 and t.rank == 0


def test_a_trainer_that_lacks_a_method_every_strategy_defines_cannot_be_made():
    class NoEvaluation(LeastSquares):
        # the abstract one: as if LeastSquares had not defined it
        evaluate = trainerlib.Trainer.evaluate

    with pytest.raises(TypeError, match="abstract method.*evaluate"):
        NoEvaluation(make().cfg, {"w": np.zeros(2)})


def test_a_probes_config_is_validated():
    probe = Probe(
        "gluon", "lenet", 2, options={"kvstore": "local"}, levers=Levers(resident_data=True)
    )
    cfg = probe.config("mxnet", 12, 0.1)
    assert (cfg.devices, cfg.batch_size, cfg.options, cfg.levers.resident_data) == (
        2,
        12,
        {"kvstore": "local"},
        True,
    )
    with pytest.raises(ValueError):
        Probe("scratch", "lenet", 2).config("torch", 12, -1.0)
