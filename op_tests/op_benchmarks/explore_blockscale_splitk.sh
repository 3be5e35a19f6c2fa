#!/usr/bin/env bash
# Exploration (device tool, one H100): do higher split-K counts and narrower tiles than the quick space's help the
# DeepSeek-V3 projections with small N (256, 512) and K = 7168 at M = 64 / 256 / 1024, where the tuned op lost to
# bf16 F.linear (BENCHMARKS.md, issue 7)? Times, with the block-scale tuner, the shipped winner of each shape next to
# split-K configs up to 16 splits and 32-wide tiles. Output under $OUT: explore.log, profile_m{64,256,1024}.csv.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/explore_out}
mkdir -p "$OUT"
LOG="$OUT/explore.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$LOG"
cands() {  # variant, BLOCK_SIZE_M list, BLOCK_SIZE_N list, split list, stage list, GROUP_SIZE_M
    python3 - "$@" <<'PY'
import sys
from aiter_gemm.kernels.a8w8_blockscale import BlockscaleConfig
v, bms, bns, sks, sts, gm = sys.argv[1], *[[int(x) for x in a.split(",")] for a in sys.argv[2:6]], int(sys.argv[6])
print(",".join(BlockscaleConfig(v, bm, bn, 128, gm, sk, 4, st, True).name
               for bm in bms for bn in bns for sk in sks for st in sts))
PY
}
shipped() {  # the shipped CSV's kernelName for M at N = 256 and 512, K = 7168
    python3 -c "
import sys
from aiter_gemm.fileio import read_csv_rows
rows = read_csv_rows('configs/a8w8_blockscale_tuned_gemm.csv')[1]
print(','.join(sorted({r['kernelName'] for r in rows if r['M'] == sys.argv[1] and r['K'] == '7168' and r['N'] in ('256', '512')})))" "$1"
}
declare -A C
C[64]="$(cands splitK 64 32,64 8,12,16 3,4 1),$(cands splitK_swapAB 64 32,64 8,12,16 3,4 1)"
C[256]="$(cands splitK 64,128 32,64 6,8,12,16 3,4 8)"
C[1024]="$(cands splitK 64,128 64,128 4,6,8 3,4 8)"
for m in 64 256 1024; do
    timeout -s INT -k 20 150 python3 -m gradlib.tune_a8w8_blockscale --nk 256,7168 512,7168 --m "$m" --mp 1 \
        --candidates "$(shipped "$m"),scaled_mm_blockwise,${C[$m]}" -o "/tmp/explore_$m.csv" --json_dir /tmp/explore_json \
        --profile_file "$OUT/profile_m$m.csv" >> "$LOG" 2>&1
    echo "M=$m tuner exit status $?" >> "$LOG"
    python3 - "$OUT/profile_m$m.csv" "$(shipped "$m")" <<'PY' | tee -a "$LOG"
import sys
from aiter_gemm.fileio import read_csv_rows
rows = [r for r in read_csv_rows(sys.argv[1])[1] if r["status"] == "ok"]
ref = set(sys.argv[2].split(","))
for n in ("256", "512"):
    mine = sorted((float(r["us"]), r["kernelName"]) for r in rows if r["N"] == n)
    base = min(us for us, name in mine if name in ref)
    print(f"M={rows[0]['M']} N={n}: shipped winner {base:.2f} us; best {mine[0][0]:.2f} us {mine[0][1]}; "
          f"next {', '.join(f'{us:.2f} {name}' for us, name in mine[1:4])}")
PY
done
rm -f "$OUT"/*.lock
