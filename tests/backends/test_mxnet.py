"""MXNet-only behaviour: scratch and gluon agree on several devices, hybridize and the kvstore
type change no numbers, BatchNorm statistics are averaged before evaluation and follow torch's
running-statistics rule in every layer, gradients() are the ones a step applies, --bn sync is
refused on several CPU contexts (with why), the worker end to end (--bn, --save-weights /
--load-weights), and a GPU request on a host without an MXNet GPU build is reported as unavailable.
The speed levers: a staged (--resident-data) step is the numpy step, --compile hybridizes, bf16 /
tf32 / --channels-last are refused; the allreduce figure's reduction really sums, on both strategies
and kvstore types.

Identities of math are proven in float64 (dtype="float64", numerics.IDENTICAL); the one float32-only
path (the stock SGD kernel gluon's Trainer runs in float32) gets a tolerance measured in its test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from common.backend import Probe
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


def steps(strategy, k=2, n_steps=3, model="lenet", lr=0.5, dtype="float64", size=12, **options):
    from backends.mxnet import initial_weights, train_steps

    weights = initial_weights(model, 0)
    probe = Probe(strategy, model, k, dtype=dtype, options=options)
    return weights, train_steps(probe, weights, batches(n_steps, size), lr)


def test_scratch_and_gluon_agree_after_three_steps_on_two_devices():
    start, scratch = steps("scratch")
    _, gluon = steps("gluon")
    assert max_abs_diff(scratch, start) > 1e-3
    assert relative(gluon, scratch) <= IDENTICAL


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_hybridized_and_imperative_take_the_same_step(name):
    start, hybrid = steps(name, hybridize="on")
    _, imperative = steps(name, hybridize="off")
    assert max_abs_diff(hybrid, start) > 1e-3
    assert relative(imperative, hybrid) <= IDENTICAL


def test_both_kvstore_types_take_the_same_step():
    start, device = steps("gluon", kvstore="device")
    _, local = steps("gluon", kvstore="local")
    assert max_abs_diff(device, start) > 1e-3
    assert relative(local, device) <= IDENTICAL


def gradients(strategy, k=2, model="lenet", dtype="float64", **options):
    from backends.mxnet import gradients as gradients_of
    from backends.mxnet import initial_weights

    probe = Probe(strategy, model, k, dtype=dtype, options=options)
    return gradients_of(probe, initial_weights(model, 0), *batches(1)[0])


def test_both_kvstore_types_give_the_same_gradients():
    _, device = gradients("gluon", kvstore="device")
    _, local = gradients("gluon", kvstore="local")
    assert scale(device) > 1e-3
    assert relative(local, device) <= IDENTICAL


def manual_sgd_step(start: dict, grads: dict, lr: float) -> dict:
    """w0 - lr * g in numpy, in the gradients' dtype (LeNet: every canonical entry is trained)."""
    return {k: start[k].astype(grads[k].dtype) - lr * grads[k] for k in grads}


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_a_step_applies_exactly_the_returned_gradients(name):
    """LeNet has no running statistics: after one step, w1 = w0 - lr * gradients(w0), in float64.
    lr 0.1 and 1 / 12 are not float32 numbers, so an update whose step size went through float32
    (MXNet's stock sgd kernel, 1.4e-8 off here) fails this."""
    start, stepped = steps(name, n_steps=1, lr=0.1)
    _, grads = gradients(name)
    assert max_abs_diff(stepped, start) > 1e-3
    assert relative(stepped, manual_sgd_step(start, grads, 0.1)) <= IDENTICAL


@pytest.mark.rounding
@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_a_float32_step_applies_the_returned_gradients(name):
    """The same in float32, where gluon's Trainer runs MXNet's own sgd kernel: within 3x the distance
    of each side from its float64 self."""
    start, stepped32 = steps(name, n_steps=1, lr=0.1, dtype="float32")
    _, stepped64 = steps(name, n_steps=1, lr=0.1)
    _, grads32 = gradients(name, dtype="float32")
    _, grads64 = gradients(name)
    manual32, manual64 = manual_sgd_step(start, grads32, 0.1), manual_sgd_step(start, grads64, 0.1)
    assert max_abs_diff(stepped32, start) > 1e-3
    assert max_abs_diff(stepped32, manual32) <= float32_tolerance(
        (stepped32, stepped64), (manual32, manual64)
    )


