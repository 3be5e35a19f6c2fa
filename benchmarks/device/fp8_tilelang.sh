#!/usr/bin/env bash
# The FP8 block-scale op with its TileLang backend, on one sm_90 GPU, in one call: the GPU tests of the backend, the
# shipped rows retuned with TileLang candidates (--quick space: kept only where >= 3% faster than what ran before,
# --compare --update_improved), then the op (dispatch) against torch's block-scaled matmul per call (torch_blockscale),
# the op before TileLang (baseline: the configs of commit 0e4b641, TileLang off) and bf16 F.linear, on held-out FP8
# models (Qwen3-8B/32B-FP8) and DeepGEMM's published shapes; CUDA graphs, paired rounds; eager timing at decode M.
# TileLang serves only tuned rows: add the retuned file's shapes (or a tuned CSV of the held-out ones) for the
# comparison to show it. Run from the repository root:
#
#   OUT=/tmp/fp8 TL_PACK=.scratch/tl_pack.tar.xz COMMIT=$(git rev-parse --short HEAD) \
#     bash benchmarks/device/fp8_tilelang.sh
#
# Writes under $OUT: record.log (every step's output), configs.tar (the retuned CSV and per-(N, K) JSON files, to copy
# over configs/), fp8_tilelang_<GPU>.csv (+ _env.json), fp8_tilelang_eager_<GPU>.csv, record.log. STEPS picks steps;
# RETUNE_S the retune's limit in seconds (300). Any sm_90 GPU: its winners are rows for its device_name, and the JSON
# files (keyed by arch alone: every sm_90 device reads them) are rebuilt from the class rows only (--keep_class_rows).
set -u
. benchmarks/device/common.sh
fp8_setup
step tests 130 python -m pytest -q -m gpu op_tests/test_blockscale_tilelang.py
want retune && python - > "$OUT/shipped_shapes.csv" <<'PY'
import csv
rows = list(csv.DictReader(open("configs/a8w8_blockscale_tuned_gemm.csv")))
print("M,N,K")
for r in rows:
    print(f"{r['M']},{r['N']},{r['K']}")
PY
# Every shipped row in TileLang's --quick space (2-5 configs a shape; 128 s on the H100 for the 70 rows, the full
# space over them outran 200 s of parallel compiling): a row changes only where TileLang is >= 3% faster.
STEPS=${STEPS:-tests retune warmup bench bench_eager}
# The tuner writes this GPU's winners as device-exact rows (device_name) beside the rows of the device class they
# beat (--keep_class_rows): those keep serving the other devices of the class (op_tests/test_shipped_configs.py).
step retune "${RETUNE_S:-300}" python -m gradlib.tune_a8w8_blockscale -i "$OUT/shipped_shapes.csv" \
  -o configs/a8w8_blockscale_tuned_gemm.csv --all --keep_class_rows --compare --update_improved --libtype tilelang \
  --json_dir configs/triton --quick
dry || tar -cf "$OUT/configs.tar" configs/a8w8_blockscale_tuned_gemm.csv configs/triton/*A8W8_BLOCKSCALE*.json
R=(python -m benchmarks.run --bench fp8 --out "$OUT")
fp8_warmup shipped,heldout_fp8,deepgemm
step bench 250 "${R[@]}" --name fp8_tilelang --set shipped,heldout_fp8,deepgemm \
  --providers "torch_blockscale,dispatch,baseline:$BEFORE,flinear" \
  --baselines "torch_blockscale,baseline:$BEFORE" --pairs 11 --deadline_s "${BENCH_DEADLINE_S:-230}"
step bench_eager 60 "${R[@]}" --name fp8_tilelang_eager --set heldout_fp8 --m 1,5,16,40,64 \
  --providers "torch_blockscale,dispatch,baseline:$BEFORE" --baselines torch_blockscale --timing eager --deadline_s 50
dry || { grep "^== " "$LOG"; ls -la "$OUT"; }
