"""Align, then accelerate (arXiv 2608.29296) as one resumable job run by the same main as training:

  python -m rljax.main --config=configs/protocol.py:runlocal --workdir=D

1. Calibrate: lr0 at the base batch, a short lr sweep to the target (skipped when protocol.lr0 is
   given). Every arm's lr follows from it by the sqrt rule (controls: the base arm's lr).
2. Align: every arm (a batch, or a fixed-lr control) x protocol.num_seeds seeds is an ordinary
   training run in D/arms/<arm>/seed_<k>/, all from ONE cached warm start, each until target +
   stop_margin (protocol.stop_at_target) or its sample budget, evaluated on one sample grid
   whatever its batch.
3. Throughput: protocol.throughput_rounds interleaved rounds over the candidate batches.
   protocol.quick runs only the base arm of step 2: every batch's rN is then predicted from the
   base arm's noise scale (decision.rn_from_noise_scale), at a fraction of the sweep's samples.
4. Staged seeds: the base and the batch with the shortest predicted time get more seeds while
   that batch's interval holds 1, up to protocol.max_seeds per arm and protocol.extra_seeds.
5. Decide (rljax.protocol.report), then confirm at the base and at the fastest batch with fresh
   seeds, each run to the decision's target.

Every file the report reads is written through rljax.protocol.layout's schema. A run writes
done.json when it returns; a re-run skips the runs that have one and resumes the others from
their checkpoints. Every run directory keeps the config it was started with (config.json): a
re-run with a different config for that run is an error, never a silent mix of two experiments in
one report. D/timing.json keeps the seconds each phase took.
"""
import os
import shutil
import time

import jax
import ml_collections
import numpy as np

from rljax import algos
from rljax import stats
from rljax.protocol import calibration as calibration_lib
from rljax.protocol import curves
from rljax.protocol import decision as decision_lib
from rljax.protocol import jobs
from rljax.protocol import layout
from rljax.protocol import report as report_lib
from rljax.protocol.runs import (arm_config, arms, batch_of, checked_arm, default_lr0, make_arm,
                                 run_arm_seeds, value_of)
from rljax.train import loop as train


def calibration_name(lr):
  return f'lr{lr:g}'


def calibration_lrs(config):
  """The calibration's first bracket at the base batch: default_lr0 x each calibration_factors."""
  centre = default_lr0(config)
  return [float(f'{centre * f:.3g}') for f in config.protocol.calibration_factors]


