"""The ``tilelang`` backend of ``gemm_a8w8_blockscale``: config names and SGLang's JSON values, the one support rule,
the tuner's config space, every variant lowered to sm_90a CUDA source (CPU: TileLang lowers without a GPU), and the
dispatcher taking ``tilelang`` rows or treating them as misses where TileLang cannot run. ``gpu`` tests: numerics
against the float32 reference over odd shapes and both x_scale layouts, CUDA-graph capture, a restart served from
TileLang's disk cache, and a tuned row dispatched.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import aiter_gemm
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import render_csv
from aiter_gemm.kernels import a8w8_blockscale_tilelang as tl
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref, quantize_blockscale
from aiter_gemm.kernels.a8w8_blockscale_tilelang import TileLangConfig, config_space, shape_error
from aiter_gemm.kernels.a8w8_blockscale_tilelang_config import ws_math_registers
from aiter_gemm.ops.a8w8_blockscale import (
    BLOCKSCALE_TUNED_COLUMNS,
    GEMM_A8W8_BLOCKSCALE,
    csv_row,
    gemm_a8w8_blockscale,
    get_GEMM_A8W8_BLOCKSCALE_config,
    parse_choice,
    read_json_configs,
    solution_of,
    write_json_configs,
)
from aiter_gemm.registry import get_backend

ROOT = Path(__file__).resolve().parents[1]
SGLANG_H20 = (ROOT / "op_tests/fixtures/sglang_tilelang"
              / "N=4096,K=4096,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json")
PACKAGE = GEMM_A8W8_BLOCKSCALE.backends
IDENT = DeviceIdentity("sm_90", 132, "cuda")
try:
    import tilelang  # noqa: F401

    HAVE_TILELANG = True
except ImportError:
    HAVE_TILELANG = False
needs_tilelang = pytest.mark.skipif(not HAVE_TILELANG, reason="tilelang not installed (pip install '.[tilelang]')")

# ||out - ref|| / ||ref||, ref = float32 dequantize-and-multiply: the kernels' fp8 products are exact, their float32
# sums differ only in order, and the bf16 output rounds at 2^-9 relative per element.
TOLERANCE = {torch.bfloat16: 8e-3, torch.float16: 2e-3, torch.float32: 1e-3}

#: One config per variant and feature: both orientations, split-K, staged token scales, two math warpgroups, swizzle.
SPREAD = [
    TileLangConfig("base", 128, 128, num_stages=4, threads=256, swizzle=8),
    TileLangConfig("base", 64, 64, num_stages=2, a_scale_shm=True),
    TileLangConfig("base", 64, 128, num_stages=4),
    TileLangConfig("splitK", 64, 64, num_stages=3, split_k=2),
    TileLangConfig("swapAB", 64, 16, num_stages=8),
    TileLangConfig("swapAB", 128, 32, num_stages=4),
    TileLangConfig("splitK_swapAB", 64, 16, num_stages=4, split_k=4),
    TileLangConfig("splitK_swapAB", 64, 32, num_stages=2, split_k=2, b_scale_shm=True),
    # stages of 4 and 2 scale groups (block_K 512 / 256), one with split-K and staged token scales
    TileLangConfig("swapAB", 64, 16, 512, num_stages=3),
    TileLangConfig("splitK_swapAB", 64, 32, 256, num_stages=4, split_k=2, b_scale_shm=True),
    # hand-scheduled warp specialisation: 2 and 3 math warpgroups, 64-wide and scale-block-crossing 192-wide tiles
    TileLangConfig("ws", 128, 128, num_stages=4, threads=384, swizzle=8),
    TileLangConfig("ws", 128, 64, num_stages=2, threads=384),
    TileLangConfig("ws", 128, 192, num_stages=4, threads=384),
    TileLangConfig("ws", 192, 128, num_stages=3, threads=512),
    TileLangConfig("ws", 192, 96, num_stages=4, threads=512),  # the spaces' one-tile config at 128 < M <= 192
    # K split over 2, 3 and 4 math warpgroups, stages of 1 and 2 scale groups, 16-128 tokens
    TileLangConfig("ws_swapAB", 64, 16, 256, num_stages=6, threads=384),
    TileLangConfig("ws_swapAB", 64, 64, num_stages=8, threads=384),
    TileLangConfig("ws_swapAB", 64, 32, num_stages=6, threads=512),
    TileLangConfig("ws_swapAB", 64, 16, num_stages=4, threads=640),
    TileLangConfig("ws_swapAB", 64, 128, num_stages=6, threads=384),
    # token tiles fitted to M (one of 144 tokens, two of 80) and two CTAs an SM (104 registers, half the shared memory)
    TileLangConfig("ws_swapAB", 64, 144, num_stages=6, threads=384),
    TileLangConfig("ws_swapAB", 64, 80, num_stages=8, threads=384),
    TileLangConfig("ws_swapAB", 64, 48, num_stages=6, threads=384, min_blocks=2),
]


def _inputs(M: int, N: int, K: int, device: str = "cpu", seed: int = 0, mmajor: bool = False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g) * torch.logspace(-1, 1, M).unsqueeze(1)  # rows of different magnitude
    w = torch.randn(N, K, generator=g) * torch.logspace(-2, 0, N).unsqueeze(1)
    XQ, WQ, xs, ws = (t.to(device) for t in quantize_blockscale(x, w))
    if mmajor:
        xs = torch.empty_strided(xs.shape, (1, M), device=device).copy_(xs)
    return XQ, WQ, xs, ws


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


# ------------------------------------------------------------------------------------------------ configs


@pytest.mark.parametrize("cfg", SPREAD, ids=lambda c: c.name)
def test_name_and_json_round_trip(cfg):
    assert TileLangConfig.from_name(cfg.name) == cfg
    assert TileLangConfig.from_json(cfg.to_json()) == cfg
    assert parse_choice(cfg.name) == cfg  # told apart from the Triton grammar
    assert solution_of(cfg).libtype == "tilelang"
    assert solution_of(cfg).splitK == (cfg.split_k if cfg.split_k > 1 else 0)


def test_sglang_published_config_values_parse():
    """SGLang's H20 file (Apache-2.0, op_tests/fixtures/sglang_tilelang): every value is a config here, its
    latency_ms / tflops ignored, its c_scale_local kept as read (the kernels always scale in registers)."""
    data = json.loads(SGLANG_H20.read_text())
    cfgs = {int(m): TileLangConfig.from_json(v) for m, v in data.items()}
    assert len(cfgs) == 18
    assert cfgs[1].kernel_type == "splitK_swapAB" and cfgs[1].split_k == 4 and cfgs[1].b_scale_shm
    assert cfgs[4096] == TileLangConfig("base", 64, 64, 128, 2, 128, 1, False, False, True)
    assert {c.kernel_type for c in cfgs.values()} == {"splitK_swapAB", "base"}


@pytest.mark.parametrize("kwargs,text", [
    (dict(kernel_type="gemv", block_M=64, block_N=16), "kernel_type"),
    (dict(kernel_type="base", block_M=64, block_N=64, block_K=64), "block_K must be 128"),
    (dict(kernel_type="base", block_M=64, block_N=64, threads=192), "threads must be"),
    (dict(kernel_type="base", block_M=96, block_N=64), "multiple of 64"),
    (dict(kernel_type="base", block_M=64, block_N=12), "multiple of 8"),
    (dict(kernel_type="base", block_M=64, block_N=256), "one 128-row scale block"),
    (dict(kernel_type="swapAB", block_M=192, block_N=16), "divide or be a multiple"),
    (dict(kernel_type="base", block_M=64, block_N=64, split_k=2), "split_k 1"),
    (dict(kernel_type="splitK", block_M=64, block_N=64), "split_k >= 2"),
    (dict(kernel_type="swapAB", block_M=128, block_N=256, num_stages=8), "shared memory"),
    (dict(kernel_type="base", block_M=64, block_N=64, b_scale_shm=True), "b_scale_shm"),
    (dict(kernel_type="swapAB", block_M=64, block_N=64, a_scale_shm=True), "a_scale_shm"),
    (dict(kernel_type="base", block_M=64, block_N=12, threads=256), "multiple of 8"),
    (dict(kernel_type="ws", block_M=64, block_N=128, threads=256), "block_M 128 or 192"),
    (dict(kernel_type="ws", block_M=128, block_N=128, threads=256), "threads=384"),
    (dict(kernel_type="ws", block_M=128, block_N=160, threads=384), "192 or 256"),
    (dict(kernel_type="ws", block_M=192, block_N=192, threads=512), "registers"),
    (dict(kernel_type="ws", block_M=128, block_N=128, threads=384, split_k=2), "split_k 1"),
    (dict(kernel_type="ws", block_M=128, block_N=128, threads=384, a_scale_shm=True), "do not apply"),
    (dict(kernel_type="ws", block_M=128, block_N=192, threads=384, num_stages=6), "shared memory"),
    (dict(kernel_type="swapAB", block_M=64, block_N=16, block_K=640), "block_K must be 128 times 1..4"),
    (dict(kernel_type="base", block_M=64, block_N=64, block_K=256), "wider stages"),
    (dict(kernel_type="ws", block_M=128, block_N=128, block_K=256, threads=384), "wider stages"),
    (dict(kernel_type="swapAB", block_M=64, block_N=64, block_K=512, num_stages=4), "shared memory"),
    (dict(kernel_type="ws_swapAB", block_M=128, block_N=32, threads=384, num_stages=4), "64 weight rows"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=32, threads=256, num_stages=4), "threads 384, 512 or 640"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=24, threads=384, num_stages=4), "multiple of 16"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=96, threads=640, num_stages=4), "registers"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=32, threads=512, num_stages=4), "multiple of its 3"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=32, threads=384, num_stages=4, split_k=2), "split_k 1"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=32, threads=384, num_stages=4, swizzle=8), "_SW"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=128, block_K=256, threads=384, num_stages=6),
     "shared memory"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=224, threads=384, num_stages=4), "16..208"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=144, threads=512, num_stages=3), "registers"),
    # two CTAs an SM: ws_swapAB only, 104 registers a math thread, half the SM's shared memory
    (dict(kernel_type="swapAB", block_M=64, block_N=16, min_blocks=2), "min_blocks=2"),
    (dict(kernel_type="ws", block_M=128, block_N=64, threads=384, min_blocks=2), "min_blocks=2"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=32, threads=384, num_stages=4, min_blocks=3), "min_blocks=3"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=80, threads=384, num_stages=4, min_blocks=2),
     "112 registers .* more than 104 .* 2 CTA"),
    (dict(kernel_type="ws_swapAB", block_M=64, block_N=64, threads=384, num_stages=6, min_blocks=2),
     "shared memory, more than 113664"),
])
def test_config_rule_rejects(kwargs, text):
    with pytest.raises(ValueError, match=text):
        TileLangConfig(**kwargs)


@pytest.mark.parametrize("name,text", [  # issue 47: out of range (passed, then failed on every call), loose integers
    ("ws-BM128_BN128_BK128_S4_T384_SK1_SW2147483648", "swizzle=2147483648 must be in 0..1024"),
    ("ws-BM128_BN128_BK128_S4_T384_SK1_SW1025", "swizzle=1025 must be in 0..1024"),
    ("ws-BM128_BN128_BK128_S4_T384_SK" + "1" * 5000, "more than 18 digits"),
    ("ws-BM128_BN\u0661\u0662\u0668_BK128_S4_T384_SK1", "ASCII digits"),  # Arabic-Indic 128
])
def test_config_name_ranges(name, text):
    with pytest.raises(ValueError, match=text):
        TileLangConfig.from_name(name)
    assert TileLangConfig.from_name("ws-BM128_BN128_BK128_S4_T384_SK1_SW1024").swizzle == 1024


@pytest.mark.parametrize("value", [128.0, True, "128", 1e23])
def test_json_integers_are_json_integers(value):
    with pytest.raises(ValueError, match="block_N must be an integer"):
        TileLangConfig.from_json({"kernel_type": "ws", "block_M": 128, "block_N": value, "threads": 384})


@pytest.mark.parametrize("M,N,K,text", [
    (16, 4096, 4000, "multiple of 128"),
    (16, 4100, 4096, "multiple of 16"),
    (16, 4096, 384, "equal parts"),
    (0, 4096, 4096, "empty"),
])
def test_shape_rule_rejects(M, N, K, text):
    cfg = TileLangConfig("splitK_swapAB", 64, 16, split_k=2)
    assert text in shape_error(cfg, M, N, K)
    # The backend's why_not is the same rule: a row naming it is a miss, a candidate never timed.
    problem = GemmProblem(M, N, K, False, torch.float8_e4m3fn, torch.bfloat16)
    why = get_backend("tilelang", PACKAGE).why_not(problem, solution_of(cfg), DeviceIdentity("sm_90", 132, "cuda"))
    assert why is not None and text in why


@pytest.mark.parametrize("cfg,K,ok", [
    (TileLangConfig("swapAB", 64, 16, 512, num_stages=3), 4096, True),
    (TileLangConfig("swapAB", 64, 16, 512, num_stages=3), 4224, False),  # 33 K blocks: no whole 4-group stages
    (TileLangConfig("splitK_swapAB", 64, 32, 256, num_stages=4, split_k=2), 1536, True),
    (TileLangConfig("splitK_swapAB", 64, 32, 256, num_stages=4, split_k=2), 1280, False),  # 10 blocks, 2 x 2 groups
])
def test_wide_stages_take_whole_stages_of_k(cfg, K, ok):
    why = shape_error(cfg, 16, 4096, K)
    assert (why is None) == ok and (ok or f"whole {cfg.block_K}-wide stages" in why)
    assert cfg.groups == cfg.block_K // 128 and TileLangConfig.from_name(cfg.name) == cfg


@pytest.mark.parametrize("M", [1, 3, 17, 97, 136, 255, 1000, 5000])
@pytest.mark.parametrize("N,K", [(1040, 4096), (4096, 7168), (7168, 2048), (2112, 7168), (24576, 1536)])
def test_config_space_holds_only_what_runs(M, N, K):
    space = config_space(M, N, K)
    quick = config_space(M, N, K, quick=True)
    assert space and quick and set(quick) <= set(space)
    assert len(set(space)) == len(space)
    for cfg in space:
        assert cfg.problem() is None and shape_error(cfg, M, N, K) is None
    # decode shapes get the swapped types, M >= 64 the warp-specialised kernel
    kinds = {c.kernel_type for c in space}
    assert ("swapAB" in kinds) == (M <= 256) and (("ws" in kinds) == (M >= 64))
    # K split over the math warpgroups up to M = 256, in the quick space too; two CTAs an SM at 16 < M <= 160
    assert ("ws_swapAB" in kinds) == ("ws_swapAB" in {c.kernel_type for c in quick}) == (M <= 256)
    assert any(c.min_blocks == 2 for c in quick) == any(c.min_blocks == 2 for c in space) == (16 < M <= 160)
    # one 192-token tile where two 128-token tiles would be mostly padding, in the quick space too
    tall = {c for c in quick if c.kernel_type == "ws" and c.block_M == 192}
    assert bool(tall) == (128 < M <= 192)


@pytest.mark.parametrize("M", [1, 16, 64, 4096])
def test_tilelang_is_never_the_default(M):
    """Untuned shapes keep the op's existing default (a TileLang pick measured slower: docs/exploration.md)."""
    problem = GemmProblem(M, 4096, 7168, False, torch.float8_e4m3fn, torch.bfloat16)
    assert get_backend("tilelang", PACKAGE).default_for(problem, IDENT) is None


