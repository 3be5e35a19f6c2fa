#!/usr/bin/env bash
# Re-records BENCHMARKS.md's tables on the GPU it runs on (any single sm_90 GPU; the project's machine of record is
# the H200), from the repository root of a device copy: torch and Triton from the image, nvmath-python and
# transformers carried as wheels in .whl/, TileLang as its offline pack (tools/pack_tilelang.sh) named by TL_PACK.
# One call runs one group of steps within CALL_BUDGET_S (540 s; a device call is at most 10 minutes); the groups fit
# one session's 30 device minutes, and each carries what its steps need (the 64 MiB carry holds the wheels or the
# TileLang pack, not both):
#
#   OUT=$OUT CALL=1 bash benchmarks/device/record.sh                     # carry .whl (nvmath); COMMIT: git's HEAD
#   OUT=$OUT TL_PACK=.scratch/tl_pack.tar.xz CALL=2 bash benchmarks/device/record.sh     # carry the TileLang pack
#   DRY_RUN=1 OUT=/tmp/x CALL=2 bash benchmarks/device/record.sh      # print every command (the sub-scripts' too)
#
# CALL=N picks a group; STEPS="a b ..." names steps instead (never both). Each step is stopped at its limit (a CSV
# keeps the shapes finished by then) and cut to the call's time left, or skipped, logged, with < 10 s left; a failing
# step does not stop the next; the exit status is 1 if any step failed or was skipped. BENCH_ARGS are appended to
# every harness command here ("--pairs 5"; "--calls 20 --repeats 3" with BUILD_EXT=0 is the CPU smoke run of
# `overhead`); MAXAUTOTUNE_M (default 1) is bf16_maxautotune's M list. Steps and limits (s):
#   CALL=1  (.whl) roofline 25, bf16 130, layer 25, host 40, gemv_default 35, skinny_default 60, bf16_maxautotune 100,
#           tuner_bf16 70 (tuner.sh: the bf16 rows re-confirmed)
#   CALL=2  (TileLang) fp8_default_heldout 50 (its torch provider: torch's kernel against itself, the A/A),
#           tuner_fp8 80 (tuner.sh: the block-scale rows re-confirmed), hf_fp8 360 (hf_fp8.sh: capture, tune,
#           measure)
#   CALL=3  (.whl) hf 260 (hf.sh: measure with the tuned file of record)
#   CALL=4  (.whl) hf_moe 500 (hf_moe.sh: capture, tune both tables, measure)
#   STEPS only, their tables of record being H200 runs of an earlier commit (docs/benchmarks.md names each):
#           overhead 45, overhead_python 45 (.whl); fp8 120, fp8_tilelang 380, fp8_defaults 120, fp8_heldout 540
#           (TileLang)
#
# Writes under $OUT (<GPU>: the harness's name for the GPU, H200 for an "NVIDIA H200"):
#   record.log   call, steps, budget, the eager path's build (build.log its output), the env header, each step's
#                "== NAME: command", its output and "== NAME rc=RC S s" (124: stopped at its limit)
#   roofline/    roofline_<GPU>.csv: the bf16 matmul peak and copy bandwidth (gradlib.results.ROOFLINES)
#   overhead/    host_<GPU>.csv; overhead_<GPU>.csv, overhead_python_<GPU>.csv (+ <stem>_env.json each)
#   bf16/        bf16_<GPU>.csv, bf16_maxautotune_<GPU>.csv, layer_<GPU>.csv
#   defaults/    gemv_default_<GPU>.csv, skinny_default_<GPU>.csv, fp8_default_heldout_<GPU>.csv, fp8_defaults_<GPU>.csv
#   fp8/         fp8_<GPU>.csv; tilelang/ and heldout/: the sub-scripts' folders (record.log, CSVs)
#   hf/, hf_fp8/, hf_moe/  the HF loops' folders (env.txt, logs, results.json);  tuner/bf16/, tuner/fp8/: tuner.sh's
# Files whose names hold '=' (per-(N, K) JSON files; the device tool returns none) are packed into files_with_eq.tgz in
# their folder. Copy each topic's files to benchmarks/results/<topic>/<gpu>_<commit>/, point BENCHMARKS.md's markers at
# them (docs/benchmarks.md: which step re-records which table) and run `python -m benchmarks.run tables BENCHMARKS.md
# --write`.
set -u
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
LOG="$OUT/record.log"
export COMMIT=${COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
. benchmarks/device/common.sh
if [ -n "${CALL:-}" ] && [ -n "${STEPS:-}" ]; then
  echo "record.sh: give CALL or STEPS, not both" >&2
  exit 2
fi
case ${CALL:-} in
  1) STEPS="roofline bf16 layer host gemv_default skinny_default bf16_maxautotune tuner_bf16" ;;
  2) STEPS="fp8_default_heldout tuner_fp8 hf_fp8" ;;
  3) STEPS="hf" ;;
  4) STEPS="hf_moe" ;;
  "") [ -n "${STEPS:-}" ] || { echo "record.sh: set CALL (1-4) or STEPS" >&2; exit 2; } ;;
  *) echo "record.sh: CALL must be 1-4, got ${CALL}" >&2; exit 2 ;;
