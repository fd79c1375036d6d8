"""rljax.hf (architecture, checkpoint, tokenizer) against transformers' own outputs.

tests/testdata/tiny_qwen3{,_moe}/ are real transformers checkpoints (random weights, built by
tests/testdata/make_tiny_hf.py) with logits, greedy generations and chat-template ids recorded
from transformers. These tests need neither torch nor transformers; the one that reloads an
export in transformers is skipped when they are not installed.
"""
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import flax.linen as nn
import jax
import numpy as np
import pytest
from safetensors import safe_open

from configs import grpo as grpo_config
from rljax import hf_export
from rljax.hf import architecture
from rljax.hf import checkpoint as hf
from rljax.hf import tokenizer as hf_tokenizer
from rljax.model import lora
from rljax.model import transformer as model_lib
from rljax.rollout import sampler as sampler_lib
from rljax.train import checkpoint

TESTDATA = os.path.join(os.path.dirname(__file__), 'testdata')
MODELS = ('tiny_qwen3', 'tiny_qwen3_moe')
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTDATA_DIR = pathlib.Path(TESTDATA) / 'tiny_qwen3'


def model_dir(name):
  return os.path.join(TESTDATA, name)


def load(name, moe_impl='dense'):
  cfg = architecture.model_config(architecture.read_config(model_dir(name)), moe_impl=moe_impl)
  return cfg, hf.load_params(model_dir(name), cfg)


def reference(name):
  return dict(np.load(os.path.join(model_dir(name), 'reference.npz')))


def torch_logits(torch, model, ref):
  """A transformers model's logits of the recorded reference batch, as numpy."""
  with torch.no_grad():
    return model(input_ids=torch.tensor(ref['tokens_BxT'], dtype=torch.long),
                 attention_mask=torch.tensor(ref['mask_BxT'], dtype=torch.long),
                 position_ids=torch.tensor(ref['positions_BxT'], dtype=torch.long)).logits.numpy()


def rljax_logits(cfg, params, ref):
  logits, _, _ = jax.jit(model_lib.Transformer(cfg).apply)(
      {'params': params}, ref['tokens_BxT'], ref['mask_BxT'])
  return np.asarray(logits)


def safetensors_dict(directory):
  out = {}
  for file in sorted(os.listdir(directory)):
    if file.endswith('.safetensors'):
      with safe_open(os.path.join(directory, file), framework='numpy') as f:
        out.update({name: f.get_tensor(name) for name in f.keys()})
  return out


# ------------------------------------------------------------------ config.json


def test_model_config_reads_both_architectures():
  dense = architecture.model_config(architecture.read_config(model_dir('tiny_qwen3')))
  assert (dense.num_experts, dense.tie_embeddings, dense.head_dim, dense.rope_theta,
          dense.norm_eps) == (0, True, 16, 500.0, 1e-6)
  moe = architecture.model_config(architecture.read_config(model_dir('tiny_qwen3_moe')),
                                 moe_impl='ragged')
  assert (moe.num_experts, moe.experts_per_token, moe.expert_hidden, moe.tie_embeddings,
          moe.head_dim, moe.norm_eps, moe.moe_impl) == (8, 2, 16, False, 8, 1e-5, 'ragged')


def test_model_config_reads_transformers4_fields():
  """Hub checkpoints written by transformers 4 use rope_theta and num_experts."""
  config = architecture.read_config(model_dir('tiny_qwen3_moe'))
  config.pop('rope_parameters')
  config['num_experts'] = config.pop('num_local_experts')
  config.update(rope_theta=1e6, rope_scaling=None)
  cfg = architecture.model_config(config)
  assert (cfg.rope_theta, cfg.num_experts) == (1e6, 8)


@pytest.mark.parametrize('change, message', [
    (dict(decoder_sparse_step=2), 'mixed dense/MoE'),
    (dict(mlp_only_layers=[0]), 'mixed dense/MoE'),
    (dict(norm_topk_prob=False), 'norm_topk_prob'),
    (dict(rope_parameters={'rope_type': 'yarn', 'rope_theta': 1e6, 'factor': 4.0}), 'yarn'),
    (dict(use_sliding_window=True), 'sliding'),
    (dict(attention_bias=True), 'attention_bias'),
    (dict(model_type='llama'), 'llama'),
])
def test_model_config_rejects_what_rljax_cannot_compute(change, message):
  config = architecture.read_config(model_dir('tiny_qwen3_moe'))
  config.update(change)
  with pytest.raises(ValueError, match=message):
    architecture.model_config(config)


