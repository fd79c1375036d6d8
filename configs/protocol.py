"""The align-then-accelerate protocol (docs/method.md), run by the same main as one training:

  python -m rljax.main --config=configs/protocol.py:runlocal --workdir=D
  python -m rljax.main --config=configs/protocol.py:algo=ppo,runlocal --workdir=D
  python -m rljax.analysis --workdir=D      # rebuilds D/report.* from the logs, no training

Args after ':' (comma-separated): algo (grpo | ppo), mlperf (MLPerf Training v6.1's GRPO rules,
closed division, at its reference batches 256/512/1024; with runlocal their CPU analogue:
docs/guide/mlperf.md), runlocal (a CPU-sized protocol for 2 cores:
docs/guide/protocol.md; a base of 16 responses, targets deep in training, where a larger batch
can win), shallow (with runlocal: the earlier preset, base 128, a target a few points above the
warm start), small (with runlocal, GRPO: base 16, the shallow target), task (GRPO's task,
configs/grpo.py: arithmetic | sums | tools; another than arithmetic with the deep runlocal preset),
quick (the quick answer alone: calibration at one seed per lr, the base arm at two seeds, the
throughput rounds; with the deep runlocal preset a third of its full sweep's training samples),
seeds (seeds per arm to start with). Every arm is configs/<algo>.py at one batch:
`--config.arm.a.b=value` changes a field of every arm (e.g. --config.arm.data.dir=/tmp/data),
`--config.protocol.x=value` a protocol setting (e.g. --config.protocol.sweep='(8,16,32)').
Batches are given as the algo's batch argument (GRPO: P prompts of G responses; PPO: B).
"""
import importlib

import ml_collections

from configs import common
from rljax.protocol import mlperf


def arm_config(algo, arg):
  """configs/<algo>.py's get_config(arg): every arm is an ordinary training config of its algo."""
  try:
    module = importlib.import_module(f'configs.{algo}')
  except ModuleNotFoundError:
    raise ValueError(f'config arg algo={algo!r}: there is no configs/{algo}.py') from None
  return module.get_config(arg)


