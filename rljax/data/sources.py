"""The data layer of the trainer: TFDS splits, prompt batches and token arrays.

Splits are read through `tfds.data_source` (array_record, random access, no
TensorFlow). Batches come from `PromptIterator`, whose position is a tiny dict
so a checkpoint can restore it exactly. Token arrays are numpy, left-padded so
every prompt ends in the same column, which is where the sampler starts
decoding.
"""

from collections.abc import Sequence
import sys

import numpy as np
import tensorflow_datasets as tfds

from rljax.data.builders import arithmetic
from rljax.data.tokenizer import ArithmeticTokenizer


def load_split(data_dir, *, digits=3, ops='+', zero_pad=True,
               num_train=100_000, num_test=1_000, seed=0, extra_test=0, split='train'):
  """Returns a data source of one split of the arithmetic task."""
  config = arithmetic.make_config(digits, ops, zero_pad, num_train, num_test,
                                  seed, extra_test)
  return load_tfds_split(arithmetic.Arithmetic, config, data_dir, split)


def load_tfds_split(builder_cls, config, data_dir, split):
  """Returns a data source of one split, building the dataset if needed.

  Concurrent builds are safe: TFDS writes into a private temporary directory
  and renames it into place, so a process that loses the race only fails that
  rename; it then reads the winner's copy.
  """
  builder = builder_cls(config=config, data_dir=data_dir)
  if not builder.is_prepared():
    if not (sys.stdout.isatty() and sys.stderr.isatty()):   # bars redraw with \r: not in a file
      tfds.disable_progress_bar()
    try:
      builder.download_and_prepare(file_format='array_record')
    except OSError:
      if not builder_cls(config=config, data_dir=data_dir).is_prepared():
        raise
    builder = builder_cls(config=config, data_dir=data_dir)
  splits = builder.info.splits
  if split not in splits or not splits[split].num_examples:
    raise ValueError(f'split {split!r} is missing or empty in'
                     f' {builder.data_dir}; it has {sorted(splits)}')
  return builder.as_data_source(split)


def text(value) -> str:
  """Data sources return text features as bytes."""
  return value.decode() if isinstance(value, bytes) else value


def read_records(source: Sequence, indices) -> list:
  """Reads records in one call where the source can: one read per batch, not one per record."""
  indices = [int(index) for index in indices]
  if hasattr(source, '__getitems__'):
    return source.__getitems__(indices)
  return [source[index] for index in indices]


def encode_prompts(prompts: list[str], tokenizer, length=None):
  """Returns (tokens_BxT int32, mask_BxT bool), prompts LEFT-padded with PAD.

  T is `length`, or the longest prompt when None.
  """
  ids = [tokenizer.encode(prompt) for prompt in prompts]
  longest = max(map(len, ids), default=0)
  length = longest if length is None else length
  if longest > length:
    raise ValueError(f'a prompt has {longest} tokens, more than {length}')
  tokens_BxT = np.full((len(ids), length), tokenizer.pad_id, np.int32)
  mask_BxT = np.zeros((len(ids), length), bool)
  for row, prompt_ids in enumerate(ids):
    start = length - len(prompt_ids)
    tokens_BxT[row, start:] = prompt_ids
    mask_BxT[row, start:] = True
  return tokens_BxT, mask_BxT


