#!/usr/bin/env bash
# Tuner runs of record (BENCHMARKS.md, "Tuner time"; the shipped tables' device rows), on the GPU(s) it runs on, from
# the repository root; output under $OUT.
#
#   MODE=reconfirm bash benchmarks/device/tuner.sh   # re-confirm both shipped tables on this GPU (~70 s):
#       every row's own solution against the runtime default and F.linear in alternating rounds, at its M and at
#       the padded M it serves (gemm-tuner / tune_a8w8_blockscale --candidates_from); writes
#       bf16_reconfirm{ed.csv,_summary.csv,.log} and fp8_reconfirm{ed.csv,.log}, nothing in configs/
#   MODE=fp8 bash benchmarks/device/tuner.sh         # the block-scale tuner over the 70 shipped shapes with
#       both implementations (quick Triton space and torch's matmul; ~60 s): fp8_tuned.csv, fp8_profile.csv,
#       fp8_json.tar.gz (the per-(N, K) JSON files), fp8_tune.log
#   MODE=bf16 bash benchmarks/device/tuner.sh        # gemm-tuner over the 112 shipped shapes with every backend
#       (~12 min: stopped after TIME_LIMIT s, rerun with RESUME_FROM=<bf16_tuned.csv> to resume the missing shapes)
#   MODE=bf16_retune bash benchmarks/device/tuner.sh  # this GPU's own rows for the shipped bf16 shapes: every backend,
#       written as device-exact rows (device_name) beside the class rows they beat by >= 3% (--keep_class_rows
#       --compare --update_improved) into configs/bf16_tuned_gemm.csv, copied to $OUT; MIN_M / MAX_M (default 1 /
#       64) and NK ("N:K N:K ...", default every shipped (N, K)) pick the shapes, leaving out those with a row for
#       this GPU unless RETUNE_ALL=1 (so a rerun resumes); MP workers (default: every GPU). On an H200 pair, 18-28
#       shapes in ~8 min (most of it compiling the skinny and Triton spaces).
#
# MODE may name several, in order ("reconfirm fp8"); STEPS (default all) picks among their steps (bf16_reconfirm,
# fp8_reconfirm, fp8_tune, bf16_tune, bf16_retune). COMMIT names the checkout in env.txt; DRY_RUN=1 prints the tuner
# commands (common.sh's step). Wheels carried in .whl/ (nvmath-python) are installed when missing.
set -u
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
. benchmarks/device/common.sh
need_wheels nvmath
LOG="$OUT/env.txt"
STEPS=${STEPS:-all}
env_header "$LOG"
echo "mode ${MODE:-reconfirm}; steps $STEPS" >> "$LOG"
BF16=configs/bf16_tuned_gemm.csv
FP8=configs/a8w8_blockscale_tuned_gemm.csv
run() {  # name limit_s command...: common.sh's step (rc and wall time in env.txt), the output in $OUT/<name>.log
  want "$1" || return 0
  STEP_LOG="$OUT/$1.log" step "$@"
  dry || { grep "^== $1 rc=" "$LOG"; tail -n 2 "$OUT/$1.log"; }
}
for mode in ${MODE:-reconfirm}; do
case $mode in
  reconfirm)
    run bf16_reconfirm "${BF16_LIMIT_S:-390}" python -m gradlib.gemm_tuner -i "$BF16" --candidates_from "$BF16" \
      --libtype all --mp 1 -o "$OUT/bf16_reconfirmed.csv" --summary_file "$OUT/bf16_reconfirm_summary.csv"
    run fp8_reconfirm "${FP8_LIMIT_S:-170}" python -m gradlib.tune_a8w8_blockscale -i "$FP8" --candidates_from "$FP8" \
      --mp 1 -o "$OUT/fp8_reconfirmed.csv" --json_dir /tmp/fp8_json_reconfirmed ;;
  fp8)
    run fp8_tune "${TIME_LIMIT:-300}" python -m gradlib.tune_a8w8_blockscale -i "$FP8" --quick --mp 1 --batch 4 \
      -o "$OUT/fp8_tuned.csv" --json_dir /tmp/fp8_json --profile_file "$OUT/fp8_profile.csv"
    want fp8_tune && ! dry && tar -C /tmp/fp8_json -czf "$OUT/fp8_json.tar.gz" . ;;  # the device tool returns no name with '='
  bf16)
    if [ -n "${RESUME_FROM:-}" ] && ! dry; then cp "$RESUME_FROM" "$OUT/bf16_tuned.csv"; fi
    run bf16_tune "${TIME_LIMIT:-540}" python -m gradlib.gemm_tuner -i "$BF16" -o "$OUT/bf16_tuned.csv" --mp 1 \
      --screen_libtypes skinny,triton --timeout 60 --batch 1 --summary_file "$OUT/bf16_summary.csv" ;;
  bf16_retune)
    want bf16_retune || continue
    python - "${MIN_M:-1}" "${MAX_M:-64}" "${NK:-}" "${RETUNE_ALL:-0}" > /tmp/retune_shapes.csv <<'PY' || exit 2
import csv, sys
min_m, max_m, nk = int(sys.argv[1]), int(sys.argv[2]), {tuple(map(int, p.split(":"))) for p in sys.argv[3].split()}
cols = ["M", "N", "K", "bias", "dtype", "outdtype", "scaleAB", "bpreshuffle"]
out = csv.DictWriter(sys.stdout, cols, lineterminator="\n")
out.writeheader()
import torch
rows = list(csv.DictReader(open("configs/bf16_tuned_gemm.csv")))
mine = "_".join(torch.cuda.get_device_name().split())  # the tuner's device_name for this GPU
done = {tuple(r[c] for c in cols) for r in rows if r.get("device_name") == mine and sys.argv[4] != "1"}
for row in rows:
    shape = tuple(row[c] for c in cols)
    if (not row.get("device_name") and shape not in done and min_m <= int(row["M"]) <= max_m
            and (not nk or (int(row["N"]), int(row["K"])) in nk)):
        out.writerow(dict(zip(cols, shape)))
PY
    run bf16_retune "${TIME_LIMIT:-500}" python -m gradlib.gemm_tuner -i /tmp/retune_shapes.csv -o "$BF16" --all \
      --keep_class_rows --compare --update_improved --libtype all --mp "${MP:-$(python -c 'import torch; print(torch.cuda.device_count())')}" \
      --screen_libtypes skinny,triton --timeout 60 --batch 1 --summary_file "$OUT/bf16_retune_summary.csv"
    dry || { cp "$BF16" "$OUT/bf16_tuned_gemm.csv"; gzip -f "$OUT/bf16_retune.log"; } ;;
  *) echo "MODE must name reconfirm, fp8, bf16 or bf16_retune, got $mode"; exit 2 ;;
esac
done
rm -f "$OUT"/*.lock
