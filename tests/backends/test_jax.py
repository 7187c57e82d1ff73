"""JAX-only behaviour: pmap and sharding agree (steps and gradients), per-device and synchronised
BatchNorm, refusal of uneven batches, the forward pass against a numpy reference, the timed allreduce,
staged (--resident-data) batches, the precision and other levers, and the worker end to end (including
--bn sync, the levers and a save / load round trip of the weights)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.backends.conftest import NAME, run_backend_worker

pytestmark = pytest.mark.skipif(NAME != "jax", reason="jax backend only")
ROOT = Path(__file__).resolve().parents[2]


def batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def max_abs_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[k] - b[k]))) for k in a)


def trainer(strategy, model, k, batch_size, lr=0.1, bn="local", precision="fp32"):
    from backends.jax import initial_weights
    from backends.jax.environment import configure_precision
    from backends.jax.strategies import TRAINERS
    from common.config import RunConfig
    cfg = RunConfig(backend="jax", strategy=strategy, devices=k, model=model, batch_size=batch_size, lr=lr,
                    bn=bn, precision=precision).validate()
    configure_precision(cfg)
    t = TRAINERS[strategy](cfg, initial_weights(model, 0))
    t.reset()
    return t


def test_pmap_and_sharding_take_the_same_steps_on_two_devices():
    """ResNet-18 (so per-device BatchNorm is in play), 3 steps of 8 examples on 2 devices: within 1e-5."""
    from backends.jax import initial_weights, train_steps
    start = initial_weights("resnet18", 0)
    batches = [batch(8, seed=s) for s in range(3)]
    pmap = train_steps("pmap", "resnet18", 2, start, batches, 0.1)
    sharding = train_steps("sharding", "resnet18", 2, start, batches, 0.1)
    assert max_abs_diff(pmap, start) > 1e-3
    assert max_abs_diff(pmap, sharding) <= 1e-5


def test_batchnorm_uses_each_devices_own_shard_then_averages(strategy):
    """After one 2-device step, device i's running statistics are those of a 1-device step on shard i
    (not of the global batch); before evaluation they become the mean of the two."""
    from backends.jax.parallel import per_device
    x, y = batch(8)
    two = trainer(strategy, "resnet18", 2, 8)
    two.step(x, y)
    _, stats, _ = two.state
    mean_on = [np.asarray(m) for m in per_device(stats["bn"]["mean"], two.devs)]
    alone = []
    for i in range(2):
        one = trainer(strategy, "resnet18", 1, 4)
        one.step(x[4 * i:4 * (i + 1)], y[4 * i:4 * (i + 1)])
        alone.append(np.asarray(one.state[1]["bn"]["mean"])[0])
    global_batch = trainer(strategy, "resnet18", 1, 8)
    global_batch.step(x, y)
    for i in range(2):
        np.testing.assert_allclose(mean_on[i], alone[i], rtol=1e-5, atol=1e-7)
    assert np.max(np.abs(mean_on[0] - np.asarray(global_batch.state[1]["bn"]["mean"])[0])) > 1e-6

    two.average_bn_statistics()
    for m in per_device(two.state[1]["bn"]["mean"], two.devs):
        np.testing.assert_allclose(np.asarray(m), (alone[0] + alone[1]) / 2, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("bn", ["local", "sync"])
def test_pmap_and_sharding_compute_the_same_gradients_on_two_devices(bn):
    """ResNet-18, 8 examples on 2 devices: the same global mean loss and gradients from both strategies."""
    from backends.jax import gradients, initial_weights
    w = initial_weights("resnet18", 0)
    x, y = batch(8)
    loss_p, grads_p = gradients("pmap", "resnet18", 2, w, x, y, bn=bn)
    loss_s, grads_s = gradients("sharding", "resnet18", 2, w, x, y, bn=bn)
    scale = max(float(np.max(np.abs(g))) for g in grads_p.values())
    assert scale > 1e-2
    assert abs(loss_p - loss_s) <= 1e-6 * loss_p
    assert max_abs_diff(grads_p, grads_s) <= 1e-5 * scale


def test_sync_batchnorm_gradients_on_two_devices_are_the_one_device_gradients(strategy):
    """With --bn sync the 2-device gradient is the 1-device one; with local BatchNorm each half of the
    batch is normalised by itself and the gradient is a different one.

    The bound is float32 noise of the 1-device side: XLA's CPU float32 gradient of ResNet-18 on 8 images
    is 4e-3 (relative) from float64 at d2l's init, on 4 images 4e-6; the 2-device one is 3e-6 from it."""
    from backends.jax import gradients, initial_weights
    w = initial_weights("resnet18", 0)
    x, y = batch(8)
    loss_1, grads_1 = gradients(strategy, "resnet18", 1, w, x, y, bn="sync")
    loss_2, grads_2 = gradients(strategy, "resnet18", 2, w, x, y, bn="sync")
    _, grads_local = gradients(strategy, "resnet18", 2, w, x, y, bn="local")
    scale = max(float(np.max(np.abs(g))) for g in grads_1.values())
    assert abs(loss_2 - loss_1) <= 1e-6 * loss_1
    assert max_abs_diff(grads_2, grads_1) <= 5e-3 * scale
    assert max_abs_diff(grads_local, grads_1) > 0.2 * scale