def encode_supervised(prompts: list[str], answers: list[str], tokenizer):
  """Returns (tokens_BxS, mask_BxS, loss_mask_BxS) for supervised warm start.

  Each row is the left-padded prompt, the answer, EOS, then right PAD.
  Alignment: `loss_mask_BxS[:, t]` is True when the NEXT token,
  `tokens_BxS[:, t + 1]`, is an answer or EOS token, so the loss is
  `nll(logits_BxSxV[:, :-1], tokens_BxS[:, 1:]) * loss_mask_BxS[:, :-1]`.
  The last column of the loss mask is always False.
  """
  if len(prompts) != len(answers):
    raise ValueError(f'{len(prompts)} prompts but {len(answers)} answers')
  prompt_tokens_BxP, prompt_mask_BxP = encode_prompts(prompts, tokenizer)
  answer_ids = [tokenizer.encode(answer) + [tokenizer.eos_id]
                for answer in answers]
  answer_tokens_BxA = np.full((len(answer_ids), max(map(len, answer_ids),
                                                    default=0)),
                              tokenizer.pad_id, np.int32)
  answer_mask_BxA = np.zeros(answer_tokens_BxA.shape, bool)
  for row, ids in enumerate(answer_ids):
    answer_tokens_BxA[row, :len(ids)] = ids
    answer_mask_BxA[row, :len(ids)] = True
  tokens_BxS = np.concatenate([prompt_tokens_BxP, answer_tokens_BxA], axis=1)
  mask_BxS = np.concatenate([prompt_mask_BxP, answer_mask_BxA], axis=1)
  is_target_BxS = np.concatenate(
      [np.zeros_like(prompt_mask_BxP), answer_mask_BxA], axis=1)
  loss_mask_BxS = np.zeros_like(is_target_BxS)
  loss_mask_BxS[:, :-1] = is_target_BxS[:, 1:]
  return tokens_BxS, mask_BxS, loss_mask_BxS


