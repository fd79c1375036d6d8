"""One optimizer update from a batch, with gradients accumulated over micro-batches.

`loss_fn(params, micro_batch) -> (loss, metric_sums)` must be additive over micro-batches: rljax
losses weight each token with weights computed on the FULL batch (rljax.losses.token_weights), so
the summed loss and gradient do not depend on the split, while memory stays that of one micro-batch.
(One exception, as in Megatron-Core: the MoE load-balancing loss is computed per micro-batch.)

The per-micro-batch gradients also give, for free, the two squared norms behind the gradient noise
scale of McCandlish et al. (B_simple = tr(Sigma) / |G|^2): `grad_sq_small` at `b_small` =
micro-batch size and `grad_sq_big` at `b_big` = batch size (rljax.stats averages them over steps).
"""
import jax
import jax.numpy as jnp
import optax


def split_micro(batch, num_micro):
  """[B, ...] leaves -> [num_micro, B / num_micro, ...]."""
  def split(x):
    if x.shape[0] % num_micro:
      raise ValueError(f'batch of {x.shape[0]} is not divisible into {num_micro} micro-batches')
    return x.reshape(num_micro, x.shape[0] // num_micro, *x.shape[1:])
  return jax.tree.map(split, batch)


def accumulate_gradients(loss_fn, params, batch, num_micro):
  """Sums loss, metric sums and gradients over micro-batches with a `lax.scan`."""
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def step(carry, micro):
    grads, loss, metrics, micro_sq = carry
    (micro_loss, micro_metrics), micro_grads = grad_fn(params, micro)
    return (jax.tree.map(jnp.add, grads, micro_grads), loss + micro_loss,
            jax.tree.map(jnp.add, metrics, micro_metrics),
            micro_sq + jnp.square(optax.global_norm(micro_grads))), None

  micro_batches = split_micro(batch, num_micro)
  first = jax.tree.map(lambda x: x[0], micro_batches)
  metric_shapes = jax.eval_shape(loss_fn, params, first)[1]
  zeros = (jax.tree.map(jnp.zeros_like, params), jnp.zeros((), jnp.float32),
           jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes),
           jnp.zeros((), jnp.float32))
  (grads, loss, metrics, micro_sq), _ = jax.lax.scan(step, zeros, micro_batches)
  return grads, loss, metrics, micro_sq


def all_finite(tree):
  """Whether every float in `tree` is finite: one reduction per array, on device."""
  floats = [x for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.floating)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in floats] or [jnp.bool_(True)]))


def keep_finite(new_params, new_opt_state, params, opt_state):
  """The update's params and optimizer state, or, when any of them is not finite, those before it
  with the update counted as skipped (optax.apply_if_finite's counters): a finite gradient can
  still overflow a moment, and a state restored non-finite is never trained on."""
  finite = all_finite((new_params, new_opt_state.inner_state))
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  skipped = new_opt_state.last_finite & ~finite   # not already counted by apply_if_finite
  return keep(new_params, params), new_opt_state._replace(
      inner_state=keep(new_opt_state.inner_state, opt_state.inner_state),
      last_finite=new_opt_state.last_finite & finite,
      notfinite_count=new_opt_state.notfinite_count + skipped,
      total_notfinite=new_opt_state.total_notfinite + skipped)


def apply_update(loss_fn, optimizer, params, opt_state, batch, num_micro):
  """Gradient step; returns (params, opt_state, metrics incl. loss, grad_norm,
  noise-scale terms)."""
  grads, loss, metrics, micro_sq = accumulate_gradients(loss_fn, params, batch, num_micro)
  # A non-finite loss marks the whole update bad, even where its gradient happens to be finite:
  # the optimizer (optax.apply_if_finite) then skips it and counts it.
  grads = jax.tree.map(lambda g: jnp.where(jnp.isfinite(loss), g, jnp.nan), grads)
  updates, new_opt_state = optimizer.update(grads, opt_state, params)
  params, opt_state = keep_finite(optax.apply_updates(params, updates), new_opt_state, params,
                                  opt_state)
  grad_norm = optax.global_norm(grads)
  batch_size = jax.tree.leaves(batch)[0].shape[0]
  metrics = dict(metrics, loss=loss, grad_norm=grad_norm,
                 skipped=1 - opt_state.last_finite.astype(jnp.int32))
  if num_micro > 1:  # the micro-batch gradient g_i is 1/num_micro of its own mean-gradient estimate
    metrics.update(grad_sq_small=micro_sq * num_micro, grad_sq_big=jnp.square(grad_norm),
                   b_small=jnp.float32(batch_size // num_micro), b_big=jnp.float32(batch_size))
  return params, opt_state, metrics


def minibatch_epochs(step_fn, state, batch, rng, *, num_epochs, num_minibatches, group_size,
                     averaged):
  """`num_epochs` passes over `batch` in `num_minibatches` shuffled minibatches, in one program.

  `step_fn(state, minibatch) -> (state, metrics)` is one optimizer update. Rows are shuffled in
  whole groups of `group_size` (GRPO's responses to one prompt stay together). Returns the final
  state and one set of metrics: the first update's (computed before any update of this batch, so
  on-policy), except `averaged` keys (means over updates) and `skipped` (a count).
  """
  batch_size = jax.tree.leaves(batch)[0].shape[0]
  num_groups = batch_size // group_size

  def epoch(state, epoch_rng):
    order_G = (jax.random.permutation(epoch_rng, num_groups) if num_minibatches > 1
               else jnp.arange(num_groups))
    order_B = (order_G[:, None] * group_size + jnp.arange(group_size)).reshape(-1)
    minibatches = jax.tree.map(
        lambda x: x[order_B].reshape(num_minibatches, -1, *x.shape[1:]), batch)
    return jax.lax.scan(step_fn, state, minibatches)

  if num_epochs * num_minibatches == 1:   # no loop: the one update as it is
    state, metrics = step_fn(state, batch)
    metrics_U = jax.tree.map(lambda x: x[None], metrics)
  else:
    state, metrics_ExM = jax.lax.scan(epoch, state, jax.random.split(rng, num_epochs))
    metrics_U = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), metrics_ExM)
  reduced = {key: value[0] for key, value in metrics_U.items()}
  reduced.update({key: jnp.mean(metrics_U[key], axis=0) for key in averaged if key in metrics_U})
  reduced['skipped'] = jnp.sum(metrics_U['skipped'])
  return state, reduced
