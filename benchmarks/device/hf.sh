#!/usr/bin/env bash
# The Hugging Face model end to end (BENCHMARKS.md, "Hugging Face end to end") on one sm_90 GPU: README's three
# commands on a Llama-3.1-8B-shaped model with random bf16 weights: capture the GEMM shapes of generate(), tune them,
# measure prefill and decode patched against unpatched (eager and CUDA-graph replay, batch 1, 8, 32, 64, with an A/A
# control arm). Run from the repository root; results under $OUT/hf (env.txt, capture.log, captured_gemm.csv,
# tune.log, tuned_gemm.csv, measure.log, results.json, results.md, rounds.csv).
#
#   OUT=/tmp/hf COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device/hf.sh          # all three steps
#   OUT=/tmp/hf STEPS=measure TUNED=benchmarks/results/hf/loop_h100_b7bec25/call3/tuned_gemm.csv \
#     bash benchmarks/device/hf.sh                      # the measure of record, with the tuned file of record
#
# Tuning the 36 captured shapes took ~9.5 min in the run of record (most of it the M = 1 gemv spaces): with
# TUNE_LIMIT_S under the call's limit the tuner saves what finished; rerun with RESUME_FROM=<that tuned_gemm.csv>.
# STEPS (default "capture tune measure"), TUNE_ARGS (default "--libtype cublaslt,torch,skinny"), MEASURE_ARGS
# (default "--control"), PROFILE=1 adds a decode-step profile; CAPTURE_LIMIT_S / TUNE_LIMIT_S / MEASURE_LIMIT_S
# (300 / 500 / 560) stop a step (common.sh's step: rc and wall time in env.txt; DRY_RUN=1 prints the commands).
# Wheels carried in .whl/ (nvmath-python, transformers) are installed to /tmp/site when missing; the C++ eager path
# is built first.
set -u
. benchmarks/device/common.sh
out_folder hf
need_wheels nvmath transformers
STEPS=${STEPS:-capture tune measure}
hf_header "$D" "resume from ${RESUME_FROM:-nothing}"
read -ra TUNE <<< "${TUNE_ARGS:---libtype cublaslt,torch,skinny}"
read -ra MEASURE <<< "${MEASURE_ARGS:---control}"
[ "${PROFILE:-0}" = 0 ] || MEASURE+=(--profile)
HF=(python -m examples.hf_decode --config llama3_8b --out "$D")
if want tune && [ -n "${RESUME_FROM:-}" ] && ! dry; then cp "$RESUME_FROM" "$D/tuned_gemm.csv"; fi
STEP_LOG="$D/capture.log" step capture "${CAPTURE_LIMIT_S:-300}" "${HF[@]}" --mode capture
STEP_LOG="$D/tune.log" step tune "${TUNE_LIMIT_S:-500}" python -m gradlib.gemm_tuner -i "$D/captured_gemm.csv" \
  -o "$D/tuned_gemm.csv" "${TUNE[@]}"
STEP_LOG="$D/measure.log" step measure "${MEASURE_LIMIT_S:-560}" "${HF[@]}" --mode measure \
  --tuned "${TUNED:-$D/tuned_gemm.csv}" "${MEASURE[@]}"
dry || cat "$LOG"
