"""MXNet-only behaviour: hybridize and the kvstore type change no numbers, BatchNorm statistics are
averaged before evaluation and follow torch's running-statistics rule in every layer, gradients() are the
ones a step applies, --bn sync is refused on several CPU contexts (with why), the worker (--bn,
--save-weights / --load-weights, --resident-data, --threads), a GPU request on a host without an MXNet
GPU build is reported as unavailable, and two nodes refuse a kvstore of one process. The speed levers:
batches are split_and_load-ed ahead (put, stage), --compile hybridizes statically; the allreduce figure's
reduction really sums, on both strategies and kvstore types. What every backend does, the levers' steps,
records and refusals (bf16, tf32, --channels-last) included, is proven in test_contract.py.

Identities of math are proven in float64 (dtype="float64", numerics.IDENTICAL); the one float32-only
path (the stock SGD kernel gluon's Trainer runs in float32) gets a tolerance measured in its test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.backend import Probe
from common.levers import Levers
from common.nodes import NodeSpec
from tests.backends.conftest import NAME, run_backend_worker
from tests.backends.numerics import IDENTICAL, float32_tolerance, max_abs_diff, relative, scale

pytestmark = pytest.mark.skipif(NAME != "mxnet", reason="mxnet backend only")
ROOT = Path(__file__).resolve().parents[2]


def batches(n_steps, size=12):
    out = []
    for seed in range(n_steps):
        rng = np.random.default_rng(seed)
        out.append(
            (
                rng.random((size, 1, 28, 28), dtype=np.float32),
                rng.integers(0, 10, size).astype(np.int32),
            )
        )
    return out


def steps(
    backend, strategy, k=2, n_steps=3, model="lenet", lr=0.5, dtype="float64", size=12, **options
):
    weights = backend.initial_weights(model, 0)
    probe = Probe(strategy, model, k, dtype=dtype, options=options)
    return weights, backend.train_steps(probe, weights, batches(n_steps, size), lr)


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_hybridized_and_imperative_take_the_same_step(backend, name):
    start, hybrid = steps(backend, name, hybridize="on")
    _, imperative = steps(backend, name, hybridize="off")
    assert max_abs_diff(hybrid, start) > 1e-3
    assert relative(imperative, hybrid) <= IDENTICAL


def test_both_kvstore_types_take_the_same_step(backend):
    start, device = steps(backend, "gluon", kvstore="device")
    _, local = steps(backend, "gluon", kvstore="local")
    assert max_abs_diff(device, start) > 1e-3
    assert relative(local, device) <= IDENTICAL


def gradients(backend, strategy, k=2, model="lenet", dtype="float64", **options):
    probe = Probe(strategy, model, k, dtype=dtype, options=options)
    return backend.gradients(probe, backend.initial_weights(model, 0), *batches(1)[0])


def test_both_kvstore_types_give_the_same_gradients(backend):
    _, device = gradients(backend, "gluon", kvstore="device")
    _, local = gradients(backend, "gluon", kvstore="local")
    assert scale(device) > 1e-3
    assert relative(local, device) <= IDENTICAL


def manual_sgd_step(start: dict, grads: dict, lr: float) -> dict:
    """w0 - lr * g in numpy, in the gradients' dtype (LeNet: every canonical entry is trained)."""
    return {k: start[k].astype(grads[k].dtype) - lr * grads[k] for k in grads}


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_a_step_applies_exactly_the_returned_gradients(backend, name):
    """LeNet has no running statistics: after one step, w1 = w0 - lr * gradients(w0), in float64.
    lr 0.1 and 1 / 12 are not float32 numbers, so an update whose step size went through float32
    (MXNet's stock sgd kernel, 1.4e-8 off here) fails this."""
    start, stepped = steps(backend, name, n_steps=1, lr=0.1)
    _, grads = gradients(backend, name)
    assert max_abs_diff(stepped, start) > 1e-3
    assert relative(stepped, manual_sgd_step(start, grads, 0.1)) <= IDENTICAL


