"""common/backend.py, what every backend does the same way, without a framework: its refusals in their order,
the engine's session, a probe's run config, and where runs and probes are launched."""

from __future__ import annotations

import pickle
import types

import numpy as np
import pytest

from common import backend as backendlib
from common.backend import Backend, Probe, check_supported
from common.config import RunConfig
from common.errors import Unsupported
from common.nodes import NodeSpec


class Engine:
    """A distributed.py that records its joins, leaves and launches; a launch answers with what it was asked to
    run instead of running it."""

    def __init__(self):
        self.calls = []

    def join(self, cfg):
        self.calls.append(("join", cfg.nodes.count))

    def leave(self, clean=True):
        self.calls.append(("leave", clean))

    def launch(self, cfg, job, payload=None):
        self.calls.append(("launch", job.__name__))
        if payload is None:
            return {"trained": cfg.strategy}
        _, _, probe, dtype = payload
        return probe, dtype


def backend_with(engine, refusal=lambda cfg, dtype: None) -> Backend:
    strategies = types.SimpleNamespace(TRAINERS={}, REFERENCE="scratch")
    environment = types.SimpleNamespace(environment=lambda cfg: {}, refusal=refusal)
    nothing = types.SimpleNamespace()
    return Backend("torch", nothing, nothing, strategies, environment, engine, nothing)


def config(**kw) -> RunConfig:
    return RunConfig.from_dict(
        {"backend": "torch", "strategy": "ddp", "devices": 2, **kw}
    ).validate()


NODE_0_OF_2 = NodeSpec(2, 0, "127.0.0.1:1")
X, Y = np.zeros((4, 1, 28, 28), np.float32), np.zeros(4, np.int32)


def test_a_session_joins_once_and_leaves_once_when_the_outermost_ends():
    """The check worker holds a session around its job: a probe's own session inside it joins nothing again."""
    engine = Engine()
    backend = backend_with(engine)
    probe = Probe("ddp", "lenet", 2, nodes=NODE_0_OF_2)
    with backend.session(probe.config("torch", len(Y), 0.1)):
        assert backend.gradients(probe, {}, X, Y) == ("gradients", "float32")
        assert engine.calls == [("join", 2), ("launch", "probe_job")]
    assert engine.calls == [("join", 2), ("launch", "probe_job"), ("leave", True)]


def test_a_run_is_launched_where_its_strategy_runs_inside_the_callers_session():
    """train() neither checks nor joins: the worker has checked the run and holds its session."""
    engine = Engine()
    assert backend_with(engine).train(config()) == {"trained": "ddp"}
    assert engine.calls == [("launch", "train_job")]


def test_a_failed_session_leaves_without_waiting_for_its_peers():
    engine = Engine()
    backend = backend_with(engine)
    with pytest.raises(RuntimeError), backend.session(config()):
        raise RuntimeError("a peer died")
    assert engine.calls == [("join", 1), ("leave", False)]


def test_a_refused_probe_joins_no_engine():
    engine = Engine()
    backend = backend_with(engine)
    with pytest.raises(Unsupported, match="torch scratch runs in one process; --nodes 2 needs"):
        backend.gradients(Probe("scratch", "lenet", 2, nodes=NODE_0_OF_2), {}, X, Y)
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
    (probe, dtype) = backend.gradients(Probe("ddp", "lenet", 2, dtype="float64"), {}, X, Y)
    assert (probe, dtype) == ("gradients", "float64") and engine.calls == [
        ("join", 1),
        ("launch", "probe_job"),
        ("leave", True),
    ]
    assert backend.float64_gradients("lenet", {}, X, Y) == ("gradients", "float64")


class RunningEngine(Engine):
    """An engine whose launch runs the job in this process, as rank 0."""

    def launch(self, cfg, job, payload=None):
        self.calls.append(("launch", job.__name__))
        return job(cfg, 0, payload)


def test_several_probes_of_one_configuration_run_in_one_launch_each_in_its_dtype(monkeypatch):
    """`harness check` asks four probes of each configuration: one launch of its processes runs them all (a
    strategy with ranks of its own starts them once), each on a fresh trainer, its batches in its dtype."""
    engine = RunningEngine()
    backend = backend_with(engine)
    seen = []
    monkeypatch.setattr(backend, "make_trainer", lambda cfg, w, dtype: dtype)
    monkeypatch.setitem(
        backendlib.PROBES,
        "trace",
        lambda trainer, batches: seen.append((trainer, batches[0][0].dtype)),
    )
    runs = [("trace", "float32", [(X, Y)]), ("trace", "float64", [(X, Y)])]
    backend.run_probes(Probe("ddp", "lenet", 2), {}, runs, 0.1)
    assert engine.calls == [("join", 1), ("launch", "probes_job"), ("leave", True)]
    assert seen == [("float32", np.float32), ("float64", np.float64)]


def test_probes_whose_dtype_is_refused_run_none_of_them():
    engine = Engine()
    backend = backend_with(
        engine, refusal=lambda cfg, dtype: "no float64 here" if dtype == "float64" else None
    )
    runs = [("trace", "float32", [(X, Y)]), ("trace", "float64", [(X, Y)])]
    with pytest.raises(Unsupported, match="no float64 here"):
        backend.run_probes(Probe("ddp", "lenet", 2), {}, runs, 0.1)
    assert engine.calls == []


def test_a_job_sent_to_a_strategys_processes_finds_its_backend_by_name(monkeypatch):
    """A job is a bound method of the Backend; pickled for a strategy's processes, it carries the backend's
    name, and they find backends.<name>.BACKEND (here a stand-in), not a copy of its modules."""
    backend = backend_with(Engine())
    sent = pickle.dumps(backend.train_job)
    monkeypatch.setattr(backendlib, "backend_named", {"torch": backend}.get)
    job = pickle.loads(sent)
    assert job.__self__ is backend and job.__func__ is Backend.train_job
