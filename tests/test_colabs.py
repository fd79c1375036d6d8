"""The Colab notebooks run top to bottom (nbclient, a real Jupyter kernel) in their reduced mode
(RLJAX_NOTEBOOK_SMOKE=1), and show their plots inline."""
import os

import nbclient
import nbformat
import pytest

pytestmark = pytest.mark.e2e   # notebooks through a real Jupyter kernel

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLABS = os.path.join(ROOT, 'colabs')
NOTEBOOKS = ('grpo_quickstart.ipynb', 'align_then_accelerate.ipynb', 'ppo.ipynb')


def test_every_notebook_is_listed():
  assert sorted(n for n in os.listdir(COLABS) if n.endswith('.ipynb')) == sorted(NOTEBOOKS)


@pytest.mark.parametrize('name', NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, tmp_path, monkeypatch):
  if name == 'ppo.ipynb' and not os.path.exists(os.path.join(ROOT, 'configs', 'ppo.py')):
    pytest.skip('PPO (configs/ppo.py) is not in this tree yet')
  nb = nbformat.read(os.path.join(COLABS, name), as_version=4)
  assert not any(cell.get('outputs') for cell in nb.cells if cell.cell_type == 'code'), \
      'commit notebooks without outputs'
  monkeypatch.setenv('RLJAX_NOTEBOOK_SMOKE', '1')
  monkeypatch.setenv('RLJAX_NOTEBOOK_DIR', str(tmp_path))
  monkeypatch.setenv('PYTHONPATH', os.pathsep.join([ROOT, os.environ.get('PYTHONPATH', '')]))
  monkeypatch.setenv('JAX_DISABLE_MOST_OPTIMIZATIONS', '1')   # compiles ~20% faster; tiny models
  monkeypatch.setenv('MPLBACKEND', 'module://matplotlib_inline.backend_inline')
  client = nbclient.NotebookClient(nb, timeout=600, kernel_name='python3',
                                   resources={'metadata': {'path': str(tmp_path)}})
  client.execute()
  images = [o for cell in nb.cells if cell.cell_type == 'code' for o in cell.outputs
            if 'image/png' in o.get('data', {})]
  assert images, f'{name} showed no plot'
