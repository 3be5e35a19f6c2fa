#!/usr/bin/env bash
# Tuner time of record (BENCHMARKS.md, "Tuner time"), one GPU, from the repository root; output under $OUT.
#
#   MODE=reconfirm bash benchmarks/device/tuner_h100.sh   # re-confirm both shipped tables on this GPU (~70 s):
#       every row's own solution against the runtime default and F.linear in alternating rounds, at its M and at
#       the padded M it serves (gemm-tuner / tune_a8w8_blockscale --candidates_from); writes bf16_*.csv/log and
#       a8w8_blockscale_*.csv/log, nothing in configs/
#   MODE=fp8 bash benchmarks/device/tuner_h100.sh         # the block-scale tuner over the 70 shipped shapes with
#       both implementations (quick Triton space and torch's matmul; ~60 s): fp8_tuned.csv, fp8_profile.csv,
#       fp8_json.tar.gz (the per-(N, K) JSON files), fp8_tune.log
#   MODE=bf16 bash benchmarks/device/tuner_h100.sh        # gemm-tuner over the 112 shipped shapes with every backend
#       (~12 min: stopped after TIME_LIMIT s, rerun with RESUME_FROM=<bf16_tuned.csv> to resume the missing shapes)
#
# COMMIT names the checkout in env.txt. Wheels carried in .whl/ (nvmath-python) are installed when missing.
set -u
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
. benchmarks/device/common.sh
need_wheels nvmath
env_header "$OUT/env.txt"
echo "mode ${MODE:-reconfirm}" >> "$OUT/env.txt"
BF16=configs/bf16_tuned_gemm.csv
FP8=configs/a8w8_blockscale_tuned_gemm.csv
run() {  # name limit_s command...: wall time and exit status into env.txt
  local name=$1 limit=$2 s; shift 2
  s=$(date +%s)
  timeout -s TERM "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - s )) s" | tee -a "$OUT/env.txt"
  tail -n 2 "$OUT/$name.log"
}
case ${MODE:-reconfirm} in
  reconfirm)
    run bf16_reconfirm "${BF16_LIMIT_S:-390}" python -m gradlib.gemm_tuner -i "$BF16" --candidates_from "$BF16" \
      --libtype all --mp 1 -o "$OUT/bf16_tuned.csv" --summary_file "$OUT/bf16_summary.csv"
    run fp8_reconfirm "${FP8_LIMIT_S:-170}" python -m gradlib.tune_a8w8_blockscale -i "$FP8" --candidates_from "$FP8" \
      --mp 1 -o "$OUT/fp8_tuned.csv" --json_dir /tmp/fp8_json ;;
  fp8)
    run fp8_tune "${TIME_LIMIT:-300}" python -m gradlib.tune_a8w8_blockscale -i "$FP8" --quick --mp 1 --batch 4 \
      -o "$OUT/fp8_tuned.csv" --json_dir /tmp/fp8_json --profile_file "$OUT/fp8_profile.csv"
    tar -C /tmp/fp8_json -czf "$OUT/fp8_json.tar.gz" . ;;  # the device tool returns no file name with '='
  bf16)
    [ -n "${RESUME_FROM:-}" ] && cp "$RESUME_FROM" "$OUT/bf16_tuned.csv"
    run bf16_tune "${TIME_LIMIT:-540}" python -m gradlib.gemm_tuner -i "$BF16" -o "$OUT/bf16_tuned.csv" --mp 1 \
      --screen_libtypes skinny,triton --timeout 60 --batch 1 --summary_file "$OUT/bf16_summary.csv" ;;
  *) echo "MODE must be reconfirm, fp8 or bf16"; exit 2 ;;
esac
rm -f "$OUT"/*.lock
