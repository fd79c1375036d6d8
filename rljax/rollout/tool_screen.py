"""A tool's result is plain data: the tokens it may put into a response.

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
result is `max_chars` + 2 tokens (Tool.max_tokens), and one character may be several tokens.
"""


def forbidden_ids(tool):
  """The ids no result may hold: the four markers, end, padding and stop tokens, and the
  tokenizer's special (added) tokens where it has them (rljax.hf.tokenizer.HFTokenizer)."""
  tokenizer = tool.tokenizer
  ids = set(tool.marker_ids()) | {tokenizer.eos_id, tokenizer.pad_id}
  ids |= set(getattr(tokenizer, 'stop_ids', ()))
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


def check(tool):
  """ValueError unless the tool's markers are four distinct single tokens, none of them the end
  or padding token, and its error text is a clean result that fits."""
  markers = tool.marker_ids()
  tokenizer = tool.tokenizer
  if len(set(markers)) != 4 or {tokenizer.eos_id, tokenizer.pad_id} & set(markers):
    raise ValueError(f'tool markers {tool.markers} must be four distinct tokens, none of them '
                     f'the end or padding token')
  _, error = result_ids(tool, tool.error, forbidden_ids(tool))
  if error:
    raise ValueError(f'the tool\'s error text {tool.error!r} is not a valid result ({error})')
