"""The align-then-accelerate protocol (docs/method.md), run by the same main as one training:

  python -m rljax.main --config=configs/protocol.py:runlocal --workdir=D
  python -m rljax.main --config=configs/protocol.py:algo=ppo,runlocal --workdir=D
  python -m rljax.analysis --workdir=D      # rebuilds D/report.* from the logs, no training

Args after ':' (comma-separated): algo (grpo | ppo), runlocal (a CPU-sized sweep that finishes in
about half an hour on 2 cores), seeds (seeds per arm). Every arm is configs/<algo>.py at one batch:
`--config.arm.a.b=value` changes a field of every arm (e.g. --config.arm.data.dir=/tmp/data),
`--config.protocol.x=value` a protocol setting (e.g. --config.protocol.sweep='(8,16,32)').
Batches are given as the algo's batch argument (GRPO: P prompts of G responses; PPO: B).
"""
import ml_collections

from configs import common


def get_config(arg=None):
  arg = common.parse_arg(arg, algo='grpo', runlocal=False, seeds=3)
  if arg.algo not in ('grpo', 'ppo'):
    raise ValueError(f"config arg algo={arg.algo!r}: choose 'grpo' or 'ppo'")
  unit = 8 if arg.algo == 'grpo' else 1   # responses per batch argument (GRPO's G)
  if arg.runlocal:   # batches in responses (G=8: P = 16 ... 256), timed from P = 4
    sweep, base, control = (128, 256, 512, 1024, 2048), 128, (256,)
    throughput = (32, 64) + sweep
  else:              # the paper's GRPO sweep (G=8: P = 64 ... 2048), and PPO's B = 256 ... 4096
    sweep, base, control = (512, 1024, 2048, 4096, 8192, 16384), 1024, (2048,)
    throughput = sweep + (32768,)
  if arg.algo == 'ppo' and not arg.runlocal:
    sweep, base, control, throughput = (256, 512, 1024, 2048, 4096), 256, (512,), (256, 512, 1024,
                                                                                   2048, 4096, 8192)

  config = ml_collections.ConfigDict()
  config.mode = 'protocol'
  config.algo = arg.algo
  config.protocol = dict(
      arm_arg='runlocal' if arg.runlocal else '',   # passed to configs/<algo>.py with the batch
      sweep=tuple(b // unit for b in sweep),        # sqrt-lr arms
      base=base // unit,                            # rN is measured against this arm
      control=tuple(b // unit for b in control),    # fixed-lr arms at the base arm's lr
      throughput=tuple(b // unit for b in throughput),
      num_seeds=arg.seeds,
      warmstart_seed=0,            # every arm and seed starts from this one warm start
      target=0.40 if arg.runlocal else 0.8,   # J: held-out greedy accuracy (runlocal starts at 0.315)
      stop_at_target=True,
      stop_margin=0.03,            # runs go on to J + margin so the smoothed crossing is bracketed
      max_samples=32_000 if arg.runlocal else 4_000_000,   # budget of each run, in responses
      eval_every_samples=1024 if arg.runlocal else 16_384,
      checkpoint_every_evals=4,
      smooth_window=5,             # evals in the centred moving average before the crossing
      rn_tolerance=0.2,            # |rN - 1| within this counts as aligned
      n_boot=1000,
      analysis_seed=0,
      throughput_warmup=2,         # steps left out of the steady state (compilation)
      throughput_steps=6,
      confirm=True,                # a run to target at the recommended batch
      compilation_cache=True,      # in D/jax_cache: every seed after the first skips compiling
  )
  # Every arm's training config; the protocol sets only its batch-dependent fields (P for GRPO).
  config.arm = common.algo_config(arg.algo, config.protocol.arm_arg)
  if arg.algo == 'grpo':   # arms hold the calibrated lr (the runlocal demo anneals a higher one
    config.arm.optimizer.update(lr=5e-5, decay='constant')   # over its fixed budget; arms stop at J)
  if arg.runlocal:
    config.arm.train.eval_size = 1000   # all the test split: ~1.5 points std error per eval
    # Stop the warm start right at its threshold (accuracy jumps sharply there, docs/method.md):
    # RL from that earlier policy climbs slowly enough for rN to be resolved.
    config.arm.warmstart.eval_every = 5
  return config
