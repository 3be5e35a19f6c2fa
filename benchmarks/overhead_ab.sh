#!/usr/bin/env bash
# Dispatch overhead of two checkouts, alternated on one machine (CPU or GPU host): ROUNDS rounds, each running
# `benchmarks.run --bench overhead` in checkouts A and B (alternating which goes first), with the C++ eager path (ext) and without (python).
# Writes $OUT/<tag>_<mode>_<round>_<device>.csv; compare with `python -m benchmarks.run report --table overhead`.
#
#   OUT=benchmarks/results/overhead/cpu_ab A=/path/to/old/checkout B=. ROUNDS=8 bash benchmarks/overhead_ab.sh
# (FIRST=5 ROUNDS=8 adds rounds 5-8 to an earlier run's folder.)
set -eu
OUT=${OUT:?set OUT}; A=${A:?set A (checkout)}; B=${B:?set B (checkout)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
for r in $(seq "${FIRST:-1}" "${ROUNDS:-4}"); do
  # odd rounds A first, even rounds B first: neither checkout always runs on a machine warmed by the other
  for side in $([ $((r % 2)) = 1 ] && echo A B || echo B A); do
    dir=${!side}
    for mode in ext python; do
      flag=$([ "$mode" = python ] && echo off || echo auto)
      (cd "$dir" && AITER_GEMM_EAGER_EXT=$flag PYTHONPATH=$PWD python -m benchmarks.run --bench overhead \
        --calls "${CALLS:-5000}" --repeats "${REPEATS:-11}" --out "$OUT" --name "${side}_${mode}_$r")
    done
  done
done
