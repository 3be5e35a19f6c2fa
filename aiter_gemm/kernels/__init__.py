"""Triton kernels used by the backends in :mod:`aiter_gemm.backends`."""
