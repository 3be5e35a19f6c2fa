"""Tuner ``--plugin`` for CPU tests: importing it installs :func:`op_tests.fake_scaled_mm.install` and registers
``fake_slow_blockscale``, a correct block-scale launcher that takes 50 ms (on the fakes' virtual clock when a test
uses it: a rival torch's fake beats whatever the machine's load)."""

from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref
from gradlib.blockscale import register_launcher
from op_tests.fake_scaled_mm import install
from op_tests.gradlib_fakes import spend


def slow_blockscale(XQ, WQ, xs, ws, out):
    spend(0.05)
    return out.copy_(gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, out.dtype))


install()
register_launcher("fake_slow_blockscale", slow_blockscale)
