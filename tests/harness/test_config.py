"""Run-config validation and round trip."""

from __future__ import annotations

import pytest

from common.config import ConfigError, RunConfig


def cfg(**kw):
    base = dict(backend="torch", strategy="scratch", devices=2, batch_size=64)
    return RunConfig(**{**base, **kw})


def test_round_trip(tmp_path):
    c = cfg(train_size=128, seed=3).validate()
    c.save(tmp_path / "c.json")
    assert RunConfig.load(tmp_path / "c.json") == c
    assert c.per_device_batch == 32


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"devices": 0}, "at least 1"),
        ({"batch_size": 63}, "cannot be split evenly across 2 devices"),
        ({"batch_size": 1}, "smaller than the 2 devices"),
        ({"model": "vgg"}, "unknown model"),
        ({"train_size": 32}, "smaller than one batch"),
        ({"test_size": 0}, "--test-size must be at least 1"),
    ],
)
def test_invalid(kw, match):
    with pytest.raises(ConfigError, match=match):
        cfg(**kw).validate()
