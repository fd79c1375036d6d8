"""The protocol's settings (configs/protocol.py, config.protocol) checked before anything trains:
every bad value is one ValueError naming the field (rljax.main prints it as one line, exit 2)."""
from rljax.protocol import mlperf


def check(config):
  """ValueError naming the first bad protocol setting, before anything trains."""
  p = config.protocol
  if config.arm.rollout.P:
    raise ValueError(f'arm.rollout.P ({config.arm.rollout.P}) is set per arm by the protocol: '
                     'sweep the batch with protocol.sweep and protocol.base, not '
                     '--config.arm.rollout.P')
  values = list(p.sweep) + list(p.control) + list(p.throughput)
  if any(not isinstance(v, int) or v < 1 for v in values):
    raise ValueError(f'protocol.sweep, .control and .throughput must be positive integers, got '
                     f'{values}')
  if len(set(p.sweep)) != len(p.sweep) or len(set(p.control)) != len(p.control):
    raise ValueError(f'protocol.sweep {tuple(p.sweep)} / control {tuple(p.control)} repeat a batch')
  if p.base not in p.sweep:
    raise ValueError(f'protocol.base ({p.base}) must be one of protocol.sweep {tuple(p.sweep)}')
  if p.min_micro_batches < 1:
    raise ValueError(f'protocol.min_micro_batches must be >= 1, got {p.min_micro_batches}')
  if p.seed_offset < 0:
    raise ValueError(f'protocol.seed_offset must be >= 0, got {p.seed_offset}')
  if p.num_seeds < 1 or p.max_seeds < p.num_seeds or p.extra_seeds < 0:
    raise ValueError(f'protocol.num_seeds ({p.num_seeds}) must be >= 1 and <= max_seeds '
                     f'({p.max_seeds}), extra_seeds ({p.extra_seeds}) >= 0')
  if not 0 <= p.target <= 1 or any(not 0 < t <= 1 for t in p.targets):
    raise ValueError(f'protocol.target ({p.target}) must be 0 (placed by the calibration) or an '
                     f'accuracy in (0, 1], .targets {tuple(p.targets)} accuracies in (0, 1]')
  if not 0 < p.calibration_fraction < 1:
    raise ValueError(f'protocol.calibration_fraction ({p.calibration_fraction}) must be in (0, 1): '
                     'the proxy target sits that far from the warm start to the runs\' top')
  if not 0 <= p.calibration_ceiling < 1:
    raise ValueError(f'protocol.calibration_ceiling ({p.calibration_ceiling}) must be in [0, 1): '
                     'the share of the rise an lr must reach to be chosen (0: none)')
  if not 0 <= p.confirm_power < 1:
    raise ValueError(f'protocol.confirm_power ({p.confirm_power}) must be in [0, 1): the chance '
                     'that the confirmation sees a pick as fast as predicted beyond noise (0: '
                     'confirm_seeds as given)')
  if p.calibration_max_lrs < len(p.calibration_factors):
    raise ValueError(f'protocol.calibration_max_lrs ({p.calibration_max_lrs}) must be >= the '
                     f'{len(p.calibration_factors)} calibration_factors')
  if (p.max_samples < 1 or p.eval_every_samples < 1 or p.calibration_eval_every_samples < 0 or
      p.calibration_max_samples < 0):
    raise ValueError('protocol.max_samples and protocol.eval_every_samples must be positive, '
                     'protocol.calibration_eval_every_samples and .calibration_max_samples >= 0')
  if p.eval_first_samples < 0 or p.budget_scales < 0:
    raise ValueError(f'protocol.eval_first_samples ({p.eval_first_samples}) and .budget_scales '
                     f'({p.budget_scales}) must be >= 0 (0: none)')
  if p.throughput_steps < 1 or p.throughput_warmup < 1 or p.throughput_rounds < 1:
    raise ValueError('protocol.throughput_steps, .throughput_rounds and .throughput_warmup must '
                     'be >= 1 (the first step compiles and must not count)')
  if not p.lr0 >= 0 or (p.lr0 == 0 and (len(p.calibration_factors) < 2 or p.calibration_seeds < 1)):
    raise ValueError('protocol.lr0 must be > 0 (given) or 0 (calibrated, with >= 2 '
                     'calibration_factors and >= 1 calibration_seeds)')
  if p.scheduler not in ('', 'slurm'):
    raise ValueError(f"protocol.scheduler must be '' (every run in this process) or 'slurm' (each "
                     f'run a job), got {p.scheduler!r}')
  _check_analysis(p)
  mlperf.check_settings(p)


def _check_analysis(p):
  """What the analysis reads after every run has trained: refused now, not hours later."""
  if not 0 < p.level < 1 or p.n_draws < 1:
    raise ValueError(f'protocol.level ({p.level}) must be in (0, 1) and n_draws ({p.n_draws}) '
                     '>= 1')
  if not (p.targets or p.target_fractions) or any(not 0 < f < 1 for f in p.target_fractions):
    raise ValueError(f'protocol.target_fractions {tuple(p.target_fractions)} must be in (0, 1), '
                     'with it or protocol.targets naming at least one target')
  if not (p.rn_tolerance >= 0 and p.stop_margin >= 0):   # NaN too
    raise ValueError(f'protocol.rn_tolerance ({p.rn_tolerance}) and stop_margin '
                     f'({p.stop_margin}) must be >= 0')
  for key in ('smooth_window', 'checkpoint_every_evals', 'confirm_seeds'):
    if p[key] < 1:
      raise ValueError(f'protocol.{key} must be >= 1, got {p[key]}')
  for key in ('analysis_seed', 'warmstart_seed'):
    if p[key] < 0:
      raise ValueError(f'protocol.{key} must be >= 0, got {p[key]}')


def check_arms(config, arm_list):
  """The arms built: one sample grid for all (eval_every_samples a multiple of every batch), and,
  with MLPerf's rules in the closed division, every rule held (rljax.protocol.mlperf)."""
  p = config.protocol
  for key in ('eval_every_samples', 'eval_first_samples'):
    off_grid = [a.batch for a in arm_list if p[key] % a.batch]
    if off_grid:
      raise ValueError(f'protocol.{key} ({p[key]}) must be a multiple of every arm\'s batch, so '
                       f'that all arms are evaluated on one sample grid; not of {off_grid}')
  mlperf.check_arms(config, arm_list)
