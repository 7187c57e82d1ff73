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

from common import architectures
from common.config import INITS
from common.files import write_atomic

INIT_STD = 0.01
# "d2l": kernels ~ N(0, 0.01^2), the seeds' recipe and every run's default.
# "he": the same draws rescaled to He's std sqrt(2 / fan_in). With d2l's tiny kernels ResNet-18's
# deep activations are small next to BatchNorm's eps, and the float32 gradient of a small batch is
# ~1e-2 away from the float64 one in every framework; He-scaled weights are well conditioned, so
# comparisons at 1e-4 measure the math rather than float32 rounding (see `harness check`).


def init_canonical(
    spec: list[tuple[str, tuple[int, ...], str]], seed: int
) -> dict[str, np.ndarray]:
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


class WeightsError(ValueError):
    """A weights file that is missing, altered, or for another model."""


def initial_weights(model: str, seed: int, init: str = "d2l") -> dict[str, np.ndarray]:
    """The canonical initial weights of `model`: what every run of every backend starts from."""
    weights = init_canonical(architectures.spec(model), seed)
    if init == "he":
        return he_scaled(weights, model)
    if init != "d2l":
        raise ValueError(f"unknown init {init!r}; choose from {', '.join(INITS)}")
    return weights


def he_scaled(weights: dict[str, np.ndarray], model: str) -> dict[str, np.ndarray]:
    """Conv and dense kernels rescaled from d2l's std 0.01 to He's sqrt(2 / fan_in); the rest unchanged."""
    out = dict(weights)
    for name, shape, kind in architectures.spec(model):
        if kind in ("conv", "dense"):
            # in float64, then rounded once: numpy 1 (MXNet's environment) would multiply a float32 array by a
            # float64 scalar in float32, numpy 2 in float64, and the weights would differ by one float32 step
            scale = np.sqrt(2.0 / np.prod(shape[1:])) / INIT_STD
            out[name] = (np.asarray(weights[name], np.float64) * scale).astype(np.float32)
    return out


def for_run(cfg) -> dict[str, np.ndarray]:
    """The weights a run starts from: --load-weights if given, else the seeded canonical init."""
    if cfg.load_weights:
        return load(cfg.load_weights, cfg.model)
    return initial_weights(cfg.model, cfg.seed, cfg.init)


HASH_KEY = "__sha256__"


def save(path, weights: dict[str, np.ndarray]) -> str:
    """Write canonical weights as .npz with their fingerprint inside, atomically; return the fingerprint."""
    digest = fingerprint(weights)
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
    arrays[HASH_KEY] = np.frombuffer(digest.encode(), dtype=np.uint8)
    write_atomic(path, lambda f: np.savez(f, **arrays), mode="wb")
    return digest


def _read_npz(path) -> tuple[str | None, dict[str, np.ndarray]]:
    """(the recorded fingerprint, the arrays) of an .npz file; every array is read now, so a damaged member
    fails here."""
    with open(path, "rb") as raw:
        if raw.read(4) != b"PK\x03\x04":  # np.load would also accept .npy and pickles
            raise WeightsError(
                f"cannot read weights file {path}: not an .npz archive (as --save-weights writes)"
            )
    with np.load(path, allow_pickle=False) as f:
        stored = bytes(f[HASH_KEY]).decode() if HASH_KEY in f.files else None
        return stored, {k: f[k] for k in f.files if k != HASH_KEY}


def load(path, model: str | None = None) -> dict[str, np.ndarray]:
    """Read a weights file, check its fingerprint and, given `model`, that it has that model's names and shapes."""
    try:
        stored, weights = _read_npz(path)
        matches = stored is not None and stored == fingerprint(weights)
    except WeightsError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged archive fails in many ways (zip, CRC, zlib, EOF, dtype)
        detail = (str(e).strip().splitlines() or [""])[0]
        reason = type(e).__name__ + (f": {detail}" if detail else "")
        raise WeightsError(f"cannot read weights file {path}: {reason}") from None
    if not matches:
        raise WeightsError(f"weights file {path} does not match its recorded fingerprint")
    if model is not None:
        expected = {name: shape for name, shape, _ in architectures.spec(model)}
        actual = {name: tuple(a.shape) for name, a in weights.items()}
        if expected != actual:
            raise WeightsError(
                f"weights file {path} does not hold {model} weights "
                f"(e.g. {sorted(set(expected.items()) ^ set(actual.items()))[:2]})"
            )
    return weights
