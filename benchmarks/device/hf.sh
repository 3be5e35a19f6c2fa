#!/usr/bin/env bash
# The Hugging Face model end to end (BENCHMARKS.md, "Hugging Face end to end"): README's three commands on a
# Llama-3.1-8B-shaped model with random bf16 weights: capture the GEMM shapes of generate(), tune them, measure
# prefill and decode patched against unpatched (eager and CUDA-graph replay, batch 1, 8, 32, 64, with an A/A control
# arm). Run from the repository root; results under $OUT/hf (env.txt, capture.log, captured_gemm.csv, tune.log,
# tuned_gemm.csv, measure.log, results.json, results.md, rounds.csv).
#
#   OUT=/tmp/hf COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device/hf.sh          # all three steps
#   OUT=/tmp/hf STEPS=measure TUNED=benchmarks/results/hf/loop_h100_b7bec25/call3/tuned_gemm.csv \
#     bash benchmarks/device/hf.sh                      # the measure of record, with the tuned file of record
#
# Tuning the 36 captured shapes takes ~9.5 min on an H100 (most of it the M = 1 gemv spaces): with TUNE_LIMIT_S
# under the call's limit the tuner saves what finished; rerun with RESUME_FROM=<that tuned_gemm.csv> to resume.
# STEPS (default "capture tune measure"), TUNE_ARGS (default "--libtype cublaslt,torch,skinny"), MEASURE_ARGS
# (default "--control"), PROFILE=1 adds a decode-step profile. Wheels carried in .whl/ (nvmath-python,
# transformers) are installed to /tmp/site when missing; the C++ eager path is built first.
set -u
OUT=${OUT:?set OUT to an output folder}
D="$OUT/hf"
mkdir -p "$D"
. benchmarks/device/common.sh
need_wheels nvmath transformers
python -m aiter_gemm.eager_ext > "$D/build.log" 2>&1
env_header "$D/env.txt"
{
  python -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -n 1
  echo "steps ${STEPS:-capture tune measure}; resume from ${RESUME_FROM:-nothing}"
} >> "$D/env.txt"
for step in ${STEPS:-capture tune measure}; do
  s=$(date +%s)
  case $step in
    capture)
      python -m examples.hf_decode --config llama3_8b --mode capture --out "$D" > "$D/capture.log" 2>&1 ;;
    tune)
      [ -n "${RESUME_FROM:-}" ] && cp "$RESUME_FROM" "$D/tuned_gemm.csv"
      timeout -s TERM "${TUNE_LIMIT_S:-500}" python -m gradlib.gemm_tuner -i "$D/captured_gemm.csv" \
        -o "$D/tuned_gemm.csv" ${TUNE_ARGS:---libtype cublaslt,torch,skinny} > "$D/tune.log" 2>&1 ;;
    measure)
      python -m examples.hf_decode --config llama3_8b --mode measure --out "$D" \
        --tuned "${TUNED:-$D/tuned_gemm.csv}" $([ "${PROFILE:-0}" = 0 ] || echo --profile) ${MEASURE_ARGS:---control} \
        > "$D/measure.log" 2>&1 ;;
  esac
  echo "$step rc=$? $(( $(date +%s) - s )) s" >> "$D/env.txt"
done
cat "$D/env.txt"
