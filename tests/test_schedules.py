"""Rollout schedules (rljax.train.schedules): each chosen from the config, with the carry's named
slots (checkpoints in the flat layout before the slots: tests/test_upgrades.py)."""
from configs import grpo as grpo_config
from rljax.train import run as run_lib
from rljax.train import schedules


def tiny(schedule, data_dir):
  """The config the fixtures were written with (a 1-layer dense model, P=4 x G=4)."""
  config = grpo_config.get_config('runlocal,P=4,G=4')
  config.model.update(d_model=16, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=8,
                      num_experts=0, dense_hidden=32)
  config.data.update(dir=data_dir, digits=1, num_train=200, num_test=20)
  config.warmstart.enabled = False
  config.metrics.update(tensorboard=False, progress=False)
  config.optimizer.decay = 'constant'
  config.train.update(max_samples=0, max_steps=2, eval_every=10, eval_size=8, micro_batch=8,
                      checkpoint_every=1, keep_checkpoints=1)
  if schedule == 'each_step':
    config.grpo.kl_coef = 0.01
  elif schedule == 'partial':
    config.rollout.update(slots=6, schedule='partial', max_staleness=1, max_new_tokens=8)
  else:
    config.rollout.update(schedule='drawn_ahead', devices=4, slots=6, max_new_tokens=8)
  return config


def test_each_schedule_is_chosen_from_the_config(tmp_path):
  for schedule, kind in (('each_step', schedules.EachStep), ('partial', schedules.Partial),
                         ('drawn_ahead', schedules.DrawnAhead)):
    run, carry, _ = run_lib.setup(tiny(schedule, str(tmp_path / 'data')),
                                  str(tmp_path / schedule))
    run.ckpt.close()
    assert type(run.schedule) is kind   # pylint: disable=unidiomatic-typecheck
    assert (carry['rollout'] is None) == (schedule == 'each_step')
