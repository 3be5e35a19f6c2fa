#!/usr/bin/env bash
# Every single-GPU GEMM table of record in BENCHMARKS.md, in one call meant to take under ~8 minutes on an H100
# (CUDA-graph timing, paired rounds): the dispatch overhead (C++ and Python paths), the bf16 dispatch against F.linear
# on the shipped, off-grid and held-out shapes (graph and eager), against max-autotune at M = 1, the M = 1 default,
# the FP8 block-scale op, the decoder layer and the host time of eager calls. Run from the repository root:
#
#   OUT=/tmp/record COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device/record.sh
#
# Writes under $OUT: <name>_<GPU>.csv and <name>_<GPU>_env.json per step (names: overhead, overhead_python, bf16,
# bf16_maxautotune, gemv_default, fp8, layer, host), record.log (each step's output and wall time) and build.log
# (the C++ eager path). Then copy them under benchmarks/results/<topic>/, point BENCHMARKS.md's <!-- report: -->
# markers at them and run `python -m benchmarks.run tables BENCHMARKS.md --write`. Marker -> file (add `--set
# shipped` where the old file held the shipped shapes only): the overhead tables -> overhead_*, overhead_python_*;
# host -> host_*; the bf16 mclass / matrix / roof tables and `plot --set shipped` -> bf16_*; max-autotune ->
# bf16_maxautotune_*; layer -> layer_*; the gemv default summaries -> gemv_default_* (`--provider default`); the
# held-out summary -> bf16_* and fp8_* together; the FP8 tables -> fp8_* (`--set shipped`, `--vs torch_blockscale`
# for the per-call matmul in place of torch_prepared).
#
# STEPS picks steps (default: all, in the order above). Wheels carried in .whl/ (nvmath-python for the cuBLASLt
# backend) are installed to /tmp/site when nvmath is missing; the C++ eager path is built first (~30 s).
set -u
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
LOG="$OUT/record.log"
export COMMIT=${COMMIT:-unknown}
. benchmarks/device/common.sh
need_wheels nvmath
s=$(date +%s); python -m aiter_gemm.eager_ext > "$OUT/build.log" 2>&1
echo "eager_ext build $(( $(date +%s) - s )) s; steps ${STEPS:-all}" > "$LOG"
env_header "$LOG"

R="python -m benchmarks.run --out $OUT"
HF_TUNED=benchmarks/results/hf/loop_h100_b7bec25/call3/tuned_gemm.csv
step overhead 45 $R --bench overhead --calls 5000 --repeats 11
step overhead_python 45 env AITER_GEMM_EAGER_EXT=off $R --bench overhead --name overhead_python \
  --calls 5000 --repeats 11
step bf16 160 $R --bench bf16 --set shipped,offgrid,heldout --timing graph,eager --deadline_s 140
# max-autotune compiles for ~9 s per shape (Inductor's autotuning): M = 1 only here, --m 1,2,4,8,16 for the whole table
step bf16_maxautotune 110 $R --bench bf16 --name bf16_maxautotune --set shipped --m 1 \
  --providers flinear,dispatch,maxautotune --baselines flinear,maxautotune --compile_budget_s 80 --deadline_s 90
step gemv_default 35 $R --bench bf16 --name gemv_default --set offgrid,heldout --m 1 --providers flinear,default
step fp8 120 $R --bench fp8 --set shipped,offgrid --providers torch_blockscale,flinear,dispatch \
  --baselines torch_blockscale,flinear --timing graph,eager --deadline_s 100
step layer 25 $R --bench layer --set llama3_8b --m 1,8,32,128,2048 --timing graph,eager
step host 25 env AITER_CONFIG_GEMM_BF16="$HF_TUNED:configs/bf16_tuned_gemm.csv" $R --bench bf16 --name host \
  --set benchmarks/results/hf/loop_h100_b7bec25/call3/captured_gemm.csv --timing host
date -u +%Y-%m-%dT%H:%M:%SZ >> "$LOG"
grep "^== " "$LOG"
ls -la "$OUT"
