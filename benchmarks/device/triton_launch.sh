#!/usr/bin/env bash
# Issue 53's bound Triton launches and torch's cached cuBLASLt plan on one GPU: build the C++ eager extension,
# install nvmath-python from the carried .whl/ if missing, run the GPU tests that compare the bound launch with
# Triton's own (op_tests/test_triton_launch.py: the quantizer; test_blockscale_bound.py: the block-scale GEMM's
# shipped H200 configs, eagerly and in a CUDA graph), the plan with F.scaled_mm (test_blockscale_lt.py), then the FP8
# linear tests, and the overhead bench (its FP8 rows: the bound quantizer against Triton's launcher; the cached plan
# against torch's bound op; the op, torch's block-scaled arm and the FP8Linear twin against bf16 F.linear /
# nn.Linear; each row's note says which launch, GEMM (bound launch or cuBLASLt plan, or why not) and call entry it
# took). Results under $OUT/triton_launch: build.log, tests.log, overhead.log, the overhead CSV ($NAME, default
# overhead_i53), env.txt (each step's rc and wall time). ~6-9 min.
#
#   OUT=/tmp/i53 COMMIT=$(git rev-parse --short HEAD) [NAME=overhead_i53_next] bash benchmarks/device/triton_launch.sh
set -u
. benchmarks/device/common.sh
out_folder triton_launch
need_wheels nvmath transformers
build_ext "$D/build.log" > "$LOG"
env_header "$LOG"
NAME=${NAME:-overhead_i53}
STEP_LOG="$D/tests.log" step tests 420 python -m pytest -q -rs op_tests/test_triton_launch.py \
  op_tests/test_blockscale_bound.py op_tests/test_blockscale_lt.py op_tests/test_fp8_call.py op_tests/test_fp8_linear.py
STEP_LOG="$D/overhead.log" step overhead 150 python -m benchmarks.run --bench overhead --calls 4000 --repeats 9 \
  --out "$D" --name "$NAME"
dry || { cat "$LOG"; tail -n 5 "$D/tests.log"; grep -h "fp8" "$D/$NAME"*.csv 2>/dev/null; }