class PromptIterator:
  """Endless, deterministic, resumable batches of train prompts and answers.

  Epoch e visits the records in the order `permutation(seed, e)`, cut into
  global batches of `batch_size` (a last partial batch is dropped). Process p
  owns the p-th contiguous slice of every global batch, so without bad
  records the processes' batches concatenate to the single-process batch.
  A skipped record is replaced by the next one from the same process's own
  slices, which keeps the processes disjoint and every batch full.

  A batch is {'prompt': [...], 'answer': [...], 'id': [...]}: 'id' is each
  record's stream index, epoch x records in the split + its position in the
  split, unique over the stream (what WORKDIR/prompts.jsonl logs).

  The batch size can change between batches (rljax.auto_batch.hook): the
  state's 'offset' is where in the epoch's order the current layout of
  batches starts, and `continue_with_batch` moves it past the batches drawn
  so far, so the next iterator, of any batch size, reads on from there.
  """

  def __init__(self, source: Sequence, batch_size: int, seed: int,
               process_index: int = 0, process_count: int = 1, state=None, *,
               tokenizer=None, on_bad_record: str = 'skip'):
    if batch_size < 1 or batch_size % process_count:
      raise ValueError(f'batch_size {batch_size} is not a positive multiple'
                       f' of process_count {process_count}')
    if not 0 <= process_index < process_count:
      raise ValueError(f'process_index {process_index} is not in'
                       f' [0, {process_count})')
    if on_bad_record not in ('skip', 'raise'):
      raise ValueError(f"on_bad_record must be 'skip' or 'raise', got"
                       f' {on_bad_record!r}')
    if len(source) < batch_size:
      raise ValueError(f'the source has {len(source)} records, fewer than'
                       f' one batch of {batch_size}')
    self._source = source
    self._batch_size = batch_size
    self._seed = seed
    self._process_index = process_index
    self._process_count = process_count
    self._local_batch_size = batch_size // process_count
    self._tokenizer = tokenizer or ArithmeticTokenizer()
    self._on_bad_record = on_bad_record
    state = state or {'epoch': 0, 'index': 0}
    self.skipped = int(state.get('skipped', 0))  # Malformed records passed over so far.
    self._skipped_records = []   # (stream index, reason) of those since take_skipped_records
    self._epoch, self._index = int(state['epoch']), int(state['index'])
    self._offset = int(state.get('offset', 0))   # where this epoch's layout starts
    self._batches = int(state.get('batches', self._index // self._local_batch_size))
    self._positions = self._epoch_positions(self._epoch)
    if not 0 <= self._index <= len(self._positions):
      raise ValueError(f'state {state} is outside an epoch of'
                       f' {len(self._positions)} records for this process')

  def state(self) -> dict:
    """Position after the last batch; pass it back as `state` to resume.

    'index' counts the records this process has read in the epoch's layout,
    so a state only makes sense for the same source, batch size and process
    layout ('batches': the batches drawn in it; continue_with_batch changes
    the batch size).
    """
    return {'epoch': self._epoch, 'index': self._index, 'skipped': self.skipped,
            'offset': self._offset, 'batches': self._batches}

  @property
  def batch_size(self) -> int:
    return self._batch_size

  def with_batch(self, batch_size: int) -> 'PromptIterator':
    """An iterator of `batch_size` that reads on from where this one is (`continue_with_batch`)."""
    return PromptIterator(
        self._source, batch_size, self._seed, self._process_index, self._process_count,
        continue_with_batch(self.state(), self._batch_size), tokenizer=self._tokenizer,
        on_bad_record=self._on_bad_record)

  def _epoch_positions(self, epoch: int) -> np.ndarray:
    """This process's record indices for one epoch, in visiting order."""
    order = np.random.default_rng([self._seed, epoch]).permutation(
        len(self._source))[self._offset if epoch == self._epoch else 0:]
    count = len(order) // self._batch_size
    batches = order[:count * self._batch_size].reshape(
        count, self._process_count, self._local_batch_size)
    return batches[:, self._process_index].reshape(-1)

  def take_skipped_records(self) -> list:
    """[(stream index, reason)] of the malformed records passed over since the last call: the
    step that read them logs them (rljax.train.loop)."""
    taken, self._skipped_records = self._skipped_records, []
    return taken

  def _stream_index(self, position) -> int:
    return self._epoch * len(self._source) + int(position)

  def _parse(self, record, position: int):
    """Returns (prompt, answer), or None for a skipped malformed record."""
    try:
      prompt, answer = text(record['prompt']), text(record['answer'])
      if not prompt or not answer:
        raise ValueError(f'empty prompt {prompt!r} or answer {answer!r}')
      self._tokenizer.encode(prompt)
      self._tokenizer.encode(answer)
    except (KeyError, TypeError, ValueError) as error:
      if self._on_bad_record == 'raise':
        raise ValueError(f'malformed record {position}: {error!r}') from error
      self.skipped += 1
      self._skipped_records.append((self._stream_index(position), repr(error)))
      return None
    return prompt, answer

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    prompts, answers, indices = [], [], []
    visited = 0
    while len(prompts) < self._local_batch_size:
      if self._index == len(self._positions):
        self._positions = self._epoch_positions(self._epoch + 1)
        self._epoch, self._index, self._offset, self._batches = self._epoch + 1, 0, 0, 0
      if visited > len(self._positions):
        raise ValueError('a whole epoch passed without a valid record')
      stop = min(len(self._positions),
                 self._index + self._local_batch_size - len(prompts))
      positions = self._positions[self._index:stop]
      for position, record in zip(positions, read_records(self._source, positions)):
        example = self._parse(record, int(position))
        if example is not None:
          prompts.append(example[0])
          answers.append(example[1])
          indices.append(self._stream_index(position))
      visited += len(positions)
      self._index = stop
    self._batches += 1
    return {'prompt': prompts, 'answer': answers, 'id': indices}


def continue_with_batch(state: dict, batch_size: int) -> dict:
  """The state from which a PromptIterator of any batch size reads on after
  one of `batch_size` left `state`: its layout starts after the global batches
  drawn so far. Every process computes the same offset from the batch count.
  (A record one process read ahead to replace a malformed one may be read
  again after the change.)"""
  return {'epoch': state['epoch'], 'index': 0, 'skipped': state.get('skipped', 0),
          'offset': state.get('offset', 0) + state['batches'] * batch_size,
          'batches': 0}


def eval_set(source: Sequence, n: int) -> tuple[list[str], list[str]]:
  """Returns the first n (prompts, answers) of a split, in stored order."""
  if not 0 <= n <= len(source):
    raise ValueError(f'asked for {n} eval examples; the split has'
                     f' {len(source)}')
  records = read_records(source, range(n))
  return ([text(record['prompt']) for record in records],
          [text(record['answer']) for record in records])
