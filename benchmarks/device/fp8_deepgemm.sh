#!/usr/bin/env bash
# DeepGEMM beside the FP8 block-scale op (issue 50), on one sm_90 GPU, in one call: the GPU tests of the deepgemm
# backend; DeepGEMM's JIT warmed for every benchmarked shape (8 processes into $DG_JIT_CACHE_DIR); torch's block-scaled
# matmul (torch_blockscale), DeepGEMM as a user calls it (deepgemm) and the op (dispatch) side by side on DeepGEMM's
# published shapes and three held-out models (Qwen3-8B-FP8, Qwen3-32B-FP8, Qwen2.5-7B: none in the shipped FP8 table)
# at decode M (the op as shipped), CUDA graphs, paired rounds; a --quick tune of the shapes at $TUNE_M with every
# libtype ($LIBTYPES; DeepGEMM included; a tuned file already in $OUT is resumed), so the op picks DeepGEMM by measurement; then
# $TUNED_M (default the prefill M) with that tuned file. Steps past their limit keep what finished.
# Run from the repository root, DeepGEMM built against this torch (docs/deepgemm.md) unpacked from $DG_PACK:
#
#   OUT=/tmp/dg_out DG_PACK=.scratch/dg_built2.tar.xz TL_PACK=.scratch/tl_pack.tar.xz COMMIT=$(git rev-parse --short HEAD) \
#     bash benchmarks/device/fp8_deepgemm.sh
#
# Writes under $OUT: record.log (every step's output), fp8_deepgemm_<GPU>.csv (+ _env.json), dg_tuned.csv,
# dg_profile.csv and dg_json/ (the tune's rows, every candidate's time, JSON files), fp8_deepgemm_tuned_<GPU>.csv (+ _env.json). STEPS picks steps.
set -u
. benchmarks/device/common.sh
need_deepgemm "${DG_PACK:-dg_built.tar.xz}"
fp8_setup
STEPS=${STEPS:-tests dg_warm bench tune bench_tuned}
SETS=deepgemm,qwen3_8b_fp8,qwen3_32b_fp8,qwen2_5_7b
DECODE_M=1,64
PREFILL_M=1000,4096
TUNE_M=${TUNE_M:-1024,64,1,4096}  # the M a --quick tune of the shapes times (1000 pads to 1024); in this order
step tests 70 python -m pytest -q -m gpu op_tests/test_blockscale_deepgemm.py
step dg_warm 60 python -c "
import sys, multiprocessing as mp
import aiter_gemm
from aiter_gemm.kernels.a8w8_blockscale_deepgemm import shape_error, warm
from benchmarks.shapes import build_sets
ident = aiter_gemm.get_dispatcher('gemm_a8w8_blockscale').device(True)
ms = [int(m) for m in sys.argv[2].split(',')]
jobs = sorted({(p.M, p.N, p.K, p.otype) for _, (_, p) in build_sets('gemm_a8w8_blockscale', sys.argv[1], ms, ident)
               if shape_error(p.M, p.N, p.K, p.otype) is None}, key=str)
with mp.get_context('spawn').Pool(8) as pool:
    failed = pool.map(warm, [jobs[i::8] for i in range(8)])
print(len(jobs), 'shapes warmed;', 'failed:', {k: v for f in failed for k, v in f.items()})" "$SETS" "$DECODE_M,$PREFILL_M"
R=(python -m benchmarks.run --bench fp8 --out "$OUT" --providers "torch_blockscale,deepgemm,dispatch"
   --baselines "torch_blockscale,deepgemm" --pairs 7)
step bench 110 "${R[@]}" --name fp8_deepgemm --set "$SETS" --m "$DECODE_M" --deadline_s 95
want tune && ! dry && python -c "
import sys
import aiter_gemm
from benchmarks.shapes import build_sets
ident = aiter_gemm.get_dispatcher('gemm_a8w8_blockscale').device(True)
print('M,N,K')
for m in sys.argv[2].split(','):
    for _, (_, p) in build_sets('gemm_a8w8_blockscale', sys.argv[1], [int(m)], ident):
        print(f'{p.M},{p.N},{p.K}')" "$SETS" "$TUNE_M" > "$OUT/tune_shapes.csv"
step tune "${TUNE_S:-130}" python -m gradlib.tune_a8w8_blockscale -i "$OUT/tune_shapes.csv" -o "$OUT/dg_tuned.csv" \
  -o2 "$OUT/dg_profile.csv" --json_dir "$OUT/dg_json" --libtype "${LIBTYPES:-triton,torch,tilelang,deepgemm}" --quick
step bench_tuned 170 env "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE=$OUT/dg_tuned.csv:configs/a8w8_blockscale_tuned_gemm.csv" \
  "AITER_GEMM_TRITON_CONFIGS=$OUT/dg_json" "${R[@]}" --name fp8_deepgemm_tuned --set "$SETS" \
  --m "${TUNED_M:-$PREFILL_M}" --deadline_s 150
dry || { grep "^== " "$LOG"; ls -la "$OUT"; }
