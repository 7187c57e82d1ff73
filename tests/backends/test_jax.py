"""JAX-only behaviour: pmap and sharding agree (steps and gradients), the fused step is reduce_gradients()
then update(), per-device and synchronised BatchNorm, BatchNorm's running statistics (torch's convention),
refusal of uneven batches, the forward pass against a numpy reference, the timed allreduce, staged
(--resident-data) batches, float64 runs, the precision and other levers, and the worker end to end
(including --bn sync, the levers and a save / load round trip of the weights).

Identities are proven in float64 (numerics.IDENTICAL); the one float32-only claim, bf16, is judged
against the float32 rounding measured in the same test."""

from __future__ import annotations

import numpy as np
import pytest

from common.backend import Probe
from tests.backends.conftest import NAME, run_backend_worker
from tests.backends.numerics import IDENTICAL, float32_tolerance, max_abs_diff, relative

pytestmark = pytest.mark.skipif(NAME != "jax", reason="jax backend only")
DIFFERENT = 1e6 * IDENTICAL  # a float64 difference this large is other math, not rounding


def batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def float64():
    """jax_enable_x64 for the `with` block, as the equivalence API sets it for a float64 call."""
    from backends.jax.strategies import computing_in

    return computing_in("float64")


def trainer(strategy, model, k, batch_size, lr=0.1, bn="local", precision="fp32", dtype="float64"):
    """A reset trainer; a float64 one is used inside `with float64():`."""
    from backends.jax import initial_weights
    from backends.jax.environment import configure_precision
    from backends.jax.strategies import TRAINERS
    from common.config import RunConfig

    cfg = RunConfig(
        backend="jax",
        strategy=strategy,
        devices=k,
        model=model,
        batch_size=batch_size,
        lr=lr,
        bn=bn,
        precision=precision,
    ).validate()
    configure_precision(cfg)
    t = TRAINERS[strategy](cfg, initial_weights(model, 0), dtype=dtype)
    t.reset()
    return t


def on_each_device(t, stats, *path):
    """One BatchNorm statistic of trainer `t`, as numpy, per device."""
    from backends.jax.parallel import per_device

    for key in path:
        stats = stats[key]
    return [np.asarray(a) for a in per_device(stats, t.devs)]


def test_batchnorm_uses_each_devices_own_shard_then_averages(strategy):
    """After one 2-device step, device i's running statistics are those of a 1-device step on shard i
    (not of the global batch); before evaluation they become the mean of the two. float64."""
    x, y = batch(8)
    with float64():
        two = trainer(strategy, "resnet18", 2, 8)
        two.step(x, y)
        alone = []
        for i in range(2):
            one = trainer(strategy, "resnet18", 1, 4)
            one.step(x[4 * i : 4 * (i + 1)], y[4 * i : 4 * (i + 1)])
            alone.append(
                {s: on_each_device(one, one.state[1], "bn", s)[0] for s in ("mean", "var")}
            )
        global_batch = trainer(strategy, "resnet18", 1, 8)
        global_batch.step(x, y)
        for s in ("mean", "var"):
            on_devices = on_each_device(two, two.state[1], "bn", s)
            for i in range(2):
                assert relative({s: on_devices[i]}, {s: alone[i][s]}) <= IDENTICAL, (s, i)
        whole = on_each_device(global_batch, global_batch.state[1], "bn", "mean")[0]
        assert (
            relative({"m": on_each_device(two, two.state[1], "bn", "mean")[0]}, {"m": whole})
            > DIFFERENT
        )

        two.average_bn_statistics()
        for s in ("mean", "var"):
            for averaged in on_each_device(two, two.state[1], "bn", s):
                assert relative({s: averaged}, {s: (alone[0][s] + alone[1][s]) / 2}) <= IDENTICAL, s


def test_canonical_weights_average_the_running_statistics_and_leave_the_devices_alone(strategy):
    x, y = batch(8)
    with float64():
        two = trainer(strategy, "resnet18", 2, 8)
        two.step(x, y)
        means = on_each_device(two, two.state[1], "bn", "mean")
        assert (
            relative({"m": means[0]}, {"m": means[1]}) > DIFFERENT
        )  # local BatchNorm: the devices differ
        averaged = {"m": two.canonical()["bn.running_mean"]}
        assert averaged["m"].dtype == np.float64
        assert relative(averaged, {"m": (means[0] + means[1]) / 2}) <= IDENTICAL
        assert np.array_equal(on_each_device(two, two.state[1], "bn", "mean")[1], means[1])


def test_train_mode_forward_gives_the_loss_that_gradients_reports(strategy):
    """The mean cross-entropy of predict(train=True) logits is the loss of the strategy's gradient step
    (float64)."""
    from backends.jax import gradients, initial_weights, predict

    w = initial_weights("resnet18", 0)
    x, y = batch(8)
    logits = predict("resnet18", w, x, train=True, dtype="float64")
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = -np.mean(log_softmax[np.arange(len(y)), y])
    loss, _ = gradients(Probe(strategy, "resnet18", 1, dtype="float64"), w, x, y)
    assert abs(loss - expected) <= IDENTICAL * expected


