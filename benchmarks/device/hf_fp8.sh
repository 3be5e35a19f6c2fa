#!/usr/bin/env bash
# The FP8 model end to end (README, "Hugging Face") on one sm_90 GPU: a Qwen3-8B-FP8-shaped model built from
# configs/model_configs/qwen3_8b_fp8/config.json with random weights quantized to transformers' FP8Linear (128x128
# blocks), its GEMM shapes captured, tuned with the block-scale tuner (a quick space: GPU time is scarce), then prefill
# and decode measured in three arms, alternating rounds: tuned (patch_linear + the tuned table), torch_blockwise (every
# FP8Linear on torch's block-scaled matmul) and bf16 (the same model in bf16); eager and CUDA-graph replay, batch 1, 8,
# 32, 64. Run from the repository root; results under $OUT/hf_fp8 (env.txt, capture.log, captured_gemm.csv,
# a8w8_blockscale_untuned_gemm.csv, tune.log, a8w8_blockscale_tuned_gemm.csv + JSON, measure.log, results.json,
# results.md, rounds.csv).
#
#   OUT=/tmp/hf8 COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device/hf_fp8.sh  # ~8 min in the run of record
#
# The default tune includes TileLang, which must import: TL_PACK=<pack.tar.xz> unpacks its offline pack here
# (docs/tilelang.md), or pass TUNE_ARGS without it. LAYERS (default 4: the per-layer GEMM shapes are the full
# model's, the step is shorter), STEPS (default "capture tune measure"), TUNE_ARGS (default "--quick --libtype
# triton,torch,tilelang"), TUNE_LIMIT_S (170: the 32 shapes took 96-116 s), MEASURE_ARGS (default "--rounds 5
# --eager-rounds 200 --decode-steps 16 --control": the control arm is a second torch_blockwise arm, the A/A bound of
# the host-bound eager rows; each eager timing follows one untimed step of its arm; measure ~290 s), CAPTURE_LIMIT_S /
# MEASURE_LIMIT_S (300 / 560): common.sh's step runs each (rc and wall time in env.txt; DRY_RUN=1 prints them).
set -u
. benchmarks/device/common.sh
out_folder hf_fp8
need_wheels transformers
need_tilelang "${TL_PACK:-tilelang_pack.tar.xz}"
STEPS=${STEPS:-capture tune measure}
L=${LAYERS:-4}
hf_header "$D" "layers $L"
read -ra TUNE <<< "${TUNE_ARGS:---quick --libtype triton,torch,tilelang}"
read -ra MEASURE <<< "${MEASURE_ARGS:---rounds 5 --eager-rounds 200 --decode-steps 16 --control}"
HF=(python -m examples.hf_decode --config qwen3_8b_fp8 --layers "$L" --out "$D")
STEP_LOG="$D/capture.log" step capture "${CAPTURE_LIMIT_S:-300}" "${HF[@]}" --mode capture
STEP_LOG="$D/tune.log" step tune "${TUNE_LIMIT_S:-170}" python -m gradlib.tune_a8w8_blockscale \
  -i "$D/a8w8_blockscale_untuned_gemm.csv" -o "$D/a8w8_blockscale_tuned_gemm.csv" "${TUNE[@]}"
STEP_LOG="$D/measure.log" step measure "${MEASURE_LIMIT_S:-560}" "${HF[@]}" --mode measure \
  --tuned "$D/a8w8_blockscale_tuned_gemm.csv" "${MEASURE[@]}"
dry || { cat "$LOG"; tail -n 20 "$D/measure.log"; }
