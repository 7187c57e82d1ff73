"""The backend interface (docs/ARCHITECTURE.md), one module for every backend, run in each backend's environment.

A backend is the object its package builds, backends.<name>.BACKEND (common/backend.py's Backend): its modules as
common/backend_interface.py's Protocols say (the models, d2l's devices/split/allreduce and the tests' array helpers, the
strategies' trainers, the environment record and refusals, the engine), and what every backend does the same way
on them: the canonical initial weights, predict, a run, the equivalence API (gradients, train_trace, train_steps,
float64_gradients). The worker is proven end to end here too, on every strategy.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
from collections.abc import Mapping

import numpy as np
import pytest

from common import architectures, manifest, mllog, profiling
from common import backend as backendlib
from common import data as datalib
from common.backend import Probe
from common.config import RunConfig
from common.errors import Unsupported
from common.levers import PLAIN, TF32_ON_CPU, Levers
from common.nodes import NodeSpec
from common.results import SCHEMA_VERSION, result_problem
from common.trainer import METHODS, PROBES, Trainer
from common.weights import he_scaled
from tests.backends.conftest import NAME, ROOT, run_backend_worker, worker_config
from tests.backends.nodes import finish, refused_port, start_nodes
from tests.backends.numerics import (
    BF16_EPSILON,
    IDENTICAL,
    RESNET18_SIDE,
    bitwise_equal,
    float32_tolerance,
    max_abs_diff,
    relative,
    scale,
    update_distance,
)

BATCH = 12  # divisible by 1, 2 and 3 devices
# Every ResNet-18 step below takes batches of this size at this learning rate, so that a backend which compiles its
# step (jax, Keras on jax) compiles each one once per session and the tests share it (backends/jax/programs.py).
RESNET_BATCH, RESNET_LR = 8, 0.1


def batch(n=BATCH, seed=0, model="lenet"):
    """n random images of the shape `model` takes (ResNet-50: 3 x 32 x 32, its smallest; ResNet-18: RESNET18_SIDE),
    and their labels."""
    from common.architectures import example_shape, num_classes

    channels, side, _ = example_shape(model)[1:]
    side = RESNET18_SIDE if model == "resnet18" else side
    rng = np.random.default_rng(seed)
    return (
        rng.random((n, channels, side, side), dtype=np.float32),
        rng.integers(0, num_classes(model), n).astype(np.int32),
    )


def test_the_package_builds_a_backend_of_modules_that_provide_what_it_needs(backend):
    """backends.<name>.BACKEND is a common.backend.Backend of that name, and each of its modules provides what
    common/backend.py's Protocol for it says: the backend's own, and the framework's profiler (profilers/<name>.py,
    which the framework's idiom records with too)."""
    assert isinstance(backend, backendlib.Backend) and backend.name == NAME
    protocols = {
        f"backends.{NAME}.models": backendlib.Models,
        f"backends.{NAME}.parallel": backendlib.Parallel,
        f"backends.{NAME}.strategies": backendlib.Strategies,
        f"backends.{NAME}.environment": backendlib.Environment,
        f"backends.{NAME}.distributed": backendlib.Distributed,
        f"profilers.{NAME}": backendlib.Profiling,
    }
    for path, protocol in protocols.items():
        module = importlib.import_module(path)
        assert isinstance(module, protocol), f"{module.__name__} is no {protocol.__name__}"
    held = (
        backend.models,
        backend.parallel,
        backend.strategies,
        backend.distributed,
        backend.profiling,
    )
    assert held == tuple(
        importlib.import_module(path) for path in protocols if not path.endswith(".environment")
    )


