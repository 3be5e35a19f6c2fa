#!/usr/bin/env bash
# Issue 15's loop on a Llama-3.1-8B-shaped Hugging Face model (random bf16 weights), README's three commands:
# capture the GEMM shapes of generate(), tune them, measure prefill and decode patched vs unpatched (eager and
# CUDA-graph replay, batch 1, 8, 32, 64) with a profile of one decode step. Results under $OUT/hf.
#
#   OUT=/tmp/hf COMMIT=$(git rev-parse HEAD) TUNE_ARGS="--libtype cublaslt,torch,skinny" \
#     bash op_tests/op_benchmarks/run_hf_h100.sh
#
# STEPS picks steps (default "capture tune measure"); TUNED=<csv> measures with that tuned file; RESUME_FROM=<csv>
# copies an earlier, interrupted tuner output in first, so the tuner resumes it (it skips shapes already in its
# output); TUNER="python -m gradlib.gemm_tuner" where the package is not pip-installed; MEASURE_ARGS: extra
# hf_decode arguments of the measure step (e.g. "--exec eager --control"); PROFILE=0 skips the profile.
set -u
OUT=${OUT:?set OUT to an output folder}
D="$OUT/hf"
mkdir -p "$D"
{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python -c "import torch, triton, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)"
  python -c "import nvmath; print('nvmath', nvmath.__version__)" 2>&1
  python -c "from aiter_gemm import ops, eager_ext; print('eager_ext', 'loaded' if ops.EAGER_EXT else eager_ext.status)" 2>&1
  echo "commit ${COMMIT:-unknown}; steps ${STEPS:-capture tune measure}; resume from ${RESUME_FROM:-nothing}"
} >> "$D/env.txt"
for step in ${STEPS:-capture tune measure}; do
  s=$(date +%s)
  case $step in
    capture)
      python -m aiter_gemm.examples.hf_decode --config llama3_8b --mode capture --out "$D" > "$D/capture.log" 2>&1 ;;
    tune)
      [ -n "${RESUME_FROM:-}" ] && cp "$RESUME_FROM" "$D/tuned_gemm.csv"
      timeout -s TERM ${TUNE_LIMIT_S:-200} ${TUNER:-gemm-tuner} -i "$D/captured_gemm.csv" -o "$D/tuned_gemm.csv" \
        ${TUNE_ARGS:-} > "$D/tune.log" 2>&1 ;;
    measure)
      python -m aiter_gemm.examples.hf_decode --config llama3_8b --mode measure --out "$D" \
        --tuned "${TUNED:-$D/tuned_gemm.csv}" $([ "${PROFILE:-1}" = 0 ] || echo --profile) ${MEASURE_ARGS:-} \
        > "$D/measure.log" 2>&1 ;;
  esac
  echo "$step rc=$? $(( $(date +%s) - s )) s" >> "$D/env.txt"
done