def test_sync_batchnorm_running_statistics_are_the_global_batchs(strategy):
    """After one 2-device step with --bn sync, both devices hold the running statistics of the whole batch."""
    from backends.jax.parallel import per_device
    x, y = batch(8)
    two = trainer(strategy, "resnet18", 2, 8, bn="sync")
    two.step(x, y)
    one = trainer(strategy, "resnet18", 1, 8)
    one.step(x, y)
    expected = np.asarray(one.state[1]["stage2"]["0"]["bn1"]["var"])[0]
    for v in per_device(two.state[1]["stage2"]["0"]["bn1"]["var"], two.devs):
        np.testing.assert_allclose(np.asarray(v), expected, rtol=1e-5, atol=1e-7)


def test_canonical_weights_average_the_running_statistics_and_leave_the_devices_alone(strategy):
    from backends.jax.parallel import per_device
    x, y = batch(8)
    two = trainer(strategy, "resnet18", 2, 8)
    two.step(x, y)
    means = [np.asarray(m) for m in per_device(two.state[1]["bn"]["mean"], two.devs)]
    assert np.max(np.abs(means[0] - means[1])) > 1e-6          # local BatchNorm: the devices differ
    np.testing.assert_allclose(two.canonical()["bn.running_mean"], (means[0] + means[1]) / 2,
                               rtol=1e-6, atol=1e-8)
    assert np.array_equal(np.asarray(per_device(two.state[1]["bn"]["mean"], two.devs)[1]), means[1])


def test_train_mode_forward_gives_the_loss_that_gradients_reports(strategy):
    """The mean cross-entropy of predict(train=True) logits is the loss of the strategy's gradient step."""
    from backends.jax import gradients, initial_weights, predict
    w = initial_weights("resnet18", 0)
    x, y = batch(8)
    logits = predict("resnet18", w, x, train=True).astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = -np.mean(log_softmax[np.arange(len(y)), y])
    loss, _ = gradients(strategy, "resnet18", 1, w, x, y)
    assert abs(loss - expected) <= 1e-5 * expected


def test_the_train_step_refuses_a_batch_the_devices_cannot_split(strategy):
    t = trainer(strategy, "lenet", 2, 8)
    with pytest.raises(ValueError, match="batch of 7 examples cannot be split evenly across 2 devices"):
        t.step(*batch(7))


# ------------------------------------------------------------- allreduce, staged batches, levers

def test_allreduce_seconds_times_a_psum_that_really_sums(strategy):
    """`repeats` positive seconds; the collective it times leaves the sum over the 3 devices on each."""
    t = trainer(strategy, "lenet", 3, 6)
    seconds = t.allreduce_seconds(1000, 4)
    assert len(seconds) == 4 and all(isinstance(s, float) and s > 0 for s in seconds)
    buffer = t.allreduce_buffer(1000)            # device i holds i + 1 in every element
    rows = {s.device: np.asarray(s.data) for s in buffer.addressable_shards}
    assert [float(rows[d].ravel()[0]) for d in t.devs] == [1.0, 2.0, 3.0]
    summed = t.allreduce(buffer)
    shards = summed.addressable_shards
    assert {s.device for s in shards} == set(t.devs)
    for s in shards:
        a = np.asarray(s.data)
        assert a.dtype == np.float32 and a.size == 1000 and np.all(a == 6.0)


