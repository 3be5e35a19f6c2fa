"""Runnable examples of ``aiter_gemm`` in real models, run from the checkout's root (``python -m examples.<name>``;
not installed with the package: they use the tuner ``gradlib`` and the benchmarks' report): ``hf_decode`` captures,
checks and measures the GEMMs of a Hugging Face causal LM patched with :func:`aiter_gemm.nn.patch_linear`."""