def test_reduce_gradients_then_update_is_the_fused_step(strategy):
    """step() fuses reduce_gradients() and update() into one compiled call: two ResNet-18 steps of 8
    examples on 2 devices (float64) give the same handles, weights, per-device running statistics and
    optimizer state either way; canonical_gradients() reads the kept gradients. Two compiled programs may
    order their sums differently on another CPU, so "the same" is float64's IDENTICAL, not bit for bit."""
    import jax

    batches = [batch(8, seed=s) for s in range(2)]
    with float64():
        fused, halves = trainer(strategy, "resnet18", 2, 8), trainer(strategy, "resnet18", 2, 8)
        for x, y in batches:
            fused_loss, fused_correct = fused.collect([fused.step(x, y)])
            halves_loss, halves_correct = halves.collect([halves.reduce_gradients(x, y)])
            assert set(halves.canonical_gradients()) < set(halves.canonical())
            halves.update()
            assert (
                abs(halves_loss - fused_loss) <= IDENTICAL * abs(fused_loss)
                and halves_correct == fused_correct
            )
        with pytest.raises(RuntimeError, match="reduce_gradients"):
            halves.update()  # its gradients are applied already
        fused.sync()
        halves.sync()
        assert max_abs_diff(fused.canonical(), fused.weights) > 1e-3
        assert relative(halves.canonical(), fused.canonical()) <= IDENTICAL
        leaves = [
            (np.asarray(a), np.asarray(b))
            for a, b in zip(
                jax.tree.leaves(halves.state), jax.tree.leaves(fused.state), strict=True
            )
        ]
        assert all(a.dtype == np.float64 for a, _ in leaves)
        assert (
            relative(
                {i: a for i, (a, _) in enumerate(leaves)}, {i: b for i, (_, b) in enumerate(leaves)}
            )
            <= IDENTICAL
        )


def test_the_train_step_refuses_a_batch_the_devices_cannot_split(strategy):
    t = trainer(strategy, "lenet", 2, 8, dtype="float32")
    with pytest.raises(
        ValueError, match="batch of 7 examples cannot be split evenly across 2 devices"
    ):
        t.step(*batch(7))


# ------------------------------------------------------------- BatchNorm's running statistics


def batchnorm_step(x: np.ndarray, k: int, bn: str, dtype=None, param_dtype=None):
    """models.BatchNorm in training mode on NHWC `x` split over k devices in a pmap (running mean 0,
    variance 1, scale 1, bias 0): (output, running mean, running variance) per device, as numpy."""
    import jax
    import jax.numpy as jnp

    from backends.jax.batchnorm import BatchNorm
    from backends.jax.parallel import AXIS, devices

    param_dtype = param_dtype or x.dtype
    bn_module = BatchNorm(
        use_running_average=False,
        axis_name=AXIS if bn == "sync" else None,
        dtype=dtype,
        param_dtype=param_dtype,
    )
    c = x.shape[-1]
    variables = {
        "params": {"scale": jnp.ones(c, param_dtype), "bias": jnp.zeros(c, param_dtype)},
        "batch_stats": {"mean": jnp.zeros(c, param_dtype), "var": jnp.ones(c, param_dtype)},
    }

    def device(x):
        y, updates = bn_module.apply(variables, x, mutable=["batch_stats"])
        return y, updates["batch_stats"]["mean"], updates["batch_stats"]["var"]

    run = jax.pmap(device, axis_name=AXIS, devices=devices(k))
    return tuple(np.asarray(a) for a in run(jnp.asarray(x).reshape(k, -1, *x.shape[1:])))


@pytest.mark.parametrize("k,bn", [(1, "local"), (2, "local"), (2, "sync")])
def test_batchnorm_running_variance_is_unbiased_and_normalisation_biased(k, bn):
    """torch's convention, in float64 against numpy on a tiny NHWC input: running mean <- 0.9 mean + 0.1
    batch mean, running variance <- 0.9 var + 0.1 * the UNBIASED batch variance over the values each
    device normalised (its shard; with sync the global batch), while the output is normalised with the
    biased one. flax's own update (biased) is far outside the tolerance."""
    x = np.random.default_rng(0).normal(2.0, 3.0, (4, 3, 2, 5))
    with float64():
        out, mean, var = batchnorm_step(x, k, bn)
    shards = np.split(x, 1 if bn == "sync" else k)
    for i in range(k):
        part = shards[0 if bn == "sync" else i]
        batch_mean, biased, unbiased = (
            part.mean(axis=(0, 1, 2)),
            part.var(axis=(0, 1, 2)),
            part.var(axis=(0, 1, 2), ddof=1),
        )
        assert relative({"m": mean[i]}, {"m": 0.1 * batch_mean}) <= IDENTICAL
        assert relative({"v": var[i]}, {"v": 0.9 + 0.1 * unbiased}) <= IDENTICAL
        assert relative({"v": 0.9 + 0.1 * biased}, {"v": 0.9 + 0.1 * unbiased}) > DIFFERENT
        expected = (np.split(x, k)[i] - batch_mean) / np.sqrt(biased + 1e-5)
        assert relative({"y": out[i]}, {"y": expected}) <= IDENTICAL


