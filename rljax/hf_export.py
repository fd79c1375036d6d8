"""Exports the policy of a training run as a Hugging Face checkpoint (loadable by transformers).

  python -m rljax.hf_export --workdir=RUN --base=HF_DIR --out=OUT [--dtype=bfloat16] [--step=N]

RUN is a workdir of `rljax.main` that started from --config.init.hf_path=HF_DIR; the export takes
the architecture's config.json and the tokenizer from HF_DIR and the weights from RUN's latest
(or --step) checkpoint. A run that trained LoRA adapters (model.lora) exports them as a PEFT adapter
directory (rljax.hf.peft), beside a copy of HF_DIR's config.json and tokenizer. The checkpoint is
read as a resume reads it (rljax.train.checkpoint): checked against its manifest; the latest damaged
steps are set aside and the newest intact one is exported; a --step that is damaged is refused.
"""
import os
import sys

from absl import app
from absl import flags
from absl import logging

from rljax import cli
from rljax.hf import architecture
from rljax.hf import checkpoint as hf
from rljax.hf import peft
from rljax.model import lora
from rljax.train import checkpoint

_WORKDIR = flags.DEFINE_string('workdir', None, 'Training run directory (holds checkpoints/).')
_BASE = flags.DEFINE_string('base', None, 'The HF directory the run started from.')
_OUT = flags.DEFINE_string('out', None, 'Where to write the HF checkpoint.')
_DTYPE = flags.DEFINE_string('dtype', None, 'Cast weights on export, e.g. bfloat16.')
_STEP = flags.DEFINE_integer('step', None, 'Checkpoint step (default: the latest).')


def run_state(workdir, step=None):
  """(the algorithm's state, meta) saved in WORKDIR/checkpoints (latest intact step by default).
  ValueError for a missing or damaged step; checkpoint.Damaged when no step is intact."""
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  if not os.path.isdir(directory):
    raise ValueError(f'{workdir} has no checkpoints/ directory')
  reader = checkpoint.Checkpointer(workdir, read_only=True)
  try:
    steps = list(reader.manager.all_steps())
    if not steps or (step is not None and step not in steps):
      raise ValueError(f'no checkpoint {"at step " + str(step) if step else ""} in {directory}; '
                       f'steps: {steps}')
    restored = reader.restore() if step is None else reader.restore_step(step)
  finally:
    reader.close()
  if isinstance(restored, str):
    raise ValueError(f'checkpoint step {step} in {directory} is damaged ({restored})')
  state, meta = restored
  return (state['algo'] if 'algo' in state else state), meta   # the carry's slots, or flat


def run_params(workdir, step=None):
  """The policy params saved in WORKDIR/checkpoints (latest intact step by default), and
  the step."""
  state, meta = run_state(workdir, step)
  return state['params'], meta['step']


def export(workdir, base, out, dtype=None, step=None):
  """Writes RUN's params (or LoRA adapters) with BASE's config.json and tokenizer into OUT;
  returns the step."""
  config = architecture.read_config(base)
  cfg = architecture.model_config(config)
  state, meta = run_state(workdir, step)
  if 'adapters' in state:
    lora_cfg = lora.config_of(meta['config']['model'])
    peft.save_adapters(state['adapters'], cfg, lora_cfg, out, base, dtype)
  else:
    hf.save_params(state['params'], cfg, out, config=config, dtype=dtype, tokenizer_dir=base)
  return meta['step']


def summary(out):
  """'N safetensors files, X MB, DTYPE' (or for adapters 'PEFT LoRA adapters of rank R, X MB'):
  what an export wrote into `out`."""
  files = [name for name in os.listdir(out) if name.endswith('.safetensors')]
  size = sum(os.path.getsize(os.path.join(out, name)) for name in files)
  if peft.CONFIG_FILE in os.listdir(out):
    rank = architecture.read_json(os.path.join(out, peft.CONFIG_FILE))['r']
    return f'PEFT LoRA adapters of rank {rank}, {size / 1e6:.1f} MB'
  dtype = architecture.read_config(out).get('torch_dtype')
  return f'{len(files)} safetensors file{"s" * (len(files) != 1)}, {size / 1e6:.1f} MB, {dtype}'


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f'unexpected arguments: {argv[1:]}')
  if not flags.FLAGS['verbosity'].present:   # orbax logs every restore step at INFO
    logging.set_verbosity(logging.WARNING)
  sys.unraisablehook = cli.drop_checkpoint_io_noise
  try:
    step = export(_WORKDIR.value, _BASE.value, _OUT.value, _DTYPE.value, _STEP.value)
  except (ValueError, checkpoint.Damaged) as error:   # Damaged: the storage, as rljax.main says
    print(f'rljax.hf_export: error: {error}', file=sys.stderr)
    sys.exit(cli.EXIT_STORAGE if isinstance(error, checkpoint.Damaged) else cli.EXIT_BAD_INPUT)
  print(f'rljax.hf_export: wrote step {step} of {_WORKDIR.value} as a Hugging Face checkpoint to '
        f'{_OUT.value} ({summary(_OUT.value)})')


if __name__ == '__main__':
  flags.mark_flags_as_required(['workdir', 'base', 'out'])
  app.run(main)