def test_model_config_names_a_missing_field():
  config = architecture.read_config(model_dir('tiny_qwen3'))
  del config['hidden_size']
  with pytest.raises(ValueError, match=r"lacks \['hidden_size'\]"):
    architecture.model_config(config)


def test_hf_config_round_trips_the_architecture():
  for name in MODELS:
    cfg = architecture.model_config(architecture.read_config(model_dir(name)))
    assert architecture.model_config(architecture.hf_config(cfg)) == cfg


# ------------------------------------------------------------------ parity with transformers


@pytest.mark.parametrize('name, moe_impl', [('tiny_qwen3', 'dense'), ('tiny_qwen3_moe', 'dense'),
                                            ('tiny_qwen3_moe', 'ragged')])
def test_logits_match_transformers(name, moe_impl):
  cfg, params = load(name, moe_impl)
  ref = reference(name)
  mask = ref['mask_BxT']
  assert mask[1, 0] == 0, 'the reference batch must include left padding'
  got = rljax_logits(cfg, params, ref)
  scale = np.abs(ref['logits_BxTxV'][mask]).max()
  assert scale > 3, 'logits must be O(1) for a meaningful 1e-4 check'
  np.testing.assert_allclose(got[mask], ref['logits_BxTxV'][mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize('name', MODELS)
def test_greedy_generation_matches_transformers(name):
  cfg, params = load(name)
  ref = reference(name)
  tokenizer = hf_tokenizer.HFTokenizer(model_dir(name))
  expected = ref['greedy_BxN']
  assert tokenizer.eos_id not in expected   # so all N tokens are compared
  model = model_lib.Transformer(cfg)
  sample = sampler_lib.make_sampler(model, sampler_lib.SamplingConfig(
      max_new_tokens=expected.shape[1], eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
      greedy=True))
  rollout = sample(params, ref['tokens_BxT'], ref['mask_BxT'], jax.random.PRNGKey(0))
  np.testing.assert_array_equal(np.asarray(rollout.tokens_BxL), expected)


# ------------------------------------------------------------------ tokenizer


def test_chat_prompt_tokens_match_transformers_apply_chat_template():
  with open(os.path.join(TESTDATA, 'gsm8k_sample.jsonl')) as f:
    question = json.loads(f.readline())['question']
  tokenizer = hf_tokenizer.HFTokenizer(model_dir('tiny_qwen3'))
  prompt = tokenizer.chat_prompt(question)
  assert prompt.startswith('<|im_start|>user\n') and prompt.endswith('<|im_start|>assistant\n')
  assert tokenizer.encode(prompt) == reference('tiny_qwen3')['chat_ids'].tolist()


def test_tokenizer_round_trip_and_stop():
  tokenizer = hf_tokenizer.HFTokenizer(model_dir('tiny_qwen3'))
  text = 'Ava has 12 + 30 = 42 apples.\n#### 42'
  ids = tokenizer.encode(text)
  assert tokenizer.decode(ids) == text
  assert tokenizer.decode(ids + [tokenizer.eos_id] + tokenizer.encode('junk')) == text
  assert tokenizer.decode([tokenizer.pad_id] + ids + [tokenizer.pad_id]) == text
  assert tokenizer.vocab_size == 512 and tokenizer.pad_id != tokenizer.eos_id


def test_decode_stops_at_every_generation_stop_token(tmp_path):
  for name in ('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja'):
    (tmp_path / name).write_bytes((TESTDATA_DIR / name).read_bytes())
  (tmp_path / 'generation_config.json').write_text('{"eos_token_id": [2, 0]}')
  tokenizer = hf_tokenizer.HFTokenizer(str(tmp_path))
  assert tokenizer.stop_ids == {2, 0} and tokenizer.pad_id == 0
  ids = tokenizer.encode('#### 42')
  assert tokenizer.decode(ids + [0] + tokenizer.encode(' 99')) == '#### 42'


def test_tokenizer_bad_dir(tmp_path):
  with pytest.raises(ValueError, match='tokenizer.json'):
    hf_tokenizer.HFTokenizer(str(tmp_path))


# ------------------------------------------------------------------ export


@pytest.mark.parametrize('name', MODELS)
def test_export_reproduces_the_checkpoint_exactly(name, tmp_path):
  """import -> export gives back the very same tensors (names, shapes, bits), sharded on request,
  and the export imports again to the same params."""
  cfg, params = load(name)
  out = str(tmp_path / 'export')
  hf.save_params(params, cfg, out, config=architecture.read_config(model_dir(name)),
                 max_shard_bytes=60_000, tokenizer_dir=model_dir(name))
  assert os.path.exists(os.path.join(out, 'model.safetensors.index.json'))
  original, exported = safetensors_dict(model_dir(name)), safetensors_dict(out)
  assert sorted(original) == sorted(exported)
  for key, value in original.items():
    assert exported[key].dtype == value.dtype and exported[key].shape == value.shape, key
    np.testing.assert_array_equal(exported[key], value, err_msg=key)
  _, reloaded = load_from(out)
  jax.tree.map(np.testing.assert_array_equal, reloaded, params)
  exported_tokenizer = hf_tokenizer.HFTokenizer(out)
  original_tokenizer = hf_tokenizer.HFTokenizer(model_dir(name))
  assert exported_tokenizer.encode('12 + 30') == original_tokenizer.encode('12 + 30')
  assert exported_tokenizer.chat_prompt('q?') == original_tokenizer.chat_prompt('q?') != 'q?'


def load_from(directory):
  cfg = architecture.model_config(architecture.read_config(directory))
  return cfg, hf.load_params(directory, cfg)


def test_export_casts_to_bfloat16(tmp_path):
  cfg, params = load('tiny_qwen3')
  hf.save_params(params, cfg, str(tmp_path), dtype='bfloat16')
  with open(tmp_path / 'config.json') as f:
    assert json.load(f)['dtype'] == 'bfloat16'
  exported = safetensors_dict(str(tmp_path))
  embed = exported['model.embed_tokens.weight']
  assert embed.dtype == np.dtype(jax.numpy.bfloat16)
  np.testing.assert_allclose(embed.astype(np.float32), np.asarray(params['embed']['embedding']),
                             rtol=1e-2)


@pytest.mark.parametrize('name', MODELS)
def test_export_reloads_in_transformers_with_the_same_logits(name, tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  cfg, params = load(name)
  # Perturb the weights so a silently ignored file (transformers' random init) would show.
  params = jax.tree.map(lambda x: x * 1.01, params)
  hf.save_params(params, cfg, str(tmp_path), tokenizer_dir=model_dir(name))
  model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32)
  ref = reference(name)
  mask = ref['mask_BxT']
  logits = torch_logits(torch, model, ref)
  np.testing.assert_allclose(logits[mask], rljax_logits(cfg, params, ref)[mask], atol=1e-4, rtol=0)


# ------------------------------------------------------------------ LoRA adapters (PEFT)


def adapted(name, rank=3, alpha=12.0):
  """(cfg, base params, LoRA config, adapters with B far from zero) of testdata model `name`."""
  cfg, params = load(name)
  lora_cfg = lora.LoraConfig(rank, alpha, tuple(lora.TARGETS))
  boxes = jax.eval_shape(lambda: model_lib.init_params(cfg, jax.random.PRNGKey(0)))
  adapters = nn.unbox(lora.init_adapters(boxes, lora_cfg, jax.random.PRNGKey(1)))
  rng = np.random.default_rng(2)
  adapters = jax.tree_util.tree_map_with_path(
      lambda path, x: x + rng.normal(0, 0.3, x.shape).astype(np.float32) * (path[-1].key == 'b'),
      adapters)
  return cfg, params, lora_cfg, adapters


def export_adapters(name, tmp_path):
  """`python -m rljax.hf_export`'s export of a checkpoint holding LoRA adapters, as a LoRA run
  saves them (the carry's slots, the config in its meta)."""
  cfg, params, lora_cfg, adapters = adapted(name)
  run, out = tmp_path / 'run', str(tmp_path / 'adapters')
  saver = checkpoint.Checkpointer(str(run), every=1, keep=1)
  config = dict(model=dict(lora=dict(rank=lora_cfg.rank, alpha=lora_cfg.alpha,
                                     targets=list(lora_cfg.targets))))
  saver.save(7, {'algo': {'adapters': adapters}}, {'step': 7, 'config': config}, force=True)
  saver.close()
  assert hf_export.export(str(run), model_dir(name), out) == 7
  return cfg, params, lora_cfg, adapters, out


@pytest.mark.parametrize('name', MODELS)
def test_peft_adapters_merge_to_the_export_of_the_adapted_policy(name, tmp_path):
  """PEFT's merge, W + lora_alpha / r * B @ A on each exported [out, in] weight (numpy), gives
  the Hugging Face export of rljax's adapted policy, tensor by tensor."""
  cfg, params, lora_cfg, adapters, out = export_adapters(name, tmp_path)
  with open(os.path.join(out, 'adapter_config.json')) as f:
    config = json.load(f)
  assert (config['peft_type'], config['r'], config['lora_alpha']) == ('LORA', 3, 12.0)
  assert sorted(config['target_modules']) == ['down_proj', 'gate_proj', 'k_proj', 'o_proj',
                                              'q_proj', 'up_proj', 'v_proj']
  assert os.path.exists(os.path.join(out, 'config.json'))
  merged_dir = str(tmp_path / 'merged')
  hf.save_params(lora.merge(params, adapters, lora_cfg), cfg, merged_dir)
  base, merged, pieces = (safetensors_dict(d) for d in (model_dir(name), merged_dir, out))
  adapted_names = 0
  for tensor, w in base.items():
    a_name = 'base_model.model.' + tensor[:-len('weight')] + 'lora_A.weight'
    if a_name not in pieces:
      np.testing.assert_array_equal(merged[tensor], w, err_msg=tensor)
      continue
    a, b = pieces[a_name], pieces[a_name.replace('lora_A', 'lora_B')]
    assert a.shape == (3, w.shape[1]) and b.shape == (w.shape[0], 3), tensor
    np.testing.assert_allclose(merged[tensor], w + 12.0 / 3 * (b.astype(np.float64) @ a),
                               rtol=1e-5, atol=1e-6, err_msg=tensor)
    adapted_names += 1
  experts = cfg.num_experts or 1
  assert adapted_names == cfg.num_layers * (4 + 3 * experts) == len(pieces) // 2
  assert ('base_model.model.model.layers.1.mlp.experts.7.down_proj.lora_B.weight' in pieces
          if cfg.num_experts else 'base_model.model.model.layers.1.mlp.up_proj.lora_A.weight'
          in pieces)


@pytest.mark.parametrize('name', MODELS)
def test_peft_adapters_reload_in_transformers_with_the_same_logits(name, tmp_path):
  torch = pytest.importorskip('torch')
  transformers = pytest.importorskip('transformers')
  peft = pytest.importorskip('peft')
  cfg, params, lora_cfg, adapters, out = export_adapters(name, tmp_path)
  base = transformers.AutoModelForCausalLM.from_pretrained(model_dir(name), dtype=torch.float32)
  model = peft.PeftModel.from_pretrained(base, out)
  ref = reference(name)
  mask = ref['mask_BxT']
  logits = torch_logits(torch, model, ref)
  expected = rljax_logits(cfg, lora.merge(params, adapters, lora_cfg), ref)
  assert np.abs(expected - rljax_logits(cfg, params, ref))[mask].max() > 1e-2   # adapters matter
  np.testing.assert_allclose(logits[mask], expected[mask], atol=1e-4, rtol=0)


# ------------------------------------------------------------------ bad checkpoints


@pytest.mark.e2e
def test_export_cli_prints_one_line_saying_what_it_wrote(tmp_path):
  """`python -m rljax.hf_export` from a real orbax checkpoint of a run: stdout is one line, stderr
  is empty (no orbax INFO logs), and the export holds the checkpointed params."""
  cfg, params = load('tiny_qwen3')
  params = jax.tree.map(lambda x: x * 2, params)
  run, out = tmp_path / 'run', tmp_path / 'out'
  saver = checkpoint.Checkpointer(str(run), every=1, keep=1)
  saver.save(5, {'params': params}, {'step': 5}, force=True)
  saver.close()
  result = subprocess.run(
      [sys.executable, '-m', 'rljax.hf_export', f'--workdir={run}',
       f'--base={model_dir("tiny_qwen3")}', f'--out={out}'], cwd=ROOT,
      env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu'),
      capture_output=True, text=True, timeout=300, check=False)
  # Where jax's CUDA plugin is installed (the GPU compile-only targets) without CUDA, importing
  # it logs that no driver was found, before any code of ours runs: not ours to silence.
  stderr = [line for line in result.stderr.splitlines()
            if 'cudart_stub' not in line and 'before absl::InitializeLog' not in line]
  assert result.returncode == 0 and stderr == [], result.stderr
  assert result.stdout == (f'rljax.hf_export: wrote step 5 of {run} as a Hugging Face checkpoint '
                           f'to {out} (1 safetensors file, 0.2 MB, float32)\n')
  for a, b in zip(jax.tree.leaves(hf.load_params(str(out), cfg)), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_export_reads_as_a_resume_does_the_latest_intact_step(tmp_path, capfd):
  """The latest step's array data damaged: the export sets it aside with one warning line and
  writes the step before it; asking for the damaged step by number is refused."""
  from test_faults import damage, largest  # pylint: disable=g-import-not-at-top
  cfg, params = load('tiny_qwen3')
  run = tmp_path / 'run'
  saver = checkpoint.Checkpointer(str(run), every=1, keep=2)
  for step in (4, 5):
    saver.save(step, {'params': jax.tree.map(lambda x, s=step: x * s, params)}, {'step': step})
  saver.close()
  damage(largest(str(run / 'checkpoints' / '5'), 'state/d/*'), 'flip')
  with pytest.raises(ValueError, match=r'checkpoint step 5 in .* is damaged \(state/d/\w+: '):
    hf_export.run_params(str(run), step=5)
  assert hf_export.export(str(run), model_dir('tiny_qwen3'), str(tmp_path / 'out')) == 4
  warnings = [line for line in capfd.readouterr().err.splitlines() if 'rljax: warning' in line]
  assert len(warnings) == 1 and warnings[0].startswith(
      'rljax: warning: checkpoint step 5 is damaged (state/d/'), warnings
  assert os.listdir(run / 'checkpoints' / 'damaged') == ['5']
  for a, b in zip(jax.tree.leaves(hf.load_params(str(tmp_path / 'out'), cfg)),
                  jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b) * 4)


def test_missing_tensor_is_named(tmp_path):
  cfg, params = load('tiny_qwen3')
  hf.save_params(params, cfg, str(tmp_path))
  tensors = safetensors_dict(str(tmp_path))
  del tensors['model.layers.1.self_attn.k_norm.weight']
  import safetensors.numpy  # pylint: disable=import-outside-toplevel
  safetensors.numpy.save_file(tensors, str(tmp_path / 'model.safetensors'))
  with pytest.raises(ValueError, match='model.layers.1.self_attn.k_norm.weight'):
    hf.load_params(str(tmp_path), cfg)


def test_config_that_does_not_fit_the_tensors(tmp_path):
  cfg, params = load('tiny_qwen3')
  hf.save_params(params, cfg, str(tmp_path))
  wrong = architecture.model_config(dict(architecture.read_config(str(tmp_path)), head_dim=8))
  with pytest.raises(ValueError, match=r'model.layers.0.self_attn.\w+.weight has shape'):
    hf.load_params(str(tmp_path), wrong)


def test_not_a_model_dir(tmp_path):
  with pytest.raises(ValueError, match='no config.json'):
    architecture.read_config(str(tmp_path))
  (tmp_path / 'config.json').write_text('{}')
  cfg = architecture.model_config(architecture.read_config(model_dir('tiny_qwen3')))
  with pytest.raises(ValueError, match='neither model.safetensors'):
    hf.load_params(str(tmp_path), cfg)


def copy_model(name, tmp_path):
  return pathlib.Path(shutil.copytree(model_dir(name), tmp_path / name))


def truncate(path, size):
  data = path.read_bytes()
  path.write_bytes(data[:size(len(data))])


# (name, file to break, how, expected message): every case is one ValueError naming the file.
BAD_FILES = [
    ('tiny_qwen3', 'model.safetensors', lambda n: n // 2, 'is not a readable safetensors file'),
    ('tiny_qwen3', 'model.safetensors', lambda n: n - 1, 'is not a readable safetensors file'),
    ('tiny_qwen3', 'model.safetensors', lambda n: 8, 'is not a readable safetensors file'),
    ('tiny_qwen3', 'model.safetensors', lambda n: 0, 'is not a readable safetensors file'),
    ('tiny_qwen3_moe', 'model-00002-of-00002.safetensors', lambda n: n - 100,
     'is not a readable safetensors file'),
    ('tiny_qwen3_moe', 'model-00001-of-00002.safetensors', None,
     r'is missing \(listed in .*model.safetensors.index.json\)'),
    ('tiny_qwen3_moe', 'model.safetensors.index.json', lambda n: n // 2, 'is not valid JSON'),
]


@pytest.mark.parametrize('name, file, size, message', BAD_FILES,
                         ids=['half', 'one-byte-short', 'eight-bytes', 'empty', 'shard-truncated',
                              'shard-missing', 'index-not-json'])
def test_unreadable_checkpoint_files_are_named(tmp_path, name, file, size, message):
  """Up front, from the headers (hf.policy_config runs this before anything is built), and again
  when loading."""
  directory = copy_model(name, tmp_path)
  if size is None:
    (directory / file).unlink()
  else:
    truncate(directory / file, size)
  cfg = architecture.model_config(architecture.read_config(str(directory)))
  pattern = f'^{re.escape(str(directory / file))} {message}'
  with pytest.raises(ValueError, match=pattern):
    hf.check_checkpoint(str(directory), cfg)
  with pytest.raises(ValueError, match=pattern):
    hf.load_params(str(directory), cfg)


def test_config_json_that_is_not_json_is_named(tmp_path):
  directory = copy_model('tiny_qwen3', tmp_path)
  truncate(directory / 'config.json', lambda n: n // 2)
  with pytest.raises(ValueError, match=f'^{re.escape(str(directory / "config.json"))} is not '
                     'valid JSON'):
    architecture.read_config(str(directory))
  (directory / 'config.json').write_text('[1, 2]')
  with pytest.raises(ValueError, match='config.json is not a JSON object'):
    architecture.read_config(str(directory))


def test_policy_config_checks_the_checkpoint_up_front(tmp_path):
  """A training config with init.hf_path: a bad checkpoint fails when the model config is read,
  before the dataset, the model or any compilation."""
  config = grpo_config.get_config('runlocal')
  good = hf.policy_config(_with_hf_path(config, model_dir('tiny_qwen3_moe')))
  assert good.num_experts == 8
  directory = copy_model('tiny_qwen3_moe', tmp_path)
  (directory / 'model-00002-of-00002.safetensors').unlink()
  with pytest.raises(ValueError, match='model-00002-of-00002.safetensors is missing'):
    hf.policy_config(_with_hf_path(config, str(directory)))


def _with_hf_path(config, path):
  config = config.copy_and_resolve_references()
  config.init.hf_path = path
  return config


# ------------------------------------------------------------------ placement on a mesh

SHARDED_SCRIPT = r'''
import sys
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from configs import grpo as grpo_config
from rljax.hf import architecture
from rljax.hf import checkpoint as hf
from rljax.train import checkpoint
assert jax.device_count() == 8
name = sys.argv[1]
cfg = architecture.model_config(architecture.read_config(name))
full = hf.load_params(name, cfg)   # one device
mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ('data', 'model'))

def spec(shape):
  """'model' on the last axis it divides, 'data' on the last other one it divides: shards cut
  through heads, head_dim, experts and layers alike."""
  axes = [None] * len(shape)
  for mesh_axis, n in (('model', 4), ('data', 2)):
    for i in reversed(range(len(shape))):
      if axes[i] is None and shape[i] % n == 0:
        axes[i] = mesh_axis
        break
  return P(*axes)

shardings = jax.tree.map(lambda x: NamedSharding(mesh, spec(x.shape)), full)
sharded = hf.load_params(name, cfg, shardings)
cut = 0
for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(sharded)[0], jax.tree.leaves(full)):
  assert a.sharding == jax.tree.leaves(shardings)[0].__class__(mesh, a.sharding.spec)
  for shard in a.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(b)[shard.index],
                                  err_msg=jax.tree_util.keystr(path))
    cut += shard.data.size < b.size
replicated = hf.load_params(name, cfg, NamedSharding(mesh, P()))   # 8 replicas of every leaf
for a, b in zip(jax.tree.leaves(replicated), jax.tree.leaves(full)):
  assert len(a.addressable_shards) == 8
  for shard in a.addressable_shards:
    np.testing.assert_array_equal(np.asarray(shard.data), np.asarray(b))
print('OK', cut)
'''


@pytest.mark.parametrize('name', MODELS)
@pytest.mark.e2e
def test_load_places_each_shard_from_its_own_slice(name):
  flags = f'{os.environ["XLA_FLAGS"]} --xla_force_host_platform_device_count=8'
  env = dict(os.environ, XLA_FLAGS=flags, PYTHONPATH=ROOT, JAX_PLATFORMS='cpu')
  result = subprocess.run([sys.executable, '-c', SHARDED_SCRIPT, model_dir(name)], env=env,
                          capture_output=True, text=True, timeout=300, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert int(result.stdout.split('OK')[-1]) > 50   # most shards are strict slices