@pytest.mark.parametrize("min_blocks", [1, 2])
@pytest.mark.parametrize("groups", [2, 3, 4])
def test_math_registers_fit_the_launch_pool(groups, min_blocks):
    """setmaxnreg only moves registers inside the pool the CTA launched with (65536 / CTAs an SM / threads a thread,
    in steps of 8): the math warpgroups' increase must fit it beside the 24-register producer, or it never returns."""
    threads = 128 * (groups + 1)
    pool = threads * (65536 // min_blocks // threads // 8 * 8)
    regs = ws_math_registers(groups, min_blocks)
    assert regs % 8 == 0 and 128 * groups * regs + 128 * 24 <= pool
    assert 128 * groups * (regs + 8) + 128 * 24 > pool or regs == 240  # and takes all of it


@pytest.mark.parametrize("M,tiles", [(1, {16}), (40, {32, 48, 64}), (100, {64, 112, 128}), (136, {80, 144}),
                                     (200, {112, 208}), (256, {128})])
def test_ws_swapab_token_tiles_fit_m(M, tiles):
    """ws_swapAB's token tiles (one CTA an SM) hold M in one or two CTAs with little padding, within 208 tokens."""
    quick = config_space(M, 4096, 4096, quick=True)
    assert {c.block_N for c in quick if c.kernel_type == "ws_swapAB" and c.min_blocks == 1} == tiles


def test_reference_orders_sums_as_the_kernels_do():
    XQ, WQ, xs, ws = _inputs(5, 256, 512)
    ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)
    assert _rel_err(tl.gemm_a8w8_blockscale_tilelang_ref(XQ, WQ, xs, ws, torch.float32), ref) < 1e-5


