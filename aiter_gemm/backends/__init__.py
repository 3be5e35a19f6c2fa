"""The backends of ``gemm_a16w16``, one module per libtype (``<libtype>.py`` exposing ``BACKEND``); other ops keep
theirs in a sub-package (``a8w8_blockscale/``). The contract is :mod:`aiter_gemm.backends.base`; the registry that
finds them is :mod:`aiter_gemm.registry`.
"""