def calibration_arm(config, workdir, lr, divisor=1):
  """The base batch at `lr` on the calibration's grid and budget, both / divisor (`calibrate`). It
  stops at a given target (+ margin); with a placed one it runs its whole budget (the target
  needs every curve's top)."""
  p = config.protocol
  cfg = arm_config(config, workdir, p.base, lr)
  cfg.train.target = min(p.target + p.stop_margin, 1.0) if p.target else 0.0
  cfg.train.max_samples, every = calibration_lib.divided(
      p.calibration_max_samples or p.max_samples,
      p.calibration_eval_every_samples or p.eval_every_samples, divisor, batch_of(p.base, cfg))
  cfg.train.eval_every = max(1, every // batch_of(p.base, cfg))
  cfg.train.checkpoint_every = cfg.train.eval_every * p.checkpoint_every_evals
  return checked_arm(calibration_name(lr), p.base, cfg)


# ------------------------------------------------------------------------------------------------
# Phases.
# ------------------------------------------------------------------------------------------------


def calibrate(config, workdir, runner):
  """(lr0, J) at the base batch: lr0 given, or the calibration's choice (rljax.protocol.calibration)
  on a target given or placed on its runs' curves; the bracket moves past an edge while
  protocol.calibration_max_lrs allows. Never fails for want of a target: it says what it chose.
  With protocol.budget_scales, the first run's curve divides the others' budget and grid, and
  lr0's curve the arms' (calibration.json keeps them; `with_budget`)."""
  p = config.protocol
  if p.lr0 > 0:
    layout.write(workdir, 'calibration', dict(lr0=p.lr0, source='given', target=p.target))
    return p.lr0, p.target
  lrs = calibration_lrs(config)
  first = calibration_arm(config, workdir, lrs[0])
  run_arm_seeds(workdir, 'calibration', first, [0], f'calibrate 1/{len(lrs)}', runner)
  runner.wait()
  divisor = calibration_lib.divisor(_calibration_runs(workdir, lrs[:1])[lrs[0]],
                                    first.config.train.max_samples, p.budget_scales)[0]
  arm_at = lambda lr: calibration_arm(config, workdir, lr, divisor)
  budget = arm_at(lrs[0]).config.train.max_samples if divisor > 1 else None
  for seed in range(p.calibration_seeds):   # seed-major: an interrupted sweep is already usable
    for i, lr in enumerate(lrs):
      if seed or i:
        run_arm_seeds(workdir, 'calibration', arm_at(lr), [seed], f'calibrate {i + 1}/{len(lrs)}',
                      runner)
  runner.wait()
  while True:
    choice = calibration_choice(config, workdir, lrs, budget)
    lr = calibration_lib.next_lr(lrs, choice['lr0'], p.calibration_max_lrs)
    if lr is None:
      break
    print(f"[protocol] lr {choice['lr0']:g} is at the edge of {sorted(lrs)}: extending to {lr:g}",
          flush=True)
    lrs.append(lr)
    run_arm_seeds(workdir, 'calibration', arm_at(lr), range(p.calibration_seeds),
                  f'calibrate {len(lrs)}', runner)
    runner.wait()
  layout.write(workdir, 'calibration', dict(
      lr0=choice['lr0'], source='calibrated', at_edge=choice['at_edge'], target=choice['target'],
      method=choice['method'], **_budgets(config, workdir, choice['lr0'], budget)))
  _say_calibration(choice, lrs)
  return choice['lr0'], choice['target']


def _calibration_runs(workdir, lrs):
  names = {calibration_name(lr) for lr in lrs}
  return {a['spec']['lr']: a['runs'] for a in layout.load_group(workdir, 'calibration')
          if a['spec']['name'] in names}


def calibration_choice(config, workdir, lrs, budget=None):
  p = config.protocol
  return calibration_lib.choose(_calibration_runs(workdir, lrs), p.target, p.calibration_fraction,
                                p.smooth_window, p.level, budget, p.calibration_ceiling)


def _budgets(config, workdir, lr0, budget):
  """With protocol.budget_scales: the calibration runs' budget after the first, and the arms'
  budget and grid divided as lr0's curve allows (docs/guide/protocol.md, "Budget and eval grid")."""
  p = config.protocol
  if not p.budget_scales:
    return {}
  runs = [curves.until(r, budget) if budget else r for r in _calibration_runs(workdir, [lr0])[lr0]]
  divisor, scale = calibration_lib.divisor(runs, p.max_samples, p.budget_scales)
  top = max(batch_of(v, config.arm) for v in p.sweep)
  max_samples, every = calibration_lib.divided(p.max_samples, p.eval_every_samples, divisor, top)
  return dict(time_scale=scale, calibration_budget=budget, max_samples=max_samples,
              eval_every_samples=every)


def with_budget(config, workdir):
  """config with the arms' budget and eval grid calibration.json derived, where it did."""
  derived = layout.read(workdir, 'calibration') or {}
  if 'max_samples' not in derived:
    return config
  config = ml_collections.ConfigDict(config.to_dict())
  config.protocol.update(max_samples=derived['max_samples'],
                         eval_every_samples=derived['eval_every_samples'])
  return config


def _say_calibration(choice, lrs):
  """One line for lr0 and J; a warning line where the choice is a fallback."""
  print(f"[protocol] lr0 = {choice['lr0']:g}, J = {choice['target']:.3f} "
        f"({choice['target_rule']})", flush=True)
  if choice['method'] != 'fewest samples to target':
    print(f"rljax: warning: no calibration lr reached J = {choice['target']:.3f} on every seed; "
          f"lr0 = {choice['lr0']:g} has the most progress at the budget (report.md says so)",
          flush=True)
  elif choice['at_edge']:
    print(f"rljax: warning: lr0 = {choice['lr0']:g} is still at the edge of {sorted(lrs)} after "
          'protocol.calibration_max_lrs lrs: the optimum may lie beyond (report.md says so)',
          flush=True)


def summarise_throughput(run_dir, warmup):
  """Steady-state throughput of a short run by stats.steady_throughput, with per-step medians."""
  train_rows = layout.load_run(run_dir)['train']
  samples = np.diff(np.concatenate([[0.0], train_rows['samples']]))
  samples_per_s = stats.steady_throughput(samples, train_rows['step_time_s'], warmup)
  if not np.isfinite(samples_per_s):
    raise ValueError(f'{run_dir}: no steps after the {warmup} warm-up steps')
  median = lambda key: float(np.median(train_rows[key][warmup:]))
  return dict(samples_per_s=samples_per_s, step_time_s=median('step_time_s'),
              rollout_time_s=median('rollout_time_s'), update_time_s=median('update_time_s'),
              steps_measured=len(train_rows['step']) - warmup, warmup_steps=int(warmup))


def measure_throughput(config, workdir, value, lr0, round_index, stop=None):
  """One round at one batch: a few steps, no target, in D/throughput/<batch>/ (skipped if there)."""
  p = config.protocol
  cfg = arm_config(config, workdir, value, lr0)
  batch = batch_of(value, cfg)
  if layout.read(workdir, 'throughput', batch=batch, round=round_index) is not None:
    print(f'[protocol] throughput at batch {batch}, round {round_index}: already measured, '
          'skipped', flush=True)
    return
  cfg.train.max_samples, cfg.train.max_steps = 0, p.throughput_warmup + p.throughput_steps
  cfg.train.target, cfg.train.checkpoint_every, cfg.train.eval_from_samples = 0.0, 0, 0
  cfg.train.eval_first_samples = 0
  cfg.train.eval_every = cfg.train.max_steps + 1   # evals are not part of the steady state
  run_dir = os.path.join(workdir, 'throughput', str(batch), f'run_{round_index}')
  shutil.rmtree(run_dir, ignore_errors=True)   # a fresh measurement, never a resumed one
  train.train(cfg, run_dir, stop)
  result = dict(batch=batch, round=round_index, value=value,
                **summarise_throughput(run_dir, p.throughput_warmup))
  layout.write(workdir, 'throughput', result, batch=batch, round=round_index)
  print(f"[protocol] throughput at batch {batch}, round {round_index}: "
        f"{result['samples_per_s']:.0f} samples/s", flush=True)


def measure_throughputs(config, workdir, lr0, stop=None):
  """Rounds interleaved across batches, so slow drift of a shared machine hits every batch."""
  p = config.protocol
  values = sorted(set(p.sweep) | set(p.throughput))
  for round_index in range(p.throughput_rounds):
    for value in values:
      measure_throughput(config, workdir, value, lr0, round_index, stop)


def _seeds_of(workdir, arm):
  """The seeds an align arm has started, from its seed_<k> directories."""
  root = os.path.join(workdir, 'arms', arm.name)
  names = os.listdir(root) if os.path.isdir(root) else []
  return sorted(int(d[len('seed_'):]) for d in names
                if d.startswith('seed_') and d[len('seed_'):].isdigit())


def _staged(report, counts, max_seeds):
  """Arms that get one more seed: the base and the batch with the shortest predicted time among
  the others, while that batch's interval holds 1 (more seeds can change the answer there). The
  base enters every comparison, so its seeds narrow them all."""
  decision = report['decision']
  if decision['verdict'] in ('faster', 'undefined'):
    return []
  rows = [c for c in decision['candidates']
          if 'relative_wallclock' in c and c['batch'] != report['base_batch']]
  if not rows:
    return []
  best = min(rows, key=lambda c: c['relative_wallclock'])
  if not best['relative_wallclock_ci'][0] < 1:
    return []
  names = {a['batch']: a['name'] for a in report['arms'] if not a['control']}
  return [n for n in (names[report['base_batch']], names[best['batch']]) if counts[n] < max_seeds]


def add_seeds(config, workdir, arm_list, runner):
  """Staged seeds: one more at the base and at the point-fastest batch per round (_staged),
  within protocol.max_seeds per arm and protocol.extra_seeds in all."""
  p, by_name = config.protocol, {a.name: a for a in arm_list}
  for arm in arm_list:   # finish any seed a killed run had started, so decisions replay alike
    run_arm_seeds(workdir, 'arms', arm, _seeds_of(workdir, arm), 'align (resume)', runner)
  runner.wait()
  spent = sum(len(_seeds_of(workdir, a)) - p.num_seeds for a in arm_list)
  while spent < p.extra_seeds:
    report = report_lib.write_report(workdir, with_plots=False)
    counts = {a.name: len(_seeds_of(workdir, a)) for a in arm_list}
    chosen = _staged(report, counts, p.max_seeds)[:p.extra_seeds - spent]
    if not chosen:
      break
    for name in chosen:
      seed = max(_seeds_of(workdir, by_name[name])) + 1
      run_arm_seeds(workdir, 'arms', by_name[name], [seed], 'extra seed', runner)
    runner.wait()
    spent += len(chosen)


def confirm(config, workdir, report, lr0, stop=None):
  """Runs to the decision's target at the base and at the batch decision.to_confirm names, with
  seeds the align runs never use, as many a side as the report's confirm_plan sized for its power
  (else confirm_seeds); seed-major (base, pick, base, pick, ...) so a machine that slows down over
  the phase slows both batches alike instead of biasing their ratio."""
  p, pick = config.protocol, decision_lib.to_confirm(report['decision'])
  if pick is None:
    print('[protocol] no decision (see report.md): nothing to confirm', flush=True)
    return
  arm_list = [make_arm(config, workdir, value_of(batch, config.arm), lr0)
              for batch in sorted({report['base_batch'], pick})]
  for arm in arm_list:
    arm.config.train.target = min(report['primary'] + p.stop_margin, 1.0)   # the decision's
  seeds = (report.get('confirm_plan') or {}).get('seeds', p.confirm_seeds)
  for seed in range(p.max_seeds, p.max_seeds + seeds):
    for arm in arm_list:
      run_arm_seeds(workdir, 'confirm', arm, [seed], f'confirm at batch {arm.batch}',
                    jobs.InProcess(stop))   # timed: never beside other jobs


def write_protocol_json(config, workdir, base, target):
  """protocol.json: `target` is J as calibration set it; protocol.target keeps the setting."""
  p = config.protocol
  layout.write(workdir, 'protocol', dict(
      algo=config.algo, target=target, targets=list(p.targets),
      target_fractions=list(p.target_fractions), base_arm=base.name, base_batch=base.batch,
      rn_tolerance=p.rn_tolerance, smooth_window=p.smooth_window, level=p.level,
      n_draws=p.n_draws, seed=p.analysis_seed, throughput_warmup=p.throughput_warmup,
      sweep_key=algos.get(config.algo).BATCH_ARG, protocol=p.to_dict()))


def _compilation_cache(workdir):
  """Seeds of one arm compile the same programs: compile once, load them from disk after."""
  if not jax.config.jax_compilation_cache_dir:
    jax.config.update('jax_compilation_cache_dir', os.path.join(os.path.abspath(workdir),
                                                                'jax_cache'))
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.5)