@pytest.mark.rounding
@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_a_float32_step_applies_the_returned_gradients(backend, name):
    """The same in float32, where gluon's Trainer runs MXNet's own sgd kernel: within 3x the distance
    of each side from its float64 self."""
    start, stepped32 = steps(backend, name, n_steps=1, lr=0.1, dtype="float32")
    _, stepped64 = steps(backend, name, n_steps=1, lr=0.1)
    _, grads32 = gradients(backend, name, dtype="float32")
    _, grads64 = gradients(backend, name)
    manual32, manual64 = manual_sgd_step(start, grads32, 0.1), manual_sgd_step(start, grads64, 0.1)
    assert max_abs_diff(stepped32, start) > 1e-3
    assert max_abs_diff(stepped32, manual32) <= float32_tolerance(
        (stepped32, stepped64), (manual32, manual64)
    )


def make_trainer(
    backend, strategy, model, k, weights, batch_size, lr, dtype="float32", options=None, **levers
):
    """The trainer of an equivalence call's run config (common.backend.Probe.config), checked as the call
    checks it."""
    cfg = Probe(strategy, model, k, options=options or {}, levers=Levers(**levers)).config(
        "mxnet", batch_size, lr
    )
    backend.check_supported(cfg, dtype)
    return backend.make_trainer(cfg, weights, dtype)


def resnet_trainer(backend, strategy, batch_size):
    """A float64 ResNet-18 trainer on 2 devices."""
    weights = backend.initial_weights("resnet18", 0)
    return make_trainer(backend, strategy, "resnet18", 2, weights, batch_size, 0.1, "float64")


def test_canonical_running_statistics_are_the_mean_over_devices(backend):
    """canonical() (what --save-weights writes) averages the per-device running statistics, as
    evaluation does, without an evaluation first; for the first BatchNorm, whose input is the same
    on 1 and 2 devices, the mean of the shards' means is the batch mean: the 1-device value."""
    from backends.mxnet import models

    x, y = batches(1, size=4)[0]
    trainer = resnet_trainer(backend, "gluon", len(y))
    trainer.step(x, y)
    per_device = [
        a.asnumpy() for a in models.canonical_params(trainer.module)["bn.running_mean"].list_data()
    ]
    assert np.max(np.abs(per_device[0] - per_device[1])) > 1e-6  # each device saw its own shard
    two = trainer.canonical()["bn.running_mean"]
    assert relative({"m": two}, {"m": (per_device[0] + per_device[1]) / 2}) <= IDENTICAL
    _, one = steps(backend, "gluon", k=1, n_steps=1, model="resnet18", lr=0.1, size=4)
    assert relative({"m": two}, {"m": one["bn.running_mean"]}) <= IDENTICAL


@pytest.mark.parametrize(
    "name, reason",
    [
        ("gluon", "deadlocks on several CPU contexts"),  # SyncBatchNorm, in mxnet 1.9.1
        ("scratch", "separate network per context"),
    ],
)
def test_sync_batchnorm_is_refused_with_the_reason(backend, name, reason):
    from common.errors import Unsupported

    with pytest.raises(Unsupported, match=reason):
        backend.train_steps(
            Probe(name, "lenet", 2, bn="sync"), backend.initial_weights("lenet", 0), batches(1), 0.1
        )


def statistics_per_device(trainer) -> list[list[np.ndarray]]:
    """The BatchNorm running statistics each of the trainer's devices holds."""
    from backends.mxnet.models import running_statistics

    if hasattr(trainer, "replicas"):  # scratch: one network per device
        return [[p.data().asnumpy() for p in running_statistics(net)] for net in trainer.replicas]
    params = running_statistics(trainer.module)
    return [[p.list_data()[d].asnumpy() for p in params] for d in range(trainer.n_devices)]


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_batchnorm_statistics_are_averaged_across_devices_before_evaluation(backend, name):
    x, y = batches(1, size=4)[0]
    trainer = resnet_trainer(backend, name, len(y))
    trainer.step(x, y)
    before = statistics_per_device(trainer)
    # each device saw its own shard
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(*before)) > 1e-6
    correct, total = trainer.evaluate([(x, y)])
    after = statistics_per_device(trainer)
    assert total == 4 and 0 <= correct <= 4
    mean = dict(enumerate((b0 + b1) / 2 for b0, b1 in zip(*before)))
    for d in range(2):
        assert relative(dict(enumerate(after[d])), mean) <= IDENTICAL