def test_dtype_is_checked():
    """An unknown dtype is an error; float64 runs the plain step (and staged batches), not --compile."""
    from backends.mxnet import gradients as gradients_of
    from backends.mxnet import initial_weights
    from common.errors import Unsupported

    w, (x, y) = initial_weights("lenet", 0), batches(1)[0]
    with pytest.raises(ValueError, match="unknown dtype"):
        gradients_of(Probe("scratch", "lenet", 1, dtype="float16"), w, x, y)
    with pytest.raises(Unsupported, match="compile"):
        gradients_of(Probe("gluon", "lenet", 1, dtype="float64", levers={"compile": True}), w, x, y)
    _, grads = gradients_of(
        Probe("gluon", "lenet", 1, dtype="float64", levers={"resident_data": True}), w, x, y
    )
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float64)}


def make_trainer(
    strategy, model, k, weights, batch_size, lr, dtype="float32", options=None, **levers
):
    """strategies.make_trainer on the run config of an equivalence call (common.backend.Probe.config)."""
    from backends.mxnet.strategies import make_trainer as make

    probe = Probe(strategy, model, k, options=options or {}, levers=levers)
    return make(probe.config("mxnet", batch_size, lr), weights, dtype)


def test_canonical_running_statistics_are_the_mean_over_devices():
    """canonical() (what --save-weights writes) averages the per-device running statistics, as
    evaluation does, without an evaluation first; for the first BatchNorm, whose input is the same
    on 1 and 2 devices, the mean of the shards' means is the batch mean: the 1-device value."""
    from backends.mxnet import initial_weights, models

    x, y = batches(1, size=4)[0]
    trainer = make_trainer(
        "gluon", "resnet18", 2, initial_weights("resnet18", 0), len(y), lr=0.1, dtype="float64"
    )
    trainer.step(x, y)
    per_device = [
        a.asnumpy() for a in models.canonical_params(trainer.module)["bn.running_mean"].list_data()
    ]
    assert np.max(np.abs(per_device[0] - per_device[1])) > 1e-6  # each device saw its own shard
    two = trainer.canonical()["bn.running_mean"]
    assert relative({"m": two}, {"m": (per_device[0] + per_device[1]) / 2}) <= IDENTICAL
    _, one = steps("gluon", k=1, n_steps=1, model="resnet18", lr=0.1, size=4)
    assert relative({"m": two}, {"m": one["bn.running_mean"]}) <= IDENTICAL


def test_sync_batchnorm_is_refused_on_several_cpu_contexts_with_the_reason():
    from backends.mxnet import initial_weights, train_steps
    from common.errors import Unsupported

    with pytest.raises(Unsupported, match="deadlocks on several CPU contexts"):
        train_steps(
            Probe("gluon", "lenet", 2, bn="sync"), initial_weights("lenet", 0), batches(1), 0.1
        )


def test_scratch_refuses_sync_batchnorm():
    from backends.mxnet import initial_weights, train_steps
    from common.errors import Unsupported

    with pytest.raises(Unsupported, match="separate network per context"):
        train_steps(
            Probe("scratch", "lenet", 2, bn="sync"), initial_weights("lenet", 0), batches(1), 0.1
        )


