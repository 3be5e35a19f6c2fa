#!/usr/bin/env bash
# The held-out FP8 shapes (benchmarks/shapes.py: heldout_fp8, Qwen3-8B/32B-FP8 linears, none in the shipped tables) on
# one sm_90 GPU, in one call: their decode shapes (M <= 256) tuned in the quick space (triton, torch, tilelang), every
# kernel the decisions name compiled first (aiter_gemm.warmup), then the op with those rows (dispatch), its heuristic
# default, torch's block-scaled matmul per call (torch_blockscale), the op before TileLang (baseline: the configs of
# 0e4b641) and the weight-read floor (weight_read: streaming the weight once, no math); CUDA graphs, paired rounds. Run
# from the repository root:
#
#   OUT=/tmp/heldout TL_PACK=.scratch/tl_pack.tar.xz COMMIT=$(git rev-parse --short HEAD) \
#     bash benchmarks/device/fp8_heldout.sh
#
# RESUME=<tuned CSV>: start from those rows (the tuner times only shapes without one); DROP_M=<lo>-<hi>[,<lo>-<hi>...]
# drops the rows with M in those ranges from it first (to retune them after a change of the space there). RECONFIRM=1:
# re-time every row against the default and torch's kernel before the benchmark, which then serves only the rows that
# still win (reconfirmed_gemm.csv). STEPS (common.sh) picks steps (tune reconfirm warmup bench); TUNE_S / RECONFIRM_S:
# their limits in seconds (200 / 240). Writes under $OUT: record.log, a8w8_blockscale_tuned_gemm.csv (+ the per-(N, K)
# JSON files in json/), fp8_heldout_tuned_<GPU>.csv (+ _env.json).
set -u
. benchmarks/device/common.sh
fp8_setup
mkdir -p "$OUT/json"
TUNED="$OUT/a8w8_blockscale_tuned_gemm.csv"
dry || python - "$OUT/decode_shapes.csv" "${RESUME:-}" "$TUNED" "${DROP_M:-}" <<'PY'
import csv, sys
import aiter_gemm
import torch
from benchmarks.shapes import build_sets
shapes_out, resume, tuned, drop = sys.argv[1:5]
ident = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale").device(torch.cuda.is_available())
shapes = sorted({(p.M, p.N, p.K) for _, (_, p) in build_sets("gemm_a8w8_blockscale", "heldout_fp8", None, ident)
                 if p.M <= 256})
with open(shapes_out, "w") as f:
    f.write("M,N,K\n" + "".join(f"{m},{n},{k}\n" for m, n, k in shapes))
if resume:
    ranges = [tuple(int(x) for x in part.split("-")) for part in drop.split(",")] if drop else []
    with open(resume, newline="") as f:
        rows = list(csv.DictReader(f))
    keep = [r for r in rows if not any(lo <= int(r["M"]) <= hi for lo, hi in ranges)]
    with open(tuned, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(keep)
    print(f"resumed from {resume}: {len(keep)} of {len(rows)} rows kept (dropped M {drop or 'none'})")
PY
step tune "${TUNE_S:-200}" python -m gradlib.tune_a8w8_blockscale -i "$OUT/decode_shapes.csv" -o "$TUNED" --quick \
  --libtype triton,torch,tilelang --json_dir "$OUT/json"
if [ -n "${RECONFIRM:-}" ]; then
  # every row's own solution against the op's default and torch's kernel again, in alternating rounds (no search):
  # only rows that still win by --min_gain are written, and the benchmark serves those
  step reconfirm "${RECONFIRM_S:-240}" python -m gradlib.tune_a8w8_blockscale -i "$OUT/decode_shapes.csv" \
    --candidates_from "$TUNED" -o "$OUT/reconfirmed_gemm.csv" --libtype triton,torch,tilelang \
    --json_dir "$OUT/json_reconfirmed"
  TUNED="$OUT/reconfirmed_gemm.csv"
fi
export AITER_CONFIG_GEMM_A8W8_BLOCKSCALE="$TUNED:$PWD/configs/a8w8_blockscale_tuned_gemm.csv"
fp8_warmup heldout_fp8
step bench 300 python -m benchmarks.run --bench fp8 --out "$OUT" --name fp8_heldout_tuned --set heldout_fp8 \
  --providers "torch_blockscale,dispatch,default,baseline:$BEFORE,weight_read" \
  --baselines "torch_blockscale,baseline:$BEFORE,weight_read" --pairs 7 --deadline_s "${BENCH_DEADLINE_S:-280}"
dry || { grep "^== " "$LOG"; ls -la "$OUT"; }
