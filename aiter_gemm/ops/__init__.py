"""The ops, one module each: :mod:`aiter_gemm.ops.a16w16` (``gemm_a16w16``, ``tgemm``) and
:mod:`aiter_gemm.ops.a8w8_blockscale` (``gemm_a8w8_blockscale``). Each defines its :class:`~aiter_gemm.opspec.OpSpec`,
registers it (:data:`aiter_gemm.registry.OPS`) and holds its public entry points; ``aiter_gemm`` exports them.
"""
