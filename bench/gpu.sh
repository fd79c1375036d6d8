#!/bin/bash
# The numerical tests that need no mesh, then the benchmarks of the ~1B-class MoE (configs/grpo.py's
# default model: 1.3B params, 0.24B active, bf16 compute, f32 master weights) on one GPU, in under
# 10 minutes; results dated, the hardware named, everything under OUTDIR.
#
#   bench/gpu.sh OUTDIR            (from the repository root; PYTHON=... to pick the interpreter)
#
# Each benchmark runs in its own process under its own time limit, so one failure still leaves
# the others' numbers. After each step its records go into OUTDIR/results.tar, the log stays beside
# it (the device tool brings back at most 8 files, and what a killed run left must come back too).
# SMOKE=1 runs the same script on the tiny preset (a CPU check of the script).
# On a machine without ml_collections or tensorflow_datasets, bench/gpu_wheels.sh fetches them.
#
# Besides the defaults it measures the two open questions of the first H200 run (docs/performance.md):
# whether CUDA graphs over the decode loop's control flow lift the launch-bound decode step, and
# which expert implementation decodes and trains fastest (XLA:GPU rewrites `ragged_dot` into a
# dense dot over every expert unless its cuDNN ragged-dot fusion is switched on, or jax's Pallas
# Triton lowering of `ragged_dot` where the wheel has it; 'bucketed' runs batched matmuls on the
# expert weights in place).
set -u
OUTDIR=${1:-${OUT:-/tmp/rljax-bench}}
mkdir -p "$OUTDIR"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
if [ "${SMOKE:-0}" = 1 ]; then
  MODEL=tiny; BATCHES=1,16; LENGTHS=8,16; TRAIN="--batch=16 --micro=16 --prompt_len=8 --response_len=8"
  RL="--P=2,4"; REPEATS=2
else
  MODEL=gpu1b; BATCHES=1,4,16,64,256,1024; LENGTHS=64,512
  TRAIN="--batch=128 --micro=64 --prompt_len=32 --response_len=224"; RL="--P=16,64,256"
  REPEATS=3
fi
LOG="$OUTDIR/all.log"
{
  echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ) rljax $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null
  $PY -c "import jax, sys; print('python', sys.version.split()[0], 'jax', jax.__version__, jax.devices())"
} 2>&1 | tee "$LOG"
run() {   # name, time limit (s), command...   (XLA_FLAGS from the caller's environment)
  local name=$1 limit=$2; shift 2
  echo "== $name ($(date -u +%H:%M:%S), limit ${limit}s, XLA_FLAGS=${XLA_FLAGS:-}): $*" | tee -a "$LOG"
  timeout "$limit" "$PY" "$@" --out="$OUTDIR/$name.json" 2>&1 | grep -v "^W.*cuda_timer" | tee -a "$LOG"
  echo "== $name exit ${PIPESTATUS[0]}" | tee -a "$LOG"
  local records; records=$(cd "$OUTDIR" && ls ./*.json ./*.txt 2>/dev/null)
  [ -z "$records" ] || (cd "$OUTDIR" && tar rf results.tar --remove-files $records)
}
# The KV-cache decode vs full forward, MoE implementations and losses against their numpy
# references, on the accelerator, in f32 at full matmul precision (the tests' tolerances are f32's);
# four workers share the GPU, so none takes most of its memory up front.
echo "== tests ($(date -u +%H:%M:%S))" | tee -a "$LOG"
XLA_PYTHON_CLIENT_PREALLOCATE=false JAX_DEFAULT_MATMUL_PRECISION=highest timeout 120 \
  "$PY" -m pytest -q -n 4 tests/test_model.py tests/test_moe.py tests/test_losses.py \
  tests/test_sampler.py 2>&1 | tail -30 | tee -a "$LOG"
run sampler 150 bench/sampler.py --preset=$MODEL --batches=$BATCHES --lengths=$LENGTHS \
  --length_batch=16 --repeats=$REPEATS --dump_hlo="$OUTDIR/sampler_b1_hlo.txt"
XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,WHILE,CONDITIONAL \
  run sampler_graphs 60 bench/sampler.py --preset=$MODEL --batches=1,64 --lengths=64 --repeats=$REPEATS
run sampler_bucketed 60 bench/sampler.py --preset=$MODEL --batches=${BATCHES#1,4,} --lengths=64 \
  --repeats=$REPEATS --moe_impl=bucketed
for impl in ragged bucketed; do   # 'dense' was the same dot as 'ragged' in the first run
  run train_$impl 60 bench/train_step.py --preset=$MODEL $TRAIN --moe_impl=$impl --repeats=$REPEATS
done
XLA_FLAGS=--xla_gpu_experimental_use_ragged_dot_fusion=true \
  run train_ragged_cudnn 60 bench/train_step.py --preset=$MODEL $TRAIN --moe_impl=ragged --repeats=$REPEATS
if "$PY" -c "import jax._src.lax.pallas_lowerings.gpu.ragged_dot" 2>/dev/null; then
  JAX_RAGGED_DOT_USE_GPU_PALLAS_TRITON_LOWERING=true \
    run train_ragged_pallas 60 bench/train_step.py --preset=$MODEL $TRAIN --moe_impl=ragged --repeats=$REPEATS
else
  echo "== train_ragged_pallas skipped: this jax wheel has no Pallas lowering of ragged_dot" | tee -a "$LOG"
fi
run rl_step 80 bench/rl_step.py --preset=$MODEL $RL --G=8 --micro=256 --steps=2
echo "== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
