# Sourced by the device scripts (from the repository root): the package on PYTHONPATH, wheels carried in .whl/
# (nvmath-python for the cuBLASLt backend, transformers for the HF loop) installed to /tmp/site when a module the
# script needs is missing, and env_header FILE: date, GPU, versions and COMMIT appended to FILE.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# need_wheels MODULE...: install the carried wheels unless every module imports.
need_wheels() {
  local mods; mods=$(IFS=,; echo "$*")
  if ! python -c "import $mods" 2>/dev/null && ls .whl/*.whl > /dev/null 2>&1; then
    python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \
      export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
}

# need_tilelang PACK: unpack the TileLang pack (tools/pack_tilelang.sh) to /tmp/tl unless tilelang imports.
need_tilelang() {
  if ! python -c "import tilelang" 2>/dev/null && [ -f "$1" ]; then
    mkdir -p /tmp/tl && tar -xJf "$1" -C /tmp/tl && \
      export PYTHONPATH="$PYTHONPATH:/tmp/tl" LD_LIBRARY_PATH="/tmp/tl/z3/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
}

# step NAME LIMIT_S COMMAND...: run COMMAND unless STEPS (default all) leaves NAME out, its output appended to $LOG,
# stopped by SIGTERM after LIMIT_S (a benchmark's CSV then holds every shape finished by then).
step() {
  local name=$1 limit=$2; shift 2
  case " ${STEPS:-all} " in *" all "*|*" $name "*) ;; *) return ;; esac
  local s; s=$(date +%s)
  echo "== $name: $*" >> "$LOG"
  timeout -s TERM "$limit" "$@" >> "$LOG" 2>&1
  echo "== $name rc=$? $(( $(date +%s) - s )) s" >> "$LOG"
}

env_header() {
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    python -c "import nvmath; print('nvmath', nvmath.__version__)" 2>&1 | tail -n 1
    python -c "import tilelang; print('tilelang', tilelang.__version__)" 2>&1 | tail -n 1
    python -c "from aiter_gemm import eager_ext; from aiter_gemm.ops import a16w16 as ops; print('eager_ext', 'loaded' if ops.EAGER_EXT else eager_ext.status)" 2>&1 | tail -n 1
    echo "commit ${COMMIT:-unknown}"
  } >> "$1"
}

# fp8_setup: the start of the FP8 scripts: $OUT made, $LOG ($OUT/record.log) emptied and headed (env_header), the
# TileLang pack ($TL_PACK) unpacked unless tilelang imports, BEFORE = the configs of the op before TileLang.
fp8_setup() {
  OUT=${OUT:?set OUT to an output folder}
  mkdir -p "$OUT"
  LOG="$OUT/record.log"
  export COMMIT=${COMMIT:-unknown} TILELANG_CACHE_DIR=${TILELANG_CACHE_DIR:-/tmp/tilelang_cache}
  need_tilelang "${TL_PACK:-tilelang_pack.tar.xz}"
  : > "$LOG"
  env_header "$LOG"
  BEFORE=benchmarks/results/fp8/configs_before_tilelang
}

# fp8_warmup SETS: step "warmup": every kernel the block-scale op's decisions name for the shapes of SETS (a comma list
# of benchmarks/shapes.py sets) compiled in parallel (aiter_gemm.warmup), as a server would at start-up, so the
# benchmark loads them from TileLang's disk cache.
fp8_warmup() {
  step warmup 120 python -c "
import sys
import aiter_gemm
from benchmarks.shapes import build_sets
ident = aiter_gemm.get_dispatcher('gemm_a8w8_blockscale').device(True)
shapes = [p for _, (_, p) in build_sets('gemm_a8w8_blockscale', sys.argv[1], None, ident)]
print(aiter_gemm.warmup(('gemm_a8w8_blockscale',), shapes={'gemm_a8w8_blockscale': shapes}))" "$1"
}
