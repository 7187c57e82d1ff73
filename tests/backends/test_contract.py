"""The backend interface (docs/ARCHITECTURE.md), one module for every backend, run in each backend's environment.

A backend package provides INTERFACE (common/backend.py): the models, d2l's devices/split/allreduce, the canonical
initial weights, predict, the worker's run and environment, the equivalence API (gradients, train_trace,
train_steps, float64_gradients), TRAINERS (its strategies, each a common.trainer.Trainer), and the
array helpers of these tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from common import data as datalib
from common.backend import INTERFACE, Probe
from common.config import RunConfig
from common.errors import Unsupported
from common.trainer import METHODS, Trainer
from common.weights import he_scaled
from tests.backends.conftest import NAME, ROOT, run_backend_worker
from tests.backends.numerics import IDENTICAL, float32_tolerance, max_abs_diff, relative, scale

BATCH = 12  # divisible by 1, 2 and 3 devices
# Every ResNet-18 step below takes batches of this size at this learning rate, so that a backend which compiles its
# step (jax, Keras on jax) compiles each one once per session and the tests share it (backends/jax/programs.py).
RESNET_BATCH, RESNET_LR = 8, 0.1


def batch(n=BATCH, seed=0, model="lenet"):
    """n random images of the shape `model` takes (ResNet-50: 3 x 32 x 32, its smallest), and their labels."""
    from common.architectures import example_shape, num_classes

    rng = np.random.default_rng(seed)
    return (
        rng.random((n, *example_shape(model)[1:]), dtype=np.float32),
        rng.integers(0, num_classes(model), n).astype(np.int32),
    )


def test_the_package_provides_the_interface_in_its_order(backend):
    assert backend.__all__[: len(INTERFACE)] == list(
        INTERFACE
    )  # (a backend may add names of its own after them)
    assert all(hasattr(backend, name) for name in backend.__all__)
    assert backend.NAME == NAME


def test_every_strategy_is_a_trainer_with_the_glossarys_methods_in_its_order(backend, meta):
    assert list(backend.TRAINERS) == list(meta.strategies)
    for name, cls in backend.TRAINERS.items():
        assert issubclass(cls, Trainer), f"{NAME} {name}"
        for klass in cls.__mro__[: cls.__mro__.index(Trainer)]:  # the backend's own classes
            public = [
                m
                for m, v in vars(klass).items()
                if callable(v) and (m == "__init__" or not m.startswith("_"))
            ]
            assert [m for m in public if m not in METHODS] == [], f"{NAME} {klass.__name__}"
            assert public == sorted(public, key=METHODS.index), f"{NAME} {klass.__name__}: {public}"


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
    with pytest.raises(
        ValueError, match="batch of 7 examples cannot be split evenly across 2 devices"
    ):
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
    assert backend.param_count("resnet50") == 25_557_032  # torchvision's resnet50


@pytest.mark.parametrize("model, classes", [("resnet18", 10), ("lenet", 10), ("resnet50", 1000)])
def test_output_shape(backend, model, classes):
    x, _ = batch(5, model=model)
    logits = backend.predict(model, backend.initial_weights(model, 0), x)
    assert logits.shape == (5, classes) and logits.dtype == np.float32 and np.isfinite(logits).all()


def test_resnet50_takes_any_image_side_from_32(backend):
    """ResNet-50 pools globally: beside 32 x 32 (test_output_shape: 1 x 1 after its five halvings), 48 x 48 (2 x 2
    at the end, odd sides on the way) gives 1000 logits in training mode."""
    from common.weights import he_scaled

    w = he_scaled(backend.initial_weights("resnet50", 0), "resnet50")
    x = np.random.default_rng(48).random((2, 3, 48, 48), dtype=np.float32)
    logits = backend.predict("resnet50", w, x, train=True)
    assert logits.shape == (2, 1000) and np.isfinite(logits).all() and np.std(logits) > 1e-3


# SHA-256 of the canonical initial weights (seed 0): every backend must start from exactly these
# numbers, under the same canonical names and layouts (conv OIHW, dense (out, in)).
CANONICAL_FINGERPRINTS = {
    "resnet18": "1edb562911f9087d60faa0220f475e76ee56775bafc7aab1c426b9bec6b44e2c",
    "lenet": "d4edbb487ad27285ea3211f777ff08bd27ba74ca46cc26104b6344a7ef061a0f",
    "resnet50": "b77e429f8665a3a6439040499f86ec4b402048ae9ee8639d6abdeabb1446bb24",
}


@pytest.mark.parametrize("model", ["resnet18", "lenet", "resnet50"])
def test_initial_weights_are_the_canonical_ones(backend, model):
    from common.weights import fingerprint

    assert fingerprint(backend.initial_weights(model, 0)) == CANONICAL_FINGERPRINTS[model]


def test_initial_weights_are_seeded(backend):
    a, b, c = (backend.initial_weights("lenet", s) for s in (0, 0, 1))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert any(not np.array_equal(a[k], c[k]) for k in a)
    assert sum(v.size for v in a.values()) == 129_068


# ------------------------------------------------------------------ equivalence API (proving fairness)
#   predict(model, weights, x, train=False)
#   gradients(strategy, model, k, weights, x, y, bn="local", dtype="float32") -> (mean loss, canonical gradients)
#   train_trace(strategy, model, k, weights, batches, lr, bn="local", dtype="float32") -> {"first", "final", "losses"}
#   train_steps(...) -> trace["final"]: every canonical entry, BatchNorm running statistics included
# Identity of math is proven with dtype="float64" (numerics.IDENTICAL); float32 claims get a tolerance
# measured in the same test (numerics.float32_tolerance).


def call(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except Unsupported as e:
        pytest.skip(str(e))


def steps(
    backend,
    strategy,
    k,
    n_steps=1,
    model="lenet",
    lr=0.5,
    dtype="float64",
    bn="local",
    weights=None,
):
    weights = backend.initial_weights(model, 0) if weights is None else weights
    batches = [batch(BATCH, seed=s) for s in range(n_steps)]
    return call(
        backend.train_steps, Probe(strategy, model, k, bn=bn, dtype=dtype), weights, batches, lr
    )


def trainable_names(model: str) -> set[str]:
    from common.architectures import spec

    return {name for name, _, kind in spec(model) if kind not in ("bn_mean", "bn_var")}


def declared_bn_modes(meta, strategy) -> list[str]:
    return list(meta.strategies[strategy].bn)


@pytest.mark.rounding
def test_float64_runs_in_float64_and_leaves_float32_alone(backend, strategy):
    """dtype="float64" computes in float64, and a float32 call after it is the same as before it."""
    w = backend.initial_weights("lenet", 0)
    x, y = batch()
    before = call(backend.gradients, Probe(strategy, "lenet", 2), w, x, y)
    loss64, grads64 = call(backend.gradients, Probe(strategy, "lenet", 2, dtype="float64"), w, x, y)
    after = call(backend.gradients, Probe(strategy, "lenet", 2), w, x, y)
    assert {g.dtype for g in grads64.values()} == {np.dtype(np.float64)}
    assert {g.dtype for g in after[1].values()} == {np.dtype(np.float32)}
    assert after[0] == before[0] and max_abs_diff(after[1], before[1]) == 0.0
    # float64 is not float32 in disguise: the two differ by float32 rounding, not by zero
    assert 0 < max_abs_diff(before[1], grads64) <= 1e-3 * scale(grads64)
    assert isinstance(loss64, float)


def test_k_device_step_equals_one_device_step(backend, strategy):
    """LeNet: one step on 2 devices with the batch split is the 1-device step (float64, to rounding)."""
    start = backend.initial_weights("lenet", 0)
    one, two = steps(backend, strategy, 1), steps(backend, strategy, 2)
    assert max_abs_diff(one, start) > 1e-3  # the step really moved the weights
    assert relative(two, one) <= IDENTICAL


@pytest.mark.rounding
def test_k_device_step_in_float32_is_within_float32_rounding(backend, strategy):
    """The same in float32, judged against float32's own distance from float64 on this machine."""
    one32, two32 = (steps(backend, strategy, k, dtype="float32") for k in (1, 2))
    one64, two64 = (steps(backend, strategy, k) for k in (1, 2))
    assert max_abs_diff(two32, one32) <= float32_tolerance((one32, one64), (two32, two64))