# ------------------------------------------------------------------------------------------------ lowering


def _lower(cfg: TileLangConfig, mmajor: bool, dtype: torch.dtype = torch.bfloat16, N: int = 4096, K: int = 7168):
    import tilelang
    from tilelang import tvm
    from tvm.target import Target

    target = Target(tl.TARGET)
    with tvm.transform.PassContext(opt_level=3, config=tl.pass_configs(cfg)), target:
        return tilelang.lower(tl.build(N, K, cfg, dtype, mmajor), target=target).kernel_source


@needs_tilelang
@pytest.mark.parametrize("mmajor", [False, True], ids=["rows", "mmajor"])
@pytest.mark.parametrize("cfg", SPREAD, ids=lambda c: c.name)
def test_every_variant_lowers_for_sm90a(cfg, mmajor):
    src = _lower(cfg, mmajor)
    assert "wgmma" in src and "tma_load" in src  # Hopper tensor cores fed by the bulk copy engine
    assert "int m" in src  # M is a runtime argument: one kernel serves every M
    if cfg.kernel_type in tl.HAND_SCHEDULED:  # our producer/consumer split: setmaxnreg per role, no block-wide
        # barrier between the roles; ws: a math warpgroup per 64 token rows, ws_swapAB: threads / 128 - 1 split K
        groups = cfg.block_M // 64 if cfg.kernel_type == "ws" else cfg.threads // 128 - 1
        regs = ws_math_registers(groups, cfg.min_blocks)
        assert src.count(f"warpgroup_reg_alloc<{regs}>") == groups and "warpgroup_reg_dealloc<24>" in src
        assert f"__launch_bounds__({cfg.threads}, {cfg.min_blocks})" in src
        assert src.count("__syncthreads()") == 1  # after the barriers' initialisation only: more would deadlock
        assert src.count(".arrive()") >= 2  # full (producer) and empty (math) barriers
    elif cfg.threads > 128:  # registers moved to the two math warpgroups (TileLang may add it at 128 on its own)
        assert "warpgroup_reg_alloc<232>" in src
    assert ("rasterization2D" in src) == bool(cfg.swizzle)
    if cfg.split_k > 1:
        assert src.count('extern "C" __global__') >= 2  # the partial products, then the split-K reduce


