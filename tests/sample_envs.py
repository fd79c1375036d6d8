"""Environments for test_envs.py: `Guess`, the worked example of docs/guide/environments.md (the
guide shows its source, and test_envs checks that it does), and `Misbehaving`, which breaks the
contract one way at a time. Module-level classes of a module with light imports, so the worker
processes unpickle them in milliseconds."""
from rljax import envs
from rljax.data import tokenizer as tokenizer_lib


class Guess(envs.Environment):
  """Guess the prompt's answer (a number) in two tries: the model ends each guess with ']', the
  environment answers '{+}' (higher) or '{-}' (lower); a right guess wins (reward 1), a second
  wrong one loses (reward 0), and either ends the episode."""
  tokenizer = tokenizer_lib.ToolTokenizer()
  turn_end = tokenizer.encode(']')[0]
  max_observation = 3
  max_turns = 2
  error_observation = tokenizer.encode('{?}')

  def reset(self, record):
    return {'secret': int(record['answer']), 'guesses': 0}

  def step(self, state, turns):
    text = self.tokenizer.decode(turns[-1])[:-1]      # the latest turn, less its ']'
    digits = len(text) - len(text.rstrip('0123456789'))
    if not digits:                                    # no number before the ']'
      return envs.Step(self.error_observation, state, error='malformed')
    guess, state = int(text[-digits:]), dict(state, guesses=state['guesses'] + 1)
    if guess == state['secret'] or state['guesses'] == self.max_turns:
      return envs.Step([], state, reward=float(guess == state['secret']), done=True)
    hint = '{+}' if guess < state['secret'] else '{-}'
    return envs.Step(self.tokenizer.encode(hint), state)


class Misbehaving(Guess):
  """Guess with one thing wrong, as the prompt record's 'how' names it (one environment, so one
  pool of workers, for every way): what its reset or its steps return or do."""

  def reset(self, record):
    if record['how'] == 'reset raises':
      raise KeyError('secret')
    if record['how'] == 'state is a set':
      return {1, 2}
    return dict(super().reset(record), how=record['how'])

  def step(self, state, turns):
    bad = {'text observation': lambda: envs.Step('{+}', state),
           'id past the vocabulary': lambda: envs.Step([self.tokenizer.vocab_size], state),
           'end token': lambda: envs.Step([self.tokenizer.eos_id], state),
           'empty observation': lambda: envs.Step([], state),
           'too long': lambda: envs.Step(self.tokenizer.encode('{+++}'), state),
           'nan reward': lambda: envs.Step(self.error_observation, state, reward=float('nan')),
           'done is 1': lambda: envs.Step(self.error_observation, state, done=1),
           'unknown error kind': lambda: envs.Step(self.error_observation, state, error='oops'),
           'not a step': lambda: None,
           'raises': lambda: 1 / 0}
    how = state['how']
    return bad[how]() if how in bad else super().step(state, turns)