def test_strategies_agree_in_float64(backend, meta):
    """Every strategy of the backend takes the same steps: LeNet (3 steps) and ResNet-18 (1 step, its
    BatchNorm statistics included), on 1 and 2 devices, in float64."""
    for model, n_steps, size, lr in (
        ("lenet", 3, BATCH, 0.5),
        ("resnet18", 1, RESNET_BATCH, RESNET_LR),
    ):
        for k in (1, 2):
            results = {}
            for name in meta.strategies:
                try:
                    results[name] = backend.train_steps(
                        Probe(name, model, k, dtype="float64"),
                        backend.initial_weights(model, 0),
                        [batch(size, seed=s) for s in range(n_steps)],
                        lr,
                    )
                except Unsupported:
                    continue
            assert len(results) >= 2, results.keys()
            first, *others = results.values()
            assert max_abs_diff(first, backend.initial_weights(model, 0)) > 1e-3, (
                model,
                k,
            )  # the steps moved
            for other in others:
                assert relative(other, first) <= IDENTICAL, (model, k)


# The framework each idiom of this backend runs on (benchmarks/idioms/; harness/parity.py's idiom_of): Keras's
# ddp is measured against Keras on torch, its distribution against Keras on jax.
IDIOM_ENVS = {"keras": [{"KERAS_BACKEND": "torch"}, {"KERAS_BACKEND": "jax"}]}


