"""Choosing the batch during a run: pure functions over plain numbers, no jax.

The rule. McCandlish et al. (2018, "An Empirical Model of Large-Batch Training") model what one
step at a batch of B samples buys: with the gradient noise scale B_noise (their B_simple =
tr(Sigma) / |G|^2), a step at B makes the progress of 1 / (1 + B_noise / B) noise-free steps, so
each sample is worth efficiency(B) = 1 / (1 + B / B_noise) of a sample at a tiny batch. Samples
are cheap below B_noise and wasted far above it. Pollux (Qiao et al., OSDI 2021) puts that
statistical efficiency beside the system's throughput and picks, during training, the batch that
maximises their product: goodput(B) = throughput(B) x efficiency(B), useful progress per second.

This module does that with the caution a single run needs: both factors come with intervals (the
noise scale from a block bootstrap over recent steps, throughput from repeated measured steps),
and the batch moves only when the lower end of the predicted gain clears 1 + margin, to the batch
on the way to the predicted best whose gain has the highest lower end, with a stricter bar for
going back to the batch it just left (hysteresis), and it never moves on a noise scale that is
not finite. Batches are counted in samples (responses).

A move also costs a compile, which Pollux (no compiler) does not pay. When the run has a budget
(train.max_samples or max_steps) the rule moves once the gain over the rest of it repays the
compile. Without one it pays the compile the way the ski-rental problem buys skis (Karlin et al.
1988): once the time already lost by staying (the seconds at the current batch times 1 - 1/gain)
has reached the compile's seconds; whatever the run's length, that spends at most twice what
knowing it in advance would. A batch compiled already (run before, or compiled ahead of the move)
has paid its compile: moving to it costs none.

Every move is then checked by the progress it measurably made (rljax.auto_batch.check): a move
that lost progress per second beyond noise is undone, and a move that cost no more progress per
sample than predicted lets its measurement, not the noise scale, judge the next doubling up.
"""
import math
from typing import NamedTuple


class Estimate(NamedTuple):
  """A value with an interval, e.g. the noise scale or one batch's samples per second."""
  value: float
  lo: float
  hi: float


class Costs(NamedTuple):
  """Seconds that decide whether a move pays for its compile."""
  here_s: float       # run so far at the current batch (since the last move)
  remaining_s: float  # left in the budget at the current batch's throughput
  compile_s: float    # what a first step at a new batch costs (its compile)
  compiled: frozenset = frozenset()   # batches compiled already (run before, or ahead of a
  #                                     move): their compile is paid, moving to them costs none


FREE = Costs(math.inf, math.inf, 0.0)   # a compile that costs nothing: goodput alone decides


class Decision(NamedTuple):
  batch: int        # the batch to run next (the current one when holding)
  best: int         # the argmax of predicted goodput over the allowed batches
  gain: float       # predicted goodput of the step towards `best` over the current one
  gain_lo: float    # its lower end, the one compared with 1 + margin (or the return bar)
  reason: str       # why it moved or held, in words


def allowed_batches(low, high):
  """The powers of two in [low, high]."""
  return [1 << k for k in range(max(low, 1).bit_length() - 1, high.bit_length())
          if low <= 1 << k <= high]


def is_power_of_two(n):
  return isinstance(n, int) and n > 0 and n & (n - 1) == 0


def efficiency(batch, noise_scale):
  """Progress per sample at `batch` relative to a tiny batch: 1 / (1 + B / B_noise)."""
  return 1.0 / (1.0 + batch / noise_scale)


def finite_noise(noise):
  """Whether the noise-scale estimate can drive a decision: a positive, finite lower end (and a
  point that is not a finite negative)."""
  return math.isfinite(noise.lo) and noise.lo > 0 and noise.hi >= noise.lo and not noise.value <= 0


def unbounded_point(noise):
  """`noise` with a point that is not finite read as unbounded: over the window |G|^2 was not
  positive, the gradient's signal lost in its noise, so B_noise is large; the lower end still
  bounds it."""
  return noise if math.isfinite(noise.value) else noise._replace(value=math.inf)


def throughput_guess(batch, table):
  """Samples/s at `batch`: measured, or guessed within what the measured batches allow if a
  step's seconds grow with the batch at a rate that never falls (a fixed cost plus a cost per
  sample, or a roofline's max of the two) and samples/s never fall. Above the measured batches
  the guess is the most they allow (`most_per_s`), so the rule tries a bigger batch and its
  measurement then decides; between two measured batches it is the geometric mean of the most
  and the least (the line between their step times), so a move down is not made on the most
  alone."""
  if batch in table:
    return table[batch]
  step_s = {b: b / table[b].value for b in sorted(table)}
  value = most_per_s(batch, step_s)
  below, above = [b for b in step_s if b < batch], [b for b in step_s if b > batch]
  if below and above:
    a, c = below[-1], above[0]
    least = batch / (step_s[a] + (step_s[c] - step_s[a]) * (batch - a) / (c - a))
    value = math.sqrt(value * least)
  return Estimate(value, value, value)


