"""Tuner ``--plugin`` for CPU tests: importing it installs :func:`op_tests.fake_scaled_mm.install`."""

from op_tests.fake_scaled_mm import install

install()