def test_batchnorm_is_flaxs_but_for_the_running_variance():
    """float64: the same variable names as flax's nn.BatchNorm, the same output and running mean, and the
    running variance's batch term scaled by n / (n - 1)."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from backends.jax.batchnorm import BN_EPS, BatchNorm

    x = np.random.default_rng(1).normal(0.5, 2.0, (3, 4, 4, 6))
    n = 3 * 4 * 4
    with float64():
        ours = BatchNorm(use_running_average=False, param_dtype=jnp.float64)
        flax_bn = nn.BatchNorm(
            use_running_average=False,
            momentum=0.9,
            epsilon=BN_EPS,
            use_fast_variance=False,
            param_dtype=jnp.float64,
        )
        variables = ours.init(jax.random.key(0), x)
        assert jax.tree.map(np.shape, variables) == jax.tree.map(
            np.shape, flax_bn.init(jax.random.key(0), x)
        )
        y_ours, s_ours = ours.apply(variables, x, mutable=["batch_stats"])
        y_flax, s_flax = flax_bn.apply(variables, x, mutable=["batch_stats"])
    assert relative({"y": y_ours}, {"y": y_flax}) <= IDENTICAL
    assert (
        relative({"m": s_ours["batch_stats"]["mean"]}, {"m": s_flax["batch_stats"]["mean"]})
        <= IDENTICAL
    )
    batch_term_ours, batch_term_flax = (
        np.asarray(s["batch_stats"]["var"]) - 0.9 for s in (s_ours, s_flax)
    )
    assert relative({"v": batch_term_ours}, {"v": batch_term_flax * n / (n - 1)}) <= IDENTICAL


def test_batchnorm_reduces_the_activations_no_more_often_than_flax():
    """The unbiased running variance costs no pass over the activations: as many reductions (and, with an
    axis name, as many pmean's) as flax's two-pass BatchNorm makes."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from backends.jax.batchnorm import BN_EPS, BatchNorm
    from backends.jax.parallel import AXIS, devices

    def primitives(module):
        x = jnp.ones((2, 4, 8, 8, 16))
        variables = module.init(jax.random.key(0), x[0])
        step = jax.pmap(
            lambda x: module.apply(variables, x, mutable=["batch_stats"]),
            axis_name=AXIS,
            devices=devices(2),
        )
        names = []

        def walk(jaxpr):
            for eqn in jaxpr.eqns:
                names.append(eqn.primitive.name)
                for value in eqn.params.values():
                    if hasattr(value, "eqns"):
                        walk(value)
                    elif hasattr(value, "jaxpr"):
                        walk(value.jaxpr)

        walk(jax.make_jaxpr(step)(x).jaxpr)
        return {name: names.count(name) for name in ("reduce_sum", "psum", "pmean")}

    for axis in (None, AXIS):
        ours = primitives(BatchNorm(use_running_average=False, axis_name=axis))
        flax_bn = primitives(
            nn.BatchNorm(
                use_running_average=False,
                momentum=0.9,
                epsilon=BN_EPS,
                use_fast_variance=False,
                axis_name=axis,
            )
        )
        assert ours == flax_bn and ours["reduce_sum"] == 2, (axis, ours, flax_bn)


@pytest.mark.rounding
def test_bf16_batchnorm_keeps_its_statistics_in_float32():
    """bfloat16 activations: the statistics are reduced in float32 (as flax does), so they are as close to
    float64 as the float32 statistics of the same values, and the output stays bfloat16."""
    import jax.numpy as jnp

    x = np.random.default_rng(2).normal(1.0, 2.0, (4, 5, 5, 8)).astype(jnp.bfloat16)
    values = x.astype(np.float32)  # what the bfloat16 input holds, exactly
    out_bf16, mean_bf16, var_bf16 = batchnorm_step(
        x, 1, "local", dtype=jnp.bfloat16, param_dtype=jnp.float32
    )
    _, mean_32, var_32 = batchnorm_step(values, 1, "local")
    with float64():
        _, mean_64, var_64 = batchnorm_step(values.astype(np.float64), 1, "local")
    assert out_bf16.dtype == jnp.bfloat16 and mean_bf16.dtype == var_bf16.dtype == np.float32
    stats_bf16, stats_32, stats_64 = (
        {"mean": m, "var": v}
        for m, v in ((mean_bf16, var_bf16), (mean_32, var_32), (mean_64, var_64))
    )
    assert max_abs_diff(stats_bf16, stats_64) <= float32_tolerance((stats_32, stats_64))


# ------------------------------------------------------------- allreduce, staged batches, levers


def test_allreduce_seconds_times_a_psum_that_really_sums(strategy):
    """`repeats` positive seconds; the collective it times leaves the sum over the 3 devices on each."""
    t = trainer(strategy, "lenet", 3, 6, dtype="float32")
    seconds = t.allreduce_seconds(1000, 4)
    assert len(seconds) == 4 and all(isinstance(s, float) and s > 0 for s in seconds)
    buffer = t._allreduce_buffer(1000)  # device i holds i + 1 in every element (as allreduce_op's)
    rows = {s.device: np.asarray(s.data) for s in buffer.addressable_shards}
    assert [float(rows[d].ravel()[0]) for d in t.devs] == [1.0, 2.0, 3.0]
    summed = t.allreduce_op(1000)()  # the call allreduce_seconds times
    shards = summed.addressable_shards
    assert {s.device for s in shards} == set(t.devs)
    for s in shards:
        a = np.asarray(s.data)
        assert a.dtype == np.float32 and a.size == 1000 and np.all(a == 6.0)


def test_a_staged_batch_gives_the_numpy_step_without_a_copy(strategy):
    """Batches from `stage` (--resident-data) take the numpy batches' steps (float64), with no host-to-device
    transfer in the step; a numpy batch afterwards is still copied and accepted."""
    import jax

    batches = [batch(8, seed=s) for s in range(2)]
    with float64():
        plain = trainer(strategy, "lenet", 2, 8, lr=0.5)
        plain_metrics = [plain.step(x, y) for x, y in batches]
        staged = trainer(strategy, "lenet", 2, 8, lr=0.5)
        on_devices = staged.stage(batches)
        assert all(isinstance(a, jax.Array) for pair in on_devices for a in pair)
        with jax.transfer_guard("disallow_explicit"):  # a numpy batch would need a device_put here
            staged_metrics = [staged.step(x, y) for x, y in on_devices]
            staged.sync()
        assert relative(staged.canonical(), plain.canonical()) <= IDENTICAL
        assert max_abs_diff(plain.canonical(), plain.weights) > 1e-3
        assert staged.collect(staged_metrics) == plain.collect(plain_metrics)
        with pytest.raises(Exception, match="Disallowed host-to-device transfer"):
            with jax.transfer_guard("disallow_explicit"):
                staged.step(*batches[0])
        staged.step(*batches[0])
        plain.step(*batches[0])
        assert relative(staged.canonical(), plain.canonical()) <= IDENTICAL


def update_distance(start: dict, a: dict, b: dict) -> float:
    """|update a - update b| / |update b| (L2 over every weight)."""
    diff = sum(
        float(np.sum(((a[k] - start[k]) - (b[k] - start[k])).astype(np.float64) ** 2))
        for k in start
    )
    norm = sum(float(np.sum((b[k] - start[k]).astype(np.float64) ** 2)) for k in start)
    return float(np.sqrt(diff / norm))


BF16_EPSILON = 2.0**-7  # bfloat16's spacing at 1 (8 significant bits; float32's is 2 ** -23)


@pytest.mark.rounding
def test_bf16_step_is_close_to_the_fp32_step_but_not_the_same(strategy):
    """--precision bf16: LeNet's 2-device step computes in bfloat16, while the parameters and optimizer
    state stay float32. Not the same step: it is further from the float64 step than float32 rounding
    (measured here) can take a step. Close: its update is within a few bfloat16 roundings of the exact
    (float64) one, where other math would be off by the update's own size."""
    import jax

    from backends.jax import initial_weights, train_steps

    w = initial_weights("lenet", 0)
    batches = [batch(8)]
    fp64 = train_steps(Probe(strategy, "lenet", 2, dtype="float64"), w, batches, 0.5)
    fp32 = train_steps(Probe(strategy, "lenet", 2), w, batches, 0.5)
    bf16 = train_steps(Probe(strategy, "lenet", 2, levers={"precision": "bf16"}), w, batches, 0.5)
    assert max_abs_diff(fp32, w) > 1e-3
    assert max_abs_diff(bf16, fp64) > 100 * float32_tolerance((fp32, fp64))
    assert update_distance(w, bf16, fp64) <= 4 * BF16_EPSILON
    t = trainer(strategy, "lenet", 2, 8, precision="bf16", dtype="float32")
    loss, correct = t.step(*batches[0])
    assert {a.dtype for a in jax.tree.leaves(t.state)} == {np.dtype(np.float32)}
    assert np.asarray(loss).dtype == np.float32


def test_bf16_resnet_keeps_parameters_and_batchnorm_statistics_float32():
    """Only the compute dtype changes: every parameter and running statistic is declared float32."""
    import jax
    import jax.numpy as jnp

    from backends.jax.models import build, native_shapes

    shapes = native_shapes(build("resnet18", dtype=jnp.bfloat16))
    assert shapes["batch_stats"] and {s.dtype for s in jax.tree.leaves(shapes)} == {
        np.dtype(np.float32)
    }


def test_tf32_on_the_cpu_and_channels_last_are_refused(strategy):
    from backends.jax import check_supported, initial_weights, train_steps
    from common.config import RunConfig
    from common.errors import Unsupported

    with pytest.raises(
        Unsupported, match="TF32 is a mode of NVIDIA tensor cores; there is none on the CPU"
    ):
        train_steps(
            Probe(strategy, "lenet", 1, levers={"precision": "tf32"}),
            initial_weights("lenet", 0),
            [batch(4)],
            0.1,
        )
    with pytest.raises(Unsupported, match="memory layouts"):
        check_supported(RunConfig(backend="jax", strategy=strategy, devices=2, channels_last=True))
    check_supported(
        RunConfig(
            backend="jax",
            strategy=strategy,
            devices=2,
            compile=True,
            resident_data=True,
            precision="bf16",
        )
    )


def test_float64_refuses_the_levers_and_unknown_dtypes_and_restores_float32(strategy):
    """dtype="float64" is the plain path only: a lever that changes the float32 computation is refused with
    the reason (--resident-data, which only moves batches, runs); an unknown dtype is a ValueError;
    jax_enable_x64 is off again after a float64 call, one that failed included."""
    import jax

    from backends.jax import gradients, initial_weights
    from common.errors import Unsupported

    w = initial_weights("lenet", 0)
    x, y = batch(4)
    assert not jax.config.jax_enable_x64
    for lever, value in (("precision", "bf16"), ("compile", True)):
        with pytest.raises(Unsupported, match="dtype float64 runs the plain step only"):
            gradients(Probe(strategy, "lenet", 1, dtype="float64", levers={lever: value}), w, x, y)
        assert not jax.config.jax_enable_x64
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        gradients(Probe(strategy, "lenet", 1, dtype="float16"), w, x, y)
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    loss, grads = gradients(Probe(strategy, "lenet", 1, dtype="float64"), w64, x, y)
    assert isinstance(loss, float) and {g.dtype for g in grads.values()} == {np.dtype(np.float64)}
    assert not jax.config.jax_enable_x64


def test_environment_records_the_effective_levers():
    import jax

    from backends.jax import environment
    from backends.jax.environment import configure_precision
    from common.config import RunConfig

    def cfg(**levers):
        return RunConfig(backend="jax", strategy="pmap", devices=2, **levers)

    plain = environment(cfg())
    assert plain["precision"] == {
        "mode": "fp32",
        "dtype": "float32",
        "param_dtype": "float32",
        "jax_default_matmul_precision": "highest",
        "tf32_matmul": False,
        "tf32_cudnn": False,
    }
    assert plain["levers"]["compile"] is False and plain["levers"]["resident_data"] is False
    assert plain["compile"] is None and set(plain["libraries"]) == {"flax", "optax"}
    env = environment(cfg(precision="bf16", compile=True, resident_data=True))
    assert env["precision"]["dtype"] == "bfloat16" and env["precision"]["param_dtype"] == "float32"
    assert env["levers"]["precision"] == "bf16" and env["levers"]["resident_data"] is True
    assert env["levers"]["compile"] is True and "inherent" in env["compile"]
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
            patch = x[:, :, i : i + stride * oh : stride, j : j + stride * ow : stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j])
    return out + b[None, :, None, None]


