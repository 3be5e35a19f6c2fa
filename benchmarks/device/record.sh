#!/usr/bin/env bash
# Re-records BENCHMARKS.md's tables on the GPU it runs on (any single sm_90 GPU; the project's machine of record is
# the H200), from the repository root of a device copy: torch and Triton from the image, nvmath-python and
# transformers carried as wheels in .whl/, TileLang as its offline pack (tools/pack_tilelang.sh) named by TL_PACK.
# One call runs one group of steps within CALL_BUDGET_S (540 s; a device call is at most 10 minutes):
#
#   OUT=$OUT CALL=1 bash benchmarks/device/record.sh                     # COMMIT defaults to git's HEAD
#   OUT=$OUT TL_PACK=.scratch/tl_pack.tar.xz CALL=2 bash benchmarks/device/record.sh
#   DRY_RUN=1 OUT=/tmp/x CALL=2 bash benchmarks/device/record.sh      # print every command (the sub-scripts' too)
#
# CALL=N picks a group; STEPS="a b ..." names steps instead (never both). Each step is stopped at its limit (a CSV
# keeps the shapes finished by then) and cut to the call's time left, or skipped, logged, with < 10 s left; a failing
# step does not stop the next; the exit status is 1 if any step failed or was skipped. BENCH_ARGS are appended to
# every harness command here ("--pairs 5"; "--calls 20 --repeats 3" with BUILD_EXT=0 is the CPU smoke run of
# `overhead`); MAXAUTOTUNE_M (default 1) is bf16_maxautotune's M list. Steps and limits (s):
#   CALL=1  overhead 45, overhead_python 45, bf16 160, fp8 120, layer 25, host 25, gemv_default 35
#   CALL=2  fp8_tilelang 380 (fp8_tilelang.sh: warmup, bench; TL_PACK), fp8_defaults 120, skinny_default 120,
#           bf16_maxautotune 110
#   CALL=3  fp8_heldout 540 (fp8_heldout.sh: tune, reconfirm, warmup, bench; TL_PACK)
#   CALL=4  hf 470 (hf.sh: measure with the tuned file of record), tuner_reconfirm 200 (tuner.sh MODE=reconfirm)
#   CALL=5  hf_fp8 470 (hf_fp8.sh: capture, tune, measure; TL_PACK), tuner_fp8 130 (tuner.sh MODE=fp8)
#
# Writes under $OUT (<GPU>: the harness's name for the GPU, H200 for an "NVIDIA H200"):
#   record.log   call, steps, budget, the eager path's build (build.log its output), the env header, each step's
#                "== NAME: command", its output and "== NAME rc=RC S s" (124: stopped at its limit)
#   overhead/    overhead_<GPU>.csv, overhead_python_<GPU>.csv, host_<GPU>.csv (+ <stem>_env.json each)
#   bf16/        bf16_<GPU>.csv, bf16_maxautotune_<GPU>.csv, layer_<GPU>.csv
#   fp8/         fp8_<GPU>.csv; tilelang/ and heldout/: the sub-scripts' folders (record.log, CSVs)
#   defaults/    gemv_default_<GPU>.csv, skinny_default_<GPU>.csv, fp8_defaults_<GPU>.csv
#   hf/, hf_fp8/ the HF loops' folders (env.txt, logs, results.json);  tuner/reconfirm/, tuner/fp8/: tuner.sh's
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
  1) STEPS="overhead overhead_python bf16 fp8 layer host gemv_default" ;;
  2) STEPS="fp8_tilelang fp8_defaults skinny_default bf16_maxautotune" ;;
  3) STEPS="fp8_heldout" ;;
  4) STEPS="hf tuner_reconfirm" ;;
  5) STEPS="hf_fp8 tuner_fp8" ;;
  "") [ -n "${STEPS:-}" ] || { echo "record.sh: set CALL (1-5) or STEPS" >&2; exit 2; } ;;
  *) echo "record.sh: CALL must be 1-5, got ${CALL}" >&2; exit 2 ;;
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
step overhead 45 "${R[@]}" --bench overhead --out "$OUT/overhead" --calls 5000 --repeats 11 "${XARGS[@]}"
step overhead_python 45 env AITER_GEMM_EAGER_EXT=off "${R[@]}" --bench overhead --name overhead_python \
  --out "$OUT/overhead" --calls 5000 --repeats 11 "${XARGS[@]}"
