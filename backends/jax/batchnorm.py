"""BatchNorm in flax with torch's running statistics, per device or synchronised over a device axis.

flax's BatchNorm updates the running variance with the biased batch variance, torch with the unbiased one, and
every backend follows torch; --bn sync takes the statistics of the global batch (lax.pmean over the axis).

The batch statistics take one pass over the activations, as flax's default (use_fast_variance=True), torch's
kernels and Inductor do: the mean and the mean of squares are reduced together and the variance is
E[x^2] - E[x]^2. The two-pass variance (the mean, then the mean of squared deviations) reads every activation
once more, and on an H100 BatchNorm and the element-wise fusions around it are 67% of JAX's ResNet-50 step.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np
from jax import lax

BN_EPS = 1e-5
BN_MOMENTUM = 0.1  # torch's convention: running <- (1 - 0.1) * running + 0.1 * batch


def _batch_statistics(x, axis_name: str | None):
    """(mean, biased variance) per channel of NHWC `x`, in at least float32, and the number of values
    per channel they were taken over. One pass, as flax's default (use_fast_variance=True), torch and
    Inductor take it: E[x] and E[x^2] are reduced together over the same read of `x`, and the variance
    is E[x^2] - E[x]^2, clamped at 0 as flax does (rounding can make it slightly negative). With
    `axis_name` both moments are lax.pmean'ed over the devices in one collective (stacked, as flax
    does), so both are the global batch's and synchronised BatchNorm costs one all-reduce per layer.
    In float64 this is the two-pass variance to rounding; in float32 it loses digits where the mean is
    large against the spread (tests/backends/test_jax.py measures how many)."""
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    axes = tuple(range(x.ndim - 1))
    count = int(np.prod(x.shape[:-1]))
    moments = jnp.stack([x.mean(axes), lax.square(x).mean(axes)])
    if axis_name is not None:
        moments = lax.pmean(moments, axis_name)
        count *= lax.axis_size(axis_name)
    mu, mean2 = moments[0], moments[1]
    var = jnp.maximum(0.0, mean2 - lax.square(mu))
    return mu, var, count


class BatchNorm(nn.Module):
    """flax's BatchNorm (same names: params scale, bias; batch_stats mean, var) with torch's update of the
    running statistics: the running variance takes the UNBIASED batch variance, var * n / (n - 1) with n
    the values per channel the statistics were taken over (this device's shard, or with `axis_name` the
    global batch), while training-mode normalisation uses the biased one, as every framework does.

    The batch statistics take one pass over the activations, as flax's default does (E[x] and E[x^2]
    reduced together, one pmean of both with `axis_name`: `_batch_statistics`), not two. The correction
    is a per-channel scalar factor on the C-element variance vector, after the reductions: no extra pass
    over the activations, so a step costs what flax's default BatchNorm costs. Statistics are reduced in
    at least float32 (bfloat16 activations included) and normalisation is flax's arithmetic, so float32
    and bfloat16 steps compute exactly what flax's default BatchNorm computes."""

    use_running_average: bool
    axis_name: str | None = None
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        features = (x.shape[-1],)
        stats_dtype = jnp.promote_types(self.param_dtype, jnp.float32)
        ra_mean = self.variable("batch_stats", "mean", jnp.zeros, features, stats_dtype)
        ra_var = self.variable("batch_stats", "var", jnp.ones, features, stats_dtype)
        if self.use_running_average:
            mean, var = ra_mean.value, ra_var.value
        else:
            mean, var, count = _batch_statistics(
                x, None if self.is_initializing() else self.axis_name
            )
            if count < 2:
                raise ValueError(
                    f"BatchNorm needs more than 1 value per channel in training, got {count}"
                )
            if not self.is_initializing():
                ra_mean.value = (1 - BN_MOMENTUM) * ra_mean.value + BN_MOMENTUM * mean
                ra_var.value = (1 - BN_MOMENTUM) * ra_var.value + BN_MOMENTUM * (
                    var * (count / (count - 1))
                )
        scale = self.param("scale", nn.initializers.ones, features, self.param_dtype)
        bias = self.param("bias", nn.initializers.zeros, features, self.param_dtype)
        y = (x - mean) * (lax.rsqrt(var + BN_EPS) * scale) + bias
        return jnp.asarray(y, self.dtype)