esac
known=$(sed -n 's/^\(step\|sub\) \([a-z0-9_]*\) .*/\2/p' "${BASH_SOURCE[0]}")  # this file's steps
for s in $STEPS; do
  if [ "$s" != all ] && ! grep -qx "$s" <<< "$known"; then
    echo "record.sh: unknown step '$s' (steps: $(paste -sd' ' <<< "$known"))" >&2
    exit 2
  fi
done
export CALL_DEADLINE=$(( $(date +%s) + ${CALL_BUDGET_S:-540} ))
export TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang_cache}
need_wheels nvmath
[ -n "${TL_PACK:-}" ] && need_tilelang "$TL_PACK"  # exported to the sub-scripts and the tuner
echo "record.sh: call ${CALL:--}, steps $STEPS; budget ${CALL_BUDGET_S:-540} s; BENCH_ARGS ${BENCH_ARGS:-none}" > "$LOG"
build_ext "$OUT/build.log" >> "$LOG"
env_header "$LOG"

# sub NAME LIMIT_S SCRIPT [VAR=VALUE...]: one of this folder's scripts as step NAME, with the variables given (STEPS=all
# unless they name its steps), its own steps ending by this step's limit; with DRY_RUN they print their commands too.
sub() {
  local name=$1 limit=$2 script=benchmarks/device/$3; shift 3
  want "$name" || return 0
  local end=$(( $(date +%s) + limit ))
  [ "${CALL_DEADLINE:-$end}" -lt "$end" ] && end=$CALL_DEADLINE
  end=$(( end - 5 ))  # its steps end before this step is stopped
  step "$name" "$limit" env STEPS=all CALL_DEADLINE="$end" "$@" bash "$script"
  if dry; then env STEPS=all CALL_DEADLINE="$end" "$@" bash "$script"; fi
}

read -ra XARGS <<< "${BENCH_ARGS:-}"  # appended to every harness command
R=(python -m benchmarks.run)
HF_RECORD=benchmarks/results/hf/loop_h100_b7bec25/call3  # the HF loop's shapes and tuned file of record
FP8_THIRD=benchmarks/results/fp8/h200_default_sweep_70a2ade/third_shapes.csv  # 4 models no FP8 table holds
# CALL=1: the bf16 tables (11 paired rounds in graphs and eager)
step roofline 25 "${R[@]}" --bench roofline --out "$OUT/roofline" "${XARGS[@]}"
step bf16 130 "${R[@]}" --bench bf16 --out "$OUT/bf16" --set shipped,offgrid,heldout --timing graph,eager \
  --pairs 11 --eager_pairs 11 --deadline_s 120 "${XARGS[@]}"
step layer 25 "${R[@]}" --bench layer --out "$OUT/bf16" --set llama3_8b --m 1,8,32,128,2048 --timing graph,eager \
  "${XARGS[@]}"
step host 40 env AITER_CONFIG_GEMM_BF16="$HF_RECORD/tuned_gemm.csv:configs/bf16_tuned_gemm.csv" "${R[@]}" \
  --bench bf16 --name host --out "$OUT/overhead" --set "$HF_RECORD/captured_gemm.csv" --timing host "${XARGS[@]}"
step gemv_default 35 "${R[@]}" --bench bf16 --name gemv_default --out "$OUT/defaults" --set offgrid,heldout --m 1 \
  --providers flinear,default,skinny:gemv_BN1_BK2048_SK1_W4_S1_EF --baselines flinear "${XARGS[@]}"
# the skinny backend's default tiles against F.linear at decode M (where F.linear stays the default)
step skinny_default 60 "${R[@]}" --bench bf16 --name skinny_default --out "$OUT/defaults" --set offgrid,heldout \
  --m 2,4,8,16 --providers flinear,skinny --baselines flinear --pairs 5 --deadline_s 50 "${XARGS[@]}"
