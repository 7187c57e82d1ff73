"""The common interface (DESIGN.md), one module for every backend, run in each backend's environment.

A backend package provides: resnet18, lenet, devices(n, kind), split, allreduce,
initial_weights(model, seed), param_count(model), predict(model, weights, x),
train_steps(strategy, model, n_devices, weights, batches, lr), array, to_numpy, device_of.
"""

from __future__ import annotations

import numpy as np
import pytest

from common.loop import Unsupported
from common.weights import he_scaled

BATCH = 12  # divisible by 1, 2 and 3 devices


def batch(n=BATCH, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


@pytest.mark.parametrize("k", [2, 3])
def test_split_shards_concatenate_back_on_their_devices(backend, k):
    x, y = batch()
    devs = backend.devices(k)
    xs, ys = backend.split(x, y, devs)
    assert len(xs) == len(ys) == k
    assert [tuple(backend.to_numpy(s).shape) for s in xs] == [(BATCH // k, 1, 28, 28)] * k
    assert np.array_equal(np.concatenate([backend.to_numpy(s) for s in xs]), x)
    assert np.array_equal(np.concatenate([backend.to_numpy(s) for s in ys]), y)
    for shard, device in zip(xs, devs):
        assert backend.device_of(shard) == device


def test_split_refuses_a_batch_the_devices_cannot_split(backend):
    x, y = batch(7)
    with pytest.raises(ValueError, match="batch of 7 examples cannot be split evenly across 2 devices"):
        backend.split(x, y, backend.devices(2))


@pytest.mark.parametrize("k", [2, 3])
def test_allreduce_leaves_the_exact_sum_on_every_device(backend, k):
    values = [np.arange(12, dtype=np.float32).reshape(3, 4) * (i + 1) + i for i in range(k)]
    expected = sum(values)
    devs = backend.devices(k)
    out = backend.allreduce([backend.array(v, d) for v, d in zip(values, devs)])
    assert len(out) == k
    for a, device in zip(out, devs):
        assert np.array_equal(backend.to_numpy(a), expected)
        assert backend.device_of(a) == device


def test_parameter_counts(backend):
    assert backend.param_count("resnet18") == 11_175_818
    assert backend.param_count("lenet") == 129_068


@pytest.mark.parametrize("model", ["resnet18", "lenet"])
def test_output_shape(backend, model):
    x, _ = batch(5)
    logits = backend.predict(model, backend.initial_weights(model, 0), x)
    assert logits.shape == (5, 10) and logits.dtype == np.float32 and np.isfinite(logits).all()


# SHA-256 of the canonical initial weights (seed 0): every backend must start from exactly these
# numbers, under the same canonical names and layouts (conv OIHW, dense (out, in)).
CANONICAL_FINGERPRINTS = {
    "resnet18": "1edb562911f9087d60faa0220f475e76ee56775bafc7aab1c426b9bec6b44e2c",
    "lenet": "d4edbb487ad27285ea3211f777ff08bd27ba74ca46cc26104b6344a7ef061a0f",
}


@pytest.mark.parametrize("model", ["resnet18", "lenet"])
def test_initial_weights_are_the_canonical_ones(backend, model):
    from common.weights import fingerprint
    assert fingerprint(backend.initial_weights(model, 0)) == CANONICAL_FINGERPRINTS[model]


def test_initial_weights_are_seeded(backend):
    a, b, c = (backend.initial_weights("lenet", s) for s in (0, 0, 1))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)
    assert sum(v.size for v in a.values()) == 129_068


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def steps(backend, strategy, k, n_steps=1, model="lenet", lr=0.5):
    weights = backend.initial_weights(model, 0)
    batches = [batch(BATCH, seed=s) for s in range(n_steps)]
    try:
        return weights, backend.train_steps(strategy, model, k, weights, batches, lr)
    except Unsupported as e:
        pytest.skip(str(e))


def test_k_device_step_equals_one_device_step(backend, strategy):
    """LeNet, fp32: one step on 2 devices with the batch split gives the 1-device parameters (1e-5)."""
    start, one = steps(backend, strategy, 1)
    _, two = steps(backend, strategy, 2)
    assert max_abs_diff(one, start) > 1e-3          # the step really moved the weights
    assert max_abs_diff(two, one) <= 1e-5


def test_strategies_agree_on_one_device(backend, meta):
    """Every strategy of the backend takes the same 1-device step (3 steps, LeNet, 1e-5)."""
    results = {}
    for name in meta["strategies"]:
        try:
            results[name] = backend.train_steps(name, "lenet", 1, backend.initial_weights("lenet", 0),
                                                [batch(BATCH, seed=s) for s in range(3)], 0.5)
        except Unsupported:
            continue
    assert len(results) >= 2, results.keys()
    first, *others = results.values()
    for other in others:
        assert max_abs_diff(first, other) <= 1e-5


# ------------------------------------------------------------------ equivalence API (DESIGN: proving fairness)
#   predict(model, weights, x, train=False); gradients(strategy, model, k, weights, x, y, bn="local")
#   -> (mean loss, canonical gradients); train_trace(strategy, model, k, weights, batches, lr, bn="local")
#   -> {"first", "final", "losses"}

def trainable_names(model: str) -> set[str]:
    from common.architectures import spec
    return {name for name, _, kind in spec(model) if kind not in ("bn_mean", "bn_var")}


def call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Unsupported as e:
        pytest.skip(str(e))


def test_train_mode_forward_normalises_with_the_batch_statistics(backend):
    """Training mode normalises with the batch's statistics: the running statistics change nothing there."""
    x, _ = batch(6)
    w = backend.initial_weights("resnet18", 0)
    moved = {k: v + 5 if k.endswith("running_mean") else v * 100 if k.endswith("running_var") else v
             for k, v in w.items()}
    train_a, train_b = (backend.predict("resnet18", v, x, train=True) for v in (w, moved))
    eval_a, eval_b = (backend.predict("resnet18", v, x) for v in (w, moved))
    assert np.max(np.abs(train_a - train_b)) <= 1e-6 * np.max(np.abs(train_a))
    assert np.max(np.abs(eval_a - eval_b)) > 1e-3 * np.max(np.abs(eval_a))


def test_gradient_is_that_of_the_mean_loss(backend, meta):
    """Central differences of the global mean loss agree with the returned gradient (LeNet, 1 device)."""
    strategy = next(iter(meta["strategies"]))
    x, y = batch()
    w = {k: v.astype(np.float32) for k, v in backend.initial_weights("lenet", 0).items()}
    w["fc2.weight"] = w["fc2.weight"] * 100   # logits large enough for a visible loss change
    loss, grads = call(backend.gradients, strategy, "lenet", 1, w, x, y)
    assert set(grads) == trainable_names("lenet")
    h = 1e-2
    for name, index in (("fc2.bias", (3,)), ("fc2.weight", (2, 5))):
        plus, minus = ({**w, name: w[name].copy()} for _ in range(2))
        plus[name][index] += h
        minus[name][index] -= h
        numeric = (call(backend.gradients, strategy, "lenet", 1, plus, x, y)[0] -
                   call(backend.gradients, strategy, "lenet", 1, minus, x, y)[0]) / (2 * h)
        assert abs(numeric - grads[name][index]) <= 2e-3 * max(1e-3, abs(numeric)) + 1e-5, name
    assert np.isfinite(loss) and 0 < loss < 50


def test_k_device_gradients_equal_one_device(backend, strategy):
    x, y = batch()
    w = backend.initial_weights("lenet", 0)
    loss1, g1 = call(backend.gradients, strategy, "lenet", 1, w, x, y)
    loss2, g2 = call(backend.gradients, strategy, "lenet", 2, w, x, y)
    assert abs(loss2 - loss1) <= 1e-6 * abs(loss1)
    assert max_abs_diff(g1, g2) <= 1e-6
    assert max(float(np.max(np.abs(g))) for g in g1.values()) > 1e-3


def test_trace_agrees_with_steps_and_gradients(backend, strategy):
    w = backend.initial_weights("lenet", 0)
    batches = [batch(BATCH, seed=s) for s in range(3)]
    trace = call(backend.train_trace, strategy, "lenet", 2, w, batches, 0.5)
    assert len(trace["losses"]) == 3
    assert max_abs_diff(trace["final"], call(backend.train_steps, strategy, "lenet", 2, w, batches, 0.5)) <= 1e-6
    assert max_abs_diff(trace["first"], call(backend.train_steps, strategy, "lenet", 2, w, batches[:1], 0.5)) <= 1e-6
    loss0, _ = call(backend.gradients, strategy, "lenet", 2, w, *batches[0])
    assert abs(trace["losses"][0] - loss0) <= 1e-5 * abs(loss0)


def test_sync_batchnorm_makes_k_devices_one_device(backend, strategy, meta):
    """--bn sync: ResNet-18 on 2 devices takes the 1-device step (statistics over the global batch)."""
    if "sync" not in meta["strategies"][strategy].get("bn", ["local"]):
        pytest.skip(f"{meta['name']} {strategy} has no synchronised BatchNorm")
    w = he_scaled(backend.initial_weights("resnet18", 0), "resnet18")   # well conditioned in float32
    batches = [batch(8, seed=0)]
    one = call(backend.train_steps, strategy, "resnet18", 1, w, batches, 0.1, bn="sync")
    two = call(backend.train_steps, strategy, "resnet18", 2, w, batches, 0.1, bn="sync")
    local = call(backend.train_steps, strategy, "resnet18", 2, w, batches, 0.1, bn="local")
    assert max_abs_diff(two, one) <= SYNC_BN_TOLERANCE
    assert max_abs_diff(local, one) > 10 * SYNC_BN_TOLERANCE     # per-device statistics really differ


SYNC_BN_TOLERANCE = 1e-5
