"""JAX-only behaviour: per-device and synchronised BatchNorm, BatchNorm's running statistics (torch's convention,
against flax's), refusal of uneven batches, the forward pass against a numpy reference, the psum the allreduce
figure times, staged (--resident-data) batches without a copy in the step, the donated state, float64 runs and
jax_enable_x64, the precision jax computes in (bf16's float32 state and statistics, the matmul precision), the
worker with --bn sync and a save / load round trip of the weights, and the simulated devices XLA is asked for. What
every backend does, the levers' steps, records and refusals included, is proven in test_contract.py.

Identities are proven in float64 (numerics.IDENTICAL); a float32 or bf16 claim is judged against the float32
rounding measured in the same test."""

from __future__ import annotations

import numpy as np
import pytest

from common.backend import Probe
from common.levers import Levers
from tests.backends.conftest import NAME, run_backend_worker
from tests.backends.numerics import (
    FLOOR_FACTOR,
    IDENTICAL,
    RESNET18_SIDE,
    bitwise_equal,
    float32_tolerance,
    max_abs_diff,
    relative,
)

pytestmark = pytest.mark.skipif(NAME != "jax", reason="jax backend only")
DIFFERENT = 1e6 * IDENTICAL  # a float64 difference this large is other math, not rounding


def batch(n, seed=0, side=28):
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, side, side), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def float64():
    """jax_enable_x64 for the `with` block, as the equivalence API sets it for a float64 call."""
    from backends.jax.environment import computing_in

    return computing_in("float64")


def trainer(
    backend, strategy, model, k, batch_size, lr=0.1, bn="local", precision="fp32", dtype="float64"
):
    """A reset trainer; a float64 one is used inside `with float64():`."""
    cfg = Probe(strategy, model, k, bn=bn, levers=Levers(precision=precision)).config(
        "jax", batch_size, lr
    )
    return backend.make_trainer(cfg, backend.initial_weights(model, 0), dtype)


def on_each_device(t, stats, *path):
    """One BatchNorm statistic of trainer `t`, as numpy, per device."""
    from backends.jax.parallel import per_device

    for key in path:
        stats = stats[key]
    return [np.asarray(a) for a in per_device(stats, t.devs)]


@pytest.mark.replicated
def test_batchnorm_uses_each_devices_own_shard_then_averages(backend, strategy):
    """After one 2-device step, device i's running statistics are those of a 1-device step on shard i
    (not of the global batch); before evaluation they become the mean of the two. float64."""
    x, y = batch(8, side=RESNET18_SIDE)
    with float64():
        two = trainer(backend, strategy, "resnet18", 2, 8)
        two.step(x, y)
        alone = []
        for i in range(2):
            one = trainer(backend, strategy, "resnet18", 1, 4)
            one.step(x[4 * i : 4 * (i + 1)], y[4 * i : 4 * (i + 1)])
            alone.append(
                {s: on_each_device(one, one.state[1], "bn", s)[0] for s in ("mean", "var")}
            )
        global_batch = trainer(backend, strategy, "resnet18", 1, 8)
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


def test_canonical_weights_average_the_running_statistics_and_leave_the_devices_alone(
    backend, strategy
):
    x, y = batch(8, side=RESNET18_SIDE)
    with float64():
        two = trainer(backend, strategy, "resnet18", 2, 8)
        two.step(x, y)
        means = on_each_device(two, two.state[1], "bn", "mean")
        # local BatchNorm: the devices differ
        assert relative({"m": means[0]}, {"m": means[1]}) > DIFFERENT
        averaged = {"m": two.canonical()["bn.running_mean"]}
        assert averaged["m"].dtype == np.float64
        assert relative(averaged, {"m": (means[0] + means[1]) / 2}) <= IDENTICAL
        assert np.array_equal(on_each_device(two, two.state[1], "bn", "mean")[1], means[1])


@pytest.mark.replicated
def test_train_mode_forward_gives_the_loss_that_gradients_reports(backend, strategy):
    """The mean cross-entropy of predict(train=True) logits is the loss of the strategy's gradient step
    (float64)."""
    w = backend.initial_weights("resnet18", 0)
    x, y = batch(8, side=RESNET18_SIDE)
    logits = backend.predict("resnet18", w, x, train=True, dtype="float64")
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = -np.mean(log_softmax[np.arange(len(y)), y])
    loss, _ = backend.gradients(Probe(strategy, "resnet18", 1, dtype="float64"), w, x, y)
    assert abs(loss - expected) <= IDENTICAL * expected