def test_a_staged_batch_gives_the_numpy_step_without_a_copy(strategy):
    """Batches from `stage` (--resident-data) take exactly the numpy batches' steps, with no host-to-device
    transfer in the step; a numpy batch afterwards is still copied and accepted."""
    import jax
    batches = [batch(8, seed=s) for s in range(2)]
    plain = trainer(strategy, "lenet", 2, 8, lr=0.5)
    plain_metrics = [plain.step(x, y) for x, y in batches]
    staged = trainer(strategy, "lenet", 2, 8, lr=0.5)
    on_devices = staged.stage(batches)
    assert all(isinstance(a, jax.Array) for pair in on_devices for a in pair)
    with jax.transfer_guard("disallow_explicit"):   # a numpy batch would need a device_put here
        staged_metrics = [staged.step(x, y) for x, y in on_devices]
        staged.sync()
    assert max_abs_diff(staged.canonical(), plain.canonical()) <= 1e-6
    assert max_abs_diff(plain.canonical(), plain.weights) > 1e-3
    assert staged.collect(staged_metrics) == plain.collect(plain_metrics)
    with pytest.raises(Exception, match="Disallowed host-to-device transfer"):
        with jax.transfer_guard("disallow_explicit"):
            staged.step(*batches[0])
    staged.step(*batches[0])
    plain.step(*batches[0])
    assert max_abs_diff(staged.canonical(), plain.canonical()) <= 1e-6


def update_distance(start: dict, a: dict, b: dict) -> float:
    """|update a - update b| / |update b| (L2 over every weight)."""
    diff = sum(float(np.sum(((a[k] - start[k]) - (b[k] - start[k])).astype(np.float64) ** 2)) for k in start)
    norm = sum(float(np.sum((b[k] - start[k]).astype(np.float64) ** 2)) for k in start)
    return float(np.sqrt(diff / norm))


def test_bf16_step_is_close_to_the_fp32_step_but_not_the_same(strategy):
    """--precision bf16: LeNet's 2-device step computes in bfloat16 (an update within 5e-2 of the fp32 one,
    but not equal to it), while the parameters and optimizer state stay float32."""
    import jax
    from backends.jax import initial_weights, train_steps
    w = initial_weights("lenet", 0)
    batches = [batch(8)]
    fp32 = train_steps(strategy, "lenet", 2, w, batches, 0.5)
    bf16 = train_steps(strategy, "lenet", 2, w, batches, 0.5, precision="bf16")
    assert max_abs_diff(fp32, w) > 1e-3
    distance = update_distance(w, bf16, fp32)
    assert 1e-5 < distance < 5e-2, distance
    t = trainer(strategy, "lenet", 2, 8, precision="bf16")
    loss, correct = t.step(*batches[0])
    assert {a.dtype for a in jax.tree.leaves(t.state)} == {np.dtype(np.float32)}
    assert np.asarray(loss).dtype == np.float32


def test_bf16_resnet_keeps_parameters_and_batchnorm_statistics_float32():
    """Only the compute dtype changes: every parameter and running statistic is declared float32."""
    import jax
    import jax.numpy as jnp
    from backends.jax.models import build, native_shapes
    shapes = native_shapes(build("resnet18", dtype=jnp.bfloat16))
    assert shapes["batch_stats"] and {s.dtype for s in jax.tree.leaves(shapes)} == {np.dtype(np.float32)}


def test_tf32_on_the_cpu_and_channels_last_are_refused(strategy):
    from backends.jax import initial_weights, train_steps
    from backends.jax.strategies import check_supported
    from common.config import RunConfig
    from common.loop import Unsupported
    with pytest.raises(Unsupported, match="TF32 is a mode of NVIDIA tensor cores; there is none on the CPU"):
        train_steps(strategy, "lenet", 1, initial_weights("lenet", 0), [batch(4)], 0.1, precision="tf32")
    with pytest.raises(Unsupported, match="memory layouts"):
        check_supported(RunConfig(backend="jax", strategy=strategy, devices=2, channels_last=True))
    check_supported(RunConfig(backend="jax", strategy=strategy, devices=2, compile=True, resident_data=True,
                              precision="bf16"))


