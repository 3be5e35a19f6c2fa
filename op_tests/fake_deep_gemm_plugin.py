"""Tuner ``--plugin`` for CPU tests: importing it installs :mod:`op_tests.fake_deep_gemm` (in every worker) and
registers ``fake_slow_blockscale`` (:mod:`op_tests.fake_scaled_mm_plugin`), a 50-ms rival."""

import op_tests.fake_scaled_mm_plugin  # noqa: F401 - registers fake_slow_blockscale
from op_tests.fake_deep_gemm import install

install()
