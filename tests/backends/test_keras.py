"""Keras-only behaviour: why the models use their own mean and product layers (Keras's promotion drops float64),
the float64 math of distribution against the torch backend's, the data format (channels_last), ddp's torch.compile
and bf16's mixed_bfloat16 dtype policy, what ddp and distribution refuse, and the environment record of each
(Keras on torch in ddp's ranks, on jax in distribution's process).

Identities are proven in float64 (numerics.IDENTICAL); ddp's compiled step is judged against the float32 rounding
measured in the same test. The contract tests (test_contract.py) cover the rest: k devices against one,
synchronised BatchNorm, torch's running statistics, the gradient of the mean loss, the fused step, the levers'
steps, records and refusals, the worker end to end."""

from __future__ import annotations

import numpy as np
import pytest

from common.backend import Probe
from common.levers import Levers
from tests.backends.conftest import NAME
from tests.backends.numerics import (
    IDENTICAL,
    float32_tolerance,
    max_abs_diff,
    relative,
)

pytestmark = pytest.mark.skipif(NAME != "keras", reason="keras backend only")


def batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((n, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, n).astype(np.int32)


def in_float64(weights: dict) -> dict:
    return {k: v.astype(np.float64) for k, v in weights.items()}


# ------------------------------------------------------------------ float64: why the own layers, and the proof


def test_kerases_own_mean_computes_float64_in_float32_and_the_models_layers_do_not():
    """Keras 3's dtype promotion makes ops.mean of float64 values compute in float32 (and cast the result back to
    float64) outside TensorFlow (models.py): the stock GlobalAveragePooling2D and BatchNormalization would make a
    float64 run float32 halfway. The models' mean is float64's."""
    from backends.keras import models  # (first: it chooses Keras's framework)
    from backends.keras.environment import computing_in

    keras = models.keras
    x, _ = batch(4)
    exact = np.mean(x.astype(np.float64), axis=(2, 3), keepdims=True)
    with computing_in("float64"):
        values = keras.ops.convert_to_tensor(x.astype(np.float64))
        stock = keras.ops.convert_to_numpy(keras.ops.mean(values, axis=(2, 3), keepdims=True))
        ours = keras.ops.convert_to_numpy(models._mean(values, (2, 3)))
    assert stock.dtype == ours.dtype == np.float64
    # float32's digits (2 ** -24 ~ 6e-8 of each mean)
    assert np.max(np.abs(stock - exact)) > 10 * IDENTICAL
    assert np.max(np.abs(ours - exact)) <= IDENTICAL


@pytest.mark.parametrize("model", ["lenet", "resnet18"])
def test_float64_gradients_are_the_torch_backends(backend, model):
    """One 8-image batch on one device: the loss and every gradient of Keras on jax equal the torch backend's float64
    ones (torch.nn modules, the reference) to float64 rounding. (Keras on torch, ddp, takes distribution's float64
    steps: test_contract's test_strategies_agree_in_float64.)"""
    from backends.torch import BACKEND as reference

    w = in_float64(backend.initial_weights(model, 0))
    x, y = batch(8)
    loss, grads = backend.gradients(Probe("distribution", model, 1, dtype="float64"), w, x, y)
    ref_loss, ref_grads = reference.float64_gradients(model, w, x, y)
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float64)}
    assert abs(loss - ref_loss) <= IDENTICAL * abs(ref_loss)
    assert relative(grads, ref_grads) <= IDENTICAL


# ------------------------------------------------------------------ the data format, ddp's compile, the bf16 policy


def test_the_models_are_channels_last(backend):
    """Keras's models are NHWC, its own default data format (whatever --channels-last says: test_contract's lever
    tests take the plain step with it). ResNet-18 built NHWC takes the canonical weights: a layer that took the wrong
    axis for the channels (BatchNorm, padding, pooling) would give a weight of another shape, which load_canonical
    refuses."""
    from backends.keras import models

    resnet = models.build("resnet18")
    assert resnet.input_shape == (None, None, None, 1) and resnet.output_shape == (None, 10)
    models.load_canonical(resnet, backend.initial_weights("resnet18", 0))


