#!/usr/bin/env bash
# Multi-GPU tuning of record (BENCHMARKS.md, "Multi-GPU and Ray"; a machine of N >= 2 GPUs, no internet): tune the
# same shapes from scratch with --mp 1 and then with --ray on a one-node Ray cluster started here with N GPUs, and
# record the wall times (and --mp N's, for comparison with the process pool) in $OUT/ray_wall.txt.
#
#   Here, once (needs PyPI; writes git-ignored .whl/ray/):   MODE=wheels bash benchmarks/device/ray_multi_gpu.sh
#   On the device (carry .whl):                              bash benchmarks/device/ray_multi_gpu.sh
#
# Ray is not in the device image, and its wheel (79 MB: 32 MB of it the Java workers' jar) exceeds what a call
# carries (64 MiB in all), so MODE=wheels downloads ray==$RAY_VERSION for CPython 3.12 and repacks it without the
# parts a Python-only Ray core never loads: ray/jars (Java workers), the libraries rllib/tune/train/serve/data/llm/
# air and the dashboard's web UI (ray/dashboard/client); RECORD is rewritten so pip installs it as usual. Ray's
# requirements missing from the image (jsonschema and its three dependencies) come along. ~40 MB in all.
#
# Knobs: N (GPUs and actors, default: all visible), NSETS (M values, default 1,16,128,1024,4096), LISTS (shipped
# shape lists, default llama3_8b), LIBTYPE (default: torch,cublaslt,skinny where available), TIME_LIMIT (seconds per
# tuner run, default 130), MP1=0 (skip the --mp 1 run), WARMUP=0 (skip the untimed warm-up run), EXTRA (more
# tuner flags).
# Output under $OUT (8 files): ray_wall.txt (wall time per run, then winners compared), warmup.log, mp1.log,
# mpN.log, ray.log (each tuner's whole output), env.txt (GPUs, versions, 'ray start' output), shapes.csv,
# ray_tuned.csv.
# Time: four tuner runs of at most TIME_LIMIT s plus ~1 min of set-up: keep 4 * TIME_LIMIT + 60 under the call's.
set -uo pipefail
cd "$(dirname "$0")/../.."
RAY_VERSION=${RAY_VERSION:-2.60.0}
WHL=.whl/ray

if [ "${MODE:-run}" = wheels ]; then
    set -e
    rm -rf "$WHL" && mkdir -p "$WHL"
    plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64
          --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64
          --platform manylinux1_x86_64)
    python3 -m pip download -q --no-deps "${plat[@]}" -d "$WHL" "ray==$RAY_VERSION" jsonschema==4.26.0 \
        jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
    python3 - "$WHL"/ray-"$RAY_VERSION"-*.whl <<'PY'
import base64, hashlib, os, sys, zipfile
src = sys.argv[1]
DROP = ("ray/jars/", "ray/rllib/", "ray/tune/", "ray/train/", "ray/serve/", "ray/data/", "ray/llm/", "ray/air/",
        "ray/dashboard/client/")
tmp = src + ".slim"
record = []
with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
    rec_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
    for info in zin.infolist():
        if info.filename.startswith(DROP) or info.filename == rec_name:
            continue
        data = zin.read(info)
        zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
        if not info.is_dir():
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{info.filename},sha256={digest},{len(data)}")
    record.append(f"{rec_name},,")
    zout.writestr(rec_name, "\n".join(record) + "\n")
