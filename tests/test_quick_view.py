"""rljax.protocol.quick_view's bad input: a view asking for more seeds than the sweep holds is
refused with one line before anything is written."""
import json
import subprocess
import sys


def test_more_seeds_than_the_sweep_holds_writes_nothing(tmp_path):
  sweep = tmp_path / 'sweep'
  (sweep / 'arms' / 'P2' / 'seed_0').mkdir(parents=True)
  (sweep / 'arms' / 'P2' / 'arm.json').write_text('{}')
  (sweep / 'protocol.json').write_text(json.dumps(dict(protocol={}, base_arm='P2')))
  view = tmp_path / 'view'
  result = subprocess.run([sys.executable, '-m', 'rljax.analysis', f'--workdir={view}',
                           f'--quick_from={sweep}', '--seeds=2'],
                          capture_output=True, text=True, check=False)
  assert result.returncode == 2 and not view.exists()
  assert result.stderr.strip().splitlines() == [
      f'rljax.analysis: error: {sweep}/arms/P2/seed_1 is missing: the sweep has fewer than 2 '
      'seeds there']
