"""Markdown tables from the benchmarks' JSON records (what docs/performance.md shows).

  PYTHONPATH=. python bench/report.py /tmp/bench-results/*.json
"""
import json
import os
import sys

from bench import common
from bench import rl_step
from bench import sampler
from bench import train_step

PEER_SAMPLER = ['batch', 'rljax_tok_s', 'tunix_tok_s', 'ratio', 'rljax_spread', 'tunix_spread',
                'rljax_compile_s', 'tunix_compile_s', 'load_1min']
PEER_GRPO = ['P', 'G', 'responses', 'max_new_tokens', 'rljax_step_s', 'tunix_step_s', 'ratio',
             'rljax_spread', 'tunix_spread', 'rljax_first_step_s', 'tunix_first_step_s',
             'load_1min']


def render(path):
  with open(path) as f:
    record = json.load(f)
  name = os.path.basename(path)
  machine = record['machine']
  lines = [f"### {name}", '',
           f"{machine['date']}, {machine['platform']} ({machine['device_kind']}, "
           f"{machine['cpu_count']} CPUs), jax {machine['jax']}, load {machine['load_1min']:.1f} "
           'at the start', '']
  if 'sampler' in record and 'grpo' in record:      # peers
    lines += [f"Tunix: {record['tunix']} (jax {record['tunix_jax']})", '',
              common.table(record['sampler'], PEER_SAMPLER), '']
    if record['grpo']:
      grpo = record['grpo']
      lines += [common.table([grpo], PEER_GRPO), '']
      if 'tunix_error' in grpo:
        lines += ['Tunix GRPO error: ' + grpo['tunix_error'].splitlines()[0], '']
  elif record['rows'] and 'decode_tok_s' in record['rows'][0]:
    lines += [common.table(record['rows'], sampler.COLUMNS), '']
  elif record['rows'] and 'mfu_pct' in record['rows'][0]:
    lines += [common.table(record['rows'], train_step.COLUMNS), '']
  elif record['rows'] and 'rollout_s' in record['rows'][0]:
    lines += [common.table(record['rows'], rl_step.COLUMNS), '']
  else:
    columns = list(record['rows'][0])
    lines += [common.table(record['rows'], columns), '']
  return '\n'.join(lines)


if __name__ == '__main__':
  print('\n'.join(render(p) for p in sys.argv[1:]))