def statistics_per_device(trainer) -> list[list[np.ndarray]]:
    """The BatchNorm running statistics each of the trainer's devices holds."""
    from backends.mxnet.models import running_statistics

    if hasattr(trainer, "replicas"):  # scratch: one network per device
        return [[p.data().asnumpy() for p in running_statistics(net)] for net in trainer.replicas]
    params = running_statistics(trainer.module)
    return [[p.list_data()[d].asnumpy() for p in params] for d in range(trainer.n_devices)]


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_batchnorm_statistics_are_averaged_across_devices_before_evaluation(name):
    from backends.mxnet import initial_weights

    x, y = batches(1, size=4)[0]
    trainer = make_trainer(
        name, "resnet18", 2, initial_weights("resnet18", 0), len(y), lr=0.1, dtype="float64"
    )
    trainer.step(x, y)
    before = statistics_per_device(trainer)
    assert (
        max(float(np.max(np.abs(a - b))) for a, b in zip(*before)) > 1e-6
    )  # each device saw its own shard
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
def test_running_statistics_after_one_step_are_torchs(name, k, hybridize):
    """Every BatchNorm layer's running mean and variance after one ResNet-18 step (2 images per device)
    follow torch's rule with the unbiased variance over the layer's own N*H*W (1568 values per channel
    in the stem, 32 in the last stage), averaged over the devices; float64, against numpy on each
    layer's input. MXNet's own (biased) update is 9e-4 (relative) away in the last stage."""
    from backends.mxnet import initial_weights, train_steps

    weights = initial_weights("resnet18", 0)
    x, y = batches(1, size=2 * k)[0]
    probe = Probe(name, "resnet18", k, dtype="float64", options={"hybridize": hybridize})
    got = train_steps(probe, weights, [(x, y)], 0.1)
    per_shard = [batchnorm_inputs(weights, part) for part in np.split(x, k)]
    unbiased = expected_running_statistics(weights, per_shard, ddof=1)
    biased = expected_running_statistics(weights, per_shard, ddof=0)
    assert len(unbiased) == 2 * 17  # every BatchNorm layer of ResNet-18
    assert relative({key: got[key] for key in unbiased}, unbiased) <= IDENTICAL
    assert relative(biased, unbiased) > 1e4 * IDENTICAL  # the test tells the two rules apart


# ------------------------------------------------------------------ speed levers and the allreduce figure

REDUCTIONS = [("scratch", {}), ("gluon", {"kvstore": "device"}), ("gluon", {"kvstore": "local"})]


def lenet_trainer(strategy, k=2, batch_size=12, options=None, **levers):
    from backends.mxnet import initial_weights

    return make_trainer(
        strategy,
        "lenet",
        k,
        initial_weights("lenet", 0),
        batch_size,
        lr=0.5,
        options=options,
        **levers,
    )


@pytest.mark.parametrize("name,options", REDUCTIONS)
def test_allreduce_seconds_gives_one_time_per_repeat(name, options):
    seconds = lenet_trainer(name, options=options).allreduce_seconds(1000, 4)
    assert len(seconds) == 4
    assert all(isinstance(s, float) and 0 < s < 60 for s in seconds)


@pytest.mark.parametrize("name,options", REDUCTIONS)
def test_the_timed_allreduce_sums_over_the_contexts(name, options):
    """The reduction allreduce_seconds times leaves the sum of the contexts' buffers on every context."""
    trainer = lenet_trainer(name, k=3, options=options)
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
def test_a_staged_step_is_the_numpy_step(name):
    """--resident-data: batches split_and_load-ed ahead give the numpy batches' steps, loss and count
    (float64: staging keeps the trainer's dtype)."""
    from backends.mxnet.parallel import Shards

    data = batches(2)
    numpy_trainer, staged_trainer = (
        lenet_trainer(name, dtype="float64"),
        lenet_trainer(name, dtype="float64"),
    )
    staged = staged_trainer.stage(data)
    assert len(staged) == 2
    for x, y in staged:
        assert isinstance(x, Shards) and isinstance(y, Shards) and y.examples == 12
        assert [s.context for s in x] == [s.context for s in y] == staged_trainer.devs
    expected = [numpy_trainer.step(x, y) for x, y in data]
    got = [staged_trainer.step(x, y) for x, y in staged]
    assert numpy_trainer.collect(expected) == staged_trainer.collect(got)
    assert max_abs_diff(numpy_trainer.canonical(), lenet_trainer(name).canonical()) > 1e-3
    assert relative(staged_trainer.canonical(), numpy_trainer.canonical()) <= IDENTICAL


