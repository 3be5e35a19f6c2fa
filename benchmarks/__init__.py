"""The benchmark harness: one entry point (``python -m benchmarks.run``) over registered providers (F.linear, the
dispatch, each backend, max-autotune, torch's block-scaled matmul) and named shape sets, timed with the tuner's method
(:mod:`aiter_gemm.timing`: CUDA graphs over rotating inputs larger than the L2, alternating order, paired ratios), one
CSV per benchmark and GPU plus its environment; ``report`` and ``plot`` render BENCHMARKS.md's tables and figures
from those files. Installed with the package (``python -m benchmarks.run`` runs from any folder); the raw results
BENCHMARKS.md quotes (``benchmarks/results/``) and the device scripts stay in the checkout.
"""
