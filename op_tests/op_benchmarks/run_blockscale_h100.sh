#!/usr/bin/env bash
# GPU run of issue 7 (device tool, repository root, one H100): the A8W8 block-scale tuner over the benchmark's
# DeepSeek-V3 and Llama-3-70B shapes (Triton configs and torch's block-scaled matmul), then the benchmark timing the
# dispatched gemm_a8w8_blockscale with the tuned CSV and JSON against bf16 F.linear, torch's block-scaled matmul and
# the best Triton config, in the same call.
#
#   bash op_tests/op_benchmarks/run_blockscale_h100.sh        (output under $OUT, 7 files)
#
# Knobs: MS (M values, default 1,16,64,256,1024,4096,8192), TUNE_LIMIT (s, default 300), BENCH_LIMIT (s, 150),
# PYTEST=0 (skip the GPU tests), LAYOUT (x_scale's layout in the tuner and the benchmark: row_major, their default,
# or m_major).
# Output: env.txt, pytest_gpu.log, tuner.log, a8w8_blockscale_tuned.csv, profile.csv, json.tar.gz (the per-(N, K)
# JSON files: the device tool returns no file name with '='), bench.tar.gz (summary.csv, candidates.csv, best.json,
# bench.log of bench_a8w8_blockscale.py --op).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/blockscale_out}
mkdir -p "$OUT"
MS=${MS:-1,16,64,256,1024,4096,8192}
TUNE_LIMIT=${TUNE_LIMIT:-300}
BENCH_LIMIT=${BENCH_LIMIT:-150}
LAYOUT=${LAYOUT:-row_major}
# The benchmark's shapes (bench_a8w8_blockscale.DSV3_NK + LLAMA70B_NK).
NK="256,7168 2112,7168 3072,1536 4096,512 512,7168 7168,2048 10240,8192 8192,8192 57344,8192 8192,28672"
{
    date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
    python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "cuda", torch.version.cuda)'
    echo "MS=$MS TUNE_LIMIT=$TUNE_LIMIT BENCH_LIMIT=$BENCH_LIMIT LAYOUT=$LAYOUT"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

if [ "${PYTEST:-1}" = 1 ]; then
    timeout -k 10 120 python3 -m pytest -q -m gpu op_tests/test_blockscale_torch.py op_tests/test_blockscale_tuner.py \
        > "$OUT/pytest_gpu.log" 2>&1
    echo "pytest exit status $?" | tee -a "$OUT/pytest_gpu.log"
    tail -n 3 "$OUT/pytest_gpu.log"
fi

JSON=/tmp/bs_json
rm -rf "$JSON" "$OUT/a8w8_blockscale_tuned.csv" "$OUT/profile.csv"
t0=$(date +%s)
# shellcheck disable=SC2086
timeout -s INT -k 30 "$TUNE_LIMIT" python3 -m gradlib.tune_a8w8_blockscale --nk $NK --m "$MS" --quick --mp 1 \
    --x_scale_layout "$LAYOUT" --batch 4 -o "$OUT/a8w8_blockscale_tuned.csv" --json_dir "$JSON" \
    --profile_file "$OUT/profile.csv" -v \
    > "$OUT/tuner.log" 2>&1
echo "tuner exit status $? after $(($(date +%s) - t0)) s" | tee -a "$OUT/tuner.log"
grep -E "^ +[0-9]+ +[0-9]+ +[0-9]+ |tune_a8w8_blockscale:" "$OUT/tuner.log" | tail -n 80
tar -C "$JSON" -czf "$OUT/json.tar.gz" .

B=/tmp/bs_bench
rm -rf "$B"
AITER_CONFIG_GEMM_A8W8_BLOCKSCALE="$OUT/a8w8_blockscale_tuned.csv" AITER_GEMM_TRITON_CONFIGS="$JSON" \
    timeout -k 30 $((BENCH_LIMIT + 60)) python3 op_tests/op_benchmarks/bench_a8w8_blockscale.py --out "$B" --op \
    --x_scale_layout "$LAYOUT" --ms "$MS" --time-limit "$BENCH_LIMIT" > /tmp/bench.log 2>&1
echo "benchmark exit status $?" | tee -a /tmp/bench.log
cp /tmp/bench.log "$B/bench.log"
tail -n 6 "$B/bench.log"
tar -C "$B" -czf "$OUT/bench.tar.gz" .
rm -f "$OUT"/*.lock  # at most 8 files come back
ls -la "$OUT"