@pytest.mark.parametrize(
    "levers,flag",
    [
        ({"precision": "bf16"}, "--precision bf16"),
        ({"precision": "tf32"}, "--precision tf32"),
        ({"channels_last": True}, "--channels-last"),
    ],
)
def test_refused_levers_are_unsupported_with_the_declared_reason(meta, levers, flag):
    """The declared reason; tf32 on these CPU contexts meets the common rule first (common/levers.py)."""
    from common.errors import Unsupported
    from common.levers import TF32_ON_CPU

    lever = next(iter(levers))
    with pytest.raises(Unsupported) as refused:
        lenet_trainer("gluon", **levers)
    expected = (
        TF32_ON_CPU if levers == {"precision": "tf32"} else f"{flag}: {meta.levers[lever].refused}"
    )
    assert str(refused.value) == expected
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_compile_hybridizes_even_with_hybridize_off(name):
    from backends.mxnet.environment import environment

    compiled = lenet_trainer(name, options={"hybridize": "off"}, compile=True)
    imperative = lenet_trainer(name, options={"hybridize": "off"})
    assert compiled.module._active is True and imperative.module._active is False
    assert all(net._active for net in getattr(compiled, "replicas", [compiled.module]))
    assert environment(compiled.cfg)["details"]["hybridize"] is True
    assert environment(compiled.cfg)["levers"]["compile"] is True
    assert environment(compiled.cfg)["compile"].startswith("hybridize()")
    assert environment(imperative.cfg)["details"]["hybridize"] is False
    assert environment(imperative.cfg)["compile"] is None


def run_worker(tmp_path, **overrides) -> tuple[int, dict]:
    """The worker as the harness starts it: a run's --threads also in the environment (THREADS_ENV)."""
    from common.worker import THREADS_ENV

    options = {"kvstore": "device", "hybridize": "on"}
    with pytest.MonkeyPatch.context() as patch:
        if overrides.get("threads"):
            patch.setenv(THREADS_ENV, str(overrides["threads"]))
        return run_backend_worker(
            tmp_path, **{"strategy": "gluon", "options": options, **overrides}
        )


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_worker_trains_and_writes_a_complete_result(tmp_path, name):
    rc, r = run_worker(tmp_path, strategy=name, threads=1)
    assert rc == 0 and r["status"] == "ok", r["error"]
    from common.results import SCHEMA_VERSION

    assert r["schema_version"] == SCHEMA_VERSION and r["params"] == 129_068
    assert [e["epoch"] for e in r["epochs"]] == [1, 2]
    assert all(e["steps"] == 4 and e["images"] == 64 for e in r["epochs"])
    assert r["epochs"][1]["train_loss"] < r["epochs"][0]["train_loss"]
    assert all(0.0 <= e["test_acc"] <= 1.0 for e in r["epochs"])
    env = r["environment"]
    assert env["framework"] == "mxnet" and env["framework_version"] == "1.9.1"
    assert len(env["devices"]) == 2 and env["processes"] == 1 and env["threads_per_process"] == 1
    assert env["details"]["hybridize"] is True
    assert env["details"]["kvstore"] == ("device" if name == "gluon" else None)
    assert len(r["weights_hash"]) == 64 and len(r["data_hash"]) == 64
    assert r["compile_s"] > 0
    assert env["compile"] is None and env["levers"]["compile"] is False
    assert env["levers"]["resident_data"] is False and env["levers"]["channels_last"] is False
    assert r["step_time"]["steps"] == 20  # the default --timed-steps
    assert r["allreduce"]["values"] == r["params"] and r["allreduce"]["repeats"] == 10


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_worker_reports_sync_batchnorm_as_unavailable(tmp_path, name):
    rc, r = run_worker(tmp_path, strategy=name, bn="sync", threads=1)
    assert rc == 1 and r["status"] == "unavailable"
    assert r["environment"]["batchnorm"].startswith("sync: gluon.contrib.nn.SyncBatchNorm")


def test_worker_reports_a_refused_lever_as_unavailable(tmp_path):
    rc, r = run_worker(tmp_path, precision="bf16", threads=1)
    assert rc == 1 and r["status"] == "unavailable"
    assert r["error"].startswith("--precision bf16: mxnet runs float32 only here")


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


