#!/bin/bash
# The CPU runs behind docs/performance.md, one after another on an otherwise idle machine:
# decode against the roofline for a model large enough to be memory-bound at low batch ('cpu') and
# for the runlocal model ('tiny'), rljax vs Tunix side by side, the train step vs micro-batch, and
# the GRPO step split vs P. Results (JSON per benchmark, logs) under OUTDIR.
#
#   bench/cpu.sh OUTDIR            (from the repository root; PYTHON=... to pick the interpreter)
#   PYTHONPATH=. python bench/report.py OUTDIR/*.json     # the tables of docs/performance.md
# The run that docs/performance.md shows is kept in bench/results/cpu/ (OUTDIR=bench/results/cpu).
set -u
OUTDIR=${1:-/tmp/rljax-bench-cpu}
mkdir -p "$OUTDIR"
export PYTHONPATH=. PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
LOG="$OUTDIR/all.log"
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) rljax $(git rev-parse --short HEAD 2>/dev/null), $(nproc) CPUs" | tee "$LOG"
run() {   # name, command...
  local name=$1; shift
  echo "== $name ($(date -u +%H:%M:%S), load $(cut -d' ' -f1 /proc/loadavg)): $*" | tee -a "$LOG"
  "$PY" "$@" --out="$OUTDIR/$name.json" 2>&1 | tee -a "$LOG"
  echo "== $name exit ${PIPESTATUS[0]}" | tee -a "$LOG"
}
run sampler_cpu bench/sampler.py --preset=cpu --batches=1,4,16,64,256 --lengths=16,64 \
  --length_batch=16 --repeats=5
run sampler_tiny bench/sampler.py --preset=tiny --batches=1,4,16,64,256,1024 --lengths=16 --repeats=5
run peers bench/peers.py --batches=1,8,64 --repeats=5 --grpo_steps=4
run train_step bench/train_step.py --preset=peer --batch=64 --micro=8,16,32,64 --prompt_len=16 \
  --response_len=16 --repeats=3
run rl_step bench/rl_step.py --preset=tiny --P=8,16,32,64 --G=8 --micro=64 --steps=3
echo "== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
