"""The math of a step that every JAX strategy shares, on one device's shard: the loss, the SGD update,
and the predicted classes of evaluation. strategies.py decides how they are spread over the devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from backends.jax import models


def local_loss(net, params, stats, x, y):
    """Sum of the cross-entropy over this device's examples; (new BatchNorm stats, loss sum, correct) as aux."""
    logits, new_stats = models.forward(net, {"params": params, "batch_stats": stats}, x, train=True)
    loss_sum = optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()
    correct = jnp.sum(jnp.argmax(logits, axis=-1) == y)
    return loss_sum, (new_stats, loss_sum, correct)


def sgd(tx, params, opt_state, grads):
    """The SGD update of every strategy, the same in step() and update(): (new params, new opt_state)."""
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state


def predict_classes(net):
    """A compiled (params, batch_stats, x) -> predicted classes, in eval mode."""
    @jax.jit
    def predict(params, stats, x):
        logits = models.forward(net, {"params": params, "batch_stats": stats}, x, train=False)
        return jnp.argmax(logits, axis=-1)
    return predict