@needs_tilelang
@pytest.mark.parametrize("cfg", [TileLangConfig("swapAB", 64, 16, num_stages=4),
                                 TileLangConfig("ws_swapAB", 64, 32, 256, num_stages=6, threads=384)],
                         ids=lambda c: c.kernel_type)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_output_dtypes_lower(dtype, cfg):
    src = _lower(cfg, False, dtype)
    assert ("half_t" if dtype == torch.float16 else "float") in src


# ------------------------------------------------------------------------------------------------ dispatch


@pytest.fixture
def tilelang_rows(clean_runtime, tmp_path):
    """A tuned CSV with one tilelang row for (16, 4096, 7168) on sm_90/132; returns (monkeypatch, the config)."""
    mp = clean_runtime
    cfg = TileLangConfig("splitK_swapAB", 64, 16, num_stages=4, split_k=4)
    path = tmp_path / "bs.csv"
    path.write_text(render_csv(BLOCKSCALE_TUNED_COLUMNS, [csv_row(IDENT, 16, 4096, 7168, cfg, 15.9, kernel_id=3)]))
    mp.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(path))
    mp.setenv("AITER_GEMM_TRITON_CONFIGS", str(tmp_path))
    aiter_gemm.reload_configs()
    return mp, cfg


def test_dispatcher_takes_a_tilelang_row(tilelang_rows):
    """Where TileLang runs, the row's config is what runs: the backend prepares the shape's launcher."""
    mp, cfg = tilelang_rows
    made = []
    mp.setattr(tl, "unavailable_reason", lambda device=None: None)
    mp.setattr(tl, "launcher", lambda N, K, c, dtype: made.append((N, K, c, dtype)) or "runner")
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    disp.reload()
    dec = disp._decide(GemmProblem(16, 4096, 7168, False, torch.float8_e4m3fn, torch.bfloat16), IDENT)
    assert (dec.matched, dec.solution.libtype, dec.solution.kernelName, dec.runner) == (
        "exact", "tilelang", cfg.name, "runner")
    assert made == [(4096, 7168, cfg, torch.bfloat16)]
    assert dec.eager_runner is None  # a cheap launch: eager calls keep the tuned choice


