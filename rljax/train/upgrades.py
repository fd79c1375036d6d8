"""Every format an earlier rljax wrote and today's still reads, converted here and nowhere else.

rljax 0.1.x resumes every workdir and warm-start cache a 0.1 build wrote
(docs/reference/reliability.md, "Upgrades"). Each conversion names the commit from which nothing
writes its format any more. Removal: all of them go in 0.2.0, whose notes say that a 0.1 workdir
must be finished (or restarted) first; none may go earlier, and nothing else may read an old
format.

  config records   fields added since a workdir recorded its config hold their old value
                   (INTRODUCED, `as_before`): each field from the commit that added it;
                   rollout.partial and rollout.devices read as rollout.schedule (before the
                   commit that added it, 2026-12-07): `renamed`
  manifests        checkpoints and warm-start caches without a manifest (before b699319 and
                   2c3fcb5, 2026-12-04): `before_manifests`, `unmanifested_cache`
  flat carries     the carry without named slots, a schedule's answers as byte rows on device
                   and tokens without recorded experts (before 6c4e6ab, 2026-12-04):
                   `flat_carry`, `from_flat_carry`
  prompt indices   held prompts without stream indices (before e1c4166, 2026-12-04):
                   `held_prompt_ids`

jax, orbax and the schedules are imported in the functions that use them: rljax.train.workdir
reads INTRODUCED in processes that never start jax (rljax.protocol.layout).
"""
import json
import os

import numpy as np

# --------------------------------------------------------------------------------------------
# Config records.
# --------------------------------------------------------------------------------------------

_LOSSES = ('grpo', 'ppo', 'rloo')
# Fields added since workdirs record their config, each with the value that reproduces rljax
# before it: rollouts sampled on the training mesh in one piece, no chunked logits, no lr decay,
# no dual clip or off-policy weights, the clipped surrogate, no router replay, no LoRA, one clip
# norm at every batch, evaluations only every train.eval_every steps.
# auto_batch.*: any value while auto_batch is off; model.lora.*: any value while its rank is 0.
INTRODUCED = {
    'mode': 'train', 'warmstart.seed': -1, 'optimizer.decay': 'constant',
    'train.logits_chunk': 0, 'rollout.slots': 0, 'rollout.schedule': 'each_step',
    'rollout.max_staleness': 1, 'rollout.devices': 0, 'auto_batch.enabled': False,
    'grpo.adv_eps': 1e-6, 'model.router_replay': False, 'data.extra_test': 0,
    'model.lora.rank': 0, 'optimizer.clip_rule': 'constant',
    'critic_optimizer.clip_rule': 'constant', 'critic_optimizer.decay': 'constant',
    'train.eval_from_samples': 0,
    'train.eval_first_samples': 0,
    # read only by the tool task, which came with them: their defaults
    'data.demo_frac': 0.25, 'tools.enabled': True, 'tools.timeout_s': 1.0, 'tools.max_calls': 2,
    # the tool's worker processes: the calculator's results are the same at any value
    'tools.workers': 8, 'tools.memory_mb': 512,
    # read only by the reasoning_gym task, which came with them: their defaults
    'data.dataset': '', 'data.dataset_args': '{}', 'data.render': 'question',
    **{f'{algo}.{key}': value for algo in _LOSSES for key, value in (
        ('clip_ratio_c', 0.0), ('off_policy', 'none'), ('is_low', 0.5), ('is_high', 2.0),
        ('policy_loss', 'clip'))}}
# Data fields added after warm-start caches were written: at their INTRODUCED value they leave a
# cache's fingerprint as it was, so a cache written before them is still found.
LATER_DATA_FIELDS = ('dataset', 'dataset_args', 'render')


def as_before(key, present):
  """Whether `key`, missing on one side, holds on the other (flat `present`) a value that computes
  what rljax computed before the key existed."""
  if key.startswith('auto_batch.') and present.get('auto_batch.enabled') is False:
    return True
  if key.startswith('model.lora.') and present.get('model.lora.rank') == 0:
    return True
  return key in INTRODUCED and present[key] == INTRODUCED[key]


# Command-line fields an earlier rljax had: what sets the same now.
RENAMED_FLAGS = {'rollout.partial': "pass --config.rollout.schedule=partial (or each_step)"}


def renamed(flat_config):
  """A recorded flat config in today's names: the schedule an old record chose by two fields
  (rollout.partial, rollout.devices) named by rollout.schedule."""
  if 'rollout.schedule' in flat_config or not ('rollout.partial' in flat_config or
                                               flat_config.get('rollout.devices')):
    return flat_config
  new = dict(flat_config)
  partial = new.pop('rollout.partial', False)
  new['rollout.schedule'] = ('partial' if partial else
                             'drawn_ahead' if new.get('rollout.devices') else 'each_step')
  return new


def data_fingerprint(data):
  """A warm start's data fields without the later ones at their old value."""
  return {k: v for k, v in data.items()
          if not (k in LATER_DATA_FIELDS and v == INTRODUCED[f'data.{k}'])}


# --------------------------------------------------------------------------------------------
# Manifests.
# --------------------------------------------------------------------------------------------


