#!/usr/bin/env bash
# wsgemm_cluster on one Hopper GPU (issue 14): Triton 3.9 unpacked from .whl39/t39.tar.xz (the device has 3.6, whose
# Gluon cannot take shared memory in inline_asm), nvmath-python from .whl if carried (so the dispatch's cuBLASLt rows
# run), the GPU tests of wsgemm (cluster cases included), then explore_gemv_mma.py --family ws --cluster over SHAPES.
#
#   OUT=/tmp/x SHAPES=64x1280x8192,... COMMIT=$(git rev-parse HEAD) bash op_tests/op_benchmarks/explore_decode_mid/run_wscl_h100.sh
# EXPLORE_ARGS: extra arguments (default "--diag --pairs 8 --deadline_s 330"); EXPLORE_LIMIT_S (default 420);
# RUN_TESTS=0 skips the tests (a rerun of a commit whose tests passed on the device).
# .whl39/t39.tar.xz: the cp312-abi3 Triton 3.9.0 wheel unpacked, without the AMD backend, proton, CUPTI, ptxas,
# nvdisasm and cuobjdump, libtriton.so stripped (strip --strip-all), tar | xz -9e (41.8 MB: the run tool carries 64
# MiB with the tracked files; built by pack_triton39.sh); carry [".whl39"]. ptxas is the device's: CUDA's if
# installed, else Triton 3.6's.
set -u
OUT=${OUT:?set OUT to an output folder}
SHAPES=${SHAPES:?set SHAPES to MxNxK,...}
mkdir -p "$OUT" /tmp/t39
[ -f /tmp/t39/triton/__init__.py ] || xz -dc .whl39/t39.tar.xz | tar -x -C /tmp/t39
sed -i "/backends.amd/d" /tmp/t39/triton-3.9.0.dist-info/entry_points.txt  # the pack has no AMD backend
ls .whl/nvmath_python-*.whl > /dev/null 2>&1 && python -m pip install -q --no-index --no-deps .whl/nvmath_python-*.whl > "$OUT/pip.log" 2>&1
T36=$(python -c "import triton, os; print(os.path.dirname(triton.__file__))")/backends/nvidia/bin
for p in /usr/local/cuda/bin/ptxas "$T36/ptxas-blackwell" "$T36/ptxas"; do [ -x "$p" ] && { PTXAS=$p; break; }; done
export TRITON_PTXAS_PATH=${PTXAS:?no ptxas on this machine} TRITON_PTXAS_BLACKWELL_PATH=$PTXAS
export PYTHONPATH=/tmp/t39:${PYTHONPATH:-}
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, triton.__file__)"
  python -c "import nvmath; print('nvmath', nvmath.__version__)" 2>&1 | tail -1
  echo "commit ${COMMIT:-unknown}; shapes $SHAPES; args ${EXPLORE_ARGS:-}; ptxas $PTXAS"
  "$PTXAS" --version | tail -2
} > "$OUT/env.txt" 2>&1
if [ "${RUN_TESTS:-1}" != 0 ]; then
  timeout -s KILL ${TEST_LIMIT_S:-150} python -m pytest -q -p no:cacheprovider \
    op_tests/op_benchmarks/explore_decode_mid/test_explore_kernels.py -k "wsgemm" > "$OUT/pytest_gpu.log" 2>&1
  rc=$?
  echo "tests rc=$rc" >> "$OUT/env.txt"
  [ $rc = 0 ] || { echo "tests failed: no exploration" >> "$OUT/env.txt"; exit 1; }
fi
timeout -s KILL ${EXPLORE_LIMIT_S:-420} python op_tests/op_benchmarks/explore_decode_mid/explore_gemv_mma.py \
  --family ws --cluster --out "$OUT/explore" --shapes "$SHAPES" ${EXPLORE_ARGS:---diag --pairs 8 --deadline_s 330} \
  > "$OUT/explore.log" 2>&1
echo "explore rc=$?" >> "$OUT/env.txt"
