#!/usr/bin/env bash
# An MoE model end to end (issue 52) on one sm_90 GPU, in bf16 (DTYPE=bf16, the default) or FP8 (DTYPE=fp8): a
# Qwen3-30B-A3B-shaped model built from configs/model_configs/qwen3_30b_a3b/config.json with random weights (fp8:
# qwen3_30b_a3b_fp8, the same with a 128x128-block fp8 quantization_config: attention on transformers' FP8Linear, the
# experts on its FP8Experts); capture the GEMM shapes (attention, lm_head) and the experts' fused_moe shapes
# (untuned_fmoe.csv; fp8: q_dtype_w float8_e4m3fn, per_1x128) of generate(), tune both (bf16: gemm-tuner; fp8: the
# block-scale tuner on a8w8_blockscale_untuned_gemm.csv; python -m gradlib.tune_moe --quick), then measure prefill and
# decode in alternating rounds, eager and CUDA-graph replay, batch 1, 8, 32, 64, with the A/A control:
#   bf16: with (patch_linear + patch_moe, the tuned tables) against without (plain linears, transformers' grouped_mm
#         experts);
#   fp8:  tuned (patch_linear + patch_moe) against torch_blockwise (torch's block-scaled matmul; the experts per expert,
#         on fused_moe's torch loop: in a CUDA graph every expert over every token, so read graph rows against bf16)
#         and bf16 (the dequantized model, grouped_mm experts); control is a second torch_blockwise arm.
# Run from the repository root; results under $OUT/hf_moe (fp8: $OUT/hf_moe_fp8): env.txt, capture.log,
# captured_gemm.csv, untuned_fmoe.csv, tune_gemm.log, the tuned GEMM table (bf16: tuned_gemm.csv; fp8:
# a8w8_blockscale_tuned_gemm.csv + JSON), tune_moe.log, tuned_fmoe.csv, measure.log, results.json, results.md,
# rounds.csv.
#
#   OUT=/tmp/hfm COMMIT=$(git rev-parse --short HEAD) [DTYPE=fp8] bash benchmarks/device/hf_moe.sh
#
# One device call per mode: the step limits (60 + 120 + 180 + 200 s) leave the call's 600 s room for the eager-path
# build. On the H200 (2026-11-29) capture took 19-21 s and a measure of fewer rounds 52 s (bf16) and 75 s (fp8: the
# torch arm's eager experts loop launches per expert, 50-190 ms a step). A tune stopped at its limit keeps the shapes
# it finished; one that finished none leaves measure a header-only table (that arm's defaults), said in env.txt.
# LAYERS (default 4: the per-layer shapes are the full model's, the step is shorter), STEPS (default all four),
# TUNE_ARGS (bf16 "--libtype cublaslt,torch,skinny"; fp8 "--quick --libtype triton,torch": TileLang's up-front
# compile does not fit the step; with tilelang added, TL_PACK=<pack.tar.xz> unpacks its offline pack,
# docs/tilelang.md), TUNE_MOE_ARGS (default "--quick"),
# MEASURE_ARGS (bf16 "--control"; fp8 "--rounds 4 --eager-rounds 30 --decode-steps 16 --control"), CAPTURE_LIMIT_S /
# TUNE_LIMIT_S / TUNE_MOE_LIMIT_S / MEASURE_LIMIT_S (60 / 120 / 180 / 200): common.sh's step runs each (rc and wall
# time in env.txt; DRY_RUN=1 prints the commands).
set -u
. benchmarks/device/common.sh
DTYPE=${DTYPE:-bf16}
case $DTYPE in
  bf16)
    out_folder hf_moe
    need_wheels nvmath transformers
    CONFIG=qwen3_30b_a3b GEMM_TUNER=gradlib.gemm_tuner UNTUNED=captured_gemm.csv TUNED=tuned_gemm.csv
    SHIPPED=configs/bf16_tuned_gemm.csv
    read -ra TUNE <<< "${TUNE_ARGS:---libtype cublaslt,torch,skinny}"
    read -ra MEASURE <<< "${MEASURE_ARGS:---control}" ;;
  fp8)
    out_folder hf_moe_fp8
    need_wheels transformers
    need_tilelang "${TL_PACK:-tilelang_pack.tar.xz}"
    CONFIG=qwen3_30b_a3b_fp8 GEMM_TUNER=gradlib.tune_a8w8_blockscale UNTUNED=a8w8_blockscale_untuned_gemm.csv
    TUNED=a8w8_blockscale_tuned_gemm.csv SHIPPED=configs/a8w8_blockscale_tuned_gemm.csv
    read -ra TUNE <<< "${TUNE_ARGS:---quick --libtype triton,torch}"
    read -ra MEASURE <<< "${MEASURE_ARGS:---rounds 4 --eager-rounds 30 --decode-steps 16 --control}" ;;
  *)
    echo "hf_moe.sh: DTYPE must be bf16 or fp8, got $DTYPE" >&2
    exit 2 ;;
esac
STEPS=${STEPS:-capture tune_gemm tune_moe measure}
L=${LAYERS:-4}
hf_header "$D" "dtype $DTYPE; layers $L"
read -ra TUNE_MOE <<< "${TUNE_MOE_ARGS:---quick}"
HF=(python -m examples.hf_decode --config "$CONFIG" --layers "$L" --out "$D")
STEP_LOG="$D/capture.log" step capture "${CAPTURE_LIMIT_S:-60}" "${HF[@]}" --mode capture
STEP_LOG="$D/tune_gemm.log" step tune_gemm "${TUNE_LIMIT_S:-120}" python -m "$GEMM_TUNER" \
  -i "$D/$UNTUNED" -o "$D/$TUNED" "${TUNE[@]}"
STEP_LOG="$D/tune_moe.log" step tune_moe "${TUNE_MOE_LIMIT_S:-180}" python -m gradlib.tune_moe \
  -i "$D/untuned_fmoe.csv" -o "$D/tuned_fmoe.csv" "${TUNE_MOE[@]}"
# A tune that finished no shape writes no table: measure then runs that arm on a header-only one (its defaults), said.
for pair in "$TUNED:$SHIPPED" "tuned_fmoe.csv:configs/tuned_fmoe.csv"; do
  if want measure && ! dry && [ ! -f "$D/${pair%%:*}" ]; then
    head -n 1 "${pair#*:}" > "$D/${pair%%:*}"
    echo "measure: no $D/${pair%%:*} (its tune finished no shape): header-only, the arm runs its defaults" >> "$LOG"
  fi
done
STEP_LOG="$D/measure.log" step measure "${MEASURE_LIMIT_S:-200}" "${HF[@]}" --mode measure \
  --tuned "$D/$TUNED" --tuned-fmoe "$D/tuned_fmoe.csv" "${MEASURE[@]}"
dry || { cat "$LOG"; tail -n 20 "$D/measure.log"; }