def most_per_s(batch, step_s):
  """The most samples/s at `batch` given measured step seconds {batch: s}: a step takes at least
  the nearest smaller batch's seconds, at least the nearest bigger one's scaled down to `batch`,
  and at least the line through the two nearest measured batches on either side."""
  below, above = [b for b in step_s if b < batch], [b for b in step_s if b > batch][::-1]
  bounds = [step_s[below[-1]]] if below else []
  bounds += [step_s[above[-1]] * batch / above[-1]] if above else []
  for side in (below, above):   # nearest last
    if len(side) > 1:
      near, far = side[-1], side[-2]
      bounds.append(step_s[near] + (step_s[near] - step_s[far]) / (near - far) * (batch - near))
  return batch / max(bounds)


def goodput(batch, noise_value, table):
  """Predicted progress per second at `batch` (the point estimates)."""
  return throughput_guess(batch, table).value * efficiency(batch, noise_value)


def best_batch(batches, noise, table):
  """The allowed batch of the highest predicted goodput (ties: the smaller batch)."""
  return max(batches, key=lambda b: (goodput(b, noise.value, table), -b))


def throughput_ratio(current, target, table):
  """(point, lower end) of samples/s at `target` over `current`; a guess has no spread of its
  own (the optimistic guess is what a probe tests)."""
  now, then = table[current], throughput_guess(target, table)
  return then.value / now.value, (then.lo / now.hi if target in table else then.value / now.value)


def step_gain(current, target, noise, table):
  """(point, lower end) of goodput(target) / goodput(current): the throughput ratio's lower end
  times the efficiency ratio at the end of the noise interval that least favours moving."""
  worst_noise = noise.lo if target > current else noise.hi   # bigger B_noise favours bigger B
  worst_eff = (efficiency(target, worst_noise) / efficiency(current, worst_noise)
               if math.isfinite(worst_noise) else 1.0)
  point, lo = throughput_ratio(current, target, table)
  return point * efficiency(target, noise.value) / efficiency(current, noise.value), lo * worst_eff


def repays_compile(gain, costs, target):
  """At 1 - 1/gain of each second gained by moving to `target`: the rest of the budget repays
  its compile or, with no budget (ski rental), the seconds already lost by staying have reached
  it. A compiled target has nothing left to repay."""
  if target in costs.compiled:
    return True
  horizon = costs.remaining_s if math.isfinite(costs.remaining_s) else costs.here_s
  return (1 - 1 / gain) * horizon >= costs.compile_s


def decide(current, batches, noise, table, margin, left=None, costs=FREE, measured=None):
  """The batch to run next. `table`: {batch: Estimate of samples/s} measured so far (it must hold
  `current`); `left`: the batch the last move came from, which a return must beat by
  (1 + margin)**2 rather than 1 + margin, so a decision is never undone by noise alone; `costs`:
  a move waits until its compile is repaid (`repays_compile`, at the gain's lower end);
  `measured`: the progress per sample the last move kept (rljax.auto_batch.check), which judges a
  doubling up where the noise scale would hold."""
  by_noise = _by_noise_scale(current, batches, noise, table, margin, left, costs)
  if by_noise.batch != current or measured is None or current * 2 not in batches:
    return by_noise
  point, lo = throughput_ratio(current, current * 2, table)
  point, lo = point * min(measured, 1.0), lo * min(measured, 1.0)
  bar = (1 + margin) ** 2 if current * 2 == left else 1 + margin
  if lo <= bar or not repays_compile(lo, costs, current * 2):
    return by_noise
  return Decision(current * 2, by_noise.best, point, lo,
                  f'try: measured progress {measured:.2f} per sample, gain lower end {lo:.3f} > '
                  f'{bar:.3f}')


def _by_noise_scale(current, batches, noise, table, margin, left, costs):
  """decide's answer from the noise scale's prediction alone."""
  if not finite_noise(noise):
    return Decision(current, current, 1.0, 1.0, 'noise scale not estimable: hold')
  noise = unbounded_point(noise)
  best = best_batch(batches, noise, table)
  if best == current:
    return Decision(current, best, 1.0, 1.0, 'the current batch has the best predicted goodput')
  target = surest_step(current, best, batches, noise, table)
  point, lo = step_gain(current, target, noise, table)
  bar = (1 + margin) ** 2 if target == left else 1 + margin
  if lo <= bar:
    return Decision(current, best, point, lo, f'hold: gain lower end {lo:.3f} <= {bar:.3f}')
  if not repays_compile(lo, costs, target):
    return Decision(current, best, point, lo, (
        f'hold: gain lower end {lo:.3f} > {bar:.3f}, but the compile ({costs.compile_s:.1f} s) '
        'is not repaid yet'))
  verb = 'try' if target not in table else 'move'
  return Decision(target, best, point, lo, f'{verb}: gain lower end {lo:.3f} > {bar:.3f}')


def surest_step(current, best, batches, noise, table):
  """The batch on the way from `current` to `best` (inclusive) whose predicted gain has the
  highest lower end: one move as far as the intervals vouch for (ties: the nearer)."""
  way = [b for b in batches if b != current and min(current, best) <= b <= max(current, best)]
  return max(way, key=lambda b: (step_gain(current, b, noise, table)[1],
                                 -abs(math.log2(b / current))))
