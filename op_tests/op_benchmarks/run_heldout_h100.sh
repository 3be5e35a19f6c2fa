#!/usr/bin/env bash
# Held-out benchmark (issue 13) and the GPU tests of the dispatch on this GPU: bench_heldout.py over every set, then
# the GPU-marked tests of capture, dispatch, shipped configs and the block-scale op. Results under $OUT/heldout.
#
#   OUT=/tmp/ho COMMIT=$(git rev-parse HEAD) bash op_tests/op_benchmarks/run_heldout_h100.sh
# BENCH_ARGS: extra bench_heldout.py arguments (e.g. "--sets fp8 --eager_pairs 41"); RUN_TESTS=0 skips the tests.
set -u
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT/heldout"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python -c "import nvmath; print('nvmath', nvmath.__version__)" 2>&1
  python -c "from aiter_gemm import ops, eager_ext; print('eager_ext', 'loaded' if ops.EAGER_EXT else eager_ext.status)" 2>&1
  python -c "from aiter_gemm.kernels import a8w8_blockscale_torch as t; print('scaled_mm direct op', t.direct_op())" 2>&1
  echo "commit ${COMMIT:-unknown}"
} > "$OUT/heldout/env.txt"
timeout -s TERM ${BENCH_LIMIT_S:-420} python op_tests/op_benchmarks/bench_heldout.py --out "$OUT/heldout" \
  --deadline $(( ${BENCH_LIMIT_S:-420} - 20 )) ${BENCH_ARGS:-} > "$OUT/heldout/heldout.log" 2>&1
echo "bench rc=$?" >> "$OUT/heldout/env.txt"
[ "${RUN_TESTS:-1}" = 0 ] && exit 0
timeout -s TERM ${TEST_LIMIT_S:-150} python -m pytest -q -p no:cacheprovider -m gpu op_tests/test_graph_capture.py \
  op_tests/test_dispatch.py op_tests/test_blockscale_torch.py op_tests/test_a8w8_blockscale.py \
  op_tests/test_shipped_configs.py op_tests/test_eager_ext.py > "$OUT/heldout/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/heldout/env.txt"