# max-autotune compiles for ~9 s per shape (Inductor's autotuning)
step bf16_maxautotune 100 "${R[@]}" --bench bf16 --name bf16_maxautotune --out "$OUT/bf16" --set shipped \
  --m "${MAXAUTOTUNE_M:-1}" --providers flinear,dispatch,maxautotune --baselines flinear,maxautotune \
  --compile_budget_s 75 --deadline_s 85 "${XARGS[@]}"
sub tuner_bf16 70 tuner.sh OUT="$OUT/tuner/bf16" MODE=reconfirm STEPS=bf16_reconfirm BF16_LIMIT_S=60
# CALL=2: the FP8 default on held-out models, the block-scale tuner, the FP8 model end to end (TileLang)
step fp8_default_heldout 50 "${R[@]}" --bench fp8 --name fp8_default_heldout --out "$OUT/defaults" \
  --set "$FP8_THIRD" --providers torch_blockscale,default,dispatch,torch --baselines torch_blockscale --timing graph \
  --pairs 9 --deadline_s 45 "${XARGS[@]}"
sub tuner_fp8 80 tuner.sh OUT="$OUT/tuner/fp8" MODE=reconfirm STEPS=fp8_reconfirm FP8_LIMIT_S=75
sub hf_fp8 360 hf_fp8.sh OUT="$OUT" STEPS="capture tune measure" CAPTURE_LIMIT_S=45 TUNE_LIMIT_S=170 \
  MEASURE_ARGS="--rounds 5 --eager-rounds 100 --decode-steps 16 --control"
# CALL=3, CALL=4: the HF loops
sub hf 260 hf.sh OUT="$OUT" STEPS=measure TUNED="$HF_RECORD/tuned_gemm.csv" \
  MEASURE_ARGS="--rounds 5 --eager-rounds 200 --decode-steps 16 --control"
sub hf_moe 500 hf_moe.sh OUT="$OUT" CAPTURE_LIMIT_S=60 TUNE_LIMIT_S=120 TUNE_MOE_LIMIT_S=150 \
  TUNE_ARGS="--libtype cublaslt,torch" MEASURE_ARGS="--rounds 5 --eager-rounds 200 --decode-steps 16 --control"
# STEPS only: tables whose record is an H200 run of an earlier commit
step overhead 45 "${R[@]}" --bench overhead --out "$OUT/overhead" --calls 5000 --repeats 11 "${XARGS[@]}"
step overhead_python 45 env AITER_GEMM_EAGER_EXT=off "${R[@]}" --bench overhead --name overhead_python \
  --out "$OUT/overhead" --calls 5000 --repeats 11 "${XARGS[@]}"
step fp8 120 "${R[@]}" --bench fp8 --out "$OUT/fp8" --set shipped,offgrid \
  --providers torch_blockscale,flinear,dispatch --baselines torch_blockscale,flinear --timing graph,eager \
  --deadline_s 100 "${XARGS[@]}"
sub fp8_tilelang 380 fp8_tilelang.sh OUT="$OUT/fp8/tilelang" STEPS="warmup bench" BENCH_DEADLINE_S=230
step fp8_defaults 120 "${R[@]}" --bench fp8 --name fp8_defaults --out "$OUT/defaults" --set dsv3,llama3_70b_fp8 \
  --providers torch,triton --baselines torch --pairs 5 --deadline_s 100 "${XARGS[@]}"
sub fp8_heldout 540 fp8_heldout.sh OUT="$OUT/fp8/heldout" STEPS="tune reconfirm warmup bench" RECONFIRM=1 TUNE_S=330 \
  RECONFIRM_S=90 BENCH_DEADLINE_S=95
dry && exit 0

# The device tool returns no file whose name holds '=': pack them, folder by folder.
find "$OUT" -type f -name '*=*' -printf '%h\n' | sort -u | while read -r dir; do
  (cd "$dir" && tar -czf files_with_eq.tgz --remove-files -- *=*)
done
date -u +%Y-%m-%dT%H:%M:%SZ >> "$LOG"
# Every step's status, the sub-scripts' too; exit status 1 if a step did not end with rc 0 or was skipped.
grep -h "^== .*\(rc=\|skipped\)" "$LOG" "$OUT"/*/record.log "$OUT"/*/*/record.log "$OUT"/hf*/env.txt \
  "$OUT"/tuner/*/env.txt 2>/dev/null
find "$OUT" -type f | sort
! grep -q "^== .*\(rc=[1-9]\|skipped\)" "$LOG"