@pytest.mark.parametrize(
    "idiom_env", IDIOM_ENVS.get(NAME, [{}]), ids=lambda e: "-".join(e.values())
)
def test_the_idiom_takes_the_suites_steps_in_float64(backend, idiom_env, tmp_path):
    """`harness parity` times the same work on both sides: the framework's idiom (its own network and
    training step, benchmarks/idioms/) takes the same 3 SGD steps of ResNet-18 as the suite, in float64. A
    step's loss depends on every update before it, so equal losses prove the forward pass and the updates."""
    import json
    import subprocess
    import sys

    from common import data as datalib
    from common.config import RunConfig
    from harness.envs import worker_env

    cfg = RunConfig(
        backend=NAME,
        strategy=backend.strategies.REFERENCE,
        devices=1,
        batch_size=RESNET_BATCH,
        lr=RESNET_LR,
        dataset="synthetic",
        train_size=3 * RESNET_BATCH,
        test_size=RESNET_BATCH,
    ).validate()
    cfg.save(tmp_path / "run.json")
    idiom = [
        sys.executable,
        "-m",
        f"benchmarks.idioms.{NAME}",
        "--config",
        str(tmp_path / "run.json"),
    ]
    proc = subprocess.run(
        [*idiom, "--result", str(tmp_path / "idiom.json"), "--trace", "3", "--dtype", "float64"],
        cwd=ROOT,
        env=worker_env(**idiom_env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    theirs = json.loads((tmp_path / "idiom.json").read_text())["losses"]
    batches = datalib.train_batches(datalib.load(cfg), cfg.batch_size, cfg.seed, 0)
    probe = Probe(cfg.strategy, "resnet18", 1, dtype="float64")
    ours = backend.train_trace(probe, backend.initial_weights("resnet18", 0), batches, cfg.lr)
    ours = [float(loss) for loss in ours["losses"]]
    assert len(theirs) == len(ours) == 3 and len(set(ours)) == 3  # three different steps
    assert np.max(np.abs(np.subtract(theirs, ours))) <= IDENTICAL * max(map(abs, ours))


def test_train_mode_forward_normalises_with_the_batch_statistics(backend):
    """Training mode normalises with the batch's statistics: the running statistics are not read there."""
    x, _ = batch(6)
    w = backend.initial_weights("resnet18", 0)
    moved = {
        k: v + 5 if k.endswith("running_mean") else v * 100 if k.endswith("running_var") else v
        for k, v in w.items()
    }
    train_a, train_b = (backend.predict("resnet18", v, x, train=True) for v in (w, moved))
    eval_a, eval_b = (backend.predict("resnet18", v, x) for v in (w, moved))
    assert np.array_equal(train_a, train_b)  # the same computation on the same inputs
    assert np.max(np.abs(eval_a - eval_b)) > 1e-3 * np.max(np.abs(eval_a))


def test_gradient_is_that_of_the_mean_loss(backend, meta):
    """Central differences of the global mean loss agree with the returned gradient (LeNet, 1 device, float64).

    With h = 1e-4 the central difference is off by O(h^2) ~ 1e-8 of the slope and float64 rounding adds
    ~1e-12: a gradient of another loss (a sum instead of a mean, a missing term) is off by far more."""
    strategy = next(iter(meta.strategies))
    x, y = batch()
    w = {k: v.astype(np.float64) for k, v in backend.initial_weights("lenet", 0).items()}
    w["fc2.weight"] = w["fc2.weight"] * 100  # logits large enough for a visible loss change
    loss, grads = call(backend.gradients, Probe(strategy, "lenet", 1, dtype="float64"), w, x, y)
    assert set(grads) == trainable_names("lenet")
    h = 1e-4
    for name in ("fc2.bias", "fc2.weight"):  # after the last ReLU: the loss is smooth in them
        index = np.unravel_index(
            np.argmax(np.abs(grads[name])), grads[name].shape
        )  # a visible slope
        plus, minus = ({**w, name: w[name].copy()} for _ in range(2))
        plus[name][index] += h
        minus[name][index] -= h
        numeric = (
            call(backend.gradients, Probe(strategy, "lenet", 1, dtype="float64"), plus, x, y)[0]
            - call(backend.gradients, Probe(strategy, "lenet", 1, dtype="float64"), minus, x, y)[0]
        ) / (2 * h)
        assert abs(numeric - grads[name][index]) <= 1e-6 * abs(numeric) + 1e-12, name
        assert abs(numeric) > 1e-6, name  # a slope there is, so the comparison says something
    assert np.isfinite(loss) and 0 < loss < 50


def test_k_device_gradients_equal_one_device(backend, strategy):
    """The gradient after the strategy's reduction over 2 devices is the 1-device gradient (float64)."""
    x, y = batch()
    w = backend.initial_weights("lenet", 0)
    loss1, g1 = call(backend.gradients, Probe(strategy, "lenet", 1, dtype="float64"), w, x, y)
    loss2, g2 = call(backend.gradients, Probe(strategy, "lenet", 2, dtype="float64"), w, x, y)
    assert abs(loss2 - loss1) <= IDENTICAL * abs(loss1)
    assert relative(g2, g1) <= IDENTICAL
    assert scale(g1) > 1e-3


def test_trace_agrees_with_steps_and_gradients(backend, strategy):
    """A trace's first and final weights are those of 1 and 3 steps, its first loss the gradient call's."""
    w = backend.initial_weights("lenet", 0)
    batches = [batch(BATCH, seed=s) for s in range(3)]
    trace = call(backend.train_trace, Probe(strategy, "lenet", 2, dtype="float64"), w, batches, 0.5)
    assert len(trace["losses"]) == 3
    final = call(backend.train_steps, Probe(strategy, "lenet", 2, dtype="float64"), w, batches, 0.5)
    first = call(
        backend.train_steps, Probe(strategy, "lenet", 2, dtype="float64"), w, batches[:1], 0.5
    )
    assert (
        relative(trace["final"], final) <= IDENTICAL
        and relative(trace["first"], first) <= IDENTICAL
    )
    assert max_abs_diff(trace["final"], trace["first"]) > 1e-3
    loss0, _ = call(backend.gradients, Probe(strategy, "lenet", 2, dtype="float64"), w, *batches[0])
    assert abs(trace["losses"][0] - loss0) <= IDENTICAL * abs(loss0)


def test_sync_batchnorm_makes_k_devices_one_device(backend, strategy, meta):
    """--bn sync: ResNet-18 on 2 devices takes the 1-device step (statistics over the global batch),
    proven in float64; per-device statistics (--bn local) give another step."""
    if "sync" not in declared_bn_modes(meta, strategy):
        pytest.skip(f"{meta.name} {strategy} has no synchronised BatchNorm")
    w = backend.initial_weights("resnet18", 0)
    batches = [batch(RESNET_BATCH, seed=0)]
    one = call(
        backend.train_steps, Probe(strategy, "resnet18", 1, dtype="float64"), w, batches, RESNET_LR
    )
    two = call(
        backend.train_steps,
        Probe(strategy, "resnet18", 2, bn="sync", dtype="float64"),
        w,
        batches,
        RESNET_LR,
    )
    local = call(
        backend.train_steps,
        Probe(strategy, "resnet18", 2, bn="local", dtype="float64"),
        w,
        batches,
        RESNET_LR,
    )
    assert relative(two, one) <= IDENTICAL
    assert relative(local, one) > 1e6 * IDENTICAL  # per-device statistics really are other math


# ------------------------------------------------------------------ BatchNorm running statistics


def stem_convolution(x: np.ndarray, w: dict) -> np.ndarray:
    """ResNet-18's first layer (3x3, stride 1, padding 1, with bias) in numpy float64: the stem
    BatchNorm's input, computed without any framework."""
    kernel, bias = w["conv.weight"].astype(np.float64), w["conv.bias"].astype(np.float64)
    n, _, height, width = x.shape
    padded = np.pad(x[:, 0].astype(np.float64), ((0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, kernel.shape[0], height, width))
    for i in range(3):
        for j in range(3):
            out += (
                kernel[None, :, 0, i, j, None, None]
                * padded[:, None, i : i + height, j : j + width]
            )
    return out + bias[None, :, None, None]


def expected_running_statistics(x, w, shards: int, ddof: int) -> tuple[np.ndarray, np.ndarray]:
    """torch's rule after one step, per shard, then averaged over the replicas:
    mean <- 0.9 mean + 0.1 batch mean, var <- 0.9 var + 0.1 batch variance (ddof=1: unbiased)."""
    means, variances = [], []
    for part in np.split(stem_convolution(x, w), shards):
        means.append(
            0.9 * w["bn.running_mean"].astype(np.float64) + 0.1 * part.mean(axis=(0, 2, 3))
        )
        variances.append(
            0.9 * w["bn.running_var"].astype(np.float64) + 0.1 * part.var(axis=(0, 2, 3), ddof=ddof)
        )
    return np.mean(means, axis=0), np.mean(variances, axis=0)


@pytest.mark.parametrize("k,bn", [(1, "local"), (2, "local"), (2, "sync")])
def test_running_statistics_follow_torchs_convention(backend, strategy, meta, k, bn):
    """After one step the stem BatchNorm's running mean and variance are torch's: momentum 0.1 and the
    unbiased batch variance, over each device's shard (local) or the global batch (sync). float64,
    against numpy; the biased variance (another framework's default) is far outside the tolerance."""
    if bn not in declared_bn_modes(meta, strategy):
        pytest.skip(f"{meta.name} {strategy} has no --bn {bn}")
    w = he_scaled(
        backend.initial_weights("resnet18", 0), "resnet18"
    )  # statistics of a visible size
    x, y = batch(RESNET_BATCH)
    got = call(
        backend.train_steps,
        Probe(strategy, "resnet18", k, bn=bn, dtype="float64"),
        w,
        [(x, y)],
        RESNET_LR,
    )
    shards = 1 if bn == "sync" else k
    mean, var = expected_running_statistics(x, w, shards, ddof=1)
    _, biased = expected_running_statistics(x, w, shards, ddof=0)
    assert np.max(np.abs(got["bn.running_mean"] - mean)) <= IDENTICAL * np.max(np.abs(mean))
    assert np.max(np.abs(got["bn.running_var"] - var)) <= IDENTICAL * np.max(var)
    assert np.max(np.abs(biased - var)) > 1e4 * IDENTICAL * np.max(
        var
    )  # the test can tell the two apart


def test_a_gpu_run_the_framework_cannot_see_a_gpu_for_is_unavailable_with_the_reason(
    tmp_path, meta
):
    """What a host with a GPU the harness found but no CUDA runtime in the framework gets: an unavailable
    result saying so, with the framework's own GPU count in its environment."""
    rc, r = run_backend_worker(
        tmp_path,
        strategy=next(iter(meta.strategies)),
        devices=1,
        batch_size=8,
        device_kind="gpu",
        simulated=False,
    )
    if r["environment"].get("framework_gpus"):
        pytest.skip(f"{NAME} sees a GPU here")
    assert rc == 1 and r["status"] == "unavailable"
    assert "GPU" in r["error"] and len(r["error"].splitlines()) == 1
    assert r["environment"]["framework_gpus"] == 0


# ------------------------------------------------------------------------------------- the timed parts


def test_only_the_warm_up_compiles(backend, strategy, tmp_path, monkeypatch):
    """Whatever the framework compiles, it compiles in the warm-up step: a compile inside a timed epoch is paid
    by the epoch's time and never by a step timed alone, and the report's s/epoch would contradict its step
    time (Keras's distribution did: reset() left its state in another layout than its step's, so its second
    step compiled again). One device, a fresh worker process: the warm-up's compiles are this run's own."""
    if backend.TRAINERS[strategy].compiles is Trainer.compiles:
        pytest.skip(f"{NAME} does not count what it compiles")
    rc, r = run_backend_worker(tmp_path, strategy=strategy, devices=1, epochs=2, timed_steps=2)
    if r["status"] == "unavailable":
        pytest.skip(r["error"])  # torch's dp without CUDA
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["compiles"]["epochs"] == r["compiles"]["timed_steps"] == 0, r["compiles"]
    assert r["epoch_over_steps"] > 0
    if r["compiles"]["warmup"] == 0:
        return  # it runs eagerly: nothing compiles, nothing to plant
    # A planted fault, in this process: every epoch takes batches half the warm-up's, so the step compiles again
    # inside the first epoch, and the same count must say so.
    monkeypatch.setattr(datalib, "train_batches", halved_after_the_warm_up(datalib.train_batches))
    planted = backend.run(
        RunConfig.from_dict(
            {
                **r["config"],
                "epochs": 1,
                "timed_steps": 0,
                "lr": 0.0625,  # no other test's: the programs (shared ones are keyed by the rate) are compiled here
            }
        )
    )
    assert planted["compiles"]["epochs"] > 0


def halved_after_the_warm_up(train_batches):
    """train_batches whose every call after the first (the warm-up's) gives batches of half the size."""
    calls = []

    def planted(*args):
        calls.append(args)
        batches = train_batches(*args)
        if len(calls) == 1:
            return batches
        return [(x[: len(y) // 2], y[: len(y) // 2]) for x, y in batches]

    return planted


# ------------------------------------------------------------------------------------- several nodes


def _engines(meta) -> list[str]:
    return [s for s, spec in meta.strategies.items() if spec.engine]


def _survivors(marker: str) -> list[str]:
    import subprocess

    found = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True).stdout.split()
    return [pid for pid in found if int(pid) != __import__("os").getpid()]


def test_a_node_killed_mid_run_fails_the_run_with_its_error_and_ends_every_process(meta, tmp_path):
    """Loopback nodes through the harness on the real engine: SIGKILL node 1's process group (a host lost)
    during training; the run is a failed row naming node 1, the report is written, and no process of any node
    or role is left."""
    import glob
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    from harness.envs import worker_env

    engines = _engines(meta)
    if not engines:
        pytest.skip(f"{NAME} has no strategy with a distributed engine")
    out = tmp_path / "out"
    harness = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "harness",
            "--backend",
            NAME,
            "--strategy",
            engines[0],
            "--nodes",
            "2",
            "--gpus",
            "1",
            "--model",
            "lenet",
            "--dataset",
            "synthetic",
            "--train-size",
            "4096",
            "--test-size",
            "16",
            "--batch-size",
            "16",
            "--epochs",
            "50",
            "--timed-steps",
            "0",
            "--device",
            "cpu",
            "--no-check",
            "--quiet",
            "--out",
            str(out),
            "--python",
            f"{NAME}={sys.executable}",
        ],
        cwd=ROOT,
        env=worker_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline, log = time.monotonic() + 300, None
        while time.monotonic() < deadline and harness.poll() is None:
            logs = glob.glob(
                str(out / ".tmp-*" / "logs" / "*node0.log")
            )  # rank 0 reports the steps
            if logs and '"event": "step"' in open(logs[0]).read():
                log = logs[0].replace("node0", "node1")
                break
            time.sleep(0.5)
        if log is None:
            harness.kill()
            raise AssertionError(
                f"the nodes never started training:\n{harness.communicate()[0][-3000:]}"
            )
        node1 = _survivors(log.replace("/logs/", "/runs/").replace(".log", ".config.json"))
        assert node1, "node 1's process was not found"
        os.killpg(int(node1[0]), signal.SIGKILL)
        output, _ = harness.communicate(timeout=300)
    finally:
        if harness.poll() is None:
            os.killpg(harness.pid, signal.SIGKILL)
    assert harness.returncode == 1, output[-2000:]
    (report,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    (result,) = json.loads((report / "results.json").read_text())["runs"]
    assert result["status"] == "failed"
    headline = result["error"].splitlines()[-1]
    assert headline.startswith("node 1 of 2 failed first: failed: worker exited with status -9"), (
        result["error"][-600:]
    )
    assert headline in (report / "report.md").read_text()
    time.sleep(1)
    assert _survivors(str(out)) == []