def test_every_strategy_is_a_trainer_with_the_glossarys_methods_in_its_order(backend, meta):
    """Every strategy backend.toml declares is a common.trainer.Trainer that defines every abstract method (one
    that lacks one cannot be made), with its public methods in the glossary's order."""
    assert list(backend.strategies.TRAINERS) == list(meta.strategies)
    for name, cls in backend.strategies.TRAINERS.items():
        assert issubclass(cls, Trainer) and not inspect.isabstract(cls), f"{NAME} {name}"
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
    parallel = backend.parallel
    devs = parallel.devices(k)
    xs, ys = parallel.split(x, y, devs)
    assert len(xs) == len(ys) == k
    assert [tuple(parallel.to_numpy(s).shape) for s in xs] == [(BATCH // k, 1, 28, 28)] * k
    assert np.array_equal(np.concatenate([parallel.to_numpy(s) for s in xs]), x)
    assert np.array_equal(np.concatenate([parallel.to_numpy(s) for s in ys]), y)
    for shard, device in zip(xs, devs):
        assert parallel.device_of(shard) == device


def test_split_refuses_a_batch_the_devices_cannot_split(backend):
    x, y = batch(7)
    with pytest.raises(
        ValueError, match="batch of 7 examples cannot be split evenly across 2 devices"
    ):
        backend.parallel.split(x, y, backend.parallel.devices(2))


@pytest.mark.parametrize("k", [2, 3])
def test_allreduce_leaves_the_exact_sum_on_every_device(backend, k):
    values = [np.arange(12, dtype=np.float32).reshape(3, 4) * (i + 1) + i for i in range(k)]
    expected = sum(values)
    parallel = backend.parallel
    devs = parallel.devices(k)
    out = parallel.allreduce([parallel.array(v, d) for v, d in zip(values, devs)])
    assert len(out) == k
    for a, device in zip(out, devs):
        assert np.array_equal(parallel.to_numpy(a), expected)
        assert parallel.device_of(a) == device


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
@pytest.mark.replicated
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


@pytest.mark.replicated
def test_k_device_step_equals_one_device_step(backend, strategy):
    """LeNet: one step on 2 devices with the batch split is the 1-device step (float64, to rounding)."""
    start = backend.initial_weights("lenet", 0)
    one, two = steps(backend, strategy, 1), steps(backend, strategy, 2)
    assert max_abs_diff(one, start) > 1e-3  # the step really moved the weights
    assert relative(two, one) <= IDENTICAL


@pytest.mark.rounding
@pytest.mark.replicated
def test_k_device_step_in_float32_is_within_float32_rounding(backend, strategy):
    """The same in float32, judged against float32's own distance from float64 on this machine."""
    one32, two32 = (steps(backend, strategy, k, dtype="float32") for k in (1, 2))
    one64, two64 = (steps(backend, strategy, k) for k in (1, 2))
    assert max_abs_diff(two32, one32) <= float32_tolerance((one32, one64), (two32, two64))


def test_strategies_agree_in_float64(backend, meta):
    """Every strategy of the backend takes the same steps, in float64: LeNet (3 steps) on 1 and 2 devices, and
    ResNet-18 (1 step, its BatchNorm statistics included) on 2, where each device normalises its own shard and a
    variant shards its weights (on 1 device every strategy is the one-device step, which LeNet holds)."""
    for model, n_steps, size, lr, counts in (
        ("lenet", 3, BATCH, 0.5, (1, 2)),
        ("resnet18", 1, RESNET_BATCH, RESNET_LR, (2,)),
    ):
        for k in counts:
            results = {}
            for name in meta.strategies:
                try:
                    results[name] = backend.train_steps(
                        Probe(name, model, k, dtype="float64"),
                        backend.initial_weights(model, 0),
                        [batch(size, seed=s, model=model) for s in range(n_steps)],
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


# The environments this backend's idiom runs in, each once (backend.toml's per strategy, which idiom_of in
# harness/session/idioms.py reads): Keras's ddp is measured against Keras on torch, its distribution against Keras
# on jax.
DECLARED = manifest.load(NAME).strategies.values() if NAME else []
IDIOM_ENVS = [dict(env) for env in dict.fromkeys(s.idiom_env for s in DECLARED)] or [{}]


@pytest.mark.parametrize("idiom_env", IDIOM_ENVS, ids=lambda e: "-".join(e.values()))
def test_the_idiom_takes_the_suites_steps_in_float64(backend, idiom_env, tmp_path):
    """`harness parity` times the same work on both sides: the framework's idiom (its own network and
    training step, benchmarks/idioms/) takes the same 3 SGD steps of ResNet-18 as the suite, in float64. A
    step's loss depends on every update before it, so equal losses prove the forward pass and the updates."""
    import json
    import subprocess
    import sys

    from common import data as datalib
    from common.config import RunConfig
    from harness.processes.envs import worker_env

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
    x, _ = batch(6, model="resnet18")
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
        # a visible slope
        index = np.unravel_index(np.argmax(np.abs(grads[name])), grads[name].shape)
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


@pytest.mark.replicated
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


@pytest.fixture(scope="session")
def resnet_one_device_step(backend):
    """The reference strategy's float64 ResNet-18 step on 1 device, from the canonical weights: (weights, batches,
    the weights after it). Every strategy's 1-device step is this one (on 1 device there is nothing to exchange),
    so the sync BatchNorm test of each compares with it, computed once."""
    w = backend.initial_weights("resnet18", 0)
    batches = [batch(RESNET_BATCH, seed=0, model="resnet18")]
    probe = Probe(backend.strategies.REFERENCE, "resnet18", 1, dtype="float64")
    return w, batches, backend.train_steps(probe, w, batches, RESNET_LR)


def test_sync_batchnorm_makes_k_devices_one_device(backend, strategy, meta, request):
    """--bn sync: ResNet-18 on 2 devices takes the 1-device step (statistics over the global batch),
    proven in float64; per-device statistics (--bn local) give another step. A variant takes its siblings' local
    steps (test_strategies_agree_in_float64), so its local step is theirs and not run again."""
    if "sync" not in declared_bn_modes(meta, strategy):
        pytest.skip(f"{meta.name} {strategy} has no synchronised BatchNorm")
    w, batches, one = request.getfixturevalue("resnet_one_device_step")
    two = call(
        backend.train_steps,
        Probe(strategy, "resnet18", 2, bn="sync", dtype="float64"),
        w,
        batches,
        RESNET_LR,
    )
    assert relative(two, one) <= IDENTICAL
    if meta.strategies[strategy].variant:
        return
    local = call(
        backend.train_steps,
        Probe(strategy, "resnet18", 2, bn="local", dtype="float64"),
        w,
        batches,
        RESNET_LR,
    )
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
@pytest.mark.replicated
def test_running_statistics_follow_torchs_convention(backend, strategy, meta, k, bn):
    """After one step the stem BatchNorm's running mean and variance are torch's: momentum 0.1 and the
    unbiased batch variance, over each device's shard (local) or the global batch (sync). float64,
    against numpy; the biased variance (another framework's default) is far outside the tolerance."""
    if bn not in declared_bn_modes(meta, strategy):
        pytest.skip(f"{meta.name} {strategy} has no --bn {bn}")
    # statistics of a visible size
    w = he_scaled(backend.initial_weights("resnet18", 0), "resnet18")
    x, y = batch(RESNET_BATCH, model="resnet18")
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
    # the test can tell the two apart
    assert np.max(np.abs(biased - var)) > 1e4 * IDENTICAL * np.max(var)


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
    step compiled again). One device, a fresh worker process: the warm-up's compiles are this run's own.
    Only the strategies that compile without --compile (XLA's: jax's, Keras's distribution) run here: without it
    torch.compile's count (torch's strategies, Keras's ddp) is 0 by construction, so the run could not fail; the
    suite's --compile runs (tests/cross, torch's shared compile cache) hold torch.compile to its warm-up."""
    if backend.strategies.TRAINERS[strategy].compiles is Trainer.compiles:
        pytest.skip(f"{NAME} does not count what it compiles")
    if not compiles_without_the_lever(backend, strategy):
        pytest.skip(
            f"{NAME} {strategy} compiles only with --compile: its count here is 0 by construction"
        )
    overrides = {"strategy": strategy, "devices": 1, "epochs": 2, "timed_steps": 2}
    if reason := refused_here(backend, worker_config(**overrides)):
        pytest.skip(reason)  # torch's dp without CUDA
    rc, r = run_backend_worker(tmp_path, **overrides)
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["compiles"]["epochs"] == r["compiles"]["timed_steps"] == 0, r["compiles"]
    assert r["epoch_over_steps"] > 0 and r["compiles"]["warmup"] > 0, r["compiles"]
    # A planted fault, in this process: every epoch takes batches half the warm-up's, so the step compiles again
    # inside the first epoch, and the same count must say so.
    monkeypatch.setattr(datalib, "train_batches", halved_after_the_warm_up(datalib.train_batches))
    cfg = RunConfig.from_dict(
        {
            **r["config"],
            "epochs": 1,
            "timed_steps": 0,
            "lr": 0.0625,  # no other test's: the programs (shared ones are keyed by the rate) are compiled here
        }
    )
    with backend.session(cfg):
        planted = backend.train(cfg)
    assert planted["compiles"]["epochs"] > 0


def compiles_without_the_lever(backend, strategy: str) -> bool:
    """Whether `strategy` compiles every step whatever --compile says: its environment record calls the lever's
    compile inherent."""
    cfg = Probe(strategy, "lenet", 1, levers=Levers(compile=True)).config(NAME, BATCH, 0.5)
    return (backend.environment(cfg)["compile"] or "").startswith("inherent")


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


# ------------------------------------------------------------------------------------- the worker end to end


def refused_here(backend, cfg: dict) -> str | None:
    """Why the worker would refuse the run config `cfg` here, checked in this process before any worker starts
    (None: it runs)."""
    try:
        backend.check_supported(RunConfig.from_dict(cfg))
    except Unsupported as e:
        return str(e)
    return None


def runs_in_processes_of_its_own(backend, strategy: str) -> bool:
    """Whether `strategy` runs one process per device (its distributed.launch starts them), as the environment
    record of a 2-device run says."""
    return (
        backend.environment(Probe(strategy, "lenet", 2).config(NAME, BATCH, 0.5))["processes"] > 1
    )


def own_record(strategy: str) -> dict:
    """What this backend's environment record says of the worker run below, beside what every record says, by
    dotted key ("precision.tf32_matmul" is record["precision"]["tf32_matmul"])."""
    one_per_device = strategy in {"torch": ("ddp", "fsdp"), "keras": ("ddp",)}.get(NAME, ())
    return {
        "torch": {
            "processes": 2 if one_per_device else 1,
            "precision.tf32_matmul": False,
            "compile": None,
        },
        "jax": {"processes": 1, "precision.jax_default_matmul_precision": "highest"},
        "mxnet": {
            "processes": 1,
            "framework_version": "1.9.1",
            "threads_per_process": 1,  # --threads, which compat.py reads from the environment
            "details.hybridize": True,
            "details.kvstore": "device" if strategy == "gluon" else None,
            "compile": None,
            "levers.compile": False,
            "levers.resident_data": False,
            "levers.channels_last": False,
        },
        "keras": {
            "processes": 2 if one_per_device else 1,
            "libraries.keras_backend": "torch" if one_per_device else "jax",
        },
    }[NAME]


def entry(record: dict, dotted: str):
    for key in dotted.split("."):
        record = record[key]
    return record


def test_worker_trains_and_writes_a_complete_result(backend, strategy, tmp_path):
    """`python -m backends.<name>`: 2 epochs of LeNet on 2 devices, one thread per process, and a result with
    every part: the epochs (the loss falling), the environment record, the hashes, the warm-up, the timed steps,
    the allreduce of a buffer as large as the gradients, timed alone, the --profile steps' trace and breakdown,
    and the framework's matmul peak; and MLPerf's log from rank 0, here with a target no run reaches (1.0), so
    every rank trains both epochs and the run stops "aborted"."""
    overrides = {
        "strategy": strategy,
        "threads": 1,
        "timed_steps": 3,
        "profile": 2,
        "measure_peak": True,
        "target_accuracy": 1.0,
    }
    if reason := refused_here(backend, worker_config(**overrides)):
        pytest.skip(reason)  # torch's dp without CUDA
    rc, r = run_backend_worker(tmp_path, **overrides)
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["schema_version"] == SCHEMA_VERSION and r["params"] == 129_068
    assert [e["epoch"] for e in r["epochs"]] == [1, 2]
    assert all(e["steps"] == 4 and e["images"] == 64 for e in r["epochs"])
    assert r["epochs"][1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert all(0.0 <= e["test_acc"] <= 1.0 for e in r["epochs"])
    env = r["environment"]
    assert env["framework"] == NAME and len(env["devices"]) == 2
    assert {key: entry(env, key) for key in own_record(strategy)} == own_record(strategy)
    assert len(r["weights_hash"]) == 64 and len(r["data_hash"]) == 64
    assert r["compile_s"] > 0 and r["step_time"]["steps"] == 3
    assert r["allreduce"]["values"] == r["params"] and r["allreduce"]["bytes"] == 4 * r["params"]
    assert r["allreduce"]["repeats"] == 10 and r["allreduce"]["median_s"] > 0
    assert_profiled(r["profile"], tmp_path / "traces", r["environment"]["processes"])
    assert r["peak"]["tflops"]["float32"] > 0 and result_problem(r) is None
    assert r["target"] == {
        "accuracy": 1.0,
        "reached": False,
        "epoch": None,
        "train_s": None,
        "wall_s": None,
    }
    assert_mllog(tmp_path / "worker.log", r)


def assert_mllog(log, r: dict) -> None:
    """Rank 0's MLPerf log lines, once each: run_start, the two epochs, each evaluation's accuracy the result's,
    run_stop (the harness copies them into logs/<run>.mllog; tests/harness/test_mllog.py reads them with MLCommons'
    parser)."""
    records = [rec for rec in map(mllog.parse, log.read_text().splitlines()) if rec]
    keys = [rec["key"] for rec in records if not rec["key"].startswith(mllog.PREFIX)]
    assert keys[keys.index("run_start") :] == ["run_start"] + [
        "epoch_start",
        "epoch_stop",
        "eval_accuracy",
    ] * 2 + ["run_stop"], keys
    accuracies = [rec["value"] for rec in records if rec["key"] == "eval_accuracy"]
    assert accuracies == [e["test_acc"] for e in r["epochs"]]
    assert records[-1]["metadata"] == {"status": "aborted"}


def assert_profiled(profile: dict, folder, processes: int) -> None:
    """--profile 2: every rank wrote a trace; rank 0's parses into the breakdown the run recorded, which spans its
    steps within the stated margin and accounts for their wall time; the convolutions are in it."""
    assert profile["error"] is None and profile["steps"] == 2, profile
    traces = [p for p in folder.rglob("*.trace.json*") if p.is_file()]
    assert len(traces) == processes, traces
    again = profiling.breakdown(
        folder / profile["trace"],
        profiling.framework_ops(profile["framework"]),
        2 * profile["step_s"],
        2,
    )
    assert again["seconds"] == pytest.approx(profile["seconds"])
    assert profiling.coverage_problem(profile) is None, profile
    assert sum(profile["seconds"].values()) == pytest.approx(profile["step_s"])
    assert profile["seconds"]["conv_matmul"] + profile["seconds"]["fused"] > 0, profile


def test_worker_reports_divergence(backend, strategy, meta, tmp_path):
    """A loss that becomes inf or NaN (learning rate 1e30) ends the run as diverged, exit status 1, with the
    reason. The loop finds it (framework-free); a backend carries it out of the processes its strategy runs in, so
    it is proven for the first strategy, and for the first that runs in processes of its own if that is another."""
    strategies = list(meta.strategies)
    own = [s for s in strategies if runs_in_processes_of_its_own(backend, s)]
    proven = {strategies[0], *own[:1]}
    if strategy not in proven:
        pytest.skip(f"one strategy of each way of running proves it: {', '.join(sorted(proven))}")
    rc, r = run_backend_worker(tmp_path, strategy=strategy, lr=1e30, epochs=1)
    assert rc == 1 and r["status"] == "diverged"
    assert "training loss became" in r["error"]


# ------------------------------------------------------------------------------------- the speed levers

# Every value a lever takes (its flag's choices, common/levers.py); a switch takes True.
LEVER_VALUES = {
    **{
        f.name: f.metadata["flag"].choices
        for f in dataclasses.fields(Levers)
        if f.metadata["flag"].choices
    },
    "bucket_mb": (1,),
}
# The levers that leave the math alone (the batches placed earlier, the gradients grouped another way): they run
# in float64 too.
SAME_MATH = ("resident_data", "bucket_mb")
# The levers that change the math, each held to its own test (bf16 compute, bf16 gradients).
OWN_MATH = ("precision", "grad_dtype")
# What no backend runs on the CPU, whatever its backend.toml offers.
ON_THE_CPU = {("precision", "tf32"): TF32_ON_CPU}
# The levers whose steps TorchInductor may compile: its own C++, built with -march=native, which the portable pass's
# caps do not reach, so their float32 verdict is not marked `rounding`.
COMPILING = ("compile", "compile_mode")


def asking(lever: str, value) -> dict:
    """The levers of a run that asks `lever` at `value`: a compile mode needs --compile."""
    return {"compile": True, lever: value} if lever == "compile_mode" else {lever: value}


def expected_refusal(meta, lever: str, value) -> str | None:
    """Why a CPU run asking `lever` at `value` is unavailable, read from backend.toml and the CPU's own limits, not
    from the code that refuses it (None: it runs)."""
    if (lever, value) in ON_THE_CPU:
        return ON_THE_CPU[lever, value]
    declared = meta.levers[lever]
    offered = value in declared.values if declared.values is not None else not declared.refused
    if offered:
        return None
    assert declared.refused, f"backend.toml refuses {lever} {value} without saying why"
    flag = "--" + lever.replace("_", "-") + ("" if value is True else f" {value}")
    return f"{flag}: {declared.refused}"


def lever_strategy(backend, meta, lever: str) -> str:
    """The strategy a lever's tests run: the reference one, else the first that takes the lever on the CPU (bucket
    sizes and a compressed exchange are a distributed engine's)."""
    refused = dict(meta.levers[lever].strategies_refused)
    takers = [
        s
        for s in (backend.strategies.REFERENCE, *meta.strategies)
        if s not in refused and meta.strategies[s].requires != "cuda"
    ]
    return takers[0]


def running_values(meta, lever: str) -> list:
    return [v for v in LEVER_VALUES.get(lever, (True,)) if expected_refusal(meta, lever, v) is None]


def lever_steps(backend, strategy: str, levers: dict, dtype: str = "float32") -> dict:
    """One LeNet step of BATCH images on 2 devices with `levers`, unless they are refused (Unsupported)."""
    probe = Probe(strategy, "lenet", 2, dtype=dtype, levers=Levers(**levers))
    return backend.train_steps(probe, backend.initial_weights("lenet", 0), [batch()], 0.5)


def plain_steps(backend, strategy: str) -> tuple[dict, dict, dict]:
    """(start, its float32 step, its float64 step): lever_steps without a lever, both in one launch of the
    strategy's processes."""
    start = backend.initial_weights("lenet", 0)
    runs = [("trace", dtype, [batch()]) for dtype in ("float32", "float64")]
    fp32, fp64 = call(backend.run_probes, Probe(strategy, "lenet", 2), start, runs, 0.5)
    return start, fp32["final"], fp64["final"]


def assert_takes_the_float64_step(backend, strategy: str, levers: dict, stepped: dict) -> None:
    """`stepped`, the float32 step with `levers`, is as close to the float64 step as the plain float32 step is
    (measured here); with levers that backend.toml says change nothing on `strategy` (`changes_nothing`: Keras's
    models are NHWC whatever the flag; XLA compiles every step anyway), it is the plain step to the last bit."""
    _, plain, exact = plain_steps(backend, strategy)
    declared = manifest.load(NAME).levers
    if all(strategy in declared[lever].changes_nothing for lever in levers):
        assert bitwise_equal(stepped, plain), levers
    else:
        assert max_abs_diff(stepped, exact) <= float32_tolerance((plain, exact)), levers


# (a warning from inside TorchInductor)
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_each_value_of_a_lever_runs_or_is_refused_with_its_reason(backend, meta, lever):
    """Every value `lever` takes, on the reference strategy's 2 CPU devices, in this process (the worker runs them
    in test_the_worker_runs_every_lever_offered_here_and_records_it). A value backend.toml refuses is unavailable
    with exactly its declared reason (TF32 with the CPU's). One it offers takes a LeNet step that moves the weights
    (a compiled one as close to the float64 step as the eager float32 step; the others in the test below, which the
    portable pass runs again), is recorded in the environment as asked, and is refused in float64 with the dtype
    rule's reason unless it leaves the math alone (--resident-data and --bucket-mb take the plain float64 step).
    A lever the reference strategy does not take runs on the first that does (lever_strategy)."""
    strategy = lever_strategy(backend, meta, lever)
    start = backend.initial_weights("lenet", 0)
    for value in LEVER_VALUES.get(lever, (True,)):
        levers = asking(lever, value)
        if reason := expected_refusal(meta, lever, value):
            with pytest.raises(Unsupported) as refused:
                lever_steps(backend, strategy, levers)
            assert str(refused.value) == reason, value
            continue
        stepped = lever_steps(backend, strategy, levers)
        assert max_abs_diff(stepped, start) > 1e-3, value
        assert all(np.isfinite(v).all() for v in stepped.values()), value
        if lever in COMPILING:
            assert_takes_the_float64_step(backend, strategy, levers, stepped)
        cfg = Probe(strategy, "lenet", 2, levers=Levers(**levers)).config(NAME, BATCH, 0.5)
        # as asked (a compile mode is named in the record's `compile`, where the backend has modes)
        recorded = backend.environment(cfg)["levers"]
        asked = {k: v for k, v in levers.items() if k in recorded}
        assert {k: recorded[k] for k in asked} == asked
        if lever in SAME_MATH:
            exact = lever_steps(backend, strategy, {}, "float64")
            assert relative(lever_steps(backend, strategy, levers, "float64"), exact) <= IDENTICAL
        elif cfg.levers.on:  # (fp32: the plain step)
            with pytest.raises(Unsupported) as refused:
                lever_steps(backend, strategy, levers, "float64")
            rule = f"dtype float64 runs the plain step only, not {', '.join(cfg.levers.on)}"
            assert str(refused.value) == rule


@pytest.mark.rounding
def test_a_lever_takes_the_float64_step_within_float32_rounding(backend, meta, lever):
    """Every value of `lever` the backend runs here that computes in float32 (--channels-last, --resident-data): its
    step on the reference strategy is as close to the float64 step as the plain float32 step is, measured here (the
    same step, not other math); where backend.toml says it changes nothing, the plain step to the last bit.
    Precision changes the math (bf16: the test below); the compiled steps are held to the same in the test above,
    unmarked (COMPILING)."""
    if lever in OWN_MATH:
        pytest.skip(f"{lever} changes the math: its bf16 step is held to its own test")
    if lever in COMPILING:
        pytest.skip(f"{lever}: held to it in the test above, unmarked")
    values = [v for v in running_values(meta, lever) if v != PLAIN[lever]]
    if not values:
        pytest.skip(f"{NAME} runs no {lever} on the CPU")
    strategy = lever_strategy(backend, meta, lever)
    for levers in (asking(lever, value) for value in values):
        assert_takes_the_float64_step(
            backend, strategy, levers, lever_steps(backend, strategy, levers)
        )


# The steps the bf16 test compares, each computed with a (precision, dtype).
PRECISION_STEPS = {
    "fp32": ("fp32", "float32"),
    "fp64": ("fp32", "float64"),
    "bf16": ("bf16", "float32"),
}


def steps_in_each_precision(cfg: RunConfig, rank: int, payload) -> dict:
    """A job of one of the strategy's processes (distributed.launch): PRECISION_STEPS's steps from the same
    weights, so that a strategy of processes of its own starts them once."""
    backend, weights, batches = payload
    out = {}
    for name, (precision, dtype) in PRECISION_STEPS.items():
        run = cfg.with_levers(precision=precision).validate()
        with backend.computing_in(dtype):
            trainer = backend.make_trainer(run, weights, dtype)
            out[name] = PROBES["trace"](trainer, backendlib.as_dtype(batches, dtype))["final"]
    return out


@pytest.mark.rounding
def test_the_bf16_gradient_exchange_is_close_to_the_fp32_step_but_not_the_same(
    backend, meta, tmp_path
):
    """--grad-dtype bf16, where backend.toml offers it, on the first strategy that takes it: a run of LeNet on 2
    devices exchanges its gradients in bfloat16 (DDP's bf16_compress_hook, FSDP's reduce dtype, a bfloat16 psum)
    and updates in float32, and states what that changed: its result's `rounding` holds each of its first 3 steps'
    distance from a float32 exchange's (common/after_training.py). Not the same step: the first is further than
    100x the float32 exchange's own distance from the float64 step (measured here, from He-scaled weights as the
    bf16 compute test's). Close: within 4 bfloat16 roundings of the update (each rank's gradient rounded once,
    their sum once more)."""
    if reason := expected_refusal(meta, "grad_dtype", "bf16"):
        pytest.skip(reason)
    strategy = lever_strategy(backend, meta, "grad_dtype")
    start = he_scaled(backend.initial_weights("lenet", 0), "lenet")
    runs = [("trace", dtype, [batch()]) for dtype in ("float32", "float64")]
    fp32, fp64 = (
        trace["final"]
        for trace in backend.run_probes(Probe(strategy, "lenet", 2), start, runs, 0.5)
    )
    rc, r = run_backend_worker(
        tmp_path, strategy=strategy, epochs=1, timed_steps=0, grad_dtype="bf16"
    )
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["rounding"]["against"] == "grad_dtype=fp32"
    first, *later = r["rounding"]["steps"]
    assert len(later) == 2
    assert 100 * update_distance(start, fp32, fp64) < first <= 4 * BF16_EPSILON


@pytest.mark.rounding
@pytest.mark.replicated
def test_the_bf16_step_is_close_to_the_fp32_step_but_not_the_same(backend, meta, strategy):
    """--precision bf16, where backend.toml offers it, on every strategy: LeNet's 2-device step computes in bfloat16
    (torch's autocast, flax's dtype, Keras's mixed_bfloat16 policy) while the weights stay float32. Not the same
    step: it is further from the float64 step than 100x float32 rounding (measured here) can take one, so bfloat16
    really ran. Close: its update is within 4 bfloat16 roundings of the exact (float64) one, where other math would
    be off by the update's own size. From He-scaled weights, so that the update depends on the images: from d2l's
    (std 0.01) it is mostly the biases', which a forward pass on other inputs leaves alone."""
    if reason := expected_refusal(meta, "precision", "bf16"):
        pytest.skip(reason)
    cfg = Probe(strategy, "lenet", 2, levers=Levers(precision="bf16")).config(NAME, BATCH, 0.5)
    call(backend.check_supported, cfg)
    start = he_scaled(backend.initial_weights("lenet", 0), "lenet")
    with backend.session(cfg):
        job = (backend, start, [batch()])
        fp32, fp64, bf16 = backend.distributed.launch(cfg, steps_in_each_precision, job).values()
    assert {v.dtype for v in bf16.values()} == {np.dtype(np.float32)}
    assert max_abs_diff(fp32, start) > 1e-3
    assert max_abs_diff(bf16, fp64) > 100 * float32_tolerance((fp32, fp64))
    assert update_distance(start, bf16, fp64) <= 4 * BF16_EPSILON


def test_an_unknown_dtype_is_refused(backend):
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        lever_steps(backend, backend.strategies.REFERENCE, {}, "float16")


# The levers the worker run below leaves to another suite's worker runs: TorchInductor's compile runs end to end in
# tests/cross's --compile runs (the shared compile cache test, which holds it to its warm-up); here it would add half
# a minute of C++ build on a cold cache.
RUN_ELSEWHERE = {"torch": COMPILING}


def own_lever_record() -> dict:
    """What this backend's environment record says of the worker run below, beside its `levers`, by dotted key (as
    own_record's)."""
    return {
        "torch": {
            "precision.autocast": {"device_type": "cpu", "dtype": "bfloat16"},
            "precision.tf32_matmul": False,
            "precision.tf32_cudnn": False,
            "layout": "NHWC",
        },
        "jax": {
            "precision.dtype": "bfloat16",
            "precision.param_dtype": "float32",
            "compile": "inherent: jax.pmap / jax.jit compile every step whether or not --compile is given",
        },
        "mxnet": {
            "compile": "hybridize(static_alloc=True, static_shape=True), whatever the hybridize option",
            "details.hybridize": True,
            "details.static_alloc": True,
        },
        "keras": {
            "precision.dtype_policy": "mixed_bfloat16",
            "precision.variables_dtype": "float32",
            "compile": "inherent: the stateless train step is jax.jit-compiled whether or not --compile is "
            "given",
            "details.data_format": "channels_last",
            "layout": "NHWC",
        },
    }[NAME]


def test_the_worker_runs_every_lever_offered_here_and_records_it(backend, meta, tmp_path):
    """`python -m backends.<name>` on the reference strategy with every lever it offers on the CPU at once (but
    RUN_ELSEWHERE's), each at its last value that runs there (bf16 where offered, the last compile mode), one epoch
    of LeNet: it trains, and its result's environment records the levers as asked (the others as plain), the
    batches placed before the timer, and what the backend's own record says of them."""
    strategy = backend.strategies.REFERENCE
    levers = {
        lever: running_values(meta, lever)[-1]
        for lever in meta.levers
        if running_values(meta, lever)
        and lever not in RUN_ELSEWHERE.get(NAME, ())
        and lever_strategy(backend, meta, lever) == strategy
    }
    rc, r = run_backend_worker(
        tmp_path, strategy=strategy, epochs=1, timed_steps=0, threads=1, **levers
    )
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert np.isfinite(r["epochs"][0]["train_loss"])
    env = r["environment"]
    expected = {name: levers.get(name, PLAIN[name]) for name in env["levers"] if name in PLAIN}
    assert {name: env["levers"][name] for name in expected} == expected
    assert env["input_copies"].startswith("none timed")
    assert {key: entry(env, key) for key in own_lever_record()} == own_lever_record()


# ------------------------------------------------------------------------------------- how batches reach a step

# The three ways the loop feeds a step: numpy batches (the step copies each), each put --prefetch batches ahead of
# its step (trainer.put), or staged before the timer (--resident-data, trainer.stage).
FEEDS = {"numpy": {"prefetch": 0}, "ahead": {"prefetch": 2}, "staged": {"resident_data": True}}


def traces_of_each_feed(cfg: RunConfig, rank: int, payload) -> dict:
    """A job of one of the strategy's processes (distributed.launch): the float64 traces of the same steps from
    the same weights, fed each way (FEEDS)."""
    backend, weights, batches = payload
    traces = {}
    with backend.computing_in("float64"):
        for feed, levers in FEEDS.items():
            fed = cfg.with_levers(**levers).validate()
            traces[feed] = PROBES["trace"](backend.make_trainer(fed, weights, "float64"), batches)
    return traces


@pytest.mark.replicated
def test_prefetched_and_staged_batches_take_the_numpy_batches_steps_bit_for_bit(backend, strategy):
    """Batches put on the devices ahead of their step (--prefetch) or staged before it (--resident-data) take the
    steps numpy batches take, to the last bit: 3 LeNet steps on 2 devices in float64, their losses and weights.
    The three traces run in one launch of the strategy's processes."""
    cfg = Probe(strategy, "lenet", 2).config(NAME, BATCH, 0.5)
    call(backend.check_supported, cfg, "float64")
    weights = backend.initial_weights("lenet", 0)
    batches = [(x.astype(np.float64), y) for x, y in (batch(seed=s) for s in range(3))]
    with backend.session(cfg):
        traces = backend.distributed.launch(cfg, traces_of_each_feed, (backend, weights, batches))
    numpy_fed = traces["numpy"]
    assert max_abs_diff(numpy_fed["final"], weights) > 1e-3  # the steps really moved the weights
    for feed in ("ahead", "staged"):
        assert bitwise_equal(traces[feed]["final"], numpy_fed["final"]), feed
        assert traces[feed]["losses"] == numpy_fed["losses"], feed


# ------------------------------------------------------------------------------------- the step's two halves


def test_allreduce_seconds_gives_one_positive_time_per_repeat(backend, strategy):
    """The strategy's reduction of a 1000-value buffer, timed `repeats` times between barriers (what the worker
    reports). A strategy of processes of its own is timed in every worker run instead
    (test_worker_trains_and_writes_a_complete_result), as its trainer lives only inside them."""
    if runs_in_processes_of_its_own(backend, strategy):
        pytest.skip(
            f"{NAME} {strategy}'s trainer lives in its own processes; the worker run times it"
        )
    cfg = Probe(strategy, "lenet", 2).config(NAME, BATCH, 0.5)
    call(backend.check_supported, cfg)
    seconds = backend.make_trainer(cfg, backend.initial_weights("lenet", 0)).allreduce_seconds(
        1000, 4
    )
    assert len(seconds) == 4 and all(isinstance(s, float) and s > 0 for s in seconds)


def leaves(tree) -> list[np.ndarray]:
    """Every array of a nested mapping / list / tuple (a trainer's state), as numpy, in a fixed order."""
    if isinstance(tree, Mapping):
        return [a for key in sorted(tree) for a in leaves(tree[key])]
    if isinstance(tree, (list, tuple)):
        return [a for item in tree for a in leaves(item)]
    return [np.asarray(tree)]


def test_reduce_gradients_then_update_is_the_fused_step(backend, strategy, meta):
    """A strategy whose step() fuses reduce_gradients() and update() into one compiled call takes their steps:
    two ResNet-18 steps of 8 examples on 2 devices (float64) give the same handles, weights and state (every
    device's running statistics, the optimizer's), canonical_gradients() reads the kept gradients of the trainable
    parameters, and update() refuses to apply them twice. A variant on LeNet: its BatchNorm state is its siblings'
    (test_strategies_agree_in_float64), its own the weights' layout, which LeNet has too. Two compiled programs may
    order their sums differently on another CPU, so "the same" is float64's IDENTICAL, not bit for bit."""
    if backend.strategies.TRAINERS[strategy].step is Trainer.step:
        pytest.skip(f"{NAME} {strategy}'s step is the base's: reduce_gradients(), then update()")
    model, size, lr = (
        ("lenet", BATCH, 0.5)
        if meta.strategies[strategy].variant
        else ("resnet18", RESNET_BATCH, RESNET_LR)
    )
    cfg = Probe(strategy, model, 2).config(NAME, size, lr)
    weights = backend.initial_weights(model, 0)
    with backend.computing_in("float64"):
        fused, halves = (backend.make_trainer(cfg, weights, "float64") for _ in range(2))
        for x, y in (batch(size, seed=s, model=model) for s in range(2)):
            fused_loss, fused_correct = fused.collect([fused.step(x, y)])
            halves_loss, halves_correct = halves.collect([halves.reduce_gradients(x, y)])
            assert set(halves.canonical_gradients()) == set(architectures.trainable_names(model))
            halves.update()
            assert abs(halves_loss - fused_loss) <= IDENTICAL * abs(fused_loss)
            assert halves_correct == fused_correct
        with pytest.raises(RuntimeError, match="reduce_gradients"):
            halves.update()  # its gradients are applied already
        fused.sync()
        halves.sync()
        assert max_abs_diff(fused.canonical(), weights) > 1e-3
        assert relative(halves.canonical(), fused.canonical()) <= IDENTICAL
        # the whole state, as the trainer keeps it: every device's, the optimizer's
        if hasattr(fused, "state"):
            state = [dict(enumerate(leaves(t.state))) for t in (halves, fused)]
            assert all(a.dtype == np.float64 for a in state[0].values() if a.dtype.kind == "f")
            assert relative(*state) <= IDENTICAL


# ------------------------------------------------------------------------------------- several nodes


def _engines(meta) -> list[str]:
    return [s for s, spec in meta.strategies.items() if spec.engine]


def skip_another_backends_engine(meta, strategy: str) -> None:
    """A strategy whose nodes meet through another backend's engine (backend.toml's `engine_backend`: Keras's ddp
    starts and joins its ranks with torch's launcher) is proven across nodes in that backend's suite."""
    if other := meta.strategies[strategy].engine_backend:
        pytest.skip(f"{NAME} {strategy}'s nodes meet through {other}'s engine, proven in its suite")


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

    from harness.processes.envs import worker_env

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
        # the survivor's grace after node 1's failure, which it can only fail too (runner.FAILED_GRACE_ENV): 10 s
        # by default, 1 here (CI time)
        env=worker_env(DPBENCH_FAILED_NODE_GRACE_S="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline, log = time.monotonic() + 300, None
        while time.monotonic() < deadline and harness.poll() is None:
            # rank 0 reports the steps
            logs = glob.glob(str(out / ".tmp-*" / "logs" / "*node0.log"))
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
    assert headline.startswith("node 1 of 2 failed first: failed: worker killed by SIGKILL"), (
        result["error"][-600:]
    )
    assert headline in (report / "report.md").read_text()
    time.sleep(1)
    assert _survivors(str(out)) == []


def test_a_node_that_cannot_reach_the_coordinator_fails_naming_it(meta, tmp_path):
    """Node 1 of 2 alone, its coordinator refusing connections: the engine gives up within the run's timeout
    (it would wait forever or abort the process, left alone) and the result names the address it could not
    reach."""
    engines = _engines(meta)
    if not engines:
        pytest.skip(f"{NAME} has no strategy with a distributed engine")
    skip_another_backends_engine(meta, engines[0])
    address, timeout = f"127.0.0.1:{refused_port()}", 2
    job = worker_config(
        strategy=engines[0],
        epochs=1,
        timed_steps=2,
        nodes=2,
        node_rank=1,
        coordinator=address,
        timeout=timeout,
    )
    # start_nodes numbers its jobs from 0: node 1's config and result are node0's files
    ((code, output),) = finish(
        start_nodes(NAME, "--config", [job], tmp_path, ".result.json"), timeout + 60
    )
    result = json.loads((tmp_path / "node0.result.json").read_text())
    assert code != 0 and result["status"] == "failed", output[-2000:]
    unreachable = rf"could not reach the [^\n]*coordinator[^\n]* at {re.escape(address)}"
    assert re.search(unreachable, result["error"]), result["error"][-2000:]


# What a check job stores of one configuration (common/measurements.py): the first batch's loss and gradients,
# and the trace's first and final weights and every step's loss.
PARTS = ("loss", "grad", "first", "final", "losses")


def measured(arrays: dict, key: str) -> dict:
    """One configuration's measurements in a check job's arrays, by their name under `key` ("grad|fc1.bias")."""
    return {k[len(key) + 1 :]: v for k, v in arrays.items() if k.startswith(key + "|")}


def flat(loss: float, grads: dict, trace: dict) -> dict:
    """The same measurements from the equivalence API's (loss, gradients) and trace."""
    return {
        "loss": np.float64(loss),
        "losses": np.asarray(trace["losses"], np.float64),
        **{f"grad|{n}": g for n, g in grads.items()},
        **{f"first|{n}": v for n, v in trace["first"].items()},
        **{f"final|{n}": v for n, v in trace["final"].items()},
    }


def part(measurements: dict, name: str) -> dict:
    return {k: v for k, v in measurements.items() if k == name or k.startswith(name + "|")}


def probes_in(cfg: RunConfig, rank: int, payload) -> dict:
    """A job of one of the strategy's processes (distributed.launch): what a check job measures of `cfg`, in each
    of the payload's dtypes. One launch instead of one per probe keeps the test short."""
    backend, weights, batches, dtypes = payload
    out = {}
    for dtype in dtypes:
        typed = [(np.asarray(x, dtype), y) for x, y in batches]
        with backend.computing_in(dtype):
            loss, grads = PROBES["gradients"](backend.make_trainer(cfg, weights, dtype), typed)
            trace = PROBES["trace"](backend.make_trainer(cfg, weights, dtype), typed)
        out[dtype] = flat(loss, grads, trace)
    return out


@pytest.fixture(scope="session")
def lenet_on_two_nodes(backend, meta, tmp_path_factory):
    """A check job of every strategy with an engine, LeNet on 2 loopback nodes x 1 device: (weights, batches, lr,
    every node's arrays). One launch for them all (jax's pmap and sharding meet through one jax.distributed): a
    node's start and join is a third of its launch."""
    from tests.backends.nodes import measure_on_nodes, write_check_inputs

    tmp_path = tmp_path_factory.mktemp("two-nodes")
    weights, batches, lr = backend.initial_weights("lenet", 0), [batch(8, s) for s in range(3)], 0.1
    job = {
        "models": ["lenet"],
        "strategies": _engines(meta),
        "devices": [2],
        "bn": ["local"],
        "lr": lr,
        "device_kind": "cpu",
        "float64": False,
        **write_check_inputs(tmp_path, "lenet", weights, batches),
    }
    return weights, batches, lr, measure_on_nodes(NAME, job, 2, tmp_path, timeout=240)


def nodes_refuse_float64(backend, strategy: str) -> str | None:
    """Why the strategy's engine cannot run two nodes in float64 (MXNet's dist kvstore carries float32 only), or
    None."""
    try:
        backend.check_supported(
            Probe(strategy, "lenet", 2, nodes=NODE_0_OF_2).config(NAME, 8, 0.1), "float64"
        )
    except Unsupported as e:
        return str(e)
    return None


def two_nodes_and_one_process(backend, meta, strategy: str, request, dtypes: tuple) -> tuple:
    """The two-node check job's float32 and float64 measurements of `strategy` (their nodes stored the same
    values), one process's in `dtypes`, and the float64 reference on 1 device, from the same weights and batches."""
    if not meta.strategies[strategy].engine:
        pytest.skip(f"{NAME} {strategy} runs in one process")
    skip_another_backends_engine(meta, strategy)
    weights, batches, lr, nodes = request.getfixturevalue("lenet_on_two_nodes")
    assert all(bitwise_equal(node, nodes[0]) for node in nodes[1:])
    nodes32, nodes64 = (
        measured(nodes[0], f"lenet|{strategy}{s}|2|local") for s in ("", ":float64")
    )
    cfg = Probe(strategy, "lenet", 2).config(NAME, 8, lr)
    with backend.session(cfg):
        one_process = backend.distributed.launch(
            cfg, probes_in, (backend, weights, batches, dtypes)
        )
    one_device = flat(*backend.float64_reference("lenet", 1, weights, batches, lr))
    assert nodes32.keys() == one_device.keys()
    assert max_abs_diff({n: nodes32[f"final|{n}"] for n in weights}, weights) > 1e-3  # it trained
    for name in PARTS:
        assert relative(part(one_process["float64"], name), part(one_device, name)) <= IDENTICAL
    return nodes32, nodes64, one_process, one_device


def test_two_nodes_take_the_steps_of_one_process_and_of_one_device(
    backend, strategy, meta, request
):
    """A check job on 2 loopback nodes x 1 device, against 1 process x 2 devices and 1 device holding the whole
    batch: the loss, gradients, the weights after the first and the last step and every step's loss, in float64;
    every node stores the same values. Their float32 program is the one a process runs alone, whose distance from
    float64 the float32 tests hold; an engine that carries float32 only is held by the test below."""
    if reason := nodes_refuse_float64(backend, strategy):
        pytest.skip(reason)
    _, nodes64, _, one_device = two_nodes_and_one_process(
        backend, meta, strategy, request, ("float64",)
    )
    for name in PARTS:
        assert relative(part(nodes64, name), part(one_device, name)) <= IDENTICAL, name


@pytest.mark.rounding
def test_float32_only_nodes_are_as_close_to_one_process_as_float32_is_to_float64(
    backend, strategy, meta, request
):
    """An engine that carries float32 only (MXNet's dist kvstore, whose float64 run is refused with the reason):
    its two float32 nodes are as close to one process's float64 and float32 steps as float32 is to float64 in that
    process (measured here)."""
    if not nodes_refuse_float64(backend, strategy):
        pytest.skip(f"{NAME} {strategy}'s nodes run float64: the test above")
    nodes32, _, one_process, _ = two_nodes_and_one_process(
        backend, meta, strategy, request, ("float32", "float64")
    )
    tolerance = float32_tolerance((one_process["float32"], one_process["float64"]))
    assert max_abs_diff(nodes32, one_process["float64"]) <= tolerance
    assert max_abs_diff(nodes32, one_process["float32"]) <= tolerance


# Node 0 of 2, its coordinator never asked: a refusal comes before any engine starts.
NODE_0_OF_2 = NodeSpec(2, 0, "127.0.0.1:1")


def test_a_strategy_without_an_engine_refuses_several_nodes_before_joining(
    backend, strategy, meta, monkeypatch
):
    """--nodes 2 needs a strategy with a distributed engine (backend.toml's `engine`): one without is refused in
    one line naming those that have one, and no engine is joined. A strategy that has one is held to the same
    with its engine taken out of the manifest."""
    without = {
        **meta.strategies,
        strategy: dataclasses.replace(meta.strategies[strategy], engine=None),
    }
    monkeypatch.setattr(
        manifest, "load", lambda name: dataclasses.replace(meta, strategies=without)
    )
    joined = []
    monkeypatch.setattr(backend.distributed, "join", joined.append)
    engines = ", ".join(s for s, declared in without.items() if declared.engine) or "none"
    x, y = batch()
    with pytest.raises(Unsupported) as refused:
        probe = Probe(strategy, "lenet", 2, nodes=NODE_0_OF_2)
        backend.gradients(probe, backend.initial_weights("lenet", 0), x, y)
    assert str(refused.value) == (
        f"{NAME} {strategy} runs in one process; --nodes 2 needs a strategy with a distributed engine "
        f"({NAME}: {engines})"
    )
    assert joined == []
