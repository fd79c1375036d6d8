"""LoRA adapters (rljax.model.lora) as a Hugging Face PEFT adapter directory, what
`PeftModel.from_pretrained(base_model, directory)` loads: adapter_config.json and
adapter_model.safetensors, one (lora_A [r, in], lora_B [out, r]) pair per adapted Linear, named
as PEFT names them on Qwen3 / Qwen3-MoE
(base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight, ...mlp.experts.E.gate_proj...).

PEFT adds scaling * B @ A (scaling = lora_alpha / r) to the [out, in] weight; rljax adds
(alpha / r) A @ B to its [in, out] layout, the grouped axes (heads, head_dim) flattened in the
order Hugging Face's projections flatten them, so each PEFT matrix is a rljax adapter reshaped
and transposed (tests/test_lora.py checks the merge of the exported tensors in numpy).
"""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import safetensors.numpy

from rljax.hf import checkpoint as hf
from rljax.model import lora

CONFIG_FILE, WEIGHTS_FILE = 'adapter_config.json', 'adapter_model.safetensors'
PREFIX = 'base_model.model.'   # PeftModel's wrapper around the causal LM's own names
MODULES = {'w_q': 'q_proj', 'w_k': 'k_proj', 'w_v': 'v_proj', 'w_o': 'o_proj',
           'w_gate': 'gate_proj', 'w_up': 'up_proj', 'w_down': 'down_proj'}


def peft_tensors(adapters, cfg):
  """{PEFT name: numpy array} of `adapters` for the model of ModelConfig `cfg`."""
  table = hf.mappings(cfg)
  out = {}
  for keys, pair in _pairs(adapters):
    mapping = table['/'.join(keys)]   # the HF tensor per layer (and expert) of the weight
    module = mapping.name[:-len('.weight')]
    a, b = (np.asarray(jax.device_get(pair[k])) for k in ('a', 'b'))
    lead = len(mapping.stack)
    rank = a.shape[-1]
    for position in np.ndindex(*a.shape[:lead]):
      name = PREFIX + module.format(**dict(zip(mapping.stack, position)))
      out[name + '.lora_A.weight'] = np.ascontiguousarray(a[position].reshape(-1, rank).T)
      out[name + '.lora_B.weight'] = np.ascontiguousarray(b[position].reshape(rank, -1).T)
  return out


def _pairs(adapters, keys=()):
  """(path keys, {'a', 'b'}) of each adapted weight, in path order."""
  if set(adapters) == {'a', 'b'}:
    yield keys, adapters
    return
  for key in sorted(adapters):
    yield from _pairs(adapters[key], keys + (key,))


def adapter_config(lora_cfg: lora.LoraConfig, base_dir):
  """PEFT's LoraConfig (adapter_config.json) of `lora_cfg` on the base model in `base_dir`."""
  return dict(
      peft_type='LORA', task_type='CAUSAL_LM', base_model_name_or_path=os.path.abspath(base_dir),
      r=lora_cfg.rank, lora_alpha=lora_cfg.alpha, lora_dropout=0.0, bias='none',
      target_modules=sorted(MODULES[lora.TARGETS[t]] for t in lora_cfg.targets),
      fan_in_fan_out=False, use_rslora=False, use_dora=False, init_lora_weights=True,
      inference_mode=True, modules_to_save=None, layers_to_transform=None, rank_pattern={},
      alpha_pattern={})


def save_adapters(adapters, cfg, lora_cfg, out_dir, base_dir, dtype=None):
  """Writes `adapters` as a PEFT adapter directory `out_dir`, beside a copy of `base_dir`'s
  config.json and tokenizer files (the model they adapt). Only process 0 writes."""
  tensors = peft_tensors(adapters, cfg)
  if dtype is not None:
    tensors = {name: x.astype(jnp.dtype(dtype)) for name, x in tensors.items()}
  if jax.process_index():
    return
  os.makedirs(out_dir, exist_ok=True)
  safetensors.numpy.save_file(tensors, os.path.join(out_dir, WEIGHTS_FILE),
                              metadata={'format': 'pt'})
  with open(os.path.join(out_dir, CONFIG_FILE), 'w', encoding='utf-8') as f:
    json.dump(adapter_config(lora_cfg, base_dir), f, indent=2)
  for name in ('config.json',) + hf.TOKENIZER_FILES:
    if os.path.exists(os.path.join(base_dir, name)):
      shutil.copy(os.path.join(base_dir, name), os.path.join(out_dir, name))
