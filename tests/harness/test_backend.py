"""common/backend.py, the entry points written once, without a framework: its refusals in their order, the
engine's session, and a probe's run config."""

from __future__ import annotations

import types

import numpy as np
import pytest

from common.backend import ENTRY_POINTS, Backend, Probe, check_supported
from common.config import RunConfig
from common.errors import Unsupported


class Engine:
    """A distributed.py that records its joins and leaves."""

    def __init__(self):
        self.calls = []

    def join(self, cfg):
        self.calls.append(("join", cfg.nodes))

    def leave(self, clean=True):
        self.calls.append(("leave", clean))


def backend_with(engine, refusal=lambda cfg, dtype: None) -> Backend:
    strategies = types.SimpleNamespace(
        train=lambda cfg: {"trained": cfg.strategy},
        REFERENCE="scratch",
        measure=lambda cfg, weights, batches, probe, dtype: (probe, dtype),
    )
    return Backend("torch", types.SimpleNamespace(), strategies, engine, refusal)


def config(**kw) -> RunConfig:
    return RunConfig(**{"backend": "torch", "strategy": "ddp", "devices": 2, **kw}).validate()


def test_a_session_joins_once_and_leaves_once_when_the_outermost_ends():
    engine = Engine()
    backend = backend_with(engine)
    cfg = config(nodes=2, coordinator="127.0.0.1:1")
    with backend.session(cfg):
        assert backend.run(cfg) == {
            "trained": "ddp"
        }  # run's own session, inside: nothing joins again
        assert engine.calls == [("join", 2)]
    assert engine.calls == [("join", 2), ("leave", True)]


def test_a_failed_session_leaves_without_waiting_for_its_peers():
    engine = Engine()
    backend = backend_with(engine)
    with pytest.raises(RuntimeError), backend.session(config()):
        raise RuntimeError("a peer died")
    assert engine.calls == [("join", 1), ("leave", False)]


def test_a_refused_run_joins_no_engine():
    engine = Engine()
    backend = backend_with(engine)
    with pytest.raises(Unsupported, match="torch scratch runs in one process; --nodes 2 needs"):
        backend.run(config(strategy="scratch", nodes=2, coordinator="127.0.0.1:1"))
    assert engine.calls == []


def test_refusals_come_in_order_backend_toml_then_the_float64_rule_then_the_backends_own():
    def own(cfg, dtype):
        return f"own refusal ({dtype})"

    with pytest.raises(Unsupported, match="torch dp needs CUDA GPUs"):
        check_supported(config(strategy="dp", devices=1), own)
    with pytest.raises(Unsupported, match="TF32 is a mode of NVIDIA tensor cores"):
        check_supported(config(precision="tf32"), own)
    with pytest.raises(Unsupported, match="dtype float64 runs the plain step only, not bf16"):
        check_supported(config(precision="bf16"), own, dtype="float64")
    with pytest.raises(Unsupported, match=r"own refusal \(float64\)"):
        check_supported(config(), own, dtype="float64")
    check_supported(config(), lambda cfg, dtype: None)


def test_a_probe_runs_its_config_inside_a_session_and_float64_gradients_use_the_reference_strategy():
    engine = Engine()
    backend = backend_with(engine)
    x, y = np.zeros((4, 1, 28, 28), np.float32), np.zeros(4, np.int32)
    (probe, dtype) = backend.gradients(Probe("ddp", "lenet", 2, dtype="float64"), {}, x, y)
    assert (probe, dtype) == ("gradients", "float64") and engine.calls == [
        ("join", 1),
        ("leave", True),
    ]
    assert backend.float64_gradients("lenet", {}, x, y) == ("gradients", "float64")


def test_the_entry_points_are_the_backends_bound_methods_and_nothing_else():
    backend = backend_with(Engine())
    assert [backend.entry_point(name).__name__ for name in ENTRY_POINTS] == list(ENTRY_POINTS)
    with pytest.raises(
        AttributeError, match="module 'backends.torch' has no attribute 'strategies'"
    ):
        backend.entry_point("strategies")  # (a package's own names are its own, not the Backend's)
