#!/usr/bin/env bash
# fused_moe on one sm_90 GPU in one call (issue 51): the GPU tests of the kernels, the op, its bound eager launches
# and the parallel Triton precompile; a --quick MoE tune (its candidates include the QA / DIRECT / KSUM / SWAP /
# FUSED variants, the FP8 GEMM2 tiles and, opted in, DeepGEMM's experts) of Qwen3-30B-A3B's, Mixtral-8x7B's and
# DeepSeek-V3 EP8's experts (bf16, FP8); then --bench moe with that table: transformers' grouped_mm experts, the op's
# untuned default, the op (dispatch), DeepGEMM's grouped GEMMs where deep_gemm is installed (FP8 sets) and the
# weight-read floor, CUDA graphs, paired rounds. Run from the repository root:
#
#   OUT=/tmp/moe DG_PACK=.scratch/dg_built2.tar.xz COMMIT=$(git rev-parse --short HEAD) bash benchmarks/device/moe.sh
#
# Writes under $OUT/moe: env.txt (each step's rc and wall time), build.log (the C++ eager path, which the bound-launch
# tests and eager timing need), tests.log, tune.log, tuned_fmoe.csv, profile_*.csv, vllm/ (the tuner's vLLM-format
# files), bench.log, moe_<GPU>.csv (+ _env.json). STEPS picks steps (tests tune_qwen3 tune_mixtral tune_dsv3 bench);
# TOKENS (Qwen3's tune), MODEL_TOKENS and MODEL_DTYPES (Mixtral's and DeepSeek-V3's), SETS, BENCH_M, PROVIDERS
# override the lists below; TESTS_LIMIT_S / TUNE_LIMIT_S / TUNE_MODEL_LIMIT_S (Mixtral's and DeepSeek-V3's each) /
# BENCH_LIMIT_S (150 / 150 / 60 / 120, summing to 540 s); SEED_FMOE=<csv> starts the tuned table from that file's
# rows (the tuner skips the shapes it holds; a prefill token count such as 4096 can take a model's whole limit).
# MOE_LIBTYPES (default triton,torch: the tune of DeepGEMM's experts JIT-compiles per shape and
# did not fit the call on the H200; add deepgemm to time it).
set -u
. benchmarks/device/common.sh
out_folder moe
need_deepgemm "${DG_PACK:-dg_built.tar.xz}"
build_ext "$D/build.log" >> "$LOG"
env_header "$LOG"
if [ -n "${SEED_FMOE:-}" ] && ! dry; then
  cp "$SEED_FMOE" "$D/tuned_fmoe.csv" && echo "tuned_fmoe.csv seeded from $SEED_FMOE" >> "$LOG"
fi
TOKENS=${TOKENS:-1,4,16,64,1024,4096}
BENCH_M=${BENCH_M:-1,4,16,64,1024,4096}
PROVIDERS=${PROVIDERS:-grouped_mm,default,dispatch,deepgemm,weight_read}
MODEL_TOKENS=${MODEL_TOKENS:-1,64,1024}
MODEL_DTYPES=${MODEL_DTYPES:-bf16,fp8}
SETS=${SETS:-moe_qwen3_30b:bf16,moe_qwen3_30b:fp8,moe_mixtral:bf16,moe_mixtral:fp8,moe_dsv3_ep8:bf16,moe_dsv3_ep8:fp8}
STEP_LOG="$D/tests.log" step tests "${TESTS_LIMIT_S:-150}" python -m pytest -q -rs -m gpu op_tests/test_moe_kernel.py \
  op_tests/test_fused_moe.py op_tests/test_moe_swap.py op_tests/test_moe_bound.py op_tests/test_triton_precompile.py
# One tuned file for every model (rows are keyed by the experts' shape), one step a model.
T=(python -m gradlib.tune_moe --quick --timeout 120 -o "$D/tuned_fmoe.csv" --vllm_dir "$D/vllm"
   --libtype "${MOE_LIBTYPES:-triton,torch}")
STEP_LOG="$D/tune.log" step tune_qwen3 "${TUNE_LIMIT_S:-150}" "${T[@]}" -o2 "$D/profile_qwen3.csv" \
  --model_dir qwen3_30b_a3b --dtype bf16,fp8 --token "$TOKENS"
STEP_LOG="$D/tune.log" step tune_mixtral "${TUNE_MODEL_LIMIT_S:-60}" "${T[@]}" -o2 "$D/profile_mixtral.csv" --model_dir mixtral_8x7b \
  --dtype "$MODEL_DTYPES" --token "$MODEL_TOKENS"
STEP_LOG="$D/tune.log" step tune_dsv3 "${TUNE_MODEL_LIMIT_S:-60}" "${T[@]}" -o2 "$D/profile_dsv3.csv" --model_dir deepseek_v3 --ep 8 \
  --dtype "$MODEL_DTYPES" --token "$MODEL_TOKENS"
STEP_LOG="$D/bench.log" step bench "${BENCH_LIMIT_S:-120}" env "AITER_CONFIG_FMOE=$D/tuned_fmoe.csv" \
  python -m benchmarks.run --bench moe --set "$SETS" \
  --m "$BENCH_M" --providers "$PROVIDERS" --baselines grouped_mm,default,weight_read --pairs 7 \
  --deadline_s "$(( ${BENCH_LIMIT_S:-120} - 10 ))" --out "$D" --name moe
dry || { cat "$LOG"; tail -n 3 "$D/tests.log"; tail -n 25 "$D/tune.log"; }