def batchnorm_inputs(weights: dict, x: np.ndarray) -> dict[str, np.ndarray]:
    """{BatchNorm layer's canonical prefix: its input} in a float64 training-mode ResNet-18 forward of x
    (an imperative network with forward hooks; nothing is trained)."""
    from backends.mxnet import batchnorm, models
    from backends.mxnet.compat import mx

    from mxnet import autograd

    net = models.build("resnet18")
    net.initialize(ctx=mx.cpu())
    net.cast("float64")
    models.load_canonical(net, weights)
    names = {id(p): name for name, p in models.canonical_params(net).items()}
    inputs = {}
    for layer in batchnorm.layers(net):
        prefix = names[id(layer.running_var)].rpartition(".")[0]
        layer.register_forward_hook(
            lambda block, args, out, prefix=prefix: inputs.update({prefix: args[0].asnumpy()})
        )
    with autograd.train_mode():
        net(mx.nd.array(x, dtype="float64"))
    return inputs


def expected_running_statistics(
    weights: dict, per_shard: list[dict], ddof: int
) -> dict[str, np.ndarray]:
    """torch's rule for every BatchNorm layer after one step, per shard (its batchnorm_inputs), averaged
    over the shards: mean <- 0.9 mean + 0.1 batch mean, var <- 0.9 var + 0.1 batch variance (ddof 1:
    unbiased), in numpy float64."""
    expected = {}
    for prefix in per_shard[0]:
        old_mean, old_var = (
            weights[f"{prefix}.{s}"].astype(np.float64) for s in ("running_mean", "running_var")
        )
        expected[f"{prefix}.running_mean"] = np.mean(
            [0.9 * old_mean + 0.1 * inputs[prefix].mean(axis=(0, 2, 3)) for inputs in per_shard],
            axis=0,
        )
        expected[f"{prefix}.running_var"] = np.mean(
            [
                0.9 * old_var + 0.1 * inputs[prefix].var(axis=(0, 2, 3), ddof=ddof)
                for inputs in per_shard
            ],
            axis=0,
        )
    return expected


@pytest.mark.parametrize("hybridize", ["on", "off"])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_running_statistics_after_one_step_are_torchs(backend, name, k, hybridize):
    """Every BatchNorm layer's running mean and variance after one ResNet-18 step (2 images per device)
    follow torch's rule with the unbiased variance over the layer's own N*H*W (1568 values per channel
    in the stem, 32 in the last stage), averaged over the devices; float64, against numpy on each
    layer's input. MXNet's own (biased) update is 9e-4 (relative) away in the last stage."""

    weights = backend.initial_weights("resnet18", 0)
    x, y = batches(1, size=2 * k)[0]
    probe = Probe(name, "resnet18", k, dtype="float64", options={"hybridize": hybridize})
    got = backend.train_steps(probe, weights, [(x, y)], 0.1)
    per_shard = [batchnorm_inputs(weights, part) for part in np.split(x, k)]
    unbiased = expected_running_statistics(weights, per_shard, ddof=1)
    biased = expected_running_statistics(weights, per_shard, ddof=0)
    assert len(unbiased) == 2 * 17  # every BatchNorm layer of ResNet-18
    assert relative({key: got[key] for key in unbiased}, unbiased) <= IDENTICAL
    assert relative(biased, unbiased) > 1e4 * IDENTICAL  # the test tells the two rules apart


# ------------------------------------------------------------------ speed levers and the allreduce figure

REDUCTIONS = [("scratch", {}), ("gluon", {"kvstore": "device"}), ("gluon", {"kvstore": "local"})]


def lenet_trainer(backend, strategy, k=2, batch_size=12, options=None, **levers):
    return make_trainer(
        backend,
        strategy,
        "lenet",
        k,
        backend.initial_weights("lenet", 0),
        batch_size,
        lr=0.5,
        options=options,
        **levers,
    )


