"""Shared test set-up: the Triton interpreter on CPU-only machines, the ``gpu`` and ``interpreted`` markers, a clean
runtime per test."""

from __future__ import annotations

import os
import sys

import torch

# Must happen before any Triton kernel is defined (kernel modules read it at import): CPU-only machines run
# Triton kernels through the interpreter, on CPU tensors.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

HAS_GPU = torch.cuda.is_available()
_AITER_VARS = ("AITER_CONFIG_", "AITER_TUNE_GEMM", "AITER_UNTUNED_GEMM_FILE", "AITER_LOG_TUNED_CONFIG",
               "AITER_GEMM_ARCH", "AITER_GEMM_CU_NUM", "AITER_GEMM_DEVICE_NAME", "AITER_GEMM_TRITON_CONFIGS",
               "AITER_GEMM_SGLANG_TILELANG_DIR", "AITER_GEMM_PRECOMPILE_WORKERS", "CU_NUM", "GPU_ARCHS", "GTUNE_")


def pytest_collection_modifyitems(config, items):
    from aiter_gemm.kernels.common import INTERPRET

    skips = {}
    if not HAS_GPU:
        skips["gpu"] = pytest.mark.skip(reason="needs a CUDA/ROCm GPU; this machine has none")
    if not INTERPRET:
        skips["interpreted"] = pytest.mark.skip(reason="runs Triton kernels on CPU tensors, which needs "
                                                "TRITON_INTERPRET=1 (set here only on machines without a GPU)")
    for item in items:
        for marker, skip in skips.items():
            if marker in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def cpu_tuner_workers(request, monkeypatch):
    """Tuner workers on CPU even on a GPU machine, the driver off the GPU too: fake backends' sleeps are host time,
    which CUDA-graph timing would not see, and interpreted kernels run on CPU tensors. GPU-marked tests keep it."""
    if request.node.get_closest_marker("gpu"):
        return
    from gradlib import cli

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    # One thread per CPU worker: on a loaded machine a tiny float32 F.linear with OpenMP threads waiting for cores
    # took 16 ms instead of 3 us, enough to reorder the fake candidates the tests rank.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(cli, "worker_devices", lambda mp: [None] * (mp or 1))


@pytest.fixture
def inline(cpu_tuner_workers, virtual_clock, monkeypatch):
    """The tuners' executor is :class:`~op_tests.runtime_helpers.InlineExecutor`: the driver runs the candidates in
    this process (fakes that can neither hang nor crash; monkeypatches reach them)."""
    from gradlib import cli
    from op_tests.runtime_helpers import InlineExecutor

    monkeypatch.setattr(cli, "build_executor", lambda devices, plugins, timeout, ray, env: InlineExecutor(plugins))


@pytest.fixture
def virtual_clock(monkeypatch):
    """Tuner CPU timings read ``op_tests.gradlib_fakes.CLOCK``, in this process and in the workers a test spawns
    (they inherit the variable): a fake backend takes exactly the time it declares and any other runner one tick,
    so which candidate wins never depends on the machine's load."""
    from aiter_gemm import timing
    from op_tests import gradlib_fakes

    monkeypatch.setattr(timing, "cpu_clock", gradlib_fakes.CLOCK)
    monkeypatch.setenv(gradlib_fakes.VIRTUAL_CLOCK_ENV, "1")
    return gradlib_fakes.CLOCK


@pytest.fixture
def device() -> str:
    """The device tests run on: the GPU when there is one, else the CPU."""
    return "cuda" if HAS_GPU else "cpu"


@pytest.fixture
def clean_runtime(monkeypatch):
    """No AITER_* variable from the caller's shell; the runtime reloaded before and after the test."""
    import aiter_gemm

    for name in list(os.environ):
        if name.startswith(_AITER_VARS):
            monkeypatch.delenv(name)
    aiter_gemm.reload_configs()
    yield monkeypatch
    monkeypatch.undo()
    aiter_gemm.reload_configs()


@pytest.fixture
def no_deep_gemm(monkeypatch):
    """``import deep_gemm`` fails, whatever this machine has installed."""
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    return monkeypatch


@pytest.fixture
def fake_dg(monkeypatch):
    """:mod:`op_tests.fake_deep_gemm` installed as ``deep_gemm``; the fake module."""
    import op_tests.fake_deep_gemm as fake

    fake.install(monkeypatch)
    return fake
