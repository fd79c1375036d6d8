"""The tokenizer of a Hugging Face model directory, with the interface rljax's data layer uses.

tokenizer.json is run by the `tokenizers` library; the chat template in tokenizer_config.json is
rendered with jinja2 in a sandbox, with the same settings transformers uses, so a prompt becomes
exactly the token ids the model was trained to see.
"""
import functools
import json
import os

import jinja2
from jinja2 import sandbox
import tokenizers


def _raise(message):
  raise jinja2.exceptions.TemplateError(message)


@functools.lru_cache(maxsize=8)
def _compile(template):
  env = sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                              extensions=['jinja2.ext.loopcontrols'])
  env.globals['raise_exception'] = _raise
  return env.from_string(template)


def _token_text(value):
  """tokenizer_config.json writes special tokens as strings or as {"content": ...} dicts."""
  return value.get('content') if isinstance(value, dict) else value


def _generation_eos_ids(hf_dir):
  path = os.path.join(hf_dir, 'generation_config.json')
  if not os.path.exists(path):
    return []
  with open(path) as f:
    ids = json.load(f).get('eos_token_id')
  return [] if ids is None else [ids] if isinstance(ids, int) else list(ids)


class HFTokenizer:
  """encode / decode / pad_id / eos_id / vocab_size, plus `chat_prompt` for instruction models."""

  def __init__(self, hf_dir):
    path = os.path.join(hf_dir, 'tokenizer.json')
    if not os.path.exists(path):
      raise ValueError(f'{hf_dir} has no tokenizer.json')
    self._tokenizer = tokenizers.Tokenizer.from_file(path)
    config_path = os.path.join(hf_dir, 'tokenizer_config.json')
    config = {}
    if os.path.exists(config_path):
      with open(config_path) as f:
        config = json.load(f)
    self.chat_template = config.get('chat_template')
    template_path = os.path.join(hf_dir, 'chat_template.jinja')   # where transformers 5 saves it
    if os.path.exists(template_path):
      with open(template_path) as f:
        self.chat_template = f.read()
    self.eos_token = _token_text(config.get('eos_token'))
    pad_token = _token_text(config.get('pad_token')) or self.eos_token
    if self.eos_token is None:
      raise ValueError(f'{config_path} names no eos_token: generation could never stop')
    self.eos_id = self._id(self.eos_token)
    self.pad_id = self._id(pad_token)
    self.vocab_size = self._tokenizer.get_vocab_size(with_added_tokens=True)
    # Text ends at the first of any stop token: Qwen3 lists <|im_end|> and <|endoftext|>.
    self.stop_ids = {self.eos_id} | set(_generation_eos_ids(hf_dir))
    # Added tokens (<|im_start|>, <|im_end|>, <tool_call>, ...): control tokens, which a tool's
    # result may not hold (rljax.envs.screen).
    self.special_ids = (set(self._tokenizer.get_vocab(with_added_tokens=True).values())
                        - set(self._tokenizer.get_vocab(with_added_tokens=False).values()))

  def _id(self, token):
    token_id = self._tokenizer.token_to_id(token)
    if token_id is None:
      raise ValueError(f'special token {token!r} is not in the vocabulary')
    return token_id

  def encode(self, text: str) -> list[int]:
    """Token ids of `text`; special tokens written in the text (e.g. <|im_start|>) map to theirs."""
    return self._tokenizer.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts) -> list[list[int]]:
    return [e.ids for e in self._tokenizer.encode_batch(list(texts), add_special_tokens=False)]

  def decode(self, ids) -> str:
    """Text up to the first stop token, without special tokens."""
    ids = [int(i) for i in ids]
    stops = [n for n, i in enumerate(ids) if i in self.stop_ids]
    ids = ids[:stops[0]] if stops else ids
    return self._tokenizer.decode([i for i in ids if i != self.pad_id], skip_special_tokens=True)

  def chat_prompt(self, question: str) -> str:
    """`question` as one user turn, followed by the assistant's turn opening."""
    if not self.chat_template:
      return question
    return _compile(self.chat_template).render(
        messages=[{'role': 'user', 'content': question}], add_generation_prompt=True,
        eos_token=self.eos_token)