def timed(workdir, phase, fn, *args):
  """fn(*args), its seconds added to D/timing.json under `phase` (a resumed phase adds what it
  spends again; a killed invocation's partial phase is not counted)."""
  start = time.time()
  result = fn(*args)
  timing = layout.read(workdir, 'timing') or {}
  timing[phase] = timing.get(phase, 0.0) + time.time() - start
  layout.write(workdir, 'timing', timing)
  return result


def align(config, workdir, arm_list, runner):
  """Every arm x protocol.num_seeds, seed-major: a partial sweep is already a report."""
  for seed in range(config.protocol.num_seeds):
    for i, arm in enumerate(arm_list):
      run_arm_seeds(workdir, 'arms', arm, [seed], f'align {i + 1}/{len(arm_list)}', runner)
  runner.wait()


def run(config, workdir, stop=None):
  """The whole protocol in `workdir`; returns the final report (also written there). `stop` (a
  preemption.StopRequest) ends it after the current step of the current run, with a checkpoint:
  re-running resumes there."""
  if not workdir:
    raise ValueError('the protocol needs a --workdir')
  p, start = config.protocol, time.time()
  arm_list = arms(config, workdir)   # validates everything before anything trains
  os.makedirs(workdir, exist_ok=True)
  if p.compilation_cache:
    _compilation_cache(workdir)
  runner = jobs.runner(config, workdir, stop)
  lr0, target = timed(workdir, 'calibration', calibrate, config, workdir, runner)
  config = with_budget(config, workdir)
  arm_list = arms(config, workdir, lr0, target)
  base = next(a for a in arm_list if a.value == p.base and not a.control)
  write_protocol_json(config, workdir, base, target)
  if p.quick:   # every batch's rN from the base arm's noise scale instead of its own arm
    arm_list = [base]
  timed(workdir, 'align', align, config, workdir, arm_list, runner)
  timed(workdir, 'throughput', measure_throughputs, config, workdir, lr0, stop)
  timed(workdir, 'extra seeds', add_seeds, config, workdir, arm_list, runner)
  report = report_lib.write_report(workdir)
  if p.confirm:
    timed(workdir, 'confirm', confirm, config, workdir, report, lr0, stop)
    report = report_lib.write_report(workdir)
  print(f"[protocol] wrote {os.path.join(workdir, 'report.md')} in {time.time() - start:.0f} s "
        f"(this invocation); recommended batch: {report['recommended']}", flush=True)
  print(report['summary'], flush=True)
  return report