@pytest.mark.parametrize("name,options", REDUCTIONS)
def test_the_timed_allreduce_sums_over_the_contexts(backend, name, options):
    """The reduction allreduce_seconds times leaves the sum of the contexts' buffers on every context."""
    trainer = lenet_trainer(backend, name, k=3, options=options)
    reduce = trainer.allreduce_op(7)
    buffers = reduce.buffers
    assert [b.shape for b in buffers] == [(7,)] * 3 and all(b.dtype == np.float32 for b in buffers)
    for i, b in enumerate(buffers):
        b[:] = np.arange(7, dtype=np.float32) * (i + 1) + i  # sum: 6 * arange + 3
    reduce()
    trainer.sync()
    for b, ctx in zip(buffers, trainer.devs):
        assert b.context == ctx
        np.testing.assert_array_equal(b.asnumpy(), np.arange(7, dtype=np.float32) * 6 + 3)


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_compile_hybridizes_even_with_hybridize_off(backend, name):
    from backends.mxnet.environment import environment

    compiled = lenet_trainer(backend, name, options={"hybridize": "off"}, compile=True)
    imperative = lenet_trainer(backend, name, options={"hybridize": "off"})
    assert compiled.module._active is True and imperative.module._active is False
    assert all(net._active for net in getattr(compiled, "replicas", [compiled.module]))
    assert environment(compiled.cfg)["details"]["hybridize"] is True
    assert environment(compiled.cfg)["levers"]["compile"] is True
    assert environment(compiled.cfg)["compile"].startswith(
        "hybridize(static_alloc=True, static_shape=True)"
    )
    assert environment(imperative.cfg)["details"]["hybridize"] is False
    assert environment(imperative.cfg)["compile"] is None


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_compile_allocates_statically_and_still_evaluates_other_shapes(backend, name):
    """--compile (and so --best) is hybridize(static_alloc=True, static_shape=True); the hybridize option alone is the
    plain hybridize(). A static graph meets other shapes in evaluation (test batches of 12 and 5 after training on
    shards of 6) and training shapes again after it: its predictions and its next step are the plain graph's."""
    from backends.mxnet import models

    static = lenet_trainer(backend, name, compile=True)
    plain = lenet_trainer(backend, name, options={"hybridize": "on"})
    for net in getattr(static, "replicas", [static.module]):
        assert dict(net._flags)["static_alloc"] is True and dict(net._flags)["static_shape"] is True
    assert dict(plain.module._flags)["static_alloc"] is False
    (x, y), (x2, y2) = batches(2)
    for trainer in (static, plain):
        trainer.step(x, y)
    images = [x, x2[:5]]
    # labelled with the plain graph's predictions: the static graph scores all only if it predicts the same
    predicted = [
        plain.module(models.as_ndarray(t, plain.devs[0])).argmax(axis=1).asnumpy().astype(np.int64)
        for t in images
    ]
    assert static.evaluate(list(zip(images, predicted))) == (17, 17)
    for trainer in (static, plain):
        trainer.step(x2, y2)
    assert max_abs_diff(static.canonical(), plain.canonical()) == 0.0


def run_worker(tmp_path, **overrides) -> tuple[int, dict]:
    options = {"kvstore": "device", "hybridize": "on"}
    return run_backend_worker(tmp_path, **{"strategy": "gluon", "options": options, **overrides})


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_worker_reports_sync_batchnorm_as_unavailable(tmp_path, name):
    rc, r = run_worker(tmp_path, strategy=name, bn="sync", threads=1)
    assert rc == 1 and r["status"] == "unavailable"
    assert r["environment"]["batchnorm"].startswith("sync: gluon.contrib.nn.SyncBatchNorm")