def test_distribution_queues_few_steps_ahead_of_simulated_devices(backend, monkeypatch):
    """XLA's CPU client can deadlock with many collective steps queued (backends/xla.py): the distribution
    trainer on simulated devices waits for the step CPU_STEPS_AHEAD back before it queues another. The oldest
    steps are waited for, in order, and ready: a queue that dropped them without waiting would keep its length."""
    import jax

    from backends import xla

    waited = []
    wait = jax.block_until_ready
    monkeypatch.setattr(
        jax, "block_until_ready", lambda outputs: waited.append(outputs) or wait(outputs)
    )
    cfg = Probe("distribution", "lenet", 2).config("keras", 8, 0.5)
    t = backend.make_trainer(cfg, backend.initial_weights("lenet", 0), "float32")
    x, y = batch(8)
    metrics = [t.step(x, y) for _ in range(xla.CPU_STEPS_AHEAD + 3)]
    assert len(t._queued) == xla.CPU_STEPS_AHEAD
    assert [i for w in waited for i, m in enumerate(metrics) if m is w] == [0, 1, 2]
    assert all(leaf.is_ready() for m in metrics[:3] for leaf in jax.tree.leaves(m))


# Not marked `rounding`: TorchInductor compiles its own C++ with -march=native, which the portable caps do not reach.
# inside inductor
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_ddp_compiled_step_is_as_close_to_the_float64_step_as_the_eager_one(backend):
    """--compile on ddp: torch.compile of the DDP-wrapped Keras model (a float32 lever), on 1 device: the program is
    each rank's own, so a second rank would compile the same one again. Keras's own: test_contract's lever tests
    compile its reference strategy, distribution, whose step XLA compiles whatever the flag."""
    start, batches = backend.initial_weights("lenet", 0), [batch(8)]
    runs = [("trace", dtype, batches) for dtype in ("float32", "float64")]  # in one launch
    eager, exact = (
        t["final"] for t in backend.run_probes(Probe("ddp", "lenet", 1), start, runs, 0.5)
    )
    compiled = backend.train_steps(
        Probe("ddp", "lenet", 1, levers=Levers(compile=True)), start, batches, 0.5
    )
    assert max_abs_diff(eager, start) > 1e-3
    assert max_abs_diff(compiled, exact) <= float32_tolerance((eager, exact))


def test_bf16_policy_computes_in_bfloat16_and_keeps_variables_float32():
    from backends.keras import models  # (first: it chooses Keras's framework)

    keras = models.keras
    model = models.build("resnet18", policy=models.policy("bf16", "float32"))
    assert {v.dtype for v in model.variables} == {"float32"}
    assert model(np.zeros((2, 28, 28, 1), np.float32), training=False).dtype == "bfloat16"
    assert keras.config.floatx() == "float32"


# ------------------------------------------------------------------ ddp's step: nothing between host and device

# Run by Keras on torch in its own process (this one's Keras is on jax): the aten ops of one BatchNorm call, forward
# and backward, that make a tensor of a host value or read one back to the host. On a GPU each is a copy between
# host and device that waits (torch.as_tensor of a Python number: aten.lift_fresh), in every BatchNorm of every step.
HOST_OPS_ON_TORCH = """
import collections, json
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from backends.keras import models
from backends.keras.models import keras

torch.set_num_threads(1)
HOST = ("aten.lift_fresh", "aten.lift_fresh_copy", "aten.scalar_tensor", "aten._local_scalar_dense", "aten.item")

class Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = collections.Counter()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))

def host(ops):
    return {name: n for name, n in ops.seen.items() if name in HOST}

out = {}
for dtype, groups in (("float32", 2), ("float64", 1)):
    layer = models.BatchNorm(groups=groups, axis=-1, dtype=dtype)
    x = torch.from_numpy(np.random.default_rng(0).random((4, 3, 3, 5))).to(getattr(torch, dtype))
    layer.build(x.shape)
    for training in (True, False):
        inputs = x.clone().requires_grad_(training)
        with Ops() as ops:
            y = layer(inputs, training=training)
            if training:
                y.sum().backward()
        out[f"{dtype}-{'train' if training else 'eval'}"] = [host(ops), sum(ops.seen.values())]
with Ops() as ops:  # what is counted: a Keras op on a Python number makes a tensor of it
    keras.ops.multiply(x, 0.5)
out["control"] = [host(ops), sum(ops.seen.values())]
print(json.dumps(out))
"""