def get_config(arg=None):
  arg = common.parse_arg(arg, algo='grpo', runlocal=False, small=False, shallow=False,
                         quick=False, seeds=-1, task='arithmetic',
                         mlperf=False)   # seeds -1: the preset's
  if arg.mlperf and (arg.algo != 'grpo' or arg.small or arg.shallow or arg.quick):
    raise ValueError("config arg mlperf: MLPerf's RL benchmark is GRPO, run to its target per "
                     'batch and seed; give mlperf or mlperf,runlocal (and seeds=N)')
  if arg.small and not (arg.runlocal and arg.algo == 'grpo'):
    raise ValueError('config arg small: a GRPO runlocal preset; give algo=grpo,runlocal,small')
  if arg.shallow and not arg.runlocal:
    raise ValueError('config arg shallow: a runlocal preset; give runlocal,shallow')
  if arg.small and arg.shallow:
    raise ValueError('config args small and shallow: two presets; give one')
  deep = arg.runlocal and not (arg.small or arg.shallow or arg.mlperf)
  if arg.task != 'arithmetic' and not (deep and arg.algo == 'grpo'):
    raise ValueError(f'config arg task={arg.task}: GRPO with the deep runlocal preset '
                     f'(algo=grpo,runlocal,task={arg.task}); the other presets were placed on the '
                     'arithmetic task')
  seeds = (8 if deep else 4 if arg.small else 6 if arg.mlperf else 3) if arg.seeds == -1 else (
      arg.seeds)
  arm_arg = ','.join(['runlocal'] * arg.runlocal
                     + [f'task={arg.task}'] * (arg.task != 'arithmetic'))
  arm = arm_config(arg.algo, arm_arg)
  unit = arm.rollout.G   # responses per batch argument (GRPO: G responses to each of P prompts)
  if deep:           # batches in responses (G=8: P = 2, 8, 32); evals every 8192 samples
    sweep, base, control = (16, 64, 256), 16, ()
  elif arg.small:    # batches in responses (G=8: P = 2 ... 16); evals every 128 samples
    sweep, base, control = (16, 32, 64, 128), 16, (32,)
  elif arg.runlocal:   # batches in responses (G=8: P = 16 ... 128); evals every 1024 samples
    sweep, base, control = (128, 256, 512, 1024), 128, (256,)
  else:              # the paper's GRPO sweep (G=8: P = 64 ... 2048)
    sweep, base, control = (512, 1024, 2048, 4096, 8192, 16384), 1024, (2048,)
  if arg.algo == 'ppo' and not arg.runlocal:   # PPO's B = 256 ... 4096
    sweep, base, control = (256, 512, 1024, 2048, 4096), 256, (512,)

  config = ml_collections.ConfigDict()
  config.mode = 'protocol'
  config.algo = arg.algo
  # Each field's type, range and meaning: docs/reference/config.md; here, why a default is so.
  config.protocol = dict(
      arm_arg=arm_arg, sweep=tuple(b // unit for b in sweep), base=base // unit,
      control=tuple(b // unit for b in control), throughput=(),
      lr0=0.0, calibration_factors=(0.5, 0.71, 1.0, 1.41, 2.0),   # a 4x range around the arm's
      calibration_seeds=2, calibration_max_lrs=7, calibration_fraction=0.5,
      calibration_ceiling=0.0, calibration_eval_every_samples=0,
      calibration_max_samples=0 if arg.runlocal else 1_000_000,   # a quarter of an arm's
      num_seeds=seeds, max_seeds=seeds + 2, extra_seeds=4, warmstart_seed=0, seed_offset=0,
      # J placed from the calibration runs' curves: no preset but MLPerf's holds an accuracy that
      # one CPU's rounding chose.
      target=0.0, stop_at_target=True, stop_margin=0.03,
      target_fractions=(0.3, 0.5, 0.7), targets=(),
      max_samples=32_000 if arg.runlocal else 4_000_000,
      eval_every_samples=1024 if arg.runlocal else 16_384, eval_first_samples=0, budget_scales=0,
      min_micro_batches=2,         # B_simple, the noise scale, needs two at every batch
      checkpoint_every_evals=4, smooth_window=5, rn_tolerance=0.2, level=0.95, n_draws=4000,
      analysis_seed=0, throughput_rounds=3, throughput_warmup=2, throughput_steps=4,
      quick=False, confirm=True, confirm_seeds=2, confirm_power=0.0, compilation_cache=True,
      scheduler='', job_setup='', job_sbatch_args='', mlperf='', division='closed',
  )
  # Every arm's training config; the protocol sets its batch (P for GRPO, B for PPO) and its lr.
  config.arm = arm
  config.arm.rollout.P = 0   # set per arm by the protocol, from protocol.sweep
  if arg.algo == 'grpo' and not deep:   # arms hold a constant lr (the runlocal demo anneals a
    config.arm.optimizer.update(lr=5e-5, decay='constant')   # higher one; arms stop at J)
  if arg.runlocal and not deep:
    config.arm.train.eval_size = 1000   # all the test split: ~1.5 points std error per eval
    # Stop the warm start right at its threshold (accuracy jumps sharply there, docs/method.md):
    # RL from that earlier policy climbs slowly enough for rN to be resolved.
    config.arm.warmstart.eval_every = 5
    # The shallow presets' J sat a few points above the warm start (0.37 from 0.32 for GRPO, 0.42
    # for PPO), reached in 2-4k samples: on the committed archives' curves these fractions of
    # the rise within the budget place it there again.
    config.protocol.update(calibration_max_samples=8192 if arg.algo == 'grpo' else 16_384,
                           calibration_fraction=0.45 if arg.algo == 'grpo' else 0.65)
  if arg.small:   # small steps are cheap: a finer eval grid, more seeds and throughput rounds
    config.protocol.update(eval_every_samples=128, max_seeds=8, extra_seeds=8,
                           throughput_rounds=8, throughput_steps=8, confirm_seeds=6)
  if deep:
    deep_preset(config)
  if arg.mlperf:
    mlperf_preset(config, 'runlocal' if arg.runlocal else 'qwen35_397b_grpo')
  if arg.quick:   # the answer from the base arm's noise scale (docs/guide/protocol.md)
    config.protocol.update(quick=True, calibration_seeds=1, confirm=False,
                           num_seeds=2 if arg.seeds == -1 else arg.seeds)
  return config


def deep_preset(config):
  """Targets deep in training (docs/guide/protocol.md, "Where the target sits"): every arm runs
  the whole budget, the targets sit at 50/70/90% of the way from the warm start to the base arm's
  top, and lr0 is calibrated on a proxy target 70% of the way to the calibration runs' top (on the
  CPU the preset was first run on, where the proxy was 0.50, that placed it at 0.48-0.49), with
  at most six lrs x two seeds: a quarter of the sweep's training samples. Evaluations on 4000
  held-out prompts (the test split's 1000 and 3000 drawn after the training split, so the training
  data and the warm start stay the README run's; another task's test split holds all 4000), which
  shrinks the evaluation's own noise; on the same training runs it changed the seeds' spread of
  samples to J little (docs/guide/protocol_results.md). Eight seeds per arm (and up to four staged)
  and 16 throughput rounds (at 10 the rounds carried ~40% of an arm's log-time variance): the
  decision's power at the paper's truth (docs/guide/protocol_results.md, "Power and cost")."""
  config.protocol.update(
      stop_at_target=False, target_fractions=(0.5, 0.7, 0.9),
      max_samples=65_536, eval_every_samples=8192, smooth_window=3,
      calibration_factors=(0.5, 1.0, 2.0), calibration_eval_every_samples=2048,
      calibration_max_samples=32_768, calibration_max_lrs=6, calibration_fraction=0.7,
      calibration_ceiling=0.9,
      max_seeds=12, extra_seeds=4, throughput_rounds=16, throughput_steps=16, confirm_seeds=4,
      confirm_power=0.8,
      eval_first_samples=max(config.protocol.sweep) * config.arm.rollout.G, budget_scales=16)
  # The arm's own runlocal lr held constant (GRPO arithmetic: the README run's 1e-4), and its own
  # warm start (arithmetic: the README run's, 0.37 on the CPU the preset was tuned on).
  config.arm.optimizer.decay = 'constant'
  held_out = 4000
  if config.arm.data.name == 'arithmetic':
    config.arm.data.extra_test = held_out - config.arm.data.num_test
  else:   # only the arithmetic builder draws extra problems after its training split
    config.arm.data.num_test = held_out
  config.arm.train.eval_size = held_out


def mlperf_preset(config, name):
  """MLPerf Training v6.1's GRPO closed rules (rljax.protocol.mlperf.RULES[name]): lr and clip as
  functions of the batch, constant lr, no warmup, AdamW (0.9, 0.999), G = 16 at temperature 1,
  one optimizer step per batch, evaluations on its eval-set size and on its validation boundaries
  (every step from its validation start; the protocol's own grid before), runs to its target. The
  batches are its RCPs' (1, 2 and 4 x the reference batch; the analogue adds 8x, where this CPU's
  samples/s still grow), six seeds each as an RCP has (twice a submission's three runs)."""
  rules = mlperf.RULES[name]
  arm, b1, b2 = config.arm, *rules.betas
  arm.rollout.update(G=rules.G, temperature=1.0, top_p=1.0, top_k=0)
  arm.optimizer.update(lr=rules.lr, base_batch=rules.batch, lr_rule='sqrt',
                       max_grad_norm=rules.clip, clip_rule='inverse_sqrt', warmup_steps=0,
                       decay='constant', b1=b1, b2=b2, eps=rules.eps,
                       weight_decay=rules.weight_decay)
  arm.train.update(eval_size=rules.eval_prompts, num_minibatches=1, num_epochs=1)
  runlocal = name == 'runlocal'
  base = rules.batch // rules.G
  config.protocol.update(
      mlperf=name, division='closed', base=base, control=(), throughput=(), lr0=rules.lr,
      sweep=tuple(base * k for k in ((1, 2, 4, 8) if runlocal else (1, 2, 4))),
      target=rules.target, targets=(rules.target,), stop_at_target=True, max_samples=65_536,
      eval_every_samples=2048 if runlocal else 1024, smooth_window=3, confirm_seeds=3)
  if runlocal:   # the deep preset's warm start (the arm's own) and throughput rounds
    arm.warmstart.eval_every = 25
    config.protocol.update(throughput_rounds=16, throughput_steps=16)