os.replace(tmp, src)
print(f"{src}: {os.path.getsize(src) / 1e6:.1f} MB after dropping {', '.join(DROP)}")
PY
    du -ch "$WHL"/*.whl
    exit 0
fi

# A one-node cluster of our own on an isolated machine: no token. (Ray 2.60 turns token auth on when a token file
# exists, and in a local check drivers joining by address were refused by such a cluster unless RAY_AUTH_MODE=token.)
export PYTHONUNBUFFERED=1 RAY_DISABLE_USAGE_STATS=1 RAY_AUTH_MODE=disabled
OUT=${OUT:-/tmp/ray_out}
mkdir -p "$OUT"
# Ray from the carried wheels when the image lacks it.
if ! python3 -c "import ray" 2>/dev/null; then
    ls "$WHL"/*.whl >/dev/null 2>&1 || { echo "no Ray and no wheels in $WHL: run MODE=wheels here and carry .whl"; exit 2; }
    # .whl/*.whl and .whl/extra/*.whl: the project's other carried wheels (nvmath-python and the cuda-core it
    # needs, for the cublaslt backend), if any.
    shopt -s nullglob
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site_ray "$WHL"/*.whl \
        .whl/*.whl .whl/extra/*.whl || exit 2
    shopt -u nullglob
    export PYTHONPATH=/tmp/site_ray${PYTHONPATH:+:$PYTHONPATH}
    export PATH=/tmp/site_ray/bin:$PATH  # the 'ray' command
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
N=${N:-$(python3 -c 'import torch; print(torch.cuda.device_count())')}
NSETS=${NSETS:-1,16,128,1024,4096}
LISTS=${LISTS:-llama3_8b}
# Default: every available backend but Triton, whose config space compiles for minutes per shape and would make
# both runs time out rather than finish.
LIBTYPE=${LIBTYPE:-$(python3 -c 'from aiter_gemm import registry as backends
print(",".join(n for n in ("torch", "cublaslt", "skinny") if backends.get_backend(n).is_available()))')}
TIME_LIMIT=${TIME_LIMIT:-130}
MP1=${MP1:-1}
WARMUP=${WARMUP:-1}
EXTRA=${EXTRA:-}
read -ra EXTRA_ARGS <<< "$EXTRA"
read -ra LIST_NAMES <<< "$LISTS"
SHAPES=/tmp/ray_shapes.csv  # not under $OUT: 8 files at most come back
WALL="$OUT/ray_wall.txt"
{
    nvidia-smi --query-gpu=index,name,memory.total,clocks.sm,clocks.max.sm --format=csv
    python3 -c 'import torch, triton, ray; print("torch", torch.__version__, "triton", triton.__version__, "ray", ray.__version__, "gpus", torch.cuda.device_count())'
    echo "cpus $(nproc); N=$N LIBTYPE=$LIBTYPE NSETS=$NSETS LISTS=$LISTS TIME_LIMIT=$TIME_LIMIT EXTRA=$EXTRA"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ "$N" -lt 1 ]; then echo "no GPU visible"; exit 2; fi

python3 - "$NSETS" "$SHAPES" "${LIST_NAMES[@]}" <<'PY'
import sys
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.capture import untuned_row
from aiter_gemm.configs import BF16_UNTUNED_COLUMNS, load_untuned
from aiter_gemm.fileio import atomic_write_text, render_csv
nsets, out, lists = sys.argv[1], sys.argv[2], sys.argv[3:]
ms = {int(m) for m in nsets.split(",") if m.strip()}
probs = [GemmProblem(*k) for name in lists for k in load_untuned(f"configs/model_configs/{name}_untuned_gemm.csv")]
probs = [p for p in dict.fromkeys(probs) if not ms or p.M in ms]
atomic_write_text(out, render_csv(BF16_UNTUNED_COLUMNS, [untuned_row(p) for p in probs]))
print(f"{len(probs)} shapes from {' '.join(lists)} (M in {nsets}) -> {out}")
PY
cp "$SHAPES" "$OUT/shapes.csv"

# run NAME FLAGS...: tune $SHAPES from scratch into /tmp/NAME.csv, log to $OUT/NAME.log, append the wall time.
run() {
    local name=$1; shift
    rm -f "/tmp/$name.csv" "/tmp/$name.csv.lock"
    local t0 t1 rc
    t0=$(date +%s.%N)
    timeout -s INT -k 30 "$TIME_LIMIT" python3 -m gradlib.gemm_tuner -i "$SHAPES" -o "/tmp/$name.csv" \
        --libtype "$LIBTYPE" "$@" "${EXTRA_ARGS[@]}" > "$OUT/$name.log" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    tail -n 1 "$OUT/$name.log"
    local rows=0
    [ -f "/tmp/$name.csv" ] && rows=$(($(wc -l < "/tmp/$name.csv") - 1))
    echo "$name flags=[$*] rc=$rc wall_s=$(python3 -c "print(round($t1 - $t0, 1))") rows=$rows" | tee -a "$WALL"
}

: > "$WALL"
# Untimed warm-up: the skinny backend's Triton kernels compile into the on-disk cache that every later run shares.
# Without it the first timed run pays all the compiling (on a fresh 2x H200: --mp 1 took 93 s cold, its first
# shapes 7-21 s each instead of 2-4 s) and the comparison measures the cache, not the workers.
[ "$WARMUP" = 1 ] && run warmup --mp "$N"
[ "$MP1" = 1 ] && run mp1 --mp 1
[ "$N" -gt 1 ] && run "mp$N" --mp "$N"
# One Ray node with N GPUs; the tuner joins it as a driver would join a multi-node cluster (--ray auto).
ray start --head --num-gpus="$N" --num-cpus="$(nproc)" --include-dashboard=false --disable-usage-stats \
    > "$OUT/ray_start.txt" 2>&1 || { cat "$OUT/ray_start.txt"; exit 3; }
run ray --ray auto
ray stop --force > /dev/null 2>&1
[ -f /tmp/ray.csv ] && cp /tmp/ray.csv "$OUT/ray_tuned.csv"
{ echo "--- ray start"; cat "$OUT/ray_start.txt"; } >> "$OUT/env.txt"
rm -f "$OUT/ray_start.txt"

# Same shapes, same winners? Winners whose times are within 5% of each other may differ by noise between runs.
python3 - /tmp/mp1.csv "/tmp/mp$N.csv" /tmp/ray.csv <<'PY' | tee -a "$WALL"
import os, sys
from aiter_gemm.fileio import read_csv_rows
runs = {os.path.basename(p)[:-4]: {tuple(r[c] for c in ("M", "N", "K", "bias")): r for r in read_csv_rows(p)[1]}
        for p in sys.argv[1:] if os.path.isfile(p)}
if "ray" not in runs:
    sys.exit("no ray result")
for name, rows in runs.items():
    if name == "ray":
        continue
    common = rows.keys() & runs["ray"].keys()
    same = sum(rows[k]["libtype"] == runs["ray"][k]["libtype"] for k in common)
    close = sum(abs(float(rows[k]["us"]) / float(runs["ray"][k]["us"]) - 1) <= 0.05 for k in common)
    print(f"ray vs {name}: {len(common)} common shapes, same winner libtype on {same}, winner times within 5% on "
          f"{close}; only in {name}: {len(rows.keys() - common)}, only in ray: {len(runs['ray'].keys() - common)}")
PY
ls -la "$OUT"
