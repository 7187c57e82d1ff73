"""BatchNorm in flax with torch's running statistics, per device or synchronised over a device axis.

flax's BatchNorm updates the running variance with the biased batch variance, torch with the unbiased one, and
every backend follows torch; --bn sync takes the statistics of the global batch (lax.pmean over the axis).
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
    per channel they were taken over. Two passes, as torch and flax (use_fast_variance=False) compute
    them; with `axis_name` each pass's per-channel means are lax.pmean'ed over the devices, so both
    are the global batch's."""
    x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
    axes = tuple(range(x.ndim - 1))
    count = int(np.prod(x.shape[:-1]))

    def mean(values):
        m = values.mean(axes)
        return m if axis_name is None else lax.pmean(m, axis_name)

    mu = mean(x)
    var = mean(lax.square(x - mu))
    if axis_name is not None:
        count *= lax.axis_size(axis_name)
    return mu, var, count


class BatchNorm(nn.Module):
    """flax's BatchNorm (same names: params scale, bias; batch_stats mean, var) with torch's update of the
    running statistics: the running variance takes the UNBIASED batch variance, var * n / (n - 1) with n
    the values per channel the statistics were taken over (this device's shard, or with `axis_name` the
    global batch), while training-mode normalisation uses the biased one, as every framework does.

    The correction is a per-channel scalar factor on the C-element variance vector, after the two
    reductions flax makes too: no extra pass over the activations, so a step costs what flax's costs.
    Statistics are reduced in at least float32 (bfloat16 activations included) and normalisation is
    flax's arithmetic, so float32 and bfloat16 steps compute exactly what flax's BatchNorm computes."""

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
