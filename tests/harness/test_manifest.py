"""common/manifest.py: backend.toml read once, typed; the names the suite answers to come from it."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from common import manifest
from common.levers import strategy_refusals


def raw(name: str) -> dict:
    with open(manifest.BACKENDS_DIR / name / "backend.toml", "rb") as f:
        return tomllib.load(f)


def test_the_known_backends_are_those_with_a_backend_toml_torch_first():
    known = manifest.known()
    assert known[0] == "torch"
    assert set(known) == {p.parent.name for p in manifest.BACKENDS_DIR.glob("*/backend.toml")}


@pytest.mark.parametrize("name", manifest.known())
def test_a_manifest_holds_what_its_toml_declares(name):
    d, m = raw(name), manifest.load(name)
    assert m.name == d["name"] == name
    assert list(m.strategies) == list(d["strategies"])
    for key, s in m.strategies.items():
        assert s.bn == tuple(d["strategies"][key].get("bn", ["local"]))
        assert s.requires == d["strategies"][key].get("requires")
    assert {k: (o.values, o.default) for k, o in m.options.items()} == {
        k: (tuple(v["values"]), v["default"]) for k, v in d.get("options", {}).items()
    }
    assert {k: (lv.values, lv.refused) for k, lv in m.levers.items()} == {
        k: (tuple(v["values"]) if "values" in v else None, v.get("refused", ""))
        for k, v in d["levers"].items()
    }
    assert m.requirements.is_file()
    assert m.kernels == tuple(d.get("kernels", [name]))
    assert {k: lv.changes_nothing for k, lv in m.levers.items()} == {
        k: tuple(v.get("changes_nothing", [])) for k, v in d["levers"].items()
    }
    assert {k: s.engine_backend for k, s in m.strategies.items()} == {
        k: v.get("engine_backend") for k, v in d["strategies"].items()
    }


def test_a_malformed_changes_nothing_or_engine_backend_is_refused_naming_its_table():
    """The contract tests skip or loosen what these declare, so a typo must not read as a quiet declaration."""
    strategies = {"pmap": {}, "sharding": {}}
    assert manifest.read_changes_nothing(
        "jax", "compile", {"changes_nothing": ["pmap"]}, strategies
    ) == ("pmap",)
    for bad in (True, "pmap", ["pmapp"]):
        with pytest.raises(
            ValueError, match=r"jax/backend.toml: \[levers.compile\] changes_nothing = "
        ):
            manifest.read_changes_nothing("jax", "compile", {"changes_nothing": bad}, strategies)
    engine = {"engine": "torchrun"}
    assert (
        manifest.read_engine_backend("keras", "ddp", {**engine, "engine_backend": "torch"})
        == "torch"
    )
    for bad in (
        {**engine, "engine_backend": "tensorflow"},
        {**engine, "engine_backend": "keras"},
        {**engine, "engine_backend": ["torch"]},
        {"engine_backend": "torch"},
    ):
        with pytest.raises(
            ValueError, match=r"keras/backend.toml: \[strategies.ddp\] engine_backend = "
        ):
            manifest.read_engine_backend("keras", "ddp", bad)


def test_a_regex_of_the_op_names_written_as_a_list_is_its_alternatives():
    """[profile] ops wraps a long regex as a list; it reads as the one regex, in the order declared."""
    entries = [["copies", ["copy|Copy", "memcpy"]], ["fused", "ImperativeBulk"]]
    assert manifest.read_ops(entries) == (
        ("copies", "copy|Copy|memcpy"),
        ("fused", "ImperativeBulk"),
    )


def pins(name: str) -> dict[str, str]:
    """{package: exact version} of a backend's requirements.txt (its == pins)."""
    lines = (
        line.split("#")[0].strip()
        for line in manifest.load(name).requirements.read_text().splitlines()
    )
    return dict(line.split("==") for line in lines if "==" in line and ";" not in line)


def test_keras_runs_the_torch_and_jax_the_torch_and_jax_backends_pin():
    """Keras's ddp is torch's DDP and its distribution is jax's jit: the same framework versions, so that a
    difference between the backends is Keras's, not another release's."""
    keras = pins("keras")
    assert {k: keras[k] for k in ("jax", "jaxlib")} == {
        k: pins("jax")[k] for k in ("jax", "jaxlib")
    }
    assert keras["torch"] == pins("torch")["torch"]


def test_aliases_come_from_the_toml(monkeypatch):
    assert manifest.canonical_name(" PyTorch ") == "torch" == manifest.canonical_name("TORCH")
    assert manifest.canonical_name("tensorflow") is None
    real = manifest.load
    monkeypatch.setattr(
        manifest,
        "load",
        lambda name: (
            dataclasses.replace(real(name), aliases=("flax",)) if name == "jax" else real(name)
        ),
    )
    assert manifest.canonical_name("flax") == "jax"


def test_an_option_is_the_asked_value_else_the_declared_default():
    m = manifest.load("mxnet")
    assert m.option({}, "kvstore") == m.options["kvstore"].default == "device"
    assert m.option({"kvstore": "local"}, "kvstore") == "local"
    assert list(m.options_for("scratch")) == ["hybridize"] and list(m.options_for("gluon")) == [
        "kvstore",
        "hybridize",
    ]


def test_the_refusals_backend_toml_states_are_worded_once_for_the_planner_and_the_workers():
    """common/manifest.py's strategy_refusal is what the harness plans with and what every backend's worker
    refuses with first (common/backend.py): an unknown strategy, several nodes without an engine, CUDA only,
    a BatchNorm mode the strategy does not run (with the reason backend.toml gives)."""
    torch, keras, mxnet = (manifest.load(n) for n in ("torch", "keras", "mxnet"))
    refusal = manifest.strategy_refusal
    assert (
        refusal(torch, "zero1", "cpu", "local", 1)
        == "torch has no strategy 'zero1'; it has scratch, dp, ddp, fsdp"
    )
    assert refusal(mxnet, "fsdp", "cpu", "local", 1).startswith(
        "mxnet cannot run fsdp: MXNet 1.9.1 has no sharded data-parallel engine"
    )
    assert refusal(torch, "dp", "cpu", "local", 2).startswith(
        "torch dp runs in one process; --nodes 2 needs a "
        "strategy with a distributed engine (torch: ddp, fsdp)"
    )
    assert refusal(torch, "dp", "cpu", "local", 1).startswith(
        "torch dp needs CUDA GPUs; none is present ("
    )
    assert refusal(torch, "dp", "gpu", "local", 1) is None
    assert refusal(torch, "scratch", "cpu", "sync", 1) == (
        "torch scratch has no sync BatchNorm (it runs: local; --bn sync runs with: ddp, fsdp)"
    )
    # a lever the backend offers, but not to one of its strategies: the worker refuses the run with the reason
    assert strategy_refusals(torch.levers, {"channels_last": True}, "ddp") == []
    assert strategy_refusals(torch.levers, {"channels_last": True}, "fsdp") == [
        "--channels-last with fsdp: FSDP2 shards contiguous parameters only (fully_shard raises "
        "NotImplementedError on a channels_last convolution's weight)"
    ]
    assert refusal(keras, "ddp", "cpu", "sync", 1).startswith(
        "keras ddp has no sync BatchNorm: Keras's `synchronized` BatchNormalization is TensorFlow's"
    )
    # (its CPU deadlock is the worker's own refusal)
    assert refusal(mxnet, "gluon", "cpu", "sync", 1) is None
    assert "separate network per context" in refusal(mxnet, "scratch", "cpu", "sync", 1)
    assert refusal(mxnet, "gluon", "cpu", "local", 2) is None
