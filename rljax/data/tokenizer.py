"""Character tokenizer for the arithmetic tasks: 16 ids, one per symbol.

A fixed tiny vocabulary keeps toy models small and makes token ids readable in
tests and logs: PAD=0, EOS=1, '0'..'9' -> 2..11, '+' -> 12, '-' -> 13,
'*' -> 14, '=' -> 15.
"""

_SYMBOLS = '0123456789+-*='


class ArithmeticTokenizer:
  """Maps arithmetic text to token ids and back."""

  pad_id = 0
  eos_id = 1
  vocab_size = 2 + len(_SYMBOLS)

  def encode(self, text: str) -> list[int]:
    """Returns one id per character; no EOS is appended."""
    ids = []
    for char in text:
      position = _SYMBOLS.find(char)
      if position < 0:
        raise ValueError(
            f'cannot encode character {char!r} in {text!r}; the vocabulary is'
            f' {_SYMBOLS!r}')
      ids.append(2 + position)
    return ids

  def decode(self, ids) -> str:
    """Returns the text up to the first EOS, skipping PAD ids."""
    chars = []
    for token_id in ids:
      token_id = int(token_id)
      if token_id == self.eos_id:
        break
      if token_id == self.pad_id:
        continue
      if not 2 <= token_id < self.vocab_size:
        raise ValueError(
            f'token id {token_id} is outside [0, {self.vocab_size})')
      chars.append(_SYMBOLS[token_id - 2])
    return ''.join(chars)
