"""The report in words: report.md's tables and the plain-language summary of what exceeds the noise,
from the numbers rljax.protocol.report builds."""
import numpy as np

from rljax.protocol import layout


def _num(x, spec='.3g'):
  if x is None or (isinstance(x, float) and np.isnan(x)):
    return 'n/a'
  return 'unbounded' if np.isinf(x) else format(x, spec)


def _count(x):
  if x is not None and np.isinf(x):
    return 'not reached'
  return _num(x) if not np.isfinite(x) else (f'{x / 1e3:.1f}k' if x >= 1e3 else f'{x:.0f}')


def _ci(ci, spec='.2f'):
  return f'[{_num(ci[0], spec)}, {_num(ci[1], spec)}]'


def _calibration_sentence(c):
  if c['source'] == 'given':
    return f"lr0 = {_num(c['lr0'])} was given, not calibrated."
  if not c['lrs']:
    return 'No lr0 calibration in this workdir.'
  rows = ', '.join(f"{_num(r['lr'])}: {_count(r['samples_to_target'])}" for r in c['lrs'])
  where = (' It is at the edge of the lrs tried: the best lr may lie beyond them.' if c['at_edge']
           else ' It is interior: both neighbours needed more samples.')
  if c.get('ceiling') is not None:
    where += (f" An lr whose curve stayed below {_num(c['ceiling'], '.3f')} on a seed counts as "
              'not reaching J there.')
  if c['method'] != 'fewest samples to target':
    where = (f" No lr reached J on every seed: lr0 has the {c['method']}, a fallback."
             + where)
  return (f"lr0 calibration at the base batch (samples to J = {_num(c['target'], '.3f')}, "
          f"{c['target_rule']}; geometric mean over seeds): {rows}; chosen lr0 = "
          f"{_num(c['lr0'])}.{where}{_budget_sentence(c)}")


def _budget_sentence(c):
  """The budget and grid the calibration derived (protocol.budget_scales), where it did."""
  if 'max_samples' not in c:
    return ''
  after_first = (f"the calibration runs after the first trained {_count(c['calibration_budget'])} "
                 'samples each; ' if c['calibration_budget'] else '')
  return (f" Time-scale of lr0's curve: {_count(c['time_scale'])} samples; {after_first}the arms "
          f"train {_count(c['max_samples'])} samples, evaluated every "
          f"{_count(c['eval_every_samples'])}.")


def _arm_sentence(a):
  if a['rN_status'] == 'base not reached':
    return f"`{a['name']}`: rN undefined, the base arm does not reach the target on every seed."
  twin = (f"; against the sqrt arm at the same batch {_num(a['rN_vs_same_batch_sqrt'], '.2f')}"
          if a['control'] else '')
  missed = (f" ({a['n_seeds'] - a['seeds_reached']}/{a['n_seeds']} seeds did not reach it)"
            if a['rN_status'] == 'not reached' else '')
  return (f"`{a['name']}` (batch {a['batch']}, lr {_num(a['lr'])}): rN {_num(a['rN'], '.2f')} "
          f"{_ci(a['rN_ci'])}{missed}, {a['alignment']}{twin}.")


def _aligned_sentence(aligned):
  t = aligned['tolerance']
  text = (f"Aligned range (rN's interval inside [{1 - t:g}, {1 + t:g}]): batches "
          f"{aligned['batches']}")
  if aligned['batches'] == [aligned['lo']]:
    text += ' (the base alone)'
  if aligned['undetermined']:
    text += (f"; undetermined (the interval straddles the band, more seeds would tell): "
             f"{aligned['undetermined']}")
  not_aligned = [b for b, s in aligned['status'].items() if s == 'not aligned']
  return text + (f'; not aligned: {not_aligned}.' if not_aligned else '.')


def _gradient_sentence(report):
  fits = [('the aligned range', report['grad_norm_slope']), ('all sqrt arms',
                                                         report['grad_norm_slope_all'])]
  parts = [f"over {name}: {_num(f['slope'])} {_ci(f['ci'], '.3f')} (t, df {f['df']}; "
           f"{f['verdict']})" for name, f in fits if np.isfinite(f['slope'])]
  noise = ', '.join(f"{a['name']} {_num(a['noise_scale'])} {_ci(a['noise_scale_ci'], '.3g')}"
                    for a in report['arms'] if not a['control'])
  return (f"Grad norm vs batch, log-log slope {'; '.join(parts) or 'n/a'}. B_simple per arm "
          f"(block bootstrap over steps): {noise}; from the grad-norm curve: "
          f"{_num(report['noise_scale_from_grad_norms'])}.")


