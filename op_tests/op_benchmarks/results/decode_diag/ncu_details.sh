# Nsight Compute sections and per-instruction stall reasons of a diag_decode_ncu.py plan, printed as short tables.
#   OUT=/tmp/x [PLAN=op_tests/op_benchmarks/results/decode_diag/plan_tc.json] bash <this file>
set -u
P=${PLAN:-op_tests/op_benchmarks/results/decode_diag/plan_stalls.json}
ncu --profile-from-start off --clock-control none --cache-control all --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --csv --page details python op_tests/op_benchmarks/diag_decode_ncu.py --mode ncu --out $OUT --plan $P > $OUT/ncu_details.csv 2> $OUT/ncu_details.err
echo rc=$?
python - <<'PY'
import csv, os
out=os.environ["OUT"]
rows=[r for r in csv.reader(l for l in open(f"{out}/ncu_details.csv") if l.startswith('"'))]
h=rows[0]; ci={k:i for i,k in enumerate(h)}
keep=("Duration","Memory Throughput","DRAM Throughput","Achieved Occupancy","Stall","Warp Cycles Per Issued","Issued Warp","No Eligible","Active Warps Per Scheduler","Eligible Warps","L2 Hit","Mem Busy","Max Bandwidth","Registers","Grid Size","Block Size","Dynamic Shared")
cur=None
for r in rows[1:]:
    kid=r[ci["ID"]]; name=r[ci["Kernel Name"]][:50]
    if kid!=cur:
        print("=== kernel",kid,name); cur=kid
    m=r[ci["Metric Name"]]
    if any(k in m for k in keep):
        print(f"   {m:55s} {r[ci['Metric Value']]:>12s} {r[ci['Metric Unit']]}")
PY
ncu --profile-from-start off --clock-control none --cache-control all --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$',gpu__time_duration.sum,smsp__inst_executed.sum --csv --page raw python op_tests/op_benchmarks/diag_decode_ncu.py --mode ncu --out $OUT --plan $P > $OUT/ncu_stalls.csv 2> $OUT/ncu_stalls.err
echo rc2=$?
python - <<'PY'
import csv, os, json
out=os.environ["OUT"]
rows=[r for r in csv.reader(l for l in open(f"{out}/ncu_stalls.csv") if l.startswith('"'))]
h=rows[0]; data=rows[2:]
ci={k:i for i,k in enumerate(h)}
st=[k for k in h if k.startswith("smsp__average_warps_issue_stalled_")]
for r in data:
    name=r[ci["Kernel Name"]][:40]
    if "spin" in name: print("--"); continue
    vals=sorted(((float(r[ci[k]] or 0),k.replace("smsp__average_warps_issue_stalled_","").replace("_per_issue_active.ratio","")) for k in st), reverse=True)[:6]
    print(f"{name:40s} dur {r[ci['gpu__time_duration.sum']]:>8s} inst {r[ci['smsp__inst_executed.sum']]:>10s} ", " ".join(f"{k}={v:.2f}" for v,k in vals))
PY
