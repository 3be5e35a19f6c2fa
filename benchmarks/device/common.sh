# shellcheck shell=bash
# Sourced by the device scripts (from the repository root): the package on PYTHONPATH, wheels carried in .whl/
# (nvmath-python for the cuBLASLt backend, transformers for the HF loop) installed to /tmp/site when a module the
# script needs is missing, env_header FILE: date, GPU, versions and COMMIT appended to FILE, and step (below).
# DRY_RUN=1: the steps print their commands and nothing is installed, built or run.
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

# dry: whether this is a dry run (DRY_RUN set).
dry() { [ -n "${DRY_RUN:-}" ]; }

# out_folder NAME: a script's own folder $D = $OUT/NAME (made; OUT must be set) and its log LOG = $D/env.txt.
out_folder() {
  : "${OUT:?set OUT to an output folder}"
  D="$OUT/$1"
  LOG="$D/env.txt"
  mkdir -p "$D"
}

# need_wheels MODULE...: install the carried wheels unless every module imports.
need_wheels() {
  dry && return 0
  local mods; mods=$(IFS=,; echo "$*")
  if ! python -c "import $mods" 2>/dev/null && ls .whl/*.whl > /dev/null 2>&1; then
    python -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \
      export PYTHONPATH="$PYTHONPATH:/tmp/site"
  fi
}

# need_tilelang PACK: unpack the TileLang pack (tools/pack_tilelang.sh) to /tmp/tl unless tilelang imports.
need_tilelang() {
  dry && return 0
  if ! python -c "import tilelang" 2>/dev/null && [ -f "$1" ]; then
    mkdir -p /tmp/tl && tar -xJf "$1" -C /tmp/tl && \
      export PYTHONPATH="$PYTHONPATH:/tmp/tl" LD_LIBRARY_PATH="/tmp/tl/z3/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
}

# need_deepgemm PACK: unpack a built DeepGEMM package (the folder holding deep_gemm/, built against this torch:
# docs/deepgemm.md) to /tmp/dg unless deep_gemm imports; its JIT compiles with $CUDA_HOME's nvcc into $DG_JIT_CACHE_DIR.
need_deepgemm() {
  dry && return 0
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} DG_JIT_CACHE_DIR=${DG_JIT_CACHE_DIR:-/tmp/dg_jit}
  if ! python -c "import deep_gemm" 2>/dev/null && [ -f "$1" ]; then
    mkdir -p /tmp/dg && tar -xJf "$1" -C /tmp/dg && export PYTHONPATH="$PYTHONPATH:/tmp/dg"
  fi
}

# quoted WORD...: the words as a shell reads them back, quoted only where they need it.
quoted() {
  local w out=()
  for w in "$@"; do
    if [[ $w =~ ^[A-Za-z0-9_./:=,@%+-]+$ ]]; then out+=("$w"); else out+=("${w@Q}"); fi
  done
  echo "${out[*]}"
}

# want NAME: whether STEPS (default: all) names step NAME.
want() {
  case " ${STEPS:-all} " in *" all "*|*" $1 "*) return 0 ;; esac
  return 1
}

# step NAME LIMIT_S COMMAND...: run COMMAND unless STEPS (default all) leaves NAME out, stopped by SIGTERM after
# LIMIT_S (a benchmark's CSV then holds every shape finished by then; a tuner saves what finished) and killed 20 s
# later if it is still there. "== NAME: COMMAND" and "== NAME rc=RC S s" go to $LOG, the command's output too (to
# $STEP_LOG instead when set: STEP_LOG=FILE step ...). CALL_DEADLINE (seconds since the epoch; record.sh exports it):
# the limit is cut to the time left, and a step with less than 10 s left is skipped, logged. DRY_RUN=1: the command
# is printed on stdout (shell-quoted), nothing runs.
step() {
  local name=$1 limit=$2; shift 2
  want "$name" || return 0
  if [ -n "${CALL_DEADLINE:-}" ]; then
    local left=$(( CALL_DEADLINE - $(date +%s) ))
    if [ "$left" -lt 10 ]; then
      echo "== $name skipped: $left s left of the call's budget" >> "$LOG"
      return 0
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  if dry; then
    echo "== $name ($limit s): $(quoted "$@")"
    return 0
  fi
  local s rc; s=$(date +%s)
  echo "== $name: $*" >> "$LOG"
  timeout -k 20 -s TERM "$limit" "$@" >> "${STEP_LOG:-$LOG}" 2>&1
  rc=$?
  echo "== $name rc=$rc $(( $(date +%s) - s )) s" >> "$LOG"
}

# build_ext FILE: build the C++ eager path (or find it built) before anything is timed, its output in FILE; one line
# on stdout says how it went. Not with DRY_RUN, nor with BUILD_EXT=0 (CPU smoke runs: the tables time that path).
build_ext() {
  if dry || [ "${BUILD_EXT:-1}" = 0 ]; then
    echo "eager_ext build skipped (DRY_RUN / BUILD_EXT=0)"
    return 0
  fi
  local s rc; s=$(date +%s)
  python -m aiter_gemm.eager_ext > "$1" 2>&1
  rc=$?
  echo "eager_ext build rc=$rc $(( $(date +%s) - s )) s: $(tail -n 1 "$1")"
}

# env_header FILE: date, GPU, versions, the C++ eager path's state and COMMIT appended to FILE (not with DRY_RUN).
# hf_header FOLDER NOTE: the HF loop scripts' start of $LOG: the C++ eager path built (its output in FOLDER/build.log),
# env_header, transformers' version and "steps $STEPS; NOTE".
hf_header() {
  build_ext "$1/build.log" > "$LOG"
  env_header "$LOG"
  dry || python -c "import transformers; print('transformers', transformers.__version__)" 2>&1 | tail -n 1 >> "$LOG"
  echo "steps $STEPS; $2" >> "$LOG"
}

env_header() {
  dry && return 0
  {
    date -u +%Y-%m-%dT%H:%M:%SZ
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
    python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    python -c "import nvmath; print('nvmath', nvmath.__version__)" 2>&1 | tail -n 1
    python -c "import tilelang; print('tilelang', tilelang.__version__)" 2>&1 | tail -n 1
    python -c "import deep_gemm; print('deep_gemm', deep_gemm.__version__)" 2>&1 | tail -n 1
    python -c "from aiter_gemm import eager_ext; from aiter_gemm.ops import a16w16 as ops; print('eager_ext', 'loaded' if ops.EAGER_EXT else eager_ext.status)" 2>&1 | tail -n 1
    echo "commit ${COMMIT:-unknown}"
  } >> "$1" 2>&1
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
  # shellcheck disable=SC2034  # read by the FP8 scripts
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
