"""Environments: what a response talks to between its turns (docs/guide/environments.md).

A multi-turn task's responses are episodes. The model writes a turn, ending it with the
environment's `turn_end` token; the environment answers with an observation (token ids) that is
appended to the response, and the model writes its next turn after it, until the end token, the
token budget, `done`, or `max_turns` steps. A tool is one kind of environment: its turn is a
call, its observation the result (rljax.envs.tools; the built-in one, rljax.envs.calculator).

The contract, `Environment`:

  tokenizer            the task's: turns and observations are its token ids
  turn_end             the token id that ends a model turn and hands it to the environment
  max_observation      the longest observation, in tokens (the turn loop's room for one)
  max_turns            steps per episode: a response ending one more turn ends there, unstepped
  error_observation    the tokens the model reads after a step that failed; None: it ends
  reset(record)        -> state: a fresh episode of a prompt record ({'prompt', 'answer'}: text)
  step(state, turns)   -> Step: the answer to the model's turn; `turns` is the episode so far as
                       token lists, the model's turns and the observations alternating, the
                       model's latest turn (its last token turn_end) last

Token in, token out: nothing is decoded and encoded again between turns unless the environment
does it itself. Both methods should be pure functions of their arguments: an episode's state is
the value they return and take, plain JSON data (numbers, strings, lists, dicts, None), held by
the host between steps; the environment object itself holds only its settings. That is what lets
every step run in a worker process that can be killed (rljax.envs.pool: a step runs user code
on untrusted model output), and makes a step reproducible from its arguments.

The reward: a step may give one (Step.reward). An episode whose steps gave rewards is scored by
their sum, and the task's verifier is not asked; an episode that got none (the calculator gives
none) is scored by the verifier on the response's text, as a single-turn one is
(rljax.envs.reward). So an environment that judges its episodes gives the reward on the step
that ends them; one that only serves the model (a tool) leaves the judging to the verifier.

A step that fails is contained and counted, never the run's end: its error kind (ERRORS) is
counted in the training row (`tool_<kind>`), the model reads `error_observation` (or the episode
ends, where it is None) and the episode's state stays as it was. What fails: the step raised,
ran past the time or memory bound, killed its worker, or answered something that is not a
Step of valid tokens (rljax.envs.runner screens every observation); an environment may also
refuse a turn itself, answering with its own observation and an error kind (Step.error).
"""
from typing import Any, NamedTuple, Protocol

# Error kinds, besides '' (no error): a turn or an answer that is not what the contract says (a
# call without its call-open marker, a Step whose fields are of the wrong type); the step
# raised; past the time bound; the environment is disabled (tools.enabled False); its worker
# died; past the memory bound; an observation or result longer than allowed; an observation
# holding tokens that no observation may hold (the end token, special tokens, a tool's markers).
ERRORS = ('malformed', 'raised', 'timeout', 'disabled', 'crash', 'memory', 'oversize',
          'bad_result')


class Step(NamedTuple):
  """An environment's answer to one model turn."""
  observation: list      # token ids appended to the response (at least one, unless done)
  state: Any             # the episode's next state (JSON data)
  reward: float | None = None   # a reward for the episode, or None (see the module docstring)
  done: bool = False     # the episode ends here: the observation is not appended
  error: str = ''        # '' or the kind (ERRORS) this step is counted as: a refused turn


class Environment(Protocol):
  """The contract (the module docstring). Subclass it, or match it: rljax.envs.tools.Tool is a
  NamedTuple that does."""
  tokenizer: Any
  turn_end: int
  max_observation: int
  max_turns: int
  error_observation: list | None

  def reset(self, record: dict) -> Any:
    """The state of a fresh episode of the prompt `record`."""

  def step(self, state: Any, turns: list) -> Step:
    """The answer to the model's latest turn, `turns[-1]`."""