@pytest.mark.parametrize("us", [6.5, 150.0])
@pytest.mark.parametrize("M,eager", [(1, None), (3, None), (4, None), (5, "torch"), (17, "torch"), (4100, "torch")])
def test_tilelang_rows_serve_eager_calls_up_to_m4(clean_runtime, tmp_path, us, M, eager):
    """TileLang rows, short ones included, run in eager calls up to M = 4 (``eager_max_m``: above it, in a model's
    eager step, the cuBLASLt call after a TileLang launch cost about what TileLang saved); above, eager calls run
    torch's block-scaled matmul and captured ones the row's kernel."""
    import op_tests.fake_scaled_mm as fake

    mp = clean_runtime
    mp.setattr(torch.nn.functional, "scaled_mm", torch.nn.functional.scaled_mm, raising=False)
    mp.setattr(fake.torch_impl, "unavailable_reason", fake.torch_impl.unavailable_reason)
    fake.install()
    cfg = TileLangConfig("splitK_swapAB", 64, 16, num_stages=4, split_k=4)
    path = tmp_path / "bs.csv"
    path.write_text(render_csv(BLOCKSCALE_TUNED_COLUMNS, [csv_row(IDENT, M, 4096, 7168, cfg, us, kernel_id=3)]))
    mp.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(path))
    mp.setenv("AITER_GEMM_TRITON_CONFIGS", str(tmp_path))
    mp.setattr(tl, "unavailable_reason", lambda device=None: None)
    mp.setattr(tl, "launcher", lambda N, K, c, dtype: "tilelang runner")
    aiter_gemm.reload_configs()
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    dec = disp._decide(GemmProblem(M, 4096, 7168, False, torch.float8_e4m3fn, torch.bfloat16), IDENT)
    assert (dec.solution.libtype, dec.runner) == ("tilelang", "tilelang runner")
    assert (dec.eager_solution.libtype if dec.eager_solution else None) == eager
    assert dec.as_config()["eager_libtype"] == (eager or "tilelang")


