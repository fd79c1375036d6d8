"""MLPerf Training v6.1's RL benchmark (GRPO) as rules of the protocol (docs/guide/mlperf.md).

Its closed division fixes every hyperparameter but the batch, each as a function of the global
batch B (responses: prompts per step x 16 responses per prompt):
lr = 1e-6 sqrt(B / 256), clip = 0.125 sqrt(256 / B), constant lr, no warmup, AdamW (0.9, 0.999,
1e-8, no weight decay), validation after every step from B ceil(2.5 + 3840 / B) samples on, and a
target the eval accuracy must exceed. Sources, in github.com/mlcommons/logging:
  mlperf_logging/compliance_checker/training_6.1.0/closed_qwen35_397b_grpo.yaml   (the rules)
  mlperf_logging/compliance_checker/training_6.1.0/open_qwen35_397b_grpo.yaml     (open)
  mlperf_logging/rcp_checker/training_6.1.0/rcps_qwen35_397b_grpo.json            (the RCPs)
  mlperf_logging/benchmark_meta.py                 (3 result files per submission)

config.protocol.mlperf names a rule set (RULES) and config.protocol.division says whether its
closed rules hold: every arm a closed run builds is checked against them (`check_arms`), and a
field that breaks one is one clear error unless the run is marked open-division.
"""
import math
from typing import NamedTuple


class Rules(NamedTuple):
  benchmark: str         # MLPerf's name for it (submission_benchmark; the RCP records' Benchmark)
  batch: int             # the reference global batch, in responses, at which lr and clip are given
  lr: float              # lr(B) = lr x sqrt(B / batch)
  clip: float            # clip(B) = clip x sqrt(batch / B)
  G: int                 # num_generations_per_prompt
  start_steps: float     # validation_start_samples = B x ceil(start_steps + start_samples / B)
  start_samples: float
  eval_prompts: int      # eval_samples
  target: float          # a run converges at its first validation whose accuracy exceeds this
  runs: int              # result files per submission (rcp_checker.submission_runs)
  betas: tuple = (0.9, 0.999)
  eps: float = 1e-8
  weight_decay: float = 0.0


RULES = {
    'qwen35_397b_grpo': Rules('qwen35_397b_grpo', 256, 1e-6, 0.125, 16, 2.5, 3840, 256, 0.69, 3),
    # The CPU analogue on the arithmetic task (docs/guide/mlperf.md, "The runlocal analogue"):
    # MLPerf's forms and constants in responses, except three that are the reference's own:
    # the lr, 8.85e-6 at 16 responses (the deep preset's calibrated lr0 on this CPU; MLPerf's
    # 1e-6 is its reference's), carried to the analogue's reference batch 32 (the smallest whose
    # two micro-batches hold whole groups of 16) by the rule itself; the samples term of the
    # validation start, MLPerf's 3840 x 8 / 3 (MLPerf's reference reaches its target by its
    # first validation, 4608 samples; the analogue's by ~10-14k samples); and the target.
    'runlocal': Rules('qwen35_397b_grpo', 32, 8.85e-6 * math.sqrt(32 / 16),
                      0.125 * math.sqrt(256 / 32), 16, 2.5, 10_240, 256, 0.60, 3),
}
DIVISIONS = ('closed', 'open')


def rules_of(protocol):
  """The Rules that config.protocol (or protocol.json's 'protocol' dict) names; None for none."""
  name = protocol.get('mlperf', '') if hasattr(protocol, 'get') else ''
  return RULES[name] if name else None


def lr_at(rules, batch):
  return rules.lr * math.sqrt(batch / rules.batch)


def clip_at(rules, batch):
  return rules.clip * math.sqrt(rules.batch / batch)


def start_at(rules, batch):
  """validation_start_samples at a global batch of `batch` responses, as the compliance checker
  computes it: B x ceil(2.5 + 3840 / B) in MLPerf's rules. Validations follow every B samples."""
  return batch * math.ceil(rules.start_steps + rules.start_samples / batch)


def validation_start(protocol, batch):
  """start_at for the rules that `protocol` names; 0 (no validation boundaries) for none."""
  rules = rules_of(protocol)
  return 0 if rules is None else start_at(rules, batch)