step bf16 160 "${R[@]}" --bench bf16 --out "$OUT/bf16" --set shipped,offgrid,heldout --timing graph,eager \
  --deadline_s 140 "${XARGS[@]}"
step fp8 120 "${R[@]}" --bench fp8 --out "$OUT/fp8" --set shipped,offgrid \
  --providers torch_blockscale,flinear,dispatch --baselines torch_blockscale,flinear --timing graph,eager \
  --deadline_s 100 "${XARGS[@]}"
step layer 25 "${R[@]}" --bench layer --out "$OUT/bf16" --set llama3_8b --m 1,8,32,128,2048 --timing graph,eager \
  "${XARGS[@]}"
step host 25 env AITER_CONFIG_GEMM_BF16="$HF_RECORD/tuned_gemm.csv:configs/bf16_tuned_gemm.csv" "${R[@]}" \
  --bench bf16 --name host --out "$OUT/overhead" --set "$HF_RECORD/captured_gemm.csv" --timing host "${XARGS[@]}"
step gemv_default 35 "${R[@]}" --bench bf16 --name gemv_default --out "$OUT/defaults" --set offgrid,heldout --m 1 \
  --providers flinear,default,skinny:gemv_BN1_BK2048_SK1_W4_S1_EF --baselines flinear "${XARGS[@]}"
sub fp8_tilelang 380 fp8_tilelang.sh OUT="$OUT/fp8/tilelang" STEPS="warmup bench" BENCH_DEADLINE_S=230
# The defaults' own sweeps: the Triton default config against the op's torch runner (FP8), the skinny backend's
# default tiles against F.linear at decode M (bf16)
step fp8_defaults 120 "${R[@]}" --bench fp8 --name fp8_defaults --out "$OUT/defaults" --set dsv3,llama3_70b_fp8 \
  --providers torch,triton --baselines torch --pairs 5 --deadline_s 100 "${XARGS[@]}"
step skinny_default 120 "${R[@]}" --bench bf16 --name skinny_default --out "$OUT/defaults" --set offgrid,heldout \
  --m 1,2,3,4,5,8,12,16 --providers flinear,skinny --baselines flinear --pairs 5 --deadline_s 100 "${XARGS[@]}"
# max-autotune compiles for ~9 s per shape (Inductor's autotuning)
step bf16_maxautotune 110 "${R[@]}" --bench bf16 --name bf16_maxautotune --out "$OUT/bf16" --set shipped \
  --m "${MAXAUTOTUNE_M:-1}" --providers flinear,dispatch,maxautotune --baselines flinear,maxautotune \
  --compile_budget_s 80 --deadline_s 90 "${XARGS[@]}"
sub fp8_heldout 540 fp8_heldout.sh OUT="$OUT/fp8/heldout" STEPS="tune reconfirm warmup bench" RECONFIRM=1 TUNE_S=330 \
  RECONFIRM_S=90 BENCH_DEADLINE_S=95
sub hf 470 hf.sh OUT="$OUT" STEPS=measure TUNED="$HF_RECORD/tuned_gemm.csv"
sub tuner_reconfirm 200 tuner.sh OUT="$OUT/tuner/reconfirm" MODE=reconfirm BF16_LIMIT_S=100 FP8_LIMIT_S=90
sub hf_fp8 470 hf_fp8.sh OUT="$OUT" STEPS="capture tune measure"
sub tuner_fp8 130 tuner.sh OUT="$OUT/tuner/fp8" MODE=fp8 TIME_LIMIT=120
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
