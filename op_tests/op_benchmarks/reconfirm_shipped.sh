#!/usr/bin/env bash
# Re-confirm the shipped tuned CSVs on this GPU with the current tuner (issue 13): every row's own solution is timed
# against the runtime default and the library call in alternating confirmation rounds, at its M and at the padded M
# it would serve (pad_m_min), and rewritten with its timing mode. Nothing outside $OUT is written; copy the results
# into configs/ after reading them.
#
# Each tuner is stopped by SIGTERM after BF16_LIMIT_S / FP8_LIMIT_S (it saves what finished; rerun to resume).
#
#   OUT=/tmp/reconfirm bash op_tests/op_benchmarks/reconfirm_shipped.sh
set -u
OUT=${OUT:?set OUT to an output folder}
mkdir -p "$OUT/retune/triton"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python -c "import nvmath; print('nvmath', nvmath.__version__)" 2>&1
  git rev-parse HEAD 2>/dev/null
} > "$OUT/retune/env.txt"
/usr/bin/time -v timeout -s TERM ${BF16_LIMIT_S:-390} python -m gradlib.gemm_tuner -i configs/bf16_tuned_gemm.csv \
  --candidates_from configs/bf16_tuned_gemm.csv --libtype all --mp 1 \
  -o "$OUT/retune/bf16_tuned_gemm.csv" -o2 "$OUT/retune/bf16_profile.csv" \
  --summary_file "$OUT/retune/bf16_summary.csv" > "$OUT/retune/bf16.log" 2>&1
echo "bf16 rc=$?" >> "$OUT/retune/env.txt"
/usr/bin/time -v timeout -s TERM ${FP8_LIMIT_S:-170} python -m gradlib.tune_a8w8_blockscale -i configs/a8w8_blockscale_tuned_gemm.csv \
  --candidates_from configs/a8w8_blockscale_tuned_gemm.csv --mp 1 \
  -o "$OUT/retune/a8w8_blockscale_tuned_gemm.csv" --json_dir "$OUT/retune/triton" \
  -o2 "$OUT/retune/a8w8_blockscale_profile.csv" > "$OUT/retune/a8w8_blockscale.log" 2>&1
echo "blockscale rc=$?" >> "$OUT/retune/env.txt"