def test_environment_records_the_effective_levers():
    import jax
    from backends.jax import environment
    from backends.jax.environment import configure_precision
    from common.config import RunConfig

    def cfg(**levers):
        return RunConfig(backend="jax", strategy="pmap", devices=2, **levers)

    plain = environment(cfg())
    assert plain["precision"] == {"dtype": "float32", "param_dtype": "float32",
                                  "jax_default_matmul_precision": "highest", "tf32_matmul": False,
                                  "tf32_cudnn": False}
    assert plain["levers"]["compile"] is False and plain["levers"]["resident_data"] is False
    env = environment(cfg(precision="bf16", compile=True, resident_data=True))
    assert env["precision"]["dtype"] == "bfloat16" and env["precision"]["param_dtype"] == "float32"
    assert env["levers"]["precision"] == "bf16" and env["levers"]["resident_data"] is True
    assert env["levers"]["compile"] is True and "inherent" in env["levers"]["compile_effect"]
    tf32 = environment(cfg(precision="tf32"))["precision"]
    assert tf32["jax_default_matmul_precision"] == "tensorfloat32" and tf32["tf32_matmul"] is True
    try:
        configure_precision(cfg(precision="tf32"))
        assert jax.config.jax_default_matmul_precision == "tensorfloat32"
    finally:
        configure_precision(cfg())
    assert jax.config.jax_default_matmul_precision == "highest"


# ------------------------------------------------------------- forward pass against numpy

def conv_nchw(x, w, b, stride=1, padding=0):
    """Cross-correlation as torch's Conv2d defines it, in float64 numpy."""
    x = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out + b[None, :, None, None]


