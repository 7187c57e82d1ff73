"""common/manifest.py: backend.toml read once, typed; the names the suite answers to come from it."""

from __future__ import annotations

import dataclasses
import tomllib

import pytest

from common import manifest


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
    assert {k: (o.values, o.default) for k, o in m.options.items()} == \
        {k: (tuple(v["values"]), v["default"]) for k, v in d.get("options", {}).items()}
    assert {k: (lv.values, lv.refused) for k, lv in m.levers.items()} == \
        {k: (tuple(v["values"]) if "values" in v else None, v.get("refused", "")) for k, v in d["levers"].items()}
    assert m.requirements.is_file()
    assert m.kernels == tuple(d.get("kernels", [name]))


def pins(name: str) -> dict[str, str]:
    """{package: exact version} of a backend's requirements.txt (its == pins)."""
    lines = (line.split("#")[0].strip() for line in manifest.load(name).requirements.read_text().splitlines())
    return dict(line.split("==") for line in lines if "==" in line and ";" not in line)


def test_keras_runs_the_torch_and_jax_the_torch_and_jax_backends_pin():
    """Keras's ddp is torch's DDP and its distribution is jax's jit: the same framework versions, so that a
    difference between the backends is Keras's, not another release's."""
    keras = pins("keras")
    assert {k: keras[k] for k in ("jax", "jaxlib")} == {k: pins("jax")[k] for k in ("jax", "jaxlib")}
    assert keras["torch"] == pins("torch")["torch"]


def test_aliases_come_from_the_toml(monkeypatch):
    assert manifest.canonical_name(" PyTorch ") == "torch" == manifest.canonical_name("TORCH")
    assert manifest.canonical_name("tensorflow") is None
    real = manifest.load
    monkeypatch.setattr(manifest, "load", lambda name: dataclasses.replace(real(name), aliases=("flax",))
                        if name == "jax" else real(name))
    assert manifest.canonical_name("flax") == "jax"


def test_an_option_is_the_asked_value_else_the_declared_default():
    m = manifest.load("mxnet")
    assert m.option({}, "kvstore") == m.options["kvstore"].default == "device"
    assert m.option({"kvstore": "local"}, "kvstore") == "local"
    assert list(m.options_for("scratch")) == ["hybridize"] and list(m.options_for("gluon")) == ["kvstore", "hybridize"]
