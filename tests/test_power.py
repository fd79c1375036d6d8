"""The decision's error rates and power, measured on synthetic sweeps (tests/synthetic_protocol.py:
logs in the workdir format with the committed runs' noise) passed through the real report code
and rljax.protocol.driver's adaptive seeds. docs/guide/protocol_results.md quotes these numbers."""
import numpy as np
import pytest

import synthetic_protocol as sp


def shares(results, key):
  values = [key(r) for r in results]
  return {v: values.count(v) / len(values) for v in set(values)}


def test_defaults_rarely_call_a_batch_faster_when_none_is(tmp_path):
  """All batches equal: a false 'faster' in at most 5% of 80 sweeps (nominal 2.5% per batch)."""
  results = sp.replicates(str(tmp_path), sp.NULL, 80, np.random.default_rng(0))
  assert shares(results, lambda r: r[1]).get('faster', 0.0) <= 0.05


def test_defaults_never_recommend_the_truly_slower_batch(tmp_path):
  """The paper's truth: batch 2048 is 1.23x slower than the base; recommended in <= 1%."""
  results = sp.replicates(str(tmp_path), sp.PAPER, 80, np.random.default_rng(1))
  assert shares(results, lambda r: r[0]).get(2048, 0.0) <= 0.01


# (seeds to start with, throughput rounds, prompts per eval): the defaults first, then more of
# each of the three sources of noise. Training samples are the align runs' (adaptive seeds in).
DESIGNS = ((3, 3, 1000), (3, 10, 4000), (6, 10, 4000), (12, 10, 1000), (12, 10, 4000))
TRULY_FASTEST = min(sp.true_relative_time(sp.PAPER).items(), key=lambda kv: kv[1])[0]


def wilson(k, n, z=1.96):
  """Wilson's 95% interval for a proportion k / n."""
  p, half = k / n, z * np.sqrt(k / n * (1 - k / n) / n + z**2 / (4 * n**2))
  return (p + z**2 / (2 * n) - half) / (1 + z**2 / n), (p + z**2 / (2 * n) + half) / (1 + z**2 / n)


def calibration_bins(results, truth_fastest, edges=(0, 0.2, 0.4, 0.6, 0.8, 1.0001)):
  """P(fastest) against how often that batch was truly the fastest, per bin of P(fastest)."""
  pairs = [(p, batch == truth_fastest) for r in results for batch, p in r[2].items()]
  bins = []
  for lo, hi in zip(edges[:-1], edges[1:]):
    inside = [(p, hit) for p, hit in pairs if lo <= p < hi]
    if len(inside) >= 30:
      bins.append((lo, np.mean([p for p, _ in inside]), np.mean([h for _, h in inside]),
                   len(inside)))
  return bins


def test_power_against_cost(tmp_path):
  """Power (the truly fastest batch, 1024, recommended) at the paper's truth, against the align
  runs' training samples, for more seeds, throughput rounds and eval prompts. Prints the table
  docs/guide/protocol_results.md quotes; the cheapest design with >= 80% power also keeps the error
  rates (null false 'faster' <= 5%, truly slower recommended <= 1%) and P(fastest) calibrated."""
  n, rows = 80, []
  for i, (seeds, rounds, prompts) in enumerate(DESIGNS):
    design = dict(seeds=seeds, rounds=rounds, prompts=prompts)
    results = sp.replicates(str(tmp_path / f'd{i}'), sp.PAPER, n, np.random.default_rng(10 + i),
                            **design)
    hits = sum(r[0] == TRULY_FASTEST for r in results)
    rows.append(dict(design, power=hits / n, ci=wilson(hits, n), results=results,
                     samples=np.mean([r[3] for r in results])))
  default_samples = rows[0]['samples']
  print('\nseeds | rounds | prompts/eval | power [95% CI] | align samples vs defaults')
  for r in rows:
    print(f"{r['seeds']} | {r['rounds']} | {r['prompts']} | {r['power']:.2f} "
          f"[{r['ci'][0]:.2f}, {r['ci'][1]:.2f}] | {r['samples'] / default_samples:.2f}x")
  chosen = next(r for r in rows if r['power'] >= 0.8)
  design = {k: chosen[k] for k in ('seeds', 'rounds', 'prompts')}
  null = sp.replicates(str(tmp_path / 'null'), sp.NULL, n, np.random.default_rng(99), **design)
  false_faster = sum(r[1] == 'faster' for r in null)
  slower = sum(r[0] == 2048 for r in chosen['results'])
  bins = calibration_bins(chosen['results'], TRULY_FASTEST)
  print(f'cheapest design with >= 80% power: {design}; null false "faster" {false_faster}/{n}; '
        f'truly slower recommended {slower}/{n}; P(fastest) bins (from, mean P, observed, n): '
        + '; '.join(f'{lo:.1f}: {p:.2f} vs {o:.2f} ({k})' for lo, p, o, k in bins))
  assert false_faster / n <= 0.05 and slower / n <= 0.01
  assert all(abs(p - observed) <= 0.1 for _, p, observed, _ in bins)
