"""A tool's result is plain data: the tokens it may put into a response (rljax.envs.tools; the
runner screens every environment's observation for what no observation may hold,
rljax.envs.runner).

The turn loop appends a result's tokens to the response as they are, so a result that encodes
to a call or result marker would open or close a call the model never made, and one that
encodes to the end token or any other special token of the tokenizer (a Hugging Face
tokenizer's added tokens: `<|im_end|>` is one token there) would end the response on the tool's
words, and the reward would be computed on them. Such a result is rejected (`bad_result`), not
escaped: a tokenizer has no escape that the model and the verifier would both read as the
literal text (the character tokenizer cannot even encode a backslash), and a result altered in
silence is a different result, while a rejected one is an error result counted in the metrics.
The check is on token ids, after encoding, so it holds whatever text a tokenizer maps to them.
A result longer than the tool's `max_chars` tokens is `oversize`: the turn loop's room for a
result is `max_chars` + 2 tokens (Tool.max_observation), and one character may be several tokens.
"""


def forbidden_ids(tool):
  """The ids no result may hold: the four markers, end, padding and stop tokens, and the
  tokenizer's special (added) tokens where it has them (rljax.hf.tokenizer.HFTokenizer)."""
  return set(tool.marker_ids()) | control_ids(tool.tokenizer)


def control_ids(tokenizer):
  """The ids no observation of any environment may hold: the end, padding and stop tokens and
  the tokenizer's special (added) tokens, each of which would end the response or mean what the
  environment's text does not."""
  ids = {tokenizer.eos_id, tokenizer.pad_id} | set(getattr(tokenizer, 'stop_ids', ()))
  return ids | set(getattr(tokenizer, 'special_ids', ()))


def result_ids(tool, text, forbidden):
  """(the tokens of result `text`, '') or (None, the error kind): 'malformed' when the tokenizer
  cannot encode it, 'bad_result' when it holds a `forbidden` id, 'oversize' past max_chars."""
  try:
    ids = list(tool.tokenizer.encode(text))
  except Exception:  # pylint: disable=broad-except  (any tokenizer's refusal)
    return None, 'malformed'
  if forbidden.intersection(ids):
    return None, 'bad_result'
  if len(ids) > tool.max_chars:
    return None, 'oversize'
  return ids, ''
