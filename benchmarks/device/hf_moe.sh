#!/usr/bin/env bash
# An MoE model end to end (issue 52) on one sm_90 GPU: a Qwen3-30B-A3B-shaped model built from
# configs/model_configs/qwen3_30b_a3b/config.json with random bf16 weights; capture the GEMM shapes (attention,
# lm_head: captured_gemm.csv) and the experts' fused_moe shapes (untuned_fmoe.csv) of generate(), tune both (gemm-tuner;
# python -m gradlib.tune_moe --quick), then measure prefill and decode in alternating rounds: with (patch_linear +
# patch_moe, the tuned tables) against without (plain linears, transformers' grouped_mm experts) and the A/A control;
# eager and CUDA-graph replay, batch 1, 8, 32, 64. Run from the repository root; results under $OUT/hf_moe (env.txt,
# capture.log, captured_gemm.csv, untuned_fmoe.csv, tune_gemm.log, tuned_gemm.csv, tune_moe.log, tuned_fmoe.csv,
# measure.log, results.json, results.md, rounds.csv).
#
#   OUT=/tmp/hfm COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device/hf_moe.sh
#
# LAYERS (default 4: the per-layer shapes are the full model's, the step is shorter), STEPS (default "capture tune_gemm
# tune_moe measure"), TUNE_ARGS (default "--libtype cublaslt,torch,skinny"), TUNE_MOE_ARGS (default "--quick"),
# MEASURE_ARGS (default "--control"); CAPTURE_LIMIT_S / TUNE_LIMIT_S / TUNE_MOE_LIMIT_S / MEASURE_LIMIT_S
# (300 / 300 / 400 / 560): common.sh's step runs each (rc and wall time in env.txt; DRY_RUN=1 prints the commands).
set -u
. benchmarks/device/common.sh
out_folder hf_moe
need_wheels nvmath transformers
STEPS=${STEPS:-capture tune_gemm tune_moe measure}
L=${LAYERS:-4}
hf_header "$D" "layers $L"
read -ra TUNE <<< "${TUNE_ARGS:---libtype cublaslt,torch,skinny}"
read -ra TUNE_MOE <<< "${TUNE_MOE_ARGS:---quick}"
read -ra MEASURE <<< "${MEASURE_ARGS:---control}"
HF=(python -m examples.hf_decode --config qwen3_30b_a3b --layers "$L" --out "$D")
STEP_LOG="$D/capture.log" step capture "${CAPTURE_LIMIT_S:-300}" "${HF[@]}" --mode capture
STEP_LOG="$D/tune_gemm.log" step tune_gemm "${TUNE_LIMIT_S:-300}" python -m gradlib.gemm_tuner \
  -i "$D/captured_gemm.csv" -o "$D/tuned_gemm.csv" "${TUNE[@]}"
STEP_LOG="$D/tune_moe.log" step tune_moe "${TUNE_MOE_LIMIT_S:-400}" python -m gradlib.tune_moe \
  -i "$D/untuned_fmoe.csv" -o "$D/tuned_fmoe.csv" "${TUNE_MOE[@]}"
STEP_LOG="$D/measure.log" step measure "${MEASURE_LIMIT_S:-560}" "${HF[@]}" --mode measure \
  --tuned "$D/tuned_gemm.csv" --tuned-fmoe "$D/tuned_fmoe.csv" "${MEASURE[@]}"
dry || { cat "$LOG"; tail -n 20 "$D/measure.log"; }