def test_the_train_step_refuses_a_batch_the_devices_cannot_split(backend, strategy):
    t = trainer(backend, strategy, "lenet", 2, 8, dtype="float32")
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
    """float64: the same variable names as flax's nn.BatchNorm (its default one-pass statistics), the same
    output and running mean, and the running variance's batch term scaled by n / (n - 1)."""
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
    """The unbiased running variance costs no pass over the activations: as many reductions as flax's
    default (one-pass) BatchNorm makes, two over the same activations (E[x] and E[x^2], none of x - E[x]),
    and with an axis name one collective for both moments, as flax's."""
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
                axis_name=axis,
            )
        )
        collectives = ours["psum"] + ours["pmean"]
        assert ours == flax_bn and ours["reduce_sum"] == 2, (axis, ours, flax_bn)
        assert collectives == (0 if axis is None else 1), (axis, ours)


# What one pass costs in float32, measured by the test below (XLA's CPU kernels, 8 channels of 8,192 values, seed 0):
# the relative error of the variance against float64, one pass / two passes, is 6.8e-8 / 6.8e-8 for zero-mean
# activations (what a convolution gives BatchNorm), 1.2e-7 / 5.1e-8 for post-ReLU ones, and 2.3e-5 / 7.2e-8 for
# N(10, 1), where E[x^2] - E[x]^2 cancels: one pass's error grows with E[x^2] / Var (1 and 1.5 for the first two,
# 101 for the third), so it costs nothing that matters unless the mean is large against the spread.
ACTIVATIONS = {
    "zero-mean": lambda rng, shape: rng.normal(0.0, 1.0, shape),
    "post-relu": lambda rng, shape: np.maximum(rng.normal(0.0, 1.0, shape), 0.0),
    "mean-10-sd-1": lambda rng, shape: rng.normal(10.0, 1.0, shape),
}


