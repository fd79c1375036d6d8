"""Writes the small GSM8K- and MATH-format sample files used by the tests and notebooks.

The problems are synthetic (generated here from templates, answers computed with sympy) but the
records follow the public datasets' layouts exactly:
  gsm8k_sample.jsonl  {"question", "answer"}: worked steps with <<calc>> notes, then '#### 72'
  math_sample.jsonl   {"problem", "solution", "level", "type"}: the answer in the last \\boxed{}

  python tests/testdata/make_math_samples.py   # rewrites both files next to this script
"""
import json
import os
import random

import sympy

NAMES = ['Ava', 'Ben', 'Chen', 'Dana', 'Eli', 'Fatima', 'Gus', 'Hana', 'Ivan', 'Jia']
ITEMS = ['apple', 'marble', 'sticker', 'pencil', 'cookie', 'book', 'shell', 'card']


def gsm8k_record(rng):
  name, item = rng.choice(NAMES), rng.choice(ITEMS)
  kind = rng.randrange(4)
  if kind == 0:
    a, b = rng.randint(2, 60), rng.randint(2, 40)
    s = a + b
    question = f'{name} has {a} {item}s and buys {b} more. How many {item}s does {name} have now?'
    steps = [f'{name} has {a} + {b} = <<{a}+{b}={s}>>{s} {item}s now.']
    result = s
  elif kind == 1:
    a, b = rng.randint(2, 9), rng.randint(3, 12)
    p = a * b
    c = rng.randint(1, p - 1)
    question = (f'{name} fills {a} bags with {b} {item}s each and gives away {c} {item}s. '
                f'How many {item}s are left?')
    steps = [f'{name} fills {a} * {b} = <<{a}*{b}={p}>>{p} {item}s.',
             f'After giving some away, {p} - {c} = <<{p}-{c}={p - c}>>{p - c} are left.']
    result = p - c
  elif kind == 2:
    a, k = rng.randint(2, 12), rng.randint(2, 15)
    n = a * k
    question = f'A box holds {a} {item}s. How many boxes does {name} need for {n} {item}s?'
    steps = [f'{name} needs {n} / {a} = <<{n}/{a}={k}>>{k} boxes.']
    result = k
  else:
    a, b = rng.randint(400, 900), rng.randint(400, 900)
    s = a + b
    question = f'A bike costs ${a} and a scooter costs ${b}. How much do both cost in dollars?'
    steps = [f'Both cost {a} + {b} = <<{a}+{b}={s}>>{s} dollars.']
    result = f'{s:,}'   # GSM8K writes some answers with thousands separators
  return {'question': question, 'answer': '\n'.join(steps) + f'\n#### {result}'}


def math_record(rng):
  x = sympy.Symbol('x')
  kind = rng.randrange(4)
  if kind == 0:
    a, b, c, d = (rng.randint(1, 9) for _ in range(4))
    value = sympy.Rational(a, b) + sympy.Rational(c, d)
    problem = (f'What is $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$? Express your answer as a '
               f'common fraction.')
    solution = f'Over a common denominator the sum is ${sympy.latex(value)}$, so the answer is '
    kind_name = 'Prealgebra'
  elif kind == 1:
    k, m = rng.randint(2, 6), rng.choice([2, 3, 5, 6, 7])
    value = k * sympy.sqrt(m)
    problem = f'Simplify $\\sqrt{{{k * k * m}}}$.'
    solution = f'We have $\\sqrt{{{k * k * m}}} = \\sqrt{{{k * k}}}\\cdot\\sqrt{{{m}}}$, which is '
    kind_name = 'Algebra'
  elif kind == 2:
    a, b, c = rng.randint(2, 9), rng.randint(1, 20), rng.randint(21, 60)
    value = sympy.Rational(c - b, a)
    problem = f'Solve for $x$: ${a}x + {b} = {c}$.'
    solution = f'Subtracting {b} gives ${a}x = {c - b}$, and dividing by {a} gives $x = '
    solution += f'{sympy.latex(value)}$. The answer is '
    kind_name = 'Algebra'
  else:
    a = rng.randint(2, 9)
    value = sympy.expand((x + a) ** 2)
    problem = f'Expand $(x+{a})^2$.'
    solution = 'Using $(x+a)^2 = x^2 + 2ax + a^2$ gives '
    kind_name = 'Algebra'
  solution += f'$\\boxed{{{sympy.latex(value)}}}$.'
  return {'problem': problem, 'solution': solution, 'level': f'Level {rng.randint(1, 2)}',
          'type': kind_name}


def main():
  here = os.path.dirname(os.path.abspath(__file__))
  rng = random.Random(0)
  for name, make, count in (('gsm8k_sample.jsonl', gsm8k_record, 64),
                            ('math_sample.jsonl', math_record, 32)):
    with open(os.path.join(here, name), 'w') as f:
      for _ in range(count):
        f.write(json.dumps(make(rng)) + '\n')


if __name__ == '__main__':
  main()