def test_train_steps_refuses_gpus_it_cannot_use():
    from backends.mxnet import initial_weights, train_steps
    from backends.mxnet.environment import visible_gpus
    from common.errors import Unsupported

    if visible_gpus():
        pytest.skip("this MXNet build sees GPUs")
    with pytest.raises(Unsupported, match="GPU"):
        train_steps(
            Probe("gluon", "lenet", 1, device_kind="gpu"),
            initial_weights("lenet", 0),
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


def trace_with(strategy, **levers):
    from backends.mxnet import initial_weights, train_trace

    weights = initial_weights("lenet", 0)
    return weights, train_trace(
        Probe(strategy, "lenet", 2, dtype="float64", levers=levers), weights, batches(3), 0.5
    )


@pytest.mark.parametrize("name", ["scratch", "gluon"])
def test_prefetched_batches_take_the_same_steps_bit_for_bit(name):
    """--prefetch puts each batch onto the contexts ahead of its step (trainer.put); the steps and their losses
    are the numpy batches', to the last bit (float64)."""
    start, plain = trace_with(name, prefetch=0)
    _, ahead = trace_with(name, prefetch=2)
    assert max_abs_diff(plain["final"], start) > 1e-3
    assert all(np.array_equal(ahead["final"][k], plain["final"][k]) for k in plain["final"])
    assert ahead["losses"] == plain["losses"]


def test_put_splits_the_batch_onto_the_contexts():
    from backends.mxnet.parallel import Shards

    trainer = lenet_trainer("gluon")
    ((x, y),) = batches(1)
    px, py = trainer.put(x, y)
    assert isinstance(px, Shards) and py.examples == 12 and [s.context for s in px] == trainer.devs
    np.testing.assert_array_equal(np.concatenate([s.asnumpy() for s in px]), x)


def test_fp32_keeps_tf32_off_in_the_cuda_libraries():
    import os

    from backends.mxnet import environment
    from common.config import RunConfig

    assert os.environ["NVIDIA_TF32_OVERRIDE"] == "0"
    cfg = RunConfig(
        backend="mxnet", strategy="gluon", devices=2, model="lenet", batch_size=8
    ).validate()
    env = environment(cfg)
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
def test_gpu_steps_from_pinned_memory_are_the_cpu_steps(name):
    from backends.mxnet import initial_weights, train_steps

    weights = initial_weights("lenet", 0)
    k = min(2, mxnet_gpus())
    on_gpu = train_steps(
        Probe(name, "lenet", k, device_kind="gpu", dtype="float64"), weights, batches(2), 0.5
    )
    on_cpu = train_steps(Probe(name, "lenet", k, dtype="float64"), weights, batches(2), 0.5)
    assert relative(on_gpu, on_cpu) <= IDENTICAL


# ----------------------------------------------------------------------- Several nodes
# gluon runs on several nodes through a dist_sync kvstore (ps-lite: node 0 starts the scheduler, every node
# a server; backends/mxnet/distributed.py). Nodes here are loopback processes (tests/backends/nodes.py).


def node_job(tmp_path, strategy, weights, data) -> dict:
    from tests.backends.nodes import write_check_inputs

    return {
        "models": ["lenet"],
        "strategies": [strategy],
        "devices": [2],
        "bn": ["local"],
        "lr": 0.1,
        "device_kind": "cpu",
        "float64": False,
        **write_check_inputs(tmp_path, "lenet", weights, data),
    }


def probe(strategy, k, weights, data, dtype) -> dict:
    """What a check job stores for one configuration (common/measurements.py's keys), in this process."""
    from backends.mxnet import gradients, train_trace

    loss, grads = gradients(Probe(strategy, "lenet", k, dtype=dtype), weights, *data[0])
    trace = train_trace(Probe(strategy, "lenet", k, dtype=dtype), weights, data, 0.1)
    return {
        "loss": np.float64(loss),
        "losses": np.asarray(trace["losses"]),
        **{f"grad|{n}": g for n, g in grads.items()},
        **{f"first|{n}": v for n, v in trace["first"].items()},
        **{f"final|{n}": v for n, v in trace["final"].items()},
    }


def stored(arrays: dict, strategy: str, dtype: str) -> dict:
    prefix = f"lenet|{strategy}{':float64' if dtype == 'float64' else ''}|2|local|"
    return {k[len(prefix) :]: v for k, v in arrays.items() if k.startswith(prefix)}


@pytest.mark.rounding
def test_gluon_on_two_nodes_is_the_one_process_step(tmp_path):
    """2 nodes x 1 device (dist_sync) against 1 process x 2 devices and 1 device with the whole batch: loss,
    gradients, the weights after the first and last step, every step's loss; every node stores the same.
    mxnet's dist kvstore carries float32 only (strategies.DIST_FLOAT64), so the 2-node run is float32 and its
    float64 run is refused: it is held to the in-process float64 runs (proven IDENTICAL to each other) within
    the float32 tolerance measured from the in-process (float32, float64) pair."""
    from backends.mxnet import initial_weights
    from tests.backends.nodes import measure_on_nodes

    weights, data = initial_weights("lenet", 0), batches(3, size=8)
    nodes = measure_on_nodes(
        "mxnet", node_job(tmp_path, "gluon", weights, data), 2, tmp_path, timeout=240
    )
    two_nodes = stored(nodes[0], "gluon", "float32")
    assert two_nodes and not stored(
        nodes[0], "gluon", "float64"
    )  # float64 refused, with the reason
    for other in nodes[1:]:
        assert max_abs_diff(stored(other, "gluon", "float32"), two_nodes) == 0
    one_process = {
        dtype: probe("gluon", 2, weights, data, dtype) for dtype in ("float32", "float64")
    }
    one_device = probe("gluon", 1, weights, data, "float64")
    assert two_nodes.keys() == one_device.keys()
    assert max_abs_diff({n: two_nodes[f"final|{n}"] for n in weights}, weights) > 1e-4  # it trained
    assert relative(one_process["float64"], one_device) <= IDENTICAL
    tolerance = float32_tolerance((one_process["float32"], one_process["float64"]))
    assert max_abs_diff(two_nodes, one_process["float64"]) <= tolerance
    assert max_abs_diff(two_nodes, one_process["float32"]) <= tolerance


# Node 0 of 2, its coordinator never asked: the refusals come before any engine starts.
NODE_0_OF_2 = {"nodes": 2, "node_rank": 0, "coordinator": "127.0.0.1:1"}


def test_float64_on_two_nodes_is_refused_as_the_kvstore_rounds_it():
    from backends.mxnet import gradients, initial_weights
    from common.errors import Unsupported

    x, y = batches(1, size=8)[0]
    with pytest.raises(Unsupported, match="carries float32 only"):
        gradients(
            Probe("gluon", "lenet", 2, dtype="float64", levers=NODE_0_OF_2),
            initial_weights("lenet", 0),
            x,
            y,
        )


def node_run(tmp_path, rank, coordinator, **overrides) -> dict:
    cfg = {
        "backend": "mxnet",
        "strategy": "gluon",
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
        "timeout": 120,
        **overrides,
    }
    return cfg


def test_a_node_without_its_coordinator_fails_naming_the_address(tmp_path):
    from tests.backends.nodes import finish, refused_port, start_nodes

    coordinator = f"127.0.0.1:{refused_port()}"
    procs = start_nodes(
        "mxnet", "--config", [node_run(tmp_path, 1, coordinator, timeout=6)], tmp_path, ".json"
    )
    # (start_nodes numbers its files from 0: this one node of rank 1 writes node0.json)
    [(code, output)] = finish(procs, timeout=6 + 60)
    result = json.loads((tmp_path / "node0.json").read_text())
    assert code != 0 and result["status"] == "failed", output[-2000:]
    assert (
        f"could not reach the coordinator (ps-lite scheduler) at {coordinator}" in result["error"]
    )


@pytest.mark.parametrize(
    "overrides, reason",
    [
        (
            {"strategy": "scratch"},
            "--nodes 2 needs a strategy with a distributed engine",
        ),
        ({"strategy": "gluon", "options": {"kvstore": "device"}}, "needs kvstore 'dist_sync'"),
    ],
)
def test_two_nodes_are_refused_without_the_engine(tmp_path, overrides, reason):
    from backends.mxnet import gradients, initial_weights
    from common.errors import Unsupported

    x, y = batches(1, size=8)[0]
    with pytest.raises(Unsupported, match=reason):
        probe = Probe(
            overrides["strategy"], "lenet", 2, options=overrides.get("options"), levers=NODE_0_OF_2
        )
        gradients(probe, initial_weights("lenet", 0), x, y)
    rc, r = run_backend_worker(tmp_path, **overrides, nodes=2, coordinator="127.0.0.1:1")
    assert rc != 0 and r["status"] == "unavailable" and reason in r["error"]


def test_dist_sync_on_one_node_is_refused(tmp_path):
    rc, r = run_backend_worker(tmp_path, strategy="gluon", options={"kvstore": "dist_sync"})
    assert rc != 0 and r["status"] == "unavailable" and "needs several nodes" in r["error"]
