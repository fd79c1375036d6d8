"""Parses the `:key=value,...` argument of a config file (big_vision style).

`get_config("P=1024,runlocal")` in a config file calls `parse_arg(arg, P=16, runlocal=False)`:
types come from the defaults, a bare key means True, unknown keys and bad values raise one clear
ValueError (the main turns it into a non-zero exit).
"""
import importlib

import ml_collections


def _convert(key, text, default):
  if isinstance(default, bool):
    lowered = text.strip().lower()
    if lowered in ('', 'true', '1', 'yes'):
      return True
    if lowered in ('false', '0', 'no'):
      return False
    raise ValueError(f'config arg {key}={text!r}: expected a boolean (true/false)')
  if isinstance(default, int):
    try:
      return int(text)
    except ValueError:
      raise ValueError(f'config arg {key}={text!r}: expected an integer') from None
  if isinstance(default, float):
    try:
      return float(text)
    except ValueError:
      raise ValueError(f'config arg {key}={text!r}: expected a number') from None
  return text


def parse_arg(arg, **defaults):
  """Returns a ConfigDict of `defaults` overridden by the comma-separated `key=value` pairs in `arg`."""
  values = dict(defaults)
  for item in (arg or '').split(','):
    item = item.strip()
    if not item:
      continue
    key, has_value, text = item.partition('=')
    key = key.strip()
    if key not in defaults:
      raise ValueError(f'unknown config arg {key!r}; known args: {", ".join(sorted(defaults))}')
    if not has_value and not isinstance(defaults[key], bool):
      raise ValueError(f'config arg {key!r} needs a value ({key}=...)')
    values[key] = _convert(key, text, defaults[key])
  return ml_collections.ConfigDict(values)


def algo_config(algo, arg):
  """configs/<algo>.py's get_config(arg): how the protocol builds its arms of any algorithm."""
  if algo not in ('grpo', 'ppo'):
    raise ValueError(f"unknown algo {algo!r}; choose 'grpo' or 'ppo'")
  try:
    module = importlib.import_module(f'configs.{algo}')
  except ModuleNotFoundError:
    raise ValueError(f'algo {algo!r} needs configs/{algo}.py, which is missing') from None
  return module.get_config(arg)