def _robustness_sentence(report):
  """Whether the verdict (not only the recommendation) holds by first crossings at each target."""
  primary = report['decision']
  by_target = {round(d['target'], 4): f"{d['verdict']} ({d['recommended']})"
               for d in report['decisions']}
  same = all((d['verdict'], d['recommended']) == (primary['verdict'], primary['recommended'])
             for d in report['decisions'])
  if same:
    return 'The verdict is the same by first crossings at every target.'
  return (f"By first crossings the verdict differs at some target: {by_target}; it rests on "
          'the whole-curve estimate.')


def _quick_sentence(report):
  """The quick answer beside the full one, with both costs, and which assumption failed if any."""
  q, cost = report['quick'], report['cost']
  d = q['decision']
  answer = (f"batch {d['recommended']} ({d['verdict']})" if d['recommended'] else
            d['statement'][0].lower() + d['statement'][1:-1])
  text = (f"From the base arm alone (B_simple {_num(q['noise_scale'])} "
          f"{_ci(q['noise_scale_ci'], '.3g')}, rN = (1 + B/B_simple) / (1 + B0/B_simple)), the "
          f"quick answer is {answer}, for "
          f"{_count(cost['quick'])} training samples against the full sweep's "
          f"{_count(cost['full_sweep'])}.")
  if report['mode'] == 'quick':
    return text
  failed = [c for c in q['checks'] if not c['consistent']]
  agree = (d['verdict'], d['recommended']) == (report['decision']['verdict'],
                                              report['recommended'])
  text += ' It agrees with the full sweep.' if agree else ' It differs from the full sweep.'
  if failed:
    text += (' The noise-scale model fails at batch ' + ', '.join(
        f"{c['batch']} (measured rN {_num(c['rN'], '.2f')} {_ci(c['rN_ci'])}, predicted "
        f"{_num(c['rN_predicted'], '.2f')} {_ci(c['rN_predicted_ci'])})" for c in failed) +
             ": B_simple at the base does not carry over to that batch.")
  elif not agree:
    text += (" Every measured rN's interval overlaps its predicted one, so these logs cannot "
             "reject the model; the two answers differ within their intervals.")
  return text


def _confirm_plan_sentence(plan):
  sds = ' / '.join(_num(sd, '.2f') for sd in plan['run_log_sd'])
  return (f"The confirmation runs {plan['seeds']} seeds a side: the fewest that see a pick as "
          f"fast as predicted ({_num(plan['predicted'], '.2f')}x) faster beyond noise with "
          f"probability >= {_num(plan['target_power'], '.2f')} (here "
          f"{_num(plan['power'], '.2f')}; a run's log-seconds spread {sds} at the pick / base).")


def _confirm_sentence(c):
  """Measured vs predicted time, split into samples and throughput (seconds = samples / rate)."""
  ratio = (_num(c['samples_vs_predicted'], '.2f') if np.isfinite(c['samples_vs_predicted'])
           else 'n/a')
  return (f"Confirmation at batch {c['batch']} ({c['n_seeds']} seeds): measured "
          f"{_num(c['steady_wallclock_s'])} s to J at its steady step time vs predicted "
          f"{_num(c['predicted_wallclock_s'])} s ({_num(c['measured_wallclock_s'])} s with "
          f"compilation); samples {ratio}x the predicted, throughput "
          f"{_num(c.get('throughput_vs_rounds'), '.2f')}x the rounds'.")


def _confirmation_ratio_sentence(ratio):
  """The measured ratio against the decision's interval and against the range a confirmation of
  these seeds lands in if the prediction holds; the gap split into samples and throughput."""
  inside = lambda key: 'inside' if ratio[key] else 'outside'
  text = (f"Measured, batch {ratio['batch']} took {_num(ratio['ratio'], '.2f')}x the "
          f"base's seconds to J {_ci(ratio['ci'])} (Welch, df {ratio['df']}; predicted "
          f"{_num(ratio['predicted'], '.2f')}x {_ci(ratio['predicted_ci'])}: "
          f"{inside('inside_predicted_ci')} the decision's interval")
  gap = ratio['gap']
  return text + (f"; {inside('inside_expected_ci')} {_ci(ratio['expected_ci'])}, where a "
                 "confirmation of these seeds lands if the prediction holds). Measured over "
                 f"predicted: {_num(gap['total'], '.2f')}x, of which samples to J "
                 f"{_num(gap['samples'], '.2f')}x and throughput {_num(gap['throughput'], '.2f')}x "
                 "(the runs' samples/s against the rounds', the base's over the pick's).")