def test_tilelang_row_is_a_miss_where_tilelang_cannot_run(tilelang_rows, caplog):
    """No TileLang (or no Hopper GPU): the row is a miss, said once, and the next level serves the shape."""
    mp, _ = tilelang_rows
    mp.setattr(tl, "unavailable_reason", lambda device=None: "tilelang is not installed (test)")
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    disp.reload()
    on_cpu = DeviceIdentity(IDENT.gfx, IDENT.cu_num, "cpu")  # the row's key, and a default that runs here
    dec = disp._decide(GemmProblem(16, 4096, 7168, False, torch.float8_e4m3fn, torch.bfloat16), on_cpu)
    assert dec.matched == "default" and dec.solution.libtype == "triton"
    assert "libtype 'tilelang' cannot run here (tilelang is not installed (test))" in caplog.text


def test_tilelang_json_bucket_round_trip(tmp_path):
    cfg = TileLangConfig("swapAB", 64, 32, num_stages=8)
    path = tmp_path / "sm_90-GEMM-A8W8_BLOCKSCALE-N=4096-K=7168.json"
    write_json_configs(path, {"M_LEQ_32": cfg, "any": TileLangConfig("base", 128, 128, threads=256)})
    (bound, key, got), *_ = read_json_configs(path)
    assert (bound, key, got) == (32, "M_LEQ_32", cfg)