def check_settings(protocol):
  """ValueError naming protocol.mlperf or protocol.division when it is not one of its choices."""
  if protocol.mlperf and protocol.mlperf not in RULES:
    raise ValueError(f'protocol.mlperf {protocol.mlperf!r} is not a rule set; choose one of '
                     f"{sorted(RULES)} or '' (none)")
  if protocol.division not in DIVISIONS:
    raise ValueError(f'protocol.division must be one of {DIVISIONS}, got {protocol.division!r}')


def _fixed_fields(rules, cfg):
  """(field, value, the closed rule's value) for each fixed setting of an arm's training config."""
  opt, rollout, train = cfg.optimizer, cfg.rollout, cfg.train
  return [('optimizer.warmup_steps', opt.warmup_steps, 0),
          ('optimizer.decay', opt.decay, 'constant'), ('optimizer.b1', opt.b1, rules.betas[0]),
          ('optimizer.b2', opt.b2, rules.betas[1]), ('optimizer.eps', opt.eps, rules.eps),
          ('optimizer.weight_decay', opt.weight_decay, rules.weight_decay),
          ('rollout.G', rollout.G, rules.G), ('rollout.temperature', rollout.temperature, 1.0),
          ('rollout.top_p', rollout.top_p, 1.0), ('rollout.top_k', rollout.top_k, 0),
          # one optimizer step per rollout batch: the global batch is the optimizer's batch
          ('train.num_minibatches', train.num_minibatches, 1),
          ('train.num_epochs', train.num_epochs, 1),
          ('train.eval_size', train.eval_size, rules.eval_prompts)]


def _scaled(arm, rules, base_batch):
  """(what is off, the closed rule) for the arm's lr and clip at its batch, or None."""
  lr, clip, b = arm.lr, arm.clip, arm.batch
  if not math.isclose(lr, lr_at(rules, b), rel_tol=1e-9):
    return (f'trains at lr {lr:.6g} at batch {b}',
            f'{rules.lr:.6g} x sqrt({b} / {rules.batch}) = {lr_at(rules, b):.6g} (protocol.lr0, '
            f'the lr at the base batch {base_batch}, is {lr_at(rules, base_batch):.6g} by it)')
  if not math.isclose(clip, clip_at(rules, b), rel_tol=1e-9):
    return (f'clips at {clip:.6g} at batch {b}', f'{rules.clip:.6g} x sqrt({rules.batch} / {b}) = '
            f'{clip_at(rules, b):.6g} (optimizer.max_grad_norm, clip_rule=inverse_sqrt)')
  return None


def _arm_breach(arm, rules, base_batch):
  """(what is off, the closed rule) for one arm, or None."""
  fixed = [(f'has {field}={value!r}', repr(rule))
           for field, value, rule in _fixed_fields(rules, arm.config) if value != rule]
  breach = fixed[0] if fixed else _scaled(arm, rules, base_batch)
  return (f'arm {arm.name} {breach[0]}', breach[1]) if breach else None


def _protocol_breach(config, rules):
  """(what is off, the closed rule) for the protocol's own settings, or None."""
  p = config.protocol
  if config.algo != 'grpo':
    return f'algo={config.algo}', "'grpo'"
  if p.lr0 <= 0:
    return 'protocol.lr0=0 (an lr calibrated per run)', 'the lr rule (protocol.lr0 > 0)'
  if p.control:
    return (f'fixed-lr controls {tuple(p.control)}',
            'the lr rule at every batch (protocol.control=())')
  if p.target != rules.target:
    return f'protocol.target={p.target}', f'{rules.target} (the accuracy a run must exceed)'
  return None


def check_arms(config, arm_list):
  """In the closed division of protocol.mlperf's rules: ValueError, one line, at the first setting
  of the protocol or of an arm (lr and clip at its batch, the fixed fields) that breaks a rule."""
  rules, p = rules_of(config.protocol), config.protocol
  if rules is None or p.division == 'open':
    return
  base_batch = p.base * config.arm.rollout.G
  breach = _protocol_breach(config, rules) or next(
      filter(None, (_arm_breach(arm, rules, base_batch) for arm in arm_list)), None)
  if breach:
    raise ValueError(f"protocol.division='closed' (MLPerf {rules.benchmark}, rules "
                     f"{p.mlperf!r}): {breach[0]}, the closed rule is {breach[1]}; pass "
                     '--config.protocol.division=open to run it open-division')
