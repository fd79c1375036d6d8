"""Character tokenizers for the built-in tasks: one id per symbol.

A fixed tiny vocabulary keeps toy models small and makes token ids readable in
tests and logs: PAD=0, EOS=1, '0'..'9' -> 2..11, '+' -> 12, '-' -> 13,
'*' -> 14, '=' -> 15. The tool task's tokenizer adds the calculator's
parentheses, its call and result markers and its error mark after those:
'(' ')' '[' ']' '{' '}' '?' -> 16..22. The reasoning-gym task's text tokenizer has a symbol for
every printable ASCII character and the newline, so any question of that library can be read.
"""
import string


class ArithmeticTokenizer:
  """Maps arithmetic text to token ids and back."""

  symbols = '0123456789+-*='
  pad_id = 0
  eos_id = 1
  vocab_size = 2 + len(symbols)

  def encode(self, text: str) -> list[int]:
    """Returns one id per character; no EOS is appended."""
    ids = []
    for char in text:
      position = self.symbols.find(char)
      if position < 0:
        raise ValueError(
            f'cannot encode character {char!r} in {text!r}; the vocabulary is'
            f' {self.symbols!r}')
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
      chars.append(self.symbols[token_id - 2])
    return ''.join(chars)


class ToolTokenizer(ArithmeticTokenizer):
  """The arithmetic symbols (same ids), then '()[]{}?': the tool task's (rljax.tasks.tool_sums)."""

  symbols = ArithmeticTokenizer.symbols + '()[]{}?'
  vocab_size = 2 + len(symbols)


class TextTokenizer(ArithmeticTokenizer):
  """One id per printable ASCII character and per newline (digits keep their ids): the reasoning_gym
  task's (rljax.tasks.reasoning_gym), whose library's questions are English text and whose
  references are JSON."""

  symbols = string.printable[:95] + '\n'   # digits, letters, punctuation, space; no tab or \r
  vocab_size = 2 + len(symbols)
