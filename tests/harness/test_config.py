"""Run-config validation and round trip."""

from __future__ import annotations

import pytest

from common.config import ConfigError, RunConfig
from common.levers import Levers
from common.nodes import NodeSpec

# results.json's config keys, in order, as they were before the levers and the nodes became groups of their own:
# what every reader of results.json reads, and what a resumed report's runs are matched by
FLAT_KEYS = [
    "backend", "strategy", "devices", "device_kind", "simulated", "model", "epochs", "batch_size", "lr",
    "train_size", "test_size", "eval_batch_size", "dataset", "data_dir", "image_size", "seed", "order_seed",
    "timeout", "threads", "options", "bn", "init", "precision", "compile", "channels_last", "resident_data",
    "compile_mode", "prefetch", "grad_dtype", "bucket_mb", "compile_cache", "timed_steps", "target_accuracy",
    "profile", "profile_epoch", "measure_peak",
    "nodes", "node_rank", "coordinator", "loopback_nodes", "join_timeout", "peer_timeout", "local_addr",
    "interface", "load_weights", "save_weights",
]  # fmt: skip


def cfg(**kw):
    base = dict(backend="torch", strategy="scratch", devices=2, batch_size=64)
    return RunConfig.from_dict({**base, **kw})


def test_round_trip(tmp_path):
    c = cfg(train_size=128, seed=3).validate()
    c.save(tmp_path / "c.json")
    assert RunConfig.load(tmp_path / "c.json") == c
    assert c.per_device_batch == 32


def grouped() -> RunConfig:
    """A run whose every group differs from its defaults."""
    return RunConfig(
        backend="mxnet",
        strategy="gluon",
        devices=4,
        batch_size=64,
        options={"kvstore": "dist_sync"},
        levers=Levers("bf16", True, True, True, "max-autotune", 0),
        nodes=NodeSpec(2, 1, "10.0.0.1:29500", False, 60.0, 5.0, "10.0.0.2", "eth0"),
    ).validate()


def test_the_flat_form_has_todays_keys_in_todays_order():
    assert list(grouped().to_dict()) == FLAT_KEYS
    assert list(RunConfig("torch", "ddp", 1).to_dict()) == FLAT_KEYS


def test_a_config_round_trips_through_its_flat_form():
    c = grouped()
    flat = c.to_dict()
    assert {
        k: flat[k] for k in ("precision", "compile_mode", "prefetch", "nodes", "node_rank")
    } == {
        "precision": "bf16",
        "compile_mode": "max-autotune",
        "prefetch": 0,
        "nodes": 2,
        "node_rank": 1,
    }
    assert (flat["loopback_nodes"], flat["peer_timeout"], flat["interface"]) == (False, 5.0, "eth0")
    assert RunConfig.from_dict(flat) == c
    assert RunConfig.from_dict(flat).to_dict() == flat


def test_an_older_flat_config_takes_the_groups_defaults():
    """A results.json written before a field existed reads with that field's default, as before."""
    flat = {k: v for k, v in grouped().to_dict().items() if k not in ("prefetch", "peer_timeout")}
    c = RunConfig.from_dict({**flat, "no_such_field": 1})
    assert (c.levers.prefetch, c.nodes.peer_timeout) == (2, 30.0)
    assert (c.levers.precision, c.nodes.rank) == ("bf16", 1)


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"devices": 0}, "at least 1"),
        ({"batch_size": 63}, "cannot be split evenly across 2 devices"),
        ({"batch_size": 1}, "smaller than the 2 devices"),
        ({"model": "vgg"}, "unknown model"),
        ({"train_size": 32}, "smaller than one batch"),
        ({"test_size": 0}, "--test-size must be at least 1"),
        ({"compile_mode": "max-autotune"}, "--compile-mode max-autotune needs --compile"),
        ({"precision": "fp16"}, "unknown --precision 'fp16'"),
        ({"prefetch": 17}, "--prefetch must be between 0 and 16"),
        ({"nodes": 2, "node_rank": 2, "coordinator": "h:1"}, "--node-rank must be between 0 and 1"),
        ({"nodes": 2}, "--coordinator takes HOST:PORT"),
        (
            {"nodes": 2, "coordinator": "h:1", "peer_timeout": 0.5},
            "--peer-timeout must be at least 1",
        ),
        (
            {"devices": 3, "batch_size": 63, "nodes": 2, "coordinator": "h:1"},
            "3 devices cannot be split",
        ),
    ],
)
def test_invalid(kw, match):
    with pytest.raises(ConfigError, match=match):
        cfg(**kw).validate()