def before_manifests(directory, steps, step):
  """Whether checkpoint `step` of `directory` was saved before manifests: neither it nor an older
  one of `steps` has a manifest (a step without one after a step with one lost it: damaged)."""
  return not any(os.path.isdir(os.path.join(directory, str(older), 'manifest'))
                 for older in steps if older <= step)


def unmanifested_cache(path, init_params):
  """(params, info) of a warm-start cache written before manifests (params/ and info.json, the
  latter written last), or None where `path` holds none."""
  import jax  # pylint: disable=g-import-not-at-top
  import orbax.checkpoint as ocp  # pylint: disable=g-import-not-at-top
  if not os.path.exists(os.path.join(path, 'info.json')):
    return None
  with open(os.path.join(path, 'info.json')) as f:
    info = json.load(f)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, init_params)
  params = ocp.StandardCheckpointer().restore(os.path.join(path, 'params'), abstract)
  return params, dict(info, steps=int(info['steps']))


# --------------------------------------------------------------------------------------------
# Flat carries: the algorithm's arrays, rng and reference side by side, the schedule's state
# under its own key, its answers as 0-padded utf-8 rows beside it, no recorded experts.
# --------------------------------------------------------------------------------------------

ANSWER_BYTES = 256   # each answer row's width
_FLAT_KEY = {'Partial': 'flight', 'DrawnAhead': 'pending'}   # EachStep's carry held none


def _answer_rows(rows):
  return [bytes(row).rstrip(b'\0').decode() for row in np.asarray(rows)]


def _flat_pool(schedule, flight):
  from rljax import sharding  # pylint: disable=g-import-not-at-top
  rows = np.zeros((flight.serial_Q.shape[0], ANSWER_BYTES), np.uint8)
  old = dict(flight._asdict(), answer_QxW=sharding.place(rows, schedule.sampler.mesh))
  del old['experts_RxLxYxK']
  return old


def _pool_from_flat(schedule, old):
  """(pool, answers); the tokens' experts -1 (the trainer routes them as it computes)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from rljax.rollout import partial  # pylint: disable=g-import-not-at-top
  answers = {str(serial): answer for serial, answer in
             zip(np.asarray(old['serial_Q']), _answer_rows(old['answer_QxW'])) if serial >= 0}
  experts = jax.tree.map(jnp.copy, schedule.pool.experts_RxLxYxK)   # the pool's get donated
  kept = {k: v for k, v in old.items() if k != 'answer_QxW'}
  return partial.Flight(**kept, experts_RxLxYxK=experts), answers


def _flat_ahead(schedule, ahead):
  import jax  # pylint: disable=g-import-not-at-top
  from rljax import sharding  # pylint: disable=g-import-not-at-top
  prompts = ahead['prompt_BxT'].shape[0] // schedule.sampler.G
  rows = jax.device_put(np.zeros((prompts, ANSWER_BYTES), np.uint8),
                        sharding.batch_sharding(schedule.sampler.mesh, 2))
  rollout = ahead['rollout']._asdict()
  del rollout['experts_BxLxYxK']
  return dict(ahead, rollout=rollout, answer_PxW=rows)


def _ahead_from_flat(schedule, old):
  """(batch drawn ahead, answers); the tokens' experts -1, as for the pool."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from rljax.rollout import sampler  # pylint: disable=g-import-not-at-top
  experts = jax.tree.map(jnp.copy, schedule.empty['rollout'].experts_BxLxYxK)
  ahead = {k: v for k, v in old.items() if k != 'answer_PxW'}
  ahead['rollout'] = sampler.Rollout(**ahead['rollout'], experts_BxLxYxK=experts)
  return ahead, _answer_rows(old['answer_PxW'])


_FLAT = {'Partial': (_flat_pool, _pool_from_flat), 'DrawnAhead': (_flat_ahead, _ahead_from_flat)}


def flat_carry(carry, schedule):
  """`carry` (named slots) in the flat layout: the template its checkpoints restore into."""
  old = dict(carry['algo'], rng=carry['rng'])
  if carry['reference'] is not None:
    old['reference'] = carry['reference']
  name = type(schedule).__name__
  if name in _FLAT:
    old[_FLAT_KEY[name]] = _FLAT[name][0](schedule, carry['rollout'])
  return old


def from_flat_carry(old, meta, carry, schedule):
  """(carry, meta) of a checkpoint restored into `flat_carry(carry, schedule)`."""
  new = dict(algo={k: old[k] for k in carry['algo']}, rng=old['rng'],
             reference=old.get('reference'), rollout=None)
  name = type(schedule).__name__
  if name in _FLAT:
    new['rollout'], answers = _FLAT[name][1](schedule, old[_FLAT_KEY[name]])
    meta = dict(meta, answers=answers)
  return new, meta


# --------------------------------------------------------------------------------------------
# Prompt indices.
# --------------------------------------------------------------------------------------------


def held_prompt_ids(meta, answers):
  """The stream indices of the prompts a restored schedule holds: the checkpoint's, or None for
  each held answer of a checkpoint saved before they were kept (prompts.jsonl logs them so)."""
  if 'prompt_ids' in meta:
    return meta['prompt_ids']
  if isinstance(answers, dict):
    return dict.fromkeys(answers)
  return None if answers is None else [None] * len(answers)