def test_warmup_precompiles_this_devices_tilelang_rows(tilelang_rows):
    mp, cfg = tilelang_rows
    jobs = []
    backend = get_backend("tilelang", PACKAGE)
    mp.setattr(tl, "unavailable_reason", lambda device=None: None)
    mp.setattr(type(backend), "precompile", lambda self, todo: jobs.extend(todo) or {})
    mp.setattr(tl, "launcher", lambda N, K, c, dtype: "runner")
    disp = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")
    disp.reload()
    mp.setattr(disp, "device", lambda on_gpu: IDENT)
    summary = disp.warm_up(True)
    assert summary["shapes"] == 1 and summary["failed"] == {}
    # the row's shape, plus the TileLang buckets of the shipped per-(N, K) JSON files (always read after the user's)
    ours = [(p.M, p.N, p.K, s.kernelName) for p, s in jobs if (p.N, p.K) == (4096, 7168)]
    assert ours == [(16, 4096, 7168, cfg.name)]


# ------------------------------------------------------------------------------------------------ GPU

gpu = pytest.mark.gpu
needs_hopper = pytest.mark.skipif(not HAVE_TILELANG or tl.unavailable_reason() is not None,
                                  reason=f"TileLang kernels cannot run here: {tl.unavailable_reason()}")
ODD_M = [1, 3, 17, 97, 255, 1000, 5000]
GPU_NK = [(1040, 4096), (4096, 1024)]  # N = 1040: 16 past a multiple of 128, so every tile width leaves a remainder


@pytest.fixture(scope="module")
def compiled_spread():
    if tl.unavailable_reason() is None:
        failed = tl.precompile([(N, K, cfg, torch.bfloat16) for N, K in GPU_NK for cfg in SPREAD])
        assert not failed, failed


@gpu
@needs_hopper
@pytest.mark.parametrize("mmajor", [False, True], ids=["rows", "mmajor"])
@pytest.mark.parametrize("N,K", GPU_NK)
@pytest.mark.parametrize("cfg", SPREAD, ids=lambda c: c.name)
def test_gpu_matches_reference_at_odd_shapes(compiled_spread, cfg, N, K, mmajor):
    run = tl.launcher(N, K, cfg, torch.bfloat16)
    for M in ODD_M:
        XQ, WQ, xs, ws = _inputs(M, N, K, "cuda", seed=M, mmajor=mmajor)
        out = run(XQ, WQ, xs, ws)
        ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)
        assert out.shape == (M, N) and torch.isfinite(out).all(), (cfg.name, M)
        assert _rel_err(out, ref) < TOLERANCE[torch.bfloat16], (cfg.name, M, _rel_err(out, ref))
        assert torch.equal(run(XQ, WQ, xs, ws), out), (cfg.name, M)  # deterministic: no race, no atomics