def test_saved_weights_evaluate_to_the_accuracy_they_were_saved_with(tmp_path):
    """ResNet-18 on 2 devices (BatchNorm statistics per device): --save-weights writes what was
    evaluated, and a run with --load-weights and 0 epochs starts from it."""
    from common.weights import fingerprint, load

    saved = str(tmp_path / "w.npz")
    common = {
        "model": "resnet18",
        "train_size": 32,
        "test_size": 16,
        "threads": 1,
        "timed_steps": 0,
    }
    rc, trained = run_worker(tmp_path, epochs=1, save_weights=saved, **common)
    assert rc == 0 and trained["status"] == "ok", trained["error"]
    assert trained["saved_weights"]["path"] == saved
    rc, evaluated = run_worker(tmp_path, epochs=0, load_weights=saved, **common)
    assert rc == 0 and evaluated["status"] == "ok", evaluated["error"]
    assert evaluated["final_test_acc"] == trained["final_test_acc"]
    assert evaluated["weights_hash"] == fingerprint(load(saved)) != trained["weights_hash"]


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_worker_times_steps_and_the_allreduce_of_the_gradients(tmp_path, name):
    rc, r = run_worker(
        tmp_path, strategy=name, epochs=1, timed_steps=3, threads=1, resident_data=True
    )
    assert rc == 0 and r["status"] == "ok", r["error"]
    assert r["step_time"]["steps"] == 3
    # a buffer as large as the gradients: this suite's LeNet (conv 20/50, 800-128-10) has 129,068 parameters
    assert (
        r["allreduce"]["values"] == r["params"] == 129_068
        and r["allreduce"]["bytes"] == 4 * 129_068
    )
    assert r["allreduce"]["repeats"] == 10 and r["allreduce"]["median_s"] > 0
    assert r["environment"]["levers"]["resident_data"] is True


def test_gpu_request_is_unavailable_without_an_mxnet_gpu_build(tmp_path):
    from backends.mxnet.environment import visible_gpus

    if visible_gpus():
        pytest.skip("this MXNet build sees GPUs")
    rc, r = run_worker(tmp_path, device_kind="gpu", simulated=False)
    assert rc == 1 and r["status"] == "unavailable"
    assert "no MXNet GPU build can run here" in r["error"]
    assert r["environment"]["framework"] == "mxnet"


def test_train_steps_refuses_gpus_it_cannot_use(backend):
    from backends.mxnet.environment import visible_gpus
    from common.errors import Unsupported

    if visible_gpus():
        pytest.skip("this MXNet build sees GPUs")
    with pytest.raises(Unsupported, match="GPU"):
        backend.train_steps(
            Probe("gluon", "lenet", 1, device_kind="gpu"),
            backend.initial_weights("lenet", 0),
            batches(1),
            0.1,
        )


def test_threads_come_from_the_environment_variable_else_every_usable_core():
    """MXNet sizes its thread pools when imported: compat.py takes the run's --threads from THREADS_ENV
    (set by the harness), not from the command line."""
    from common.sysinfo import usable_cpus
    from common.worker import THREADS_ENV

    code = "from backends.mxnet.compat import THREADS; import os; print(THREADS, os.environ['OMP_NUM_THREADS'])"

    def threads(**env) -> str:
        caller = {k: v for k, v in os.environ.items() if k != THREADS_ENV}
        return subprocess.run(
            [sys.executable, "-c", code, "--config", "ignored.json"],
            cwd=ROOT,
            check=True,
            text=True,
            capture_output=True,
            env={**caller, "PYTHONPATH": str(ROOT), **env},
        ).stdout.split()

    assert threads(**{THREADS_ENV: "3"}) == ["3", "3"]
    assert threads() == [str(usable_cpus())] * 2


def test_numpy_aliases_mxnet_uses_are_there():
    import backends.mxnet  # noqa: F401  (restores them on numpy >= 1.24)

    assert np.bool is bool and np.object is object