@pytest.mark.rounding
@pytest.mark.parametrize("activations", ACTIVATIONS)
def test_one_pass_variance_is_as_close_to_float64_as_its_two_moments(activations):
    """The batch variance in one pass, E[x^2] - E[x]^2: in float64 it is the two-pass variance (identical
    math); in float32 it is off from float64 by no more than the float32 rounding of its two moments,
    measured here (|E[x^2] float32 - float64| + |E[x]^2 float32 - float64| + float32's spacing at the
    variance), per channel. Where the mean is large against the spread that rounding is E[x^2] / Var
    times the variance's own; the message gives the relative errors of one pass and of two passes."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from backends.jax.batchnorm import _batch_statistics

    values = ACTIVATIONS[activations](np.random.default_rng(0), (32, 16, 16, 8)).astype(np.float32)
    exact = values.astype(np.float64)  # what the float32 input holds, exactly
    axes = (0, 1, 2)
    truth = exact.var(axis=axes)  # two passes, float64
    with float64():
        _, var_64, _ = jax.jit(lambda x: _batch_statistics(x, None))(jnp.asarray(exact))
        assert np.asarray(var_64).dtype == np.float64
    assert relative({"v": var_64}, {"v": truth}) <= IDENTICAL

    x = jnp.asarray(values)
    mean_32, var_32, _ = jax.jit(lambda x: _batch_statistics(x, None))(x)
    square_mean_32 = jax.jit(lambda x: lax.square(x).mean(axes))(x)
    two_pass_32 = jax.jit(lambda x: lax.square(x - x.mean(axes)).mean(axes))(x)
    var_32, mean_32, square_mean_32 = (
        np.asarray(a, np.float64) for a in (var_32, mean_32, square_mean_32)
    )
    moments_rounding = (
        np.abs(square_mean_32 - (exact**2).mean(axis=axes))
        + np.abs(np.square(mean_32.astype(np.float32)) - exact.mean(axis=axes) ** 2)
        + np.finfo(np.float32).eps * truth
    )
    one, two = (relative({"v": v}, {"v": truth}) for v in (var_32, two_pass_32))
    assert np.all(np.abs(var_32 - truth) <= FLOOR_FACTOR * moments_rounding), (
        f"{activations}: relative variance error vs float64, one pass {one:.2e}, two passes {two:.2e}"
    )


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


def test_the_timed_allreduce_is_a_psum_that_really_sums(backend, strategy):
    """The collective allreduce_seconds times leaves the sum over the 3 devices on each."""
    t = trainer(backend, strategy, "lenet", 3, 6, dtype="float32")
    buffer = t._allreduce_buffer(1000)  # device i holds i + 1 in every element (as allreduce_op's)
    rows = {s.device: np.asarray(s.data) for s in buffer.addressable_shards}
    assert [float(rows[d].ravel()[0]) for d in t.devs] == [1.0, 2.0, 3.0]
    summed = t.allreduce_op(1000)()  # the call allreduce_seconds times
    shards = summed.addressable_shards
    assert {s.device for s in shards} == set(t.devs)
    for s in shards:
        a = np.asarray(s.data)
        assert a.dtype == np.float32 and a.size == 1000 and np.all(a == 6.0)


def test_the_host_queues_few_steps_ahead_of_simulated_devices(backend, strategy, monkeypatch):
    """XLA's CPU client can deadlock with many collective steps queued (backends/xla.py): a trainer on simulated
    devices waits for the step CPU_STEPS_AHEAD back before it queues another; on a GPU the queue is not bounded.
    The oldest steps are waited for, in order (a step this small may be ready unwaited), and ready."""
    import jax

    from backends import xla

    waited = []
    wait = jax.block_until_ready
    monkeypatch.setattr(
        jax, "block_until_ready", lambda outputs: waited.append(outputs) or wait(outputs)
    )
    t = trainer(backend, strategy, "lenet", 2, 8, dtype="float32")
    x, y = batch(8)
    metrics = [t.step(x, y) for _ in range(xla.CPU_STEPS_AHEAD + 3)]
    assert len(t._queued) == xla.CPU_STEPS_AHEAD
    assert [i for w in waited for i, m in enumerate(metrics) if m is w] == [0, 1, 2]
    assert all(leaf.is_ready() for m in metrics[:3] for leaf in jax.tree.leaves(m))
    assert xla.StepQueue.for_devices("gpu").ahead is None


@pytest.mark.replicated
def test_a_staged_batch_gives_the_numpy_step_without_a_copy(backend, strategy):
    """Batches from `stage` (--resident-data) take the numpy batches' steps (float64), with no host-to-device
    transfer in the step; a numpy batch afterwards is still copied and accepted."""
    import jax

    batches = [batch(8, seed=s) for s in range(2)]
    with float64():
        plain = trainer(backend, strategy, "lenet", 2, 8, lr=0.5)
        plain_metrics = [plain.step(x, y) for x, y in batches]
        staged = trainer(backend, strategy, "lenet", 2, 8, lr=0.5)
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


def test_a_bf16_trainer_keeps_its_state_and_loss_float32(backend, strategy):
    """--precision bf16 computes in bfloat16 (test_contract's bf16 test: the step), while the whole state the trainer
    keeps (parameters, BatchNorm statistics, optimizer state) and the loss it returns stay float32."""
    import jax

    t = trainer(backend, strategy, "lenet", 2, 12, lr=0.5, precision="bf16", dtype="float32")
    loss, correct = t.step(*batch(12))
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


def test_jax_enable_x64_is_off_again_after_a_float64_call_that_ran_or_was_refused(
    backend, strategy
):
    """A float64 call turns jax_enable_x64 on for as long as it computes: after one refused (a lever that changes
    the float32 computation, test_contract's lever tests) and after one that ran, it is off again."""
    import jax

    from common.errors import Unsupported

    gradients = backend.gradients
    w = backend.initial_weights("lenet", 0)
    x, y = batch(4)
    assert not jax.config.jax_enable_x64
    for lever, value in (("precision", "bf16"), ("compile", True)):
        with pytest.raises(Unsupported):
            gradients(
                Probe(strategy, "lenet", 1, dtype="float64", levers=Levers(**{lever: value})),
                w,
                x,
                y,
            )
        assert not jax.config.jax_enable_x64
    w64 = {k: v.astype(np.float64) for k, v in w.items()}
    loss, grads = gradients(Probe(strategy, "lenet", 1, dtype="float64"), w64, x, y)
    assert isinstance(loss, float) and {g.dtype for g in grads.values()} == {np.dtype(np.float64)}
    assert not jax.config.jax_enable_x64


def test_environment_records_the_precision_jax_computes_in(backend):
    """The precision record of a plain run, whole; tf32's matmul precision, which configure_precision sets and sets
    back. (Every lever's record: test_contract's lever tests.)"""
    import jax

    from backends.jax.environment import configure_precision
    from common.config import RunConfig

    environment = backend.environment

    def cfg(**levers):
        return RunConfig(backend="jax", strategy="pmap", devices=2, levers=Levers(**levers))

    plain = environment(cfg())
    assert plain["precision"] == {
        "mode": "fp32",
        "dtype": "float32",
        "param_dtype": "float32",
        "jax_default_matmul_precision": "highest",
        "tf32_matmul": False,
        "tf32_cudnn": False,
    }
    assert plain["compile"] is None and set(plain["libraries"]) == {"flax", "optax"}
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
def test_forward_pass_matches_a_numpy_reference(backend, model, reference):
    """Eval-mode logits on canonical weights (OIHW, (out, in), NCHW flatten order) equal a numpy
    implementation of the torch definitions, both in float64."""
    w = perturbed(backend.initial_weights(model, 0))
    x, _ = batch(3)
    expected = reference({k: v.astype(np.float64) for k, v in w.items()}, x.astype(np.float64))
    got = backend.predict(model, w, x, dtype="float64")
    assert got.dtype == np.float64
    assert relative({"logits": got}, {"logits": expected}) <= IDENTICAL


# ------------------------------------------------------------------------- the worker


def run_worker(tmp_path, **overrides) -> tuple[int, dict]:
    return run_backend_worker(tmp_path, **{"strategy": "pmap", **overrides})


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


# ------------------------------------------------------------------ prefetch, donation, predict on the CPU


def traces_with(backend, strategy, **levers):
    """3 float64 LeNet steps of 12 examples on 2 devices (the contract's: their programs are compiled already)."""
    start = backend.initial_weights("lenet", 0)
    batches = [batch(12, seed=s) for s in range(3)]
    return start, backend.train_trace(
        Probe(strategy, "lenet", 2, dtype="float64", levers=Levers(**levers)), start, batches, 0.5
    )


def test_donated_state_gives_the_same_steps_bit_for_bit_and_leaves_the_weights_alone(
    backend, strategy, monkeypatch
):
    """The step donates (params, batch_stats, opt_state): the old buffers are consumed, the steps are those
    without donation to the last bit (float64), and the caller's weights are not written into."""
    import jax

    from backends.jax import programs

    start, donated = traces_with(backend, strategy)
    kept = {k: v.copy() for k, v in start.items()}
    _, again = traces_with(backend, strategy)
    monkeypatch.setattr(programs, "DONATED", ())
    _, undonated = traces_with(backend, strategy)
    assert (
        bitwise_equal(donated["final"], undonated["final"])
        and donated["losses"] == undonated["losses"]
    )
    assert bitwise_equal(again["final"], donated["final"])
    monkeypatch.undo()
    t = trainer(backend, strategy, "lenet", 2, 8, dtype="float32")
    old = t.state
    t.step(*batch(8))
    t.sync()
    assert all(a.is_deleted() for a in jax.tree.leaves(old))
    t.reset()  # from the numpy initial weights: still intact
    assert bitwise_equal(t.canonical(), kept)


def test_put_returns_the_batch_placed_as_the_step_takes_it(backend, strategy):
    t = trainer(backend, strategy, "lenet", 2, 8, dtype="float32")
    x, y = batch(8)
    placed = t.put(x, y)
    assert t._is_placed(*placed)
    assert np.array_equal(np.asarray(placed[0]).reshape(x.shape), x)


def test_predict_runs_on_the_cpu_at_full_float32_precision(backend, monkeypatch):
    """Whatever the process's default (TF32 on a GPU host), predict's forward runs at "highest" matmul
    precision on a CPU device: its logits are compared with the other backends' CPU logits."""
    import jax

    from backends.jax import models

    seen = []
    real = models.forward  # (predict's network runs in models.py)

    def spy(net, variables, x, train):
        seen.append((jax.config.jax_default_matmul_precision, jax.config.jax_default_device))
        return real(net, variables, x, train)

    monkeypatch.setattr(models, "forward", spy)
    previous = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", "tensorfloat32")
    try:
        backend.predict("lenet", backend.initial_weights("lenet", 0), batch(2)[0])
    finally:
        jax.config.update("jax_default_matmul_precision", previous)
    ((precision, device),) = seen
    assert precision == "highest" and device.platform == "cpu"
    lowered = jax.jit(
        lambda x: models.forward(
            models.build("lenet"),
            models.from_canonical(models.build("lenet"), backend.initial_weights("lenet", 0)),
            x,
            False,
        )
    )
    # what that setting does to the convolutions it lowers
    with jax.default_matmul_precision("highest"):
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
def test_gpu_steps_in_float64_are_the_cpu_steps(backend, strategy):
    train_steps = backend.train_steps
    start = backend.initial_weights("lenet", 0)
    batches = [batch(8, seed=s) for s in range(2)]
    on_gpu = train_steps(
        Probe(strategy, "lenet", GPUS, device_kind="gpu", dtype="float64"), start, batches, 0.5
    )
    on_cpu = train_steps(Probe(strategy, "lenet", GPUS, dtype="float64"), start, batches, 0.5)
    assert relative(on_gpu, on_cpu) <= IDENTICAL


@needs_gpu
def test_gpu_fp32_steps_run_at_full_precision(backend, strategy):
    """fp32 on the GPU (jax_default_matmul_precision "highest") stays within 10x the CPU's float32 distance
    from the float64 step, measured here; XLA's default (TF32 on Ampere and later) is ~1000x."""
    train_steps = backend.train_steps
    start = backend.initial_weights("lenet", 0)
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


def test_a_training_worker_asks_xla_for_its_runs_devices():
    """XLA makes its simulated CPU devices when jax is imported; a step is slower with more than the run uses, so
    a worker the harness started for a run of 3 devices (common.worker.DEVICES_ENV) has 3, and one without it the
    most --gpus may ask for."""
    import subprocess
    import sys

    from common.config import MAX_SIMULATED_DEVICES
    from common.worker import DEVICES_ENV
    from harness.processes.envs import worker_env

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