@gpu
@needs_hopper
@pytest.mark.parametrize("K", [256, 384])
def test_gpu_ws_swapab_with_fewer_stages_than_warpgroups(K):
    """ws_swapAB with 4 math warpgroups on 2 or 3 K blocks: the idle warpgroups hand over zero tiles."""
    cfg = TileLangConfig("ws_swapAB", 64, 16, num_stages=4, threads=640)
    XQ, WQ, xs, ws = _inputs(17, 1040, K, "cuda")
    out = tl.launcher(1040, K, cfg, torch.bfloat16)(XQ, WQ, xs, ws)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


@gpu
@needs_hopper
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_gpu_output_dtypes(dtype):
    cfg = TileLangConfig("splitK_swapAB", 64, 16, num_stages=4, split_k=2)
    XQ, WQ, xs, ws = _inputs(17, 1040, 1024, "cuda")
    out = tl.launcher(1040, 1024, cfg, dtype)(XQ, WQ, xs, ws)
    assert out.dtype == dtype
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[dtype]


@gpu
@needs_hopper
@pytest.mark.parametrize("cfg", [SPREAD[0], SPREAD[6]], ids=lambda c: c.name)
def test_gpu_cuda_graph_replay(compiled_spread, cfg):
    N, K = GPU_NK[0]
    run = tl.launcher(N, K, cfg, torch.bfloat16)
    XQ, WQ, xs, ws = _inputs(97, N, K, "cuda")
    expect = run(XQ, WQ, xs, ws)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run(XQ, WQ, xs, ws)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = run(XQ, WQ, xs, ws)
    XQ2, WQ2, xs2, ws2 = _inputs(97, N, K, "cuda", seed=5)
    for dst, src in ((XQ, XQ2), (WQ, WQ2), (xs, xs2), (ws, ws2)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, run(XQ2, WQ2, xs2, ws2)) and not torch.equal(out, expect)


@gpu
@needs_hopper
def test_gpu_restart_is_served_from_the_disk_cache(tmp_path):
    """A second process compiles nothing: the kernels come from TileLang's disk cache."""
    code = textwrap.dedent("""
        import json, sys, time, torch
        import tilelang  # imported before the clock starts: ~3 s, once per process
        from aiter_gemm.kernels import a8w8_blockscale_tilelang as tl
        cfg = tl.TileLangConfig("swapAB", 64, 16, num_stages=4)
        t = time.monotonic()
        run = tl.launcher(2048, 1024, cfg, torch.bfloat16)
        print(json.dumps({"s": time.monotonic() - t}))
    """)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "TILELANG_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": path}
    times = []
    for _ in range(2):
        res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, res.stderr[-2000:]
        times.append(json.loads(res.stdout.strip().splitlines()[-1])["s"])
    # cold: nvcc for both layouts (7-8 s on the H100); warm: the cache's load and the CUDA module's, no compiler
    assert times[1] < 0.5 * times[0], times


@gpu
@needs_hopper
def test_gpu_dispatch_runs_a_tuned_tilelang_row(clean_runtime, tmp_path):
    mp = clean_runtime
    ident = aiter_gemm.current_device_identity(True)
    cfg = TileLangConfig("splitK_swapAB", 64, 16, num_stages=4, split_k=2)
    path = tmp_path / "bs.csv"
    path.write_text(render_csv(BLOCKSCALE_TUNED_COLUMNS, [csv_row(ident, 16, 1040, 4096, cfg, 10.0)]))
    mp.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(path))
    aiter_gemm.reload_configs()
    assert aiter_gemm.warmup(("gemm_a8w8_blockscale",))[0]["failed"] == {}
    got = get_GEMM_A8W8_BLOCKSCALE_config(16, 1040, 4096)
    assert (got["libtype"], got["kernelName"], got["matched"]) == ("tilelang", cfg.name, "exact")
    for mmajor in (False, True):
        XQ, WQ, xs, ws = _inputs(16, 1040, 4096, "cuda", mmajor=mmajor)
        out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
        assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]
