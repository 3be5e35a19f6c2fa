#!/usr/bin/env bash
# Build the TileLang pack for a GPU machine without internet access (docs/tilelang.md): the wheels of TileLang and
# what it needs beyond a CUDA image with torch (apache-tvm-ffi, torch-c-dlpack-ext, z3-solver) unpacked into one
# folder, z3's second copy of its library dropped (z3_solver-*.data/ and libz3.so.4.15, a symlink instead: 45 MB),
# xz-compressed. 0.1.15 for CPython 3.12 on x86-64: 38.5 MB.
#
#   tools/pack_tilelang.sh [OUT.tar.xz] [PYTHON_VERSION]        # default tilelang_pack.tar.xz, 3.12
#   on the GPU machine:  mkdir -p /tmp/tl && tar -xJf tilelang_pack.tar.xz -C /tmp/tl
#                        export PYTHONPATH=/tmp/tl:$PYTHONPATH LD_LIBRARY_PATH=/tmp/tl/z3/lib:$LD_LIBRARY_PATH
set -euo pipefail
out=$(realpath -m "${1:-tilelang_pack.tar.xz}")
py=${2:-3.12}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for spec in tilelang==0.1.15 apache-tvm-ffi==0.1.12 torch-c-dlpack-ext==0.1.5 z3-solver==4.15.4.0; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$work/whl" "$spec"
done
mkdir "$work/site"
for w in "$work"/whl/*.whl; do python3 -m zipfile -e "$w" "$work/site"; done
rm -rf "$work"/site/z3_solver-*.data
lib="$work/site/z3/lib"
if [ -f "$lib/libz3.so.4.15" ] && [ -f "$lib/libz3.so" ]; then rm "$lib/libz3.so.4.15"; ln -s libz3.so "$lib/libz3.so.4.15"; fi
tar -C "$work/site" -cJf "$out" .
ls -l "$out"
