"""Initial weights, made once in numpy so that every backend and strategy starts from the same numbers.

A backend describes its model as a list of (canonical name, shape, kind); this module
fills it with d2l's initialisation: conv and dense weights ~ N(0, 0.01^2), biases 0,
BatchNorm gamma 1, beta 0, running mean 0, running variance 1. Each array is drawn
from its own stream seeded by (seed, name), so the values do not depend on the order
in which a framework lists its parameters.

Canonical layout: NCHW activations, conv kernels (out, in, kh, kw), dense (out, in).
"""

from __future__ import annotations

import hashlib
import zlib

import numpy as np

KINDS = ("conv", "dense", "bias", "bn_gamma", "bn_beta", "bn_mean", "bn_var")
INIT_STD = 0.01


def init_canonical(spec: list[tuple[str, tuple[int, ...], str]], seed: int) -> dict[str, np.ndarray]:
    weights = {}
    for name, shape, kind in spec:
        if kind in ("conv", "dense"):
            rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
            value = rng.normal(0.0, INIT_STD, size=shape)
        elif kind in ("bias", "bn_beta", "bn_mean"):
            value = np.zeros(shape)
        elif kind in ("bn_gamma", "bn_var"):
            value = np.ones(shape)
        else:
            raise ValueError(f"unknown parameter kind {kind!r} for {name}")
        weights[name] = value.astype(np.float32)
    return weights


def fingerprint(weights: dict[str, np.ndarray]) -> str:
    """SHA-256 over names, shapes and float32 bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(weights):
        a = np.ascontiguousarray(weights[name], dtype=np.float32)
        h.update(f"{name}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()