def avg_pool2(x):
    n, c, h, w = x.shape
    return x[:, :, : h // 2 * 2, : w // 2 * 2].reshape(n, c, h // 2, 2, w // 2, 2).mean(axis=(3, 5))


def relu(x):
    return np.maximum(x, 0)


def batchnorm_eval(x, w, name):
    factor = w[f"{name}.weight"] / np.sqrt(w[f"{name}.running_var"] + 1e-5)
    return (x - w[f"{name}.running_mean"][None, :, None, None]) * factor[None, :, None, None] + w[
        f"{name}.bias"
    ][None, :, None, None]


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
        else:  # conv and dense weights: unit-variance scale (d2l's 0.01 leaves deep activations tiny)
            v = v * (np.sqrt(1.0 / np.prod(v.shape[1:])) / 0.01)
        out[name] = v.astype(np.float32)
    return out


@pytest.mark.parametrize("model,reference", [("lenet", lenet_numpy), ("resnet18", resnet18_numpy)])
def test_forward_pass_matches_a_numpy_reference(model, reference):
    """Eval-mode logits on canonical weights (OIHW, (out, in), NCHW flatten order) equal a numpy
    implementation of the torch definitions, both in float64."""
    from backends.jax import initial_weights, predict

    w = perturbed(initial_weights(model, 0))
    x, _ = batch(3)
    expected = reference({k: v.astype(np.float64) for k, v in w.items()}, x.astype(np.float64))
    got = predict(model, w, x, dtype="float64")
    assert got.dtype == np.float64
    assert relative({"logits": got}, {"logits": expected}) <= IDENTICAL


# ------------------------------------------------------------------------- the worker


def run_worker(tmp_path, **overrides) -> tuple[int, dict]:
    return run_backend_worker(tmp_path, **{"strategy": "pmap", **overrides})


@pytest.mark.parametrize("name", ["pmap", "sharding"])
def test_worker_trains_and_writes_a_complete_result(tmp_path, name):
    rc, r = run_worker(tmp_path, strategy=name, timed_steps=5)
    assert rc == 0 and r["status"] == "ok", r["error"]
    from common.results import SCHEMA_VERSION

    assert r["schema_version"] == SCHEMA_VERSION and r["params"] == 129_068
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
    rc, r = run_worker(
        tmp_path,
        strategy="sharding",
        precision="bf16",
        compile=True,
        resident_data=True,
        timed_steps=3,
    )
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["epochs"][1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert r["environment"]["precision"]["dtype"] == "bfloat16"
    assert r["environment"]["levers"] == {
        **r["environment"]["levers"],
        "precision": "bf16",
        "compile": True,
        "resident_data": True,
        "channels_last": False,
    }
    assert r["step_time"]["steps"] == 3 and r["allreduce"]["values"] == 129_068
    for lever, reason in (
        ({"channels_last": True}, "memory layouts"),
        ({"precision": "tf32"}, "TF32"),
    ):
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
    assert "32 CPU devices requested" in r["error"]


def test_worker_reports_divergence(tmp_path):
    rc, r = run_worker(tmp_path, lr=1e30, epochs=1)
    assert rc == 1 and r["status"] == "diverged"
    assert "training loss became" in r["error"]


# ------------------------------------------------------------------ prefetch, donation, predict on the CPU


def traces_with(strategy, **levers):
    from backends.jax import initial_weights, train_trace

    start = initial_weights("lenet", 0)
    batches = [batch(8, seed=s) for s in range(3)]
    return start, train_trace(
        Probe(strategy, "lenet", 2, dtype="float64", levers=levers), start, batches, 0.5
    )


def bitwise_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_prefetched_batches_take_the_same_steps_bit_for_bit(strategy):
    """--prefetch puts each batch on the devices ahead of its step (trainer.put); the steps are the ones a
    numpy batch takes, to the last bit (float64)."""
    start, plain = traces_with(strategy, prefetch=0)
    _, ahead = traces_with(strategy, prefetch=2)
    _, resident = traces_with(
        strategy, resident_data=True
    )  # staged before the steps, in float64 too
    assert max_abs_diff(plain["final"], start) > 1e-3
    assert bitwise_equal(ahead["final"], plain["final"]) and ahead["losses"] == plain["losses"]
    assert (
        bitwise_equal(resident["final"], plain["final"]) and resident["losses"] == plain["losses"]
    )


def test_donated_state_gives_the_same_steps_bit_for_bit_and_leaves_the_weights_alone(
    strategy, monkeypatch
):
    """The step donates (params, batch_stats, opt_state): the old buffers are consumed, the steps are those
    without donation to the last bit (float64), and the caller's weights are not written into."""
    import jax

    from backends.jax import programs

    start, donated = traces_with(strategy)
    kept = {k: v.copy() for k, v in start.items()}
    _, again = traces_with(strategy)
    monkeypatch.setattr(programs, "DONATED", ())
    _, undonated = traces_with(strategy)
    assert (
        bitwise_equal(donated["final"], undonated["final"])
        and donated["losses"] == undonated["losses"]
    )
    assert bitwise_equal(again["final"], donated["final"])
    monkeypatch.undo()
    t = trainer(strategy, "lenet", 2, 8, dtype="float32")
    old = t.state
    t.step(*batch(8))
    t.sync()
    assert all(a.is_deleted() for a in jax.tree.leaves(old))
    t.reset()  # from the numpy initial weights: still intact
    assert bitwise_equal(t.canonical(), kept)


def test_put_returns_the_batch_placed_as_the_step_takes_it(strategy):
    t = trainer(strategy, "lenet", 2, 8, dtype="float32")
    x, y = batch(8)
    placed = t.put(x, y)
    assert t._is_placed(*placed)
    assert np.array_equal(np.asarray(placed[0]).reshape(x.shape), x)


def test_predict_runs_on_the_cpu_at_full_float32_precision(monkeypatch):
    """Whatever the process's default (TF32 on a GPU host), predict's forward runs at "highest" matmul
    precision on a CPU device: its logits are compared with the other backends' CPU logits."""
    import jax

    import backends.jax as jax_backend
    from backends.jax import initial_weights, models

    seen = []
    real = models.forward  # (predict's network runs in models.py)

    def spy(net, variables, x, train):
        seen.append((jax.config.jax_default_matmul_precision, jax.config.jax_default_device))
        return real(net, variables, x, train)

    monkeypatch.setattr(models, "forward", spy)
    previous = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "tensorfloat32")
    try:
        jax_backend.predict("lenet", initial_weights("lenet", 0), batch(2)[0])
    finally:
        jax.config.update("jax_default_matmul_precision", previous)
    ((precision, device),) = seen
    assert precision == "highest" and device.platform == "cpu"
    lowered = jax.jit(
        lambda x: models.forward(
            models.build("lenet"),
            models.from_canonical(models.build("lenet"), initial_weights("lenet", 0)),
            x,
            False,
        )
    )
    with jax.default_matmul_precision(
        "highest"
    ):  # what that setting does to the convolutions it lowers
        assert "HIGHEST" in lowered.lower(batch(2)[0]).as_text()


# ------------------------------------------------------------------ GPU only (run where a GPU is present)


def gpu_count() -> int:
    if NAME != "jax":
        return 0
    import backends.jax  # noqa: F401  (first: it asks XLA for the simulated CPU devices before jax starts)
    from backends.jax.parallel import gpu_count as seen_by_jax

    return seen_by_jax()


needs_gpu = pytest.mark.skipif(gpu_count() == 0, reason="needs a GPU JAX can see")
GPUS = min(2, gpu_count())


@needs_gpu
def test_gpu_steps_in_float64_are_the_cpu_steps(strategy):
    from backends.jax import initial_weights, train_steps

    start = initial_weights("lenet", 0)
    batches = [batch(8, seed=s) for s in range(2)]
    on_gpu = train_steps(
        Probe(strategy, "lenet", GPUS, device_kind="gpu", dtype="float64"), start, batches, 0.5
    )
    on_cpu = train_steps(Probe(strategy, "lenet", GPUS, dtype="float64"), start, batches, 0.5)
    assert relative(on_gpu, on_cpu) <= IDENTICAL


@needs_gpu
def test_gpu_fp32_steps_run_at_full_precision(strategy):
    """fp32 on the GPU (jax_default_matmul_precision "highest") stays within 10x the CPU's float32 distance
    from the float64 step, measured here; XLA's default (TF32 on Ampere and later) is ~1000x."""
    from backends.jax import initial_weights, train_steps

    start = initial_weights("lenet", 0)
    batches = [batch(8, seed=s) for s in range(2)]
    exact = train_steps(Probe(strategy, "lenet", GPUS, dtype="float64"), start, batches, 0.5)
    cpu = train_steps(Probe(strategy, "lenet", GPUS), start, batches, 0.5)
    gpu = train_steps(Probe(strategy, "lenet", GPUS, device_kind="gpu"), start, batches, 0.5)
    assert max_abs_diff(gpu, exact) <= 10 * max_abs_diff(cpu, exact)


@needs_gpu
def test_gpu_worker_trains_with_prefetch(tmp_path):
    rc, r = run_worker(
        tmp_path, devices=GPUS, device_kind="gpu", simulated=False, timed_steps=3, epochs=1
    )
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert (
        r["environment"]["input_copies"]
        == "2 batches ahead of their step: jax.device_put to the GPUs, not waited for"
    )


# ------------------------------------------------------------------ Several nodes


def lenet_check_job(tmp_path, strategy) -> tuple[dict, dict, list]:
    """A check job (common/measurements.py) of `strategy` on LeNet, 2 devices, 3 batches of 8: (job, weights,
    batches)."""
    from backends.jax import initial_weights
    from tests.backends.nodes import write_check_inputs

    weights, batches = initial_weights("lenet", 0), [batch(8, seed=s) for s in range(3)]
    job = {
        "models": ["lenet"],
        "strategies": [strategy],
        "devices": [2],
        "bn": ["local"],
        "lr": 0.1,
        "device_kind": "cpu",
        "float64": False,
        **write_check_inputs(tmp_path, "lenet", weights, batches),
    }
    return job, weights, batches


def measured(arrays: dict, key: str) -> dict:
    """One configuration's measurements (loss, grad|, first|, final|, losses) by their name under `key`."""
    return {k[len(key) + 1 :]: v for k, v in arrays.items() if k.startswith(key + "|")}


def in_process(strategy, k, weights, batches, dtype) -> dict:
    """The same measurements in this process on k devices (k=1: one device with the whole batch)."""
    from backends.jax import gradients, train_trace

    loss, grads = gradients(Probe(strategy, "lenet", k, dtype=dtype), weights, *batches[0])
    trace = train_trace(Probe(strategy, "lenet", k, dtype=dtype), weights, batches, 0.1)
    return {
        "loss": np.float64(loss),
        "losses": np.asarray(trace["losses"], np.float64),
        **{f"grad|{n}": g for n, g in grads.items()},
        **{f"first|{n}": v for n, v in trace["first"].items()},
        **{f"final|{n}": v for n, v in trace["final"].items()},
    }


@pytest.mark.rounding
def test_two_nodes_of_one_device_are_one_process_of_two_devices_and_one_device(tmp_path, strategy):
    """2 loopback nodes x 1 device (jax.distributed) against 1 process x 2 devices and 1 device with the whole
    batch: the same loss, gradients, weights and losses in float64; every node the same values; float32
    within the float32-vs-float64 distance measured here."""
    job, weights, batches = lenet_check_job(tmp_path, strategy)
    nodes = measure_on_nodes_of(job, tmp_path)
    two_nodes = [measured(a, f"lenet|{strategy}:float64|2|local") for a in nodes]
    two_nodes32 = [measured(a, f"lenet|{strategy}|2|local") for a in nodes]
    assert (
        max_abs_diff(two_nodes[0], two_nodes[1]) == 0
        and max_abs_diff(two_nodes32[0], two_nodes32[1]) == 0
    )
    f64 = {k: in_process(strategy, k, weights, batches, "float64") for k in (1, 2)}
    for k in (1, 2):
        assert relative(two_nodes[0], f64[k]) < IDENTICAL, k
    f32 = in_process(strategy, 2, weights, batches, "float32")
    tolerance = float32_tolerance((two_nodes32[0], two_nodes[0]), (f32, f64[2]))
    assert max_abs_diff(two_nodes32[0], f32) <= tolerance


def measure_on_nodes_of(job, tmp_path):
    from tests.backends.nodes import measure_on_nodes

    return measure_on_nodes("jax", job, 2, tmp_path, timeout=240)


def node_config(tmp_path, rank, coordinator, **overrides) -> dict:
    return {
        "backend": "jax",
        "strategy": "pmap",
        "devices": 2,
        "model": "lenet",
        "epochs": 1,
        "batch_size": 16,
        "lr": 0.1,
        "train_size": 64,
        "test_size": 40,
        "eval_batch_size": 16,
        "dataset": "synthetic",
        "timed_steps": 2,
        "nodes": 2,
        "node_rank": rank,
        "coordinator": coordinator,
        **overrides,
    }


def test_a_node_that_cannot_reach_the_coordinator_fails_with_its_address(tmp_path):
    import json

    from tests.backends.nodes import finish, refused_port, start_nodes

    coordinator = f"127.0.0.1:{refused_port()}"
    job = node_config(tmp_path, 1, coordinator, timeout=6)  # (the wait for the coordinator)
    # start_nodes numbers its jobs from 0: node 1's config is written as node0.json
    ((code, text),) = finish(
        start_nodes("jax", "--config", [job], tmp_path, ".result.json"), timeout=6 + 60
    )
    assert code != 0, text[-2000:]
    result = json.loads((tmp_path / "node0.result.json").read_text())
    assert result["status"] == "failed"
    assert f"could not reach the jax.distributed coordinator at {coordinator}" in result["error"]


def test_a_strategy_without_an_engine_refuses_several_nodes(monkeypatch):
    """Every jax strategy has an engine (backend.toml); one without is refused before anything joins."""
    import dataclasses

    from backends.jax import TRAINERS, check_supported, distributed
    from common import manifest
    from common.config import RunConfig
    from common.errors import Unsupported

    real = manifest.load("jax")
    assert all(real.strategies[s].engine for s in TRAINERS)
    without = {
        **real.strategies,
        "sharding": dataclasses.replace(real.strategies["sharding"], engine=None),
    }
    monkeypatch.setattr(
        manifest, "load", lambda name: dataclasses.replace(real, strategies=without)
    )
    cfg = RunConfig(
        backend="jax",
        strategy="sharding",
        devices=2,
        model="lenet",
        batch_size=8,
        nodes=2,
        node_rank=1,
        coordinator="127.0.0.1:1",
    ).validate()
    with pytest.raises(
        Unsupported, match=r"--nodes 2 needs a strategy with a distributed engine \(jax: pmap\)"
    ):
        check_supported(cfg)
    assert distributed._joined is None


def test_a_training_worker_asks_xla_for_its_runs_devices():
    """XLA makes its simulated CPU devices when jax is imported; a step is slower with more than the run uses, so
    a worker the harness started for a run of 3 devices (common.worker.DEVICES_ENV) has 3, and one without it the
    most --gpus may ask for."""
    import subprocess
    import sys

    from common.config import MAX_SIMULATED_DEVICES
    from common.worker import DEVICES_ENV
    from harness.envs import worker_env

    def devices(**env) -> int:
        code = "import backends.jax, jax; print(jax.local_device_count())"
        env = worker_env(**env)
        env.pop("XLA_FLAGS", None)  # (a count of the caller's there would win)
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        return int(out.stdout.strip().splitlines()[-1])

    assert devices(**{DEVICES_ENV: "3"}) == 3
    assert devices(**{DEVICES_ENV: ""}) == MAX_SIMULATED_DEVICES