def _cost_sentence(report):
  cost, timing = report['cost'], report['timing']
  text = (f"Training samples: calibration {_count(cost['calibration'])} "
          f"({_num(cost['calibration_vs_arms'], '.0%')} of the arms'), arms "
          f"{_count(cost['arms'])}, throughput rounds {_count(cost['throughput'])}, confirmation "
          f"{_count(cost['confirm'])}.")
  if 'arms_eval_share' in cost:
    text += f" Evaluations took {cost['arms_eval_share']:.0%} of the arms' run time."
  if timing:
    text += (' Wall-clock: ' + ', '.join(f'{k} {v / 60:.1f} min' for k, v in timing.items()) +
             f', {sum(timing.values()) / 60:.1f} min in all.')
  return text


def summary(report):
  """A plain-language paragraph: what exceeds the noise and what does not."""
  base = next(a for a in report['arms'] if a['base'])
  lines = [_calibration_sentence(report['calibration'])]
  lines.append(f"Targets ({report['rule']}): {[round(t, 4) for t in report['targets']]}; the "
               f"decision uses J = {report['primary']:.4g}. Base `{base['name']}` (batch "
               f"{base['batch']}) needs {_count(base['samples_to_target'])} samples "
               f"({_num(base['steps_to_target'], '.0f')} steps).")
  lines += [_arm_sentence(a) for a in report['arms'] if not a['base']]
  lines.append(_aligned_sentence(report['aligned_range']))
  lines.append(_gradient_sentence(report))
  lines.append(report['decision']['statement'])
  if report['decisions']:
    lines.append(_robustness_sentence(report))
  lines.append(_quick_sentence(report))
  if report.get('confirm_plan'):
    lines.append(_confirm_plan_sentence(report['confirm_plan']))
  lines += [_confirm_sentence(c) for c in report['confirm']]
  ratio = report['confirmation_ratio']
  if ratio:
    lines.append(_confirmation_ratio_sentence(ratio))
  lines.append(_cost_sentence(report))
  return ' '.join(lines)


def _arms_table(report):
  rows = ['| arm | batch | lr | samples to J | rN [CI] | alignment | rN by crossing at ' +
          ', '.join(f'{t:.3g}' for t in report['targets']) + ' | B_simple [CI] | own samples/s |',
          '|' + '---|' * 9]
  for a in report['arms']:
    tag = ' (base)' if a['base'] else (' (control)' if a['control'] else '')
    at = ', '.join(_num(p['rN'], '.2f') for p in a['per_target'])
    rows.append(f"| {a['name']}{tag} | {a['batch']} | {_num(a['lr'])} | "
                f"{_count(a['samples_to_target'])} | {_num(a['rN'], '.2f')} {_ci(a['rN_ci'])} | "
                f"{a['alignment']} | {at} | {_num(a['noise_scale'])} "
                f"{_ci(a['noise_scale_ci'], '.3g')} | "
                f"{_num(a['own_throughput']['median'], '.4g')} |")
  return rows


def _decision_table(report):
  thr = {t['batch']: t for t in report['throughput']}
  rows = ['| batch | samples/s median [CI] | rounds | predicted s to J | relative [CI] | '
          'P(fastest) | note |', '|' + '---|' * 7]
  for c in report['decision']['candidates']:
    t, star = thr[c['batch']], ' **recommended**' if c['batch'] == report['recommended'] else ''
    rows.append(f"| {c['batch']}{star} | {_num(t['median'], '.4g')} "
                f"{_ci([t['lo'], t['hi']], '.4g')}"
                f" | {t['rounds']} | {_num(c.get('predicted_wallclock_s'), '.4g')} | "
                f"{_num(c.get('relative_wallclock'), '.2f')} "
                f"{_ci(c.get('relative_wallclock_ci', [None, None]))} | "
                f"{_num(c.get('p_fastest'), '.2f')} | {c['why_not']} |")
  return rows


def markdown(report, sections=''):
  """report.md; `sections`: markdown put before the plots (MLPerf's terms)."""
  figures = '\n'.join(f'![{p}]({p})' for p in report.get('plots', layout.PLOTS))
  return (f"# Align, then accelerate: {report['algo']} from batch {report['base_batch']}\n\n"
          f"## Arms (decision target J = {report['primary']:.4g})\n\n" +
          '\n'.join(_arms_table(report)) +
          '\n\n## Decision\n\n' + '\n'.join(_decision_table(report)) + '\n\n' +
          report['decision']['statement'] + '\n\n## What exceeds the noise\n\n' +
          report['summary'] + '\n\n' + sections + '## Plots\n\n' + figures + '\n')