def test_ddps_batchnorm_moves_nothing_between_host_and_device():
    """ddp's BatchNorm (Keras on torch) makes no tensor of a Python number and reads nothing back, in training
    (forward and backward, its running statistics updated) or evaluation: its numbers meet torch's tensors
    through torch's operators, never a Keras op or a Keras variable's operator (models.BatchNorm._normalize).
    Each such op was a blocking copy on a GPU: 34 a ResNet-18 step, two per BatchNorm."""
    import json
    import subprocess
    import sys

    from harness.processes.envs import worker_env
    from tests.backends.conftest import ROOT

    proc = subprocess.run(
        [sys.executable, "-c", HOST_OPS_ON_TORCH],
        cwd=ROOT,
        env=worker_env(KERAS_BACKEND="torch"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert counts.pop("control")[0] == {"aten.lift_fresh": 1}
    assert {call: host for call, (host, _) in counts.items()} == dict.fromkeys(counts, {})
    assert all(total >= 5 for _, total in counts.values())  # (the mode saw the layer's ops)


# ------------------------------------------------------------------ refusals and the environment record


def test_what_each_strategy_refuses_and_why(backend):
    from common.config import RunConfig
    from common.errors import Unsupported

    def refused(**kw):
        with pytest.raises(Unsupported) as e:
            backend.check_supported(
                RunConfig.from_dict({"backend": "keras", "devices": 2, **kw}).validate()
            )
        return str(e.value)

    assert "Keras's `synchronized` BatchNormalization is TensorFlow's only" in refused(
        strategy="ddp", bn="sync"
    )
    assert "32 CPU devices requested" in refused(strategy="distribution", devices=32, batch_size=32)


def test_ddp_ranks_import_keras_themselves_on_a_gpu():
    """On a GPU, Keras imported in the ranks' forkserver initialises CUDA there, and every rank forked from it
    fails ("Cannot re-initialize CUDA in forked subprocess", as on an H200): only a CPU run preloads it."""
    from backends.keras.distributed import preloaded
    from common.config import RunConfig

    def ddp(kind):
        return RunConfig(backend="keras", strategy="ddp", devices=1, device_kind=kind)

    assert preloaded(ddp("cpu")) == ("keras",) and preloaded(ddp("gpu")) == ()


def test_environment_records_the_framework_under_keras(backend):
    """ddp computes on torch in its ranks, with Keras's mixed_bfloat16 policy for bf16 (not torch's autocast);
    distribution on jax in one process. (Every lever's record on distribution: test_contract's lever tests.)"""
    from common.config import RunConfig

    ddp = backend.environment(
        RunConfig(
            backend="keras",
            strategy="ddp",
            devices=2,
            levers=Levers(precision="bf16", channels_last=True),
        ).validate()
    )
    assert ddp["libraries"]["keras_backend"] == "torch" and ddp["processes"] == 2
    assert (
        ddp["precision"]["dtype_policy"] == "mixed_bfloat16" and "autocast" not in ddp["precision"]
    )
    assert ddp["details"]["data_format"] == "channels_last" and "gloo" in ddp["collective"]
    dist = backend.environment(
        RunConfig(backend="keras", strategy="distribution", devices=2).validate()
    )
    assert dist["libraries"]["keras_backend"] == "jax" and dist["processes"] == 1
    assert dist["precision"]["jax_default_matmul_precision"] == "highest"