def avg_pool2(x):
    n, c, h, w = x.shape
    return x[:, :, :h // 2 * 2, :w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))


def relu(x):
    return np.maximum(x, 0)


def batchnorm_eval(x, w, name):
    scale = w[f"{name}.weight"] / np.sqrt(w[f"{name}.running_var"] + 1e-5)
    return (x - w[f"{name}.running_mean"][None, :, None, None]) * scale[None, :, None, None] + \
        w[f"{name}.bias"][None, :, None, None]


def lenet_numpy(w, x):
    x = avg_pool2(relu(conv_nchw(x, w["conv1.weight"], w["conv1.bias"])))
    x = avg_pool2(relu(conv_nchw(x, w["conv2.weight"], w["conv2.bias"])))
    x = relu(x.reshape(len(x), -1) @ w["fc1.weight"].T + w["fc1.bias"])
    return x @ w["fc2.weight"].T + w["fc2.bias"]


def resnet18_numpy(w, x):
    def conv(name, x, stride=1, padding=1):
        return conv_nchw(x, w[f"{name}.weight"], w[f"{name}.bias"], stride, padding)

    def residual(p, x, stride, shortcut_conv):
        y = relu(batchnorm_eval(conv(f"{p}.conv1", x, stride), w, f"{p}.bn1"))
        y = batchnorm_eval(conv(f"{p}.conv2", y), w, f"{p}.bn2")
        return relu(y + (conv(f"{p}.conv3", x, stride, 0) if shortcut_conv else x))

    x = relu(batchnorm_eval(conv("conv", x), w, "bn"))
    for s in range(1, 5):
        x = residual(f"stage{s}.0", x, 1 if s == 1 else 2, s > 1)
        x = residual(f"stage{s}.1", x, 1, False)
    return x.mean(axis=(2, 3)) @ w["fc.weight"].T + w["fc.bias"]


def perturbed(weights, seed=1):
    """Canonical weights with nonzero biases and BatchNorm statistics, so that every term counts."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, v in weights.items():
        if name.endswith("running_var"):
            v = rng.uniform(0.5, 2.0, v.shape)
        elif name.endswith(("bias", "running_mean")) or ".bn" in name or name.startswith("bn."):
            v = v + rng.normal(0, 0.1, v.shape)
        else:   # conv and dense weights: unit-variance scale (d2l's 0.01 leaves deep activations tiny)
            v = v * (np.sqrt(1.0 / np.prod(v.shape[1:])) / 0.01)
        out[name] = v.astype(np.float32)
    return out


@pytest.mark.parametrize("model,reference", [("lenet", lenet_numpy), ("resnet18", resnet18_numpy)])
def test_forward_pass_matches_a_numpy_reference(model, reference):
    """Eval-mode logits on canonical weights (OIHW, (out, in), NCHW flatten order) equal a float64
    numpy implementation of the torch definitions, to 1e-4 relative."""
    from backends.jax import initial_weights, predict
    w = perturbed(initial_weights(model, 0))
    x, _ = batch(3)
    expected = reference({k: v.astype(np.float64) for k, v in w.items()}, x.astype(np.float64))
    got = predict(model, w, x)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


# ------------------------------------------------------------------------- the worker

def run_worker(tmp_path, **overrides) -> tuple[int, dict]:
    return run_backend_worker(tmp_path, **{"strategy": "pmap", **overrides})


@pytest.mark.parametrize("name", ["pmap", "sharding"])
def test_worker_trains_and_writes_a_complete_result(tmp_path, name):
    rc, r = run_worker(tmp_path, strategy=name, timed_steps=5)
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["schema_version"] == 1 and r["params"] == 129_068
    assert [e["epoch"] for e in r["epochs"]] == [1, 2]
    assert all(e["steps"] == 4 and e["images"] == 64 for e in r["epochs"])
    assert r["epochs"][1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert all(0.0 <= e["test_acc"] <= 1.0 for e in r["epochs"])
    env = r["environment"]
    assert env["framework"] == "jax" and len(env["devices"]) == 2 and env["processes"] == 1
    assert env["precision"]["jax_default_matmul_precision"] == "highest"
    assert len(r["weights_hash"]) == 64 and len(r["data_hash"]) == 64
    assert r["compile_s"] > 0
    assert r["step_time"]["steps"] == 5
    assert r["allreduce"]["values"] == r["params"] and r["allreduce"]["bytes"] == 4 * r["params"]
    assert r["allreduce"]["repeats"] == 10 and r["allreduce"]["median_s"] > 0


def test_worker_runs_with_the_levers(tmp_path):
    """bf16, --compile and --resident-data together, end to end: it trains, records the levers, and has
    step and allreduce figures; --channels-last and tf32 on the CPU are reported unavailable."""
    rc, r = run_worker(tmp_path, strategy="sharding", precision="bf16", compile=True, resident_data=True,
                       timed_steps=3)
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["epochs"][1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert r["environment"]["precision"]["dtype"] == "bfloat16"
    assert r["environment"]["levers"] == {**r["environment"]["levers"], "precision": "bf16", "compile": True,
                                          "resident_data": True, "channels_last": False}
    assert r["step_time"]["steps"] == 3 and r["allreduce"]["values"] == 129_068
    for lever, reason in (({"channels_last": True}, "memory layouts"), ({"precision": "tf32"}, "TF32")):
        rc, r = run_worker(tmp_path, **lever)
        assert rc == 1 and r["status"] == "unavailable" and reason in r["error"]


def test_worker_saves_weights_that_a_later_run_loads_and_evaluates(tmp_path):
    """--save-weights writes the trained canonical weights; --load-weights with 0 epochs starts from that
    file (its fingerprint is the run's weights hash) and evaluates them to the same test accuracy."""
    saved = str(tmp_path / "trained.npz")
    rc, trained = run_worker(tmp_path, bn="sync", save_weights=saved)
    assert rc == 0 and trained["status"] == "ok", trained["error"]
    assert trained["environment"]["batchnorm"].startswith("sync")
    rc, loaded = run_worker(tmp_path, epochs=0, load_weights=saved)
    assert rc == 0 and loaded["status"] == "ok", loaded["error"]
    assert loaded["environment"]["batchnorm"].startswith("local")
    assert loaded["weights_hash"] == trained["saved_weights"]["sha256"] != trained["weights_hash"]
    assert loaded["epochs"] == [] and loaded["final_test_acc"] == trained["final_test_acc"]


def test_worker_reports_more_devices_than_jax_sees_as_unavailable(tmp_path):
    rc, r = run_worker(tmp_path, devices=32, batch_size=32, train_size=64)
    assert rc == 1 and r["status"] == "unavailable"
    assert "32 cpu devices requested" in r["error"]


def test_worker_reports_divergence(tmp_path):
    rc, r = run_worker(tmp_path, lr=1e30, epochs=1)
    assert rc == 1 and r["status"] == "diverged"
    assert "training loss became" in r["error"]