# ------------------------------------------------------------------ prefetch; GPU only


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_put_and_stage_split_the_batch_onto_the_contexts(backend, name):
    """put() (--prefetch) and stage() (--resident-data) split_and_load a batch onto the contexts as its step
    takes it, in the trainer's dtype. (That such batches take the numpy batches' steps: test_contract.)"""
    from backends.mxnet.parallel import Shards

    trainer = lenet_trainer(backend, name, dtype="float64")
    ((x, y),) = batches(1)
    px, py = trainer.put(x, y)
    assert isinstance(px, Shards) and py.examples == 12 and [s.context for s in px] == trainer.devs
    np.testing.assert_array_equal(np.concatenate([s.asnumpy() for s in px]), x)
    staged = trainer.stage(batches(2))
    assert len(staged) == 2
    for sx, sy in staged:
        assert isinstance(sx, Shards) and isinstance(sy, Shards) and sy.examples == 12
        assert [s.context for s in sx] == [s.context for s in sy] == trainer.devs
        assert {s.dtype for s in sx} == {np.float64}


def test_fp32_keeps_tf32_off_in_the_cuda_libraries(backend):
    import os

    from common.config import RunConfig

    assert os.environ["NVIDIA_TF32_OVERRIDE"] == "0"
    cfg = RunConfig(
        backend="mxnet", strategy="gluon", devices=2, model="lenet", batch_size=8
    ).validate()
    env = backend.environment(cfg)
    assert env["precision"]["NVIDIA_TF32_OVERRIDE"] == "0"
    assert (
        env["input_copies"]
        == "2 batches ahead of their step: split_and_load onto the CPU contexts, queued on the engine"
    )


def mxnet_gpus() -> int:
    if NAME != "mxnet":
        return 0
    from backends.mxnet.environment import visible_gpus

    return visible_gpus()


needs_gpu = pytest.mark.skipif(mxnet_gpus() == 0, reason="needs an MXNet GPU build and a GPU")


@needs_gpu
@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_gpu_steps_from_pinned_memory_are_the_cpu_steps(backend, name):
    weights = backend.initial_weights("lenet", 0)
    k = min(2, mxnet_gpus())
    on_gpu = backend.train_steps(
        Probe(name, "lenet", k, device_kind="gpu", dtype="float64"), weights, batches(2), 0.5
    )
    on_cpu = backend.train_steps(Probe(name, "lenet", k, dtype="float64"), weights, batches(2), 0.5)
    assert relative(on_gpu, on_cpu) <= IDENTICAL


# ----------------------------------------------------------------------- Several nodes
# gluon runs on several nodes through a dist_sync kvstore (ps-lite: node 0 starts the scheduler, every node
# a server; backends/mxnet/distributed.py). Nodes here are loopback processes (tests/backends/nodes.py).


# Node 0 of 2, its coordinator never asked: the refusals come before any engine starts.
NODE_0_OF_2 = NodeSpec(2, 0, "127.0.0.1:1")


def test_float64_on_two_nodes_is_refused_as_the_kvstore_rounds_it(backend):
    from common.errors import Unsupported

    x, y = batches(1, size=8)[0]
    with pytest.raises(Unsupported, match="carries float32 only"):
        backend.gradients(
            Probe("gluon", "lenet", 2, dtype="float64", nodes=NODE_0_OF_2),
            backend.initial_weights("lenet", 0),
            x,
            y,
        )


def test_gluon_on_two_nodes_refuses_a_kvstore_of_one_process(backend, tmp_path):
    """Two nodes need the dist_sync kvstore: gluon with --option kvstore=device is refused, by a probe and by the
    worker, before any engine starts."""
    from common.errors import Unsupported

    reason = "needs kvstore 'dist_sync'"
    x, y = batches(1, size=8)[0]
    with pytest.raises(Unsupported, match=reason):
        probe = Probe("gluon", "lenet", 2, options={"kvstore": "device"}, nodes=NODE_0_OF_2)
        backend.gradients(probe, backend.initial_weights("lenet", 0), x, y)
    rc, r = run_backend_worker(
        tmp_path, strategy="gluon", options={"kvstore": "device"}, **NODE_0_OF_2.flat()
    )
    assert rc != 0 and r["status"] == "unavailable" and reason in r["error"]


def test_dist_sync_on_one_node_is_refused(tmp_path):
    rc, r = run_backend_worker(tmp_path, strategy="gluon", options={"kvstore": "dist_sync"})
    assert rc != 0 and r["status"] == "unavailable" and "needs several nodes" in r["error"]
