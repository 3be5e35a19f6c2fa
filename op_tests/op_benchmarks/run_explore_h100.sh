#!/usr/bin/env bash
# Issue 14 on one GPU: the kernel tests of skinny and the Triton GEMM (GPU where there is one), then
# explore_skinny_inductor.py over SHAPES (skinny configs at M <= 16, Triton GEMM tiles with and without _SP above),
# optionally shipping the winners (SHIP=1: ship_skinny_rows.py into configs/bf16_tuned_gemm.csv, copied to $OUT).
#
#   OUT=/tmp/x SHAPES=4x4096x4096,8x4096x4096 COMMIT=$(git rev-parse HEAD) bash op_tests/op_benchmarks/run_explore_h100.sh
# EXPLORE_ARGS: extra explore arguments (e.g. "--deadline_s 300 --compile_max_m 0"); RUN_TESTS=0 skips the tests;
# TEST_LIMIT_S (default 360: in results gemv_m2_m8* the skinny tests alone ran past 150-170 s on the H100, compiling
# a kernel per shape). COMMIT: take it from your checkout; a device copy's own git HEAD can be stale.
set -u
OUT=${OUT:?set OUT to an output folder}
SHAPES=${SHAPES:?set SHAPES to MxNxK,...}
mkdir -p "$OUT"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  echo "commit ${COMMIT:-unknown}; shapes $SHAPES; args ${EXPLORE_ARGS:-}"
} > "$OUT/env.txt"
if [ "${RUN_TESTS:-1}" != 0 ]; then
  timeout -s TERM ${TEST_LIMIT_S:-360} python -m pytest -q -p no:cacheprovider op_tests/test_skinny_backend.py \
    op_tests/test_triton_backend.py op_tests/test_shipped_configs.py > "$OUT/pytest_gpu.log" 2>&1
  echo "tests rc=$?" >> "$OUT/env.txt"
fi
python -m op_tests.op_benchmarks.explore_skinny_inductor --out "$OUT/explore" --shapes "$SHAPES" ${EXPLORE_ARGS:-} \
  > "$OUT/explore.log" 2>&1
echo "explore rc=$?" >> "$OUT/env.txt"
if [ "${SHIP:-0}" = 1 ]; then
  python -m op_tests.op_benchmarks.ship_skinny_rows --results "$OUT/explore/results.json" \
    --out configs/bf16_tuned_gemm.csv > "$OUT/ship.log" 2>&1
  echo "ship rc=$?" >> "$OUT/env.txt"
  cp configs/bf16_tuned_gemm.csv "$OUT/"
fi
