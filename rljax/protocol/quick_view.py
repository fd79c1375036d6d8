"""The quick mode's view of a full sweep: what `protocol.quick` would have answered, and at what
cost, from runs the sweep already made.

The quick mode runs the lr0 calibration, the base arm and the throughput rounds, and predicts
every other batch's rN from the base arm's noise scale. A full sweep holds those runs and more,
so copying its first `calibration_seeds` calibration seeds, its base arm's first `seeds` seeds and
its throughput rounds into a fresh workdir (protocol.json marked quick) gives exactly the logs a
quick run with the same seed offset trains; the report built there is the quick answer, and its
cost the quick mode's.
"""
import json
import os
import shutil

RUN_FILES = ('config.json', 'done.json', 'metrics.jsonl', 'eval_correct.jsonl')


def _copy_arm(source, dest, seeds):
  """`source`'s arm.json and its runs seed_0 .. seed_<seeds - 1> (logs only, no checkpoints)."""
  os.makedirs(dest, exist_ok=True)
  shutil.copy(os.path.join(source, 'arm.json'), dest)
  for k in range(seeds):
    os.makedirs(os.path.join(dest, f'seed_{k}'), exist_ok=True)
    for name in RUN_FILES:
      if os.path.exists(os.path.join(source, f'seed_{k}', name)):
        shutil.copy(os.path.join(source, f'seed_{k}', name), os.path.join(dest, f'seed_{k}'))


def _arms_to_copy(sweep, protocol, seeds, calibration_seeds):
  """[(arm folder in the sweep, its folder in the view, seeds)], every run checked to exist before
  anything is written: a bad --seeds leaves no partial view behind."""
  calibration = os.path.join(sweep, 'calibration')
  arms = [(os.path.join(calibration, lr), os.path.join('calibration', lr), calibration_seeds)
          for lr in (sorted(os.listdir(calibration)) if os.path.isdir(calibration) else [])]
  arms.append((os.path.join(sweep, 'arms', protocol['base_arm']),
               os.path.join('arms', protocol['base_arm']), seeds))
  for source, _, count in arms:
    missing = [k for k in range(count) if not os.path.isdir(os.path.join(source, f'seed_{k}'))]
    if missing:
      raise ValueError(f"{os.path.join(source, f'seed_{missing[0]}')} is missing: the sweep has "
                       f'fewer than {count} seeds there')
  return arms


def build(sweep, workdir, seeds, calibration_seeds):
  """Writes in `workdir` the quick mode's logs taken from the full sweep in `sweep`."""
  with open(os.path.join(sweep, 'protocol.json')) as f:
    protocol = json.load(f)
  if protocol['protocol'].get('quick'):
    raise ValueError(f'{sweep} is a quick run already; give a full sweep')
  arms = _arms_to_copy(sweep, protocol, seeds, calibration_seeds)
  os.makedirs(workdir, exist_ok=True)
  protocol['protocol'].update(quick=True, num_seeds=seeds, calibration_seeds=calibration_seeds)
  with open(os.path.join(workdir, 'protocol.json'), 'w') as f:
    json.dump(protocol, f, indent=1)
  if os.path.exists(os.path.join(sweep, 'calibration.json')):
    shutil.copy(os.path.join(sweep, 'calibration.json'), workdir)
  for source, dest, count in arms:
    _copy_arm(source, os.path.join(workdir, dest), count)
  shutil.copytree(os.path.join(sweep, 'throughput'), os.path.join(workdir, 'throughput'),
                  dirs_exist_ok=True)
