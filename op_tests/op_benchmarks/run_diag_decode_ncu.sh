#!/usr/bin/env bash
# diag_decode_ncu.py on one GPU: graph times, then the same kernels under Nsight Compute, then the joined table.
#   OUT=/tmp/x COMMIT=$(git rev-parse HEAD) [PLAN=plan.json] bash op_tests/op_benchmarks/run_diag_decode_ncu.sh
set -u
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
PLAN_ARG=${PLAN:+--plan $PLAN}
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  echo "commit ${COMMIT:-unknown}; ncu $NCU $($NCU --version 2>/dev/null | tail -1)"
} > "$OUT/env.txt"
python op_tests/op_benchmarks/diag_decode_ncu.py --mode time --out "$OUT" $PLAN_ARG > "$OUT/time.log" 2>&1
echo "time rc=$?" >> "$OUT/env.txt"
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,sm__warps_active.avg.pct_of_peak_sustained_active,sm__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_shared_mem,launch__occupancy_limit_registers,sm__cycles_active.avg,gpc__cycles_elapsed.max
"$NCU" --profile-from-start off --clock-control none --cache-control all --metrics "$METRICS" --csv --page raw \
  python op_tests/op_benchmarks/diag_decode_ncu.py --mode ncu --out "$OUT" $PLAN_ARG > "$OUT/ncu_raw.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$?" >> "$OUT/env.txt"
python op_tests/op_benchmarks/diag_decode_ncu.py --mode join --out "$OUT" > "$OUT/joined.txt" 2>&1
echo "join rc=$?" >> "$OUT/env.txt"
cat "$OUT/env.txt" "$OUT/time.log" "$OUT/joined.txt"; tail -5 "$OUT/ncu.err"
