"""Runnable examples of ``aiter_gemm`` in real models (``python -m aiter_gemm.examples.<name>``): ``hf_decode``
captures, checks and measures the GEMMs of a Hugging Face causal LM patched with :func:`aiter_gemm.nn.patch_linear`."""
