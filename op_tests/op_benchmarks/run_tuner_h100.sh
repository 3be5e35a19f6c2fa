#!/usr/bin/env bash
# GPU tuning run of issue 5 (device tool, repository root): tune shipped model shape lists with every available
# backend, then measure the tuned dispatch (gemm_a16w16) against F.linear on the tuned shapes, in the same call.
#
# Resumable across calls: the tuned CSV lives in the repository ($RESULTS); each call copies it (and the profile and
# summary) to $OUT, tunes for at most $TIME_LIMIT seconds (then SIGINT: the tuner checkpoints and exits), and
# returns the files. Copy them back into $RESULTS before the next call and it resumes only the missing shapes.
#
#   MODE=tune (default) LISTS="llama3_8b llama3_70b_tp8" TIME_LIMIT=420 BENCH=1 bash op_tests/op_benchmarks/run_tuner_h100.sh
#   MODE=mp   MP=2 NSETS=1,16,256,4096: tune the same shapes twice from scratch, --mp 1 then --mp $MP, wall times
#             in $OUT/mp_wall.txt (needs $MP GPUs). The recorded multi-GPU numbers come from run_ray_multi_gpu.sh
#             instead, which also runs --mp 1 and --mp N (after a warm-up run that fills the Triton cache) plus Ray.
#
# Knobs: MP (workers, default 1 in tune mode), NSETS (restrict M values, e.g. "1,16,256"; default: the lists as
# shipped), EXTRA (more tuner flags, e.g. "--screen_libtypes skinny,triton --timeout 120"), BENCH=0 (no benchmark).
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/tuner_out}
mkdir -p "$OUT"
RESULTS=${RESULTS:-op_tests/op_benchmarks/results}
MODE=${MODE:-tune}
LISTS=${LISTS:-"llama3_8b llama3_70b_tp8"}
TIME_LIMIT=${TIME_LIMIT:-420}
BENCH=${BENCH:-1}
MP=${MP:-1}
NSETS=${NSETS:-}
EXCLUDE_N=${EXCLUDE_N:-}  # e.g. "128256,16032": leave out the lm_head projections
EXTRA=${EXTRA:-}
LOG="$OUT/tune.log"
SHAPES=/tmp/tuner_shapes.csv  # not under $OUT: at most 8 files come back

nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$LOG"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, "gpus", torch.cuda.device_count())' \
    | tee -a "$LOG"

# shape_list OUT TUNED_FILE LIST...: the shipped lists (M restricted to $NSETS when set); with TUNED_FILE only the
# shapes that file has a row for on this device.
shape_list() {
    python3 - "$NSETS" "$EXCLUDE_N" "$@" <<'PY'
import sys
import aiter_gemm
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.capture import untuned_row
from aiter_gemm.configs import BF16_UNTUNED_COLUMNS, load_untuned
from aiter_gemm.fileio import atomic_write_text, render_csv
from gradlib.results import tuned_problems
nsets, exclude, out, tuned, lists = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
ms = {int(m) for m in nsets.split(",") if m.strip()}
skip_n = {int(n) for n in exclude.split(",") if n.strip()}
probs = [GemmProblem(*k) for name in lists for k in load_untuned(f"configs/model_configs/{name}_untuned_gemm.csv")]
probs = [p for p in dict.fromkeys(probs) if (not ms or p.M in ms) and p.N not in skip_n]
if tuned != "-":
    have = tuned_problems(tuned, aiter_gemm.current_device_identity(True))
    probs = [p for p in probs if p in have]
atomic_write_text(out, render_csv(BF16_UNTUNED_COLUMNS, [untuned_row(p) for p in probs]))
print(f"{len(probs)} shapes from {' '.join(lists)}{' (tuned ones)' if tuned != '-' else ''} -> {out}")
PY
}

if [ "$MODE" = mp ]; then
    shape_list "$SHAPES" - $LISTS | tee -a "$LOG"
    for n in 1 "$MP"; do
        rm -f "$OUT/mp$n.csv"
        t0=$(date +%s.%N)
        timeout -s INT -k 30 "$TIME_LIMIT" python3 -m gradlib.gemm_tuner -i "$SHAPES" -o "$OUT/mp$n.csv" \
            --mp "$n" $EXTRA > "$OUT/mp$n.log" 2>&1
        rc=$?
        t1=$(date +%s.%N)
        rm -f "$OUT"/*.lock
        tail -n 1 "$OUT/mp$n.log"
        echo "mp=$n rc=$rc wall_s=$(python3 -c "print(round($t1 - $t0, 1))") rows=$(($(wc -l < "$OUT/mp$n.csv") - 1))" \
            | tee -a "$OUT/mp_wall.txt"
    done
    exit 0
fi

TUNED="$OUT/h100_bf16_tuned_gemm.csv"
PROFILE="$OUT/h100_tuner_profile.csv"
SUMMARY="$OUT/h100_tuner_summary.csv"
for f in "$TUNED" "$SUMMARY"; do
    [ -f "$RESULTS/$(basename "$f")" ] && cp "$RESULTS/$(basename "$f")" "$f"
done
# The profile (every candidate of every shape) outgrows the 16 MiB return limit as CSV: it travels gzipped.
[ -f "$RESULTS/$(basename "$PROFILE").gz" ] && gunzip -c "$RESULTS/$(basename "$PROFILE").gz" > "$PROFILE"

shape_list "$SHAPES" - $LISTS | tee -a "$LOG"
t0=$(date +%s)
timeout -s INT -k 60 "$TIME_LIMIT" python3 -m gradlib.gemm_tuner -i "$SHAPES" -o "$TUNED" --mp "$MP" \
    --profile_file "$PROFILE" --summary_file "$SUMMARY" --batch 1 --verbose $EXTRA 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "tuner exit status $rc after $(($(date +%s) - t0)) s (124/130: time limit reached; rerun to resume)" | tee -a "$LOG"

if [ "$BENCH" = 1 ] && [ -f "$TUNED" ]; then
    # gemm_a16w16 replaying the tuned rows against F.linear in one process, on every shape tuned so far
    # (bench_tuned_gemm.py: CUDA-graph replay, L2-sized rotating buffers, medians).
    shape_list "$SHAPES" "$TUNED" $LISTS | tee -a "$LOG"
    AITER_CONFIG_GEMM_BF16="$(realpath "$TUNED")" python3 -m op_tests.op_benchmarks.bench_tuned_gemm --shapes "$SHAPES" \
        --no_compile --profile_file "$PROFILE" --out_dir "$OUT/bench" > "$OUT/bench.log" 2>&1
    echo "benchmark exit status $?" | tee -a "$LOG"
    tail -n 40 "$OUT/bench.log"
fi
[ -f "$PROFILE" ] && gzip -f "$PROFILE"
rm -f "$OUT"/*.lock
ls -laR "$OUT"
