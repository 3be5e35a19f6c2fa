#!/usr/bin/env bash
# Build .whl39/t39.tar.xz, the Triton 3.9.0 that run_wscl_h100.sh unpacks on the device (which has 3.6): the
# cp312-abi3 wheel without the AMD backend, proton, CUPTI, ptxas, nvdisasm and cuobjdump (the device's CUDA ptxas is
# used), libtriton.so stripped; 41.8 MB, so that it fits the run tool's 64 MiB carry beside the tracked files.
# Needs pip with network access (run where the wheel can be downloaded), strip and xz. Takes ~3 min on 2 cores.
set -eu
ROOT=$(git rev-parse --show-toplevel)
TMP=$(mktemp -d)
python -m pip download -q triton==3.9.0 --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d "$TMP/w"
mkdir "$TMP/p" && python -m zipfile -e "$TMP"/w/triton-3.9.0-*.whl "$TMP/p"
cd "$TMP/p/triton"
rm -rf backends/amd _C/libproton.so backends/nvidia/lib/cupti backends/nvidia/lib/cupti-blackwell \
  backends/nvidia/bin/ptxas backends/nvidia/bin/ptxas-blackwell backends/nvidia/bin/nvdisasm \
  backends/nvidia/bin/cuobjdump
strip --strip-all _C/libtriton.so
mkdir -p "$ROOT/.whl39"
cd "$TMP/p" && tar cf - triton triton-3.9.0.dist-info | xz -T0 -9e > "$ROOT/.whl39/t39.tar.xz"
ls -la "$ROOT/.whl39/t39.tar.xz"
rm -rf "$TMP"
