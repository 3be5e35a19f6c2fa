"""A8W8 block-scale GEMM: the four Triton variants against the float32 reference, input validation, kernelName and
JSON parsing, and dispatch from a tuned CSV row, a per-(N, K) JSON bucket and the built-in default.

On CPU the kernels run under TRITON_INTERPRET=1 (set by conftest) on small shapes; ``gpu`` tests rerun them in bf16
on a GPU at sizes where the tensor-core fp8 path is used.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path

import pytest
import torch

import aiter_gemm
from aiter_gemm.backends.base import Backend, Solution
from aiter_gemm.configs import ConfigError, load_table
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import read_csv_rows, render_csv
from aiter_gemm.kernels.a8w8_blockscale import (
    VARIANTS,
    BlockscaleConfig,
    config_error,
    config_space,
    default_config,
    gemm_a8w8_blockscale_ref,
    gemm_a8w8_blockscale_triton,
    quantize_blockscale,
)
from aiter_gemm.ops.a8w8_blockscale import (
    BLOCKSCALE_TUNED_COLUMNS,
    GEMM_A8W8_BLOCKSCALE,
    KIND,
    JSONConfigError,
    buckets_from_tuned,
    choice_error,
    csv_row,
    gemm_a8w8_blockscale,
    get_GEMM_A8W8_BLOCKSCALE_config,
    json_config_path,
    parse_choice,
    read_json_configs,
    select_bucket,
    write_json_configs,
)
from aiter_gemm.registry import register_backend, unregister_backend

# ||out - ref|| / ||ref|| bounds, ref = float32 dequantize-and-multiply. Both sides see the same fp8 inputs and
# scales, so the only differences are accumulation order and the output rounding:
TOLERANCE = {
    torch.bfloat16: 8e-3,  # bf16 output: 8 mantissa bits, relative rounding up to 2^-9 = 2e-3 per element
    torch.float16: 2e-3,  # fp16 output: 11 bits, 2^-12 = 2.4e-4 per element, x4 margin plus fp8-MMA accumulation
    torch.float32: 1e-3,  # fp32 output: summation order; on GPU fp8 MMA's reduced-precision accumulation per 128 K
}

# A config per variant small enough for the interpreter; tiles 16 x 32 on the interpreter's fp32 dot.
SMALL = {
    "base": BlockscaleConfig("base", 16, 32, 128, 2, 1, 4, 2),
    "swapAB": BlockscaleConfig("swapAB", 16, 32, 128, 1, 1, 4, 2),
    "splitK": BlockscaleConfig("splitK", 32, 64, 128, 1, 2, 4, 2),
    "splitK_swapAB": BlockscaleConfig("splitK_swapAB", 16, 32, 128, 1, 3, 4, 2),
}


def _inputs(M: int, N: int, K: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # Rows of x with different magnitudes and w with different block magnitudes so wrong scale indexing shows.
    x = torch.randn(M, K, generator=g) * torch.logspace(-1, 1, M).unsqueeze(1)
    w = torch.randn(N, K, generator=g) * torch.logspace(-2, 0, N).unsqueeze(1)
    return tuple(t.to(device) for t in quantize_blockscale(x, w))


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


# ------------------------------------------------------------------------------------------------ kernels


@pytest.mark.parametrize("loads", ["ptr", "tma", "tma_ws"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("M,N,K", [(1, 128, 256), (3, 256, 384), (17, 128, 512), (130, 256, 256)])
def test_variants_match_reference(variant, M, N, K, loads, device):
    XQ, WQ, xs, ws = _inputs(M, N, K, device)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device=device)  # poisoned: all must be written
    cfg = dataclasses.replace(SMALL[variant], TMA=loads != "ptr", WARP_SPECIALIZE=loads == "tma_ws")
    gemm_a8w8_blockscale_triton(XQ, WQ, xs, ws, cfg, out)
    assert not out.isnan().any()
    ref = gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)
    assert _rel_err(out, ref) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("variant", ["base", "splitK_swapAB"])
def test_output_dtypes(variant, dtype, device):
    XQ, WQ, xs, ws = _inputs(5, 128, 384, device, seed=1)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws, dtype=dtype, config=SMALL[variant])
    assert out.dtype == dtype and out.shape == (5, 128)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[dtype]


@pytest.mark.parametrize("splits", [2, 3, 4, 7])
def test_split_k_uneven_ranges(splits, device):
    """7 K blocks over 2, 3, 4 or 7 splits: uneven ranges and (for 4: 2,2,2,1) a short last split."""
    XQ, WQ, xs, ws = _inputs(9, 128, 7 * 128, device, seed=2)
    cfg = BlockscaleConfig("splitK", 16, 64, 128, 1, splits, 4, 2)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws, config=cfg)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


def test_strided_inputs(device):
    """Non-contiguous views: XQ a column slice, x_scale M-major (as cuBLAS wants it), w_scale transposed twice."""
    XQ, WQ, xs, ws = _inputs(6, 256, 256, device, seed=3)
    wide = torch.zeros(6, 512, dtype=torch.float32, device=device)
    wide[:, 128:384] = XQ.float()
    XQ_view = wide.to(XQ.dtype)[:, 128:384]
    xs_mmajor = xs.t().contiguous().t()
    for variant in ("base", "swapAB"):
        out = gemm_a8w8_blockscale(XQ_view, WQ, xs_mmajor, ws, config=SMALL[variant])
        assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("name", ["base-BM16_BN256_BK128_GM1_SK1_W4_S2", "swapAB-BM16_BN256_BK128_GM1_SK1_W4_S2",
                                  "splitK_swapAB-BM32_BN256_BK128_GM1_SK2_W4_S2_TMA"])
def test_tiles_wider_than_a_scale_block(name, device):
    """A 256-wide tile spans two 128-row weight scale blocks: the per-element scale path (not the scalar one)."""
    XQ, WQ, xs, ws = _inputs(19, 384, 256, device, seed=5)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws, config=name)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("name", [
    "base-BM16_BN64_BK128_GM2_SK1_W4_S2_NS2", "base-BM16_BN64_BK128_GM2_SK1_W4_S2_NS2_TMA",
    "splitK-BM32_BN256_BK128_GM1_SK2_W4_S2_NS2_TMA", "swapAB-BM32_BN32_BK128_GM1_SK1_W4_S2_NS2",
    "splitK_swapAB-BM32_BN64_BK128_GM1_SK2_W4_S2_NS2_TMA",
])
@pytest.mark.parametrize("M,N,K", [(5, 2112 // 8, 7 * 128), (19, 384, 256), (130, 256, 386)])
def test_n_subtiles(name, M, N, K, device):
    """Two column halves per K block: second half partly or wholly past N, scalar and per-column scales."""
    XQ, WQ, xs, ws = _inputs(M, N, K, device, seed=6)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws, config=name)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("variant", ["base", "splitK_swapAB"])
@pytest.mark.parametrize("M,N,K", [(5, 2112 // 8, 7 * 128), (3, 576 // 2, 456), (4, 97, 386)])
def test_partial_scale_blocks(variant, tma, M, N, K, device):
    """N and K off the 128 grid (DeepSeek-V3's N = 2112 and 576, scaled down): the last scale block is partial,
    K's last tile is masked (pointer loads) or zero-filled (TMA; K = 386 is misaligned and falls back)."""
    XQ, WQ, xs, ws = _inputs(M, N, K, device, seed=4)
    assert ws.shape == (-(-N // 128), -(-K // 128))
    cfg = dataclasses.replace(SMALL[variant], TMA=tma)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws, config=cfg)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


def test_empty_m(device):
    XQ, WQ, xs, ws = _inputs(1, 128, 128, device)
    out = gemm_a8w8_blockscale(XQ[:0], WQ, xs[:0], ws)
    assert out.shape == (0, 128)


# ------------------------------------------------------------------------------------------------ validation


def _bad(device):
    XQ, WQ, xs, ws = _inputs(4, 256, 256, device)
    return {
        "XQ dtype": ((XQ.float(), WQ, xs, ws), TypeError, "XQ (shape (4, 256), dtype torch.float32)"),
        "WQ dtype": ((XQ, WQ.to(torch.bfloat16), xs, ws), TypeError, "WQ (shape (256, 256), dtype torch.bfloat16)"),
        "x_scale dtype": ((XQ, WQ, xs.half(), ws), TypeError, "x_scale (shape (4, 2), dtype torch.float16)"),
        "w_scale shape": ((XQ, WQ, xs, ws[:1]), ValueError, "w_scale (shape (1, 2), dtype torch.float32)"),
        "x_scale shape": ((XQ, WQ, xs[:3], ws), ValueError, "x_scale (shape (3, 2), dtype torch.float32)"),
        "K mismatch": ((XQ, WQ[:, :128], xs, ws[:, :1]), ValueError, "WQ (shape (256, 128)"),
        "N partial, w_scale short": ((XQ, WQ[:200], xs, ws[:1]), ValueError,
                                     "must be (ceil(N/128), ceil(K/128)) = (2, 2)"),
        "K partial, x_scale long": ((XQ[:, :200], WQ[:, :200], torch.cat([xs, xs], 1), ws), ValueError,
                                    "x_scale (shape (4, 4), dtype torch.float32) must be (M, ceil(K/128)) = (4, 2)"),
        "3-D XQ": ((XQ.unsqueeze(0), WQ, xs, ws), ValueError, "XQ (shape (1, 4, 256)"),
    }


@pytest.mark.parametrize("case", list(_bad("cpu")))
def test_validation_names_tensor(case, device):
    args, exc, text = _bad(device)[case]
    with pytest.raises(exc, match=re.escape(text)):
        gemm_a8w8_blockscale(*args)


@pytest.mark.parametrize("case", list(_bad("cpu")) + ["w_scale on meta", "WQ on meta"])
def test_validation_after_a_valid_call_of_the_same_shapes(case, device):
    """The cached entry of a valid call never serves bad operands (issue 31 asked for the block-scale op too): the
    key holds every property the checks look at, devices included."""
    XQ, WQ, xs, ws = _inputs(4, 256, 256, device)
    gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    gemm_a8w8_blockscale(XQ, WQ, xs, ws)  # the cached entry (the C++ one where built)
    if case == "w_scale on meta":
        args, exc, text = (XQ, WQ, xs, ws.to("meta")), ValueError, "w_scale (shape (2, 2), dtype torch.float32) is on"
    elif case == "WQ on meta":
        args, exc, text = (XQ, WQ.to("meta"), xs, ws), ValueError, "is on meta"
    else:
        args, exc, text = _bad(device)[case]
    with pytest.raises(exc, match=re.escape(text)):
        gemm_a8w8_blockscale(*args)


def test_bad_output_dtype(device):
    XQ, WQ, xs, ws = _inputs(2, 128, 128, device)
    with pytest.raises(TypeError, match="output dtype"):
        gemm_a8w8_blockscale(XQ, WQ, xs, ws, dtype=torch.int8)


# ------------------------------------------------------------------------------------------------ configs


def test_kernel_name_round_trip():
    cfg = BlockscaleConfig.from_name("splitK_swapAB-BM16_BN128_BK128_GM1_SK4_W4_S3")
    assert (cfg.variant, cfg.BLOCK_SIZE_M, cfg.BLOCK_SIZE_N, cfg.NUM_KSPLIT, cfg.num_warps, cfg.num_stages) == \
        ("splitK_swapAB", 16, 128, 4, 4, 3)
    assert cfg.name == "splitK_swapAB-BM16_BN128_BK128_GM1_SK4_W4_S3"
    assert BlockscaleConfig.from_json(cfg.to_json()) == cfg
    flagged = BlockscaleConfig.from_name("base-BM128_BN256_BK128_GM8_SK1_W8_S3_NS2_TMA_WS")
    assert flagged.TMA and flagged.WARP_SPECIALIZE and flagged.N_SUBTILES == 2
    assert flagged.name.endswith("_S3_NS2_TMA_WS")
    assert BlockscaleConfig.from_json(flagged.to_json()) == flagged


@pytest.mark.parametrize("name", [
    "swapAB-BM16_BN128_BK64_GM1_SK1_W4_S3",  # BK must be 128
    "fancy-BM16_BN128_BK128_GM1_SK1_W4_S3",  # unknown variant
    "splitK-BM16_BN128_BK128_GM1_SK1_W4_S3",  # splitK with one split
    "base-BM16_BN128_BK128_GM1_SK2_W4_S3",  # base with splits
    "base-BM24_BN128_BK128_GM1_SK1_W4_S3",  # tile not a power of two
    "base-BM16_BN128_BK128_GM1_SK1_W3_S3",  # 3 warps
    "base-BM16_BN128_BK128_GM1_SK1_W4",  # missing field
    "base-BM16_BN128_BK128_GM1_SK1_W4_S3_WS_TMA",  # flags out of order
    "base-BM16_BN128_BK128_GM1_SK1_W4_S3_NS4",  # 2 subtiles at most
    "swapAB-BM16_BN128_BK128_GM1_SK1_W4_S3_NS2",  # 8-wide subtiles on the MMA's N side
    "base-BM16_BN128_BK128_GM1_SK1_W4_S3 extra",
    "base-BM16_BN128_BK128_GM2147483648_SK1_W4_S3",  # issue 47: out of range, failed on every call
    "base-BM16_BN128_BK128_GM1025_SK1_W4_S3",
    "splitK-BM16_BN128_BK128_GM1_SK257_W4_S3",
    "base-BM16_BN128_BK128_GM1_SK1_W4_S" + "3" * 5000,
    "base-BM\u0661\u0666_BN128_BK128_GM1_SK1_W4_S3",  # Arabic-Indic 16
])
def test_kernel_name_strict(name):
    with pytest.raises(ValueError):
        BlockscaleConfig.from_name(name)


@pytest.mark.parametrize("M,N,K", [(1, 7168, 2304), (16, 1536, 7168), (256, 4096, 512), (4096, 10240, 8192)])
def test_config_space_is_valid_and_covers_variants(M, N, K):
    space = config_space(M, N, K)
    assert len(space) == len(set(space)) > 20
    assert all(config_error(c, M, N, K) is None for c in space)
    quick = config_space(M, N, K, quick=True)
    assert 4 <= len(quick) <= 20 and all(config_error(c, M, N, K) is None for c in quick)
    variants = {c.variant for c in space}
    assert "base" in variants
    assert ("swapAB" in variants) == (M <= 128)
    assert ("splitK" in variants) == (M <= 256)  # split-K only where M x N leaves SMs idle
    assert default_config(M, N, K) is not None and config_error(default_config(M, N, K), M, N, K) is None


def test_config_error_rejects_oversized():
    assert "shared memory" in config_error(BlockscaleConfig("base", 256, 256, 128, 1, 1, 8, 4), 512, 512, 512)
    assert "registers" in config_error(BlockscaleConfig("base", 256, 128, 128, 1, 1, 4, 2), 512, 512, 512)
    assert "exceeds" in config_error(BlockscaleConfig("splitK", 16, 64, 128, 1, 4, 4, 2), 16, 512, 256)


# ------------------------------------------------------------------------------------------------ dispatch

IDENT = DeviceIdentity("sm_test", 7, "cpu")


def _write_rows(path, rows):
    path.write_text(render_csv(BLOCKSCALE_TUNED_COLUMNS, rows))


@pytest.fixture
def test_device(clean_runtime, tmp_path):
    """Identity sm_test / 7 CUs, an empty JSON folder; returns (monkeypatch, csv path, json dir)."""
    mp = clean_runtime
    mp.setenv("AITER_GEMM_ARCH", IDENT.gfx)
    mp.setenv("AITER_GEMM_CU_NUM", str(IDENT.cu_num))
    csv_path = tmp_path / "bs.csv"
    _write_rows(csv_path, [])
    mp.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(csv_path))
    json_dir = tmp_path / "triton"
    json_dir.mkdir()
    mp.setenv("AITER_GEMM_TRITON_CONFIGS", str(json_dir))
    aiter_gemm.reload_configs()
    return mp, csv_path, json_dir


class _PluginBackend(Backend):
    """A block-scale backend registered at run time, whose kernel names are none of the op's configs."""

    name = "plugin"
    default_priority = 100

    def default_for(self, problem, device):
        return Solution(self.name, -1, 0, "plugin_kernel")

    def prepare(self, problem, solution, device):
        return lambda XQ, WQ, x_scale, w_scale, dtype: torch.zeros(XQ.shape[0], WQ.shape[0], dtype=dtype)


def test_each_backend_describes_its_own_solutions(test_device):
    """get_GEMM_A8W8_BLOCKSCALE_config reports a Triton decision's kernel parameters beside its columns; a backend
    registered for the op at run time decides too (the op parsed every kernelName as one of its own configs to
    describe it, so such a decision raised): each backend describes its own solutions (Backend.describe)."""
    got = get_GEMM_A8W8_BLOCKSCALE_config(16, 128, 512, on_gpu=False)
    assert got["libtype"] == "triton" and BlockscaleConfig.from_json(
        {k: got[k] for k in BlockscaleConfig("base").to_json()}).name == got["kernelName"]
    register_backend(_PluginBackend(), GEMM_A8W8_BLOCKSCALE.backends)
    try:
        aiter_gemm.reload_configs()
        got = get_GEMM_A8W8_BLOCKSCALE_config(16, 128, 512, on_gpu=False)
        assert (got["libtype"], got["kernelName"], got["matched"]) == ("plugin", "plugin_kernel", "default")
        assert "variant" not in got
    finally:
        unregister_backend(_PluginBackend.name, GEMM_A8W8_BLOCKSCALE.backends)
        aiter_gemm.reload_configs()


def test_dispatch_csv_row_exact_and_padded(test_device, device):
    _, csv_path, _ = test_device
    cfg = BlockscaleConfig("splitK_swapAB", 16, 32, 128, 1, 2, 4, 2)
    _write_rows(csv_path, [csv_row(IDENT, 16, 128, 512, cfg, 3.5, kernel_id=11)])
    aiter_gemm.reload_configs()
    for M, level in ((16, "exact"), (13, "padded_gl0")):
        got = get_GEMM_A8W8_BLOCKSCALE_config(M, 128, 512, on_gpu=False)
        assert (got["kernelName"], got["matched"]) == (cfg.name, level)
        assert got["source"].endswith("bs.csv:2")
        # typed as AITER's config dicts are: numbers, not their text
        assert (got["kernelId"], got["splitK"], got["us"], got["M"]) == (11, 2, 3.5, M)
        assert type(got["kernelId"]) is int and all(type(got[c]) is float for c in ("errRatio", "tflops", "bw"))
    XQ, WQ, xs, ws = _inputs(13, 128, 512, device)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]
    # Another arch's row for the same shape does not match.
    assert get_GEMM_A8W8_BLOCKSCALE_config(16, 128, 1024, on_gpu=False)["matched"] == "default"


@pytest.mark.parametrize("column,value,text", [
    ("libtype", "cublaslt", "libtype"),
    ("kernelName", "base-BM16", "kernelName"),
    ("splitK", "3", "splitK"),
    ("kernelName", "splitK-BM16_BN32_BK128_GM2147483648_SK2_W4_S2", "kernelName"),  # out of range
])
def test_dispatch_csv_row_malformed(test_device, caplog, column, value, text):
    """A malformed row is a miss warned once naming file, line and column (issue 47: every call raised, or, out of
    range, failed to compile); the strict reader (the tuner's) raises ConfigError saying so."""
    _, csv_path, _ = test_device
    row = csv_row(IDENT, 16, 128, 512, BlockscaleConfig("splitK", 16, 32, 128, 1, 2, 4, 2), 3.5)
    row[column] = value
    _write_rows(csv_path, [row])
    with pytest.raises(ConfigError, match=rf"bs\.csv:2, column '{text}'"):
        GEMM_A8W8_BLOCKSCALE.row_solution(next(iter(load_table(KIND, [csv_path]))))
    aiter_gemm.reload_configs()
    with caplog.at_level(logging.WARNING):
        for M in (16, 13):  # exact, then padded to the same row
            assert get_GEMM_A8W8_BLOCKSCALE_config(M, 128, 512, on_gpu=False)["matched"] == "default"
    warned = [r.getMessage() for r in caplog.records if re.search(rf"bs\.csv:2, column '{text}'", r.getMessage())]
    assert len(warned) == 1 and "row ignored" in warned[0], caplog.text


def test_dispatch_csv_row_that_cannot_run_is_a_miss(test_device, caplog):
    _, csv_path, _ = test_device
    too_many_splits = BlockscaleConfig("splitK", 16, 32, 128, 1, 8, 4, 2)  # 4 K blocks only
    _write_rows(csv_path, [csv_row(IDENT, 16, 128, 512, too_many_splits, 3.5)])
    aiter_gemm.reload_configs()
    assert get_GEMM_A8W8_BLOCKSCALE_config(16, 128, 512, on_gpu=False)["matched"] == "default"
    assert "row ignored" in caplog.text


def test_dispatch_json_buckets(test_device, device):
    _, csv_path, json_dir = test_device
    best = {16: SMALL["splitK_swapAB"], 64: SMALL["swapAB"], 512: SMALL["base"]}
    write_json_configs(json_config_path(json_dir, IDENT.gfx, 128, 384), buckets_from_tuned(best))
    aiter_gemm.reload_configs()
    for M, key, cfg in ((1, "M_LEQ_16", best[16]), (16, "M_LEQ_16", best[16]), (17, "M_LEQ_64", best[64]),
                        (300, "M_LEQ_512", best[512]), (5000, "any", best[512])):
        got = get_GEMM_A8W8_BLOCKSCALE_config(M, 128, 384, on_gpu=False)
        assert (got["matched"], got["kernelName"], got["source"].split("#")[1]) == ("json", cfg.name, key)
    XQ, WQ, xs, ws = _inputs(17, 128, 384, device)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]
    # A CSV row outranks the JSON bucket.
    _write_rows(csv_path, [csv_row(IDENT, 17, 128, 384, SMALL["splitK"], 2.0)])
    aiter_gemm.reload_configs()
    assert get_GEMM_A8W8_BLOCKSCALE_config(17, 128, 384, on_gpu=False)["kernelName"] == SMALL["splitK"].name


@pytest.mark.parametrize("broken", ["bad json", "bad entry", "duplicate key", "directory", "deep nesting",
                                    "huge integer", "out of range"])
def test_unusable_json_file_is_skipped_with_one_warning(test_device, device, tmp_path, caplog, broken):
    """Issue 31: one bad per-(N, K) file raised on every gemm_a8w8_blockscale call of its (N, K). As a broken tuned
    CSV is, it is skipped with a warning naming it and why (once until reload), and the next folder's file serves.
    Issue 47: JSON nested too deeply, an integer past int()'s digit limit or a GROUP_SIZE_M of 2**31 did not name
    the file: they raised on every call, and out of warmup()."""
    mp, _, json_dir = test_device
    second = tmp_path / "second"
    second.mkdir()
    write_json_configs(json_config_path(second, IDENT.gfx, 128, 384), {"any": SMALL["swapAB"]})
    mp.setenv("AITER_GEMM_TRITON_CONFIGS", f"{json_dir}:{second}")
    bad = json_config_path(json_dir, IDENT.gfx, 128, 384)
    good = json.dumps(SMALL["base"].to_json())
    if broken == "directory":
        bad.mkdir()
    else:
        bad.write_text({"bad json": "{not json", "bad entry": '{"any": {"variant": "base"}}',
                        "duplicate key": '{"M_LEQ_16": ' + good + ', "M_LEQ_16": ' + good + "}",
                        "deep nesting": '{"any": ' + "[" * 100_000 + "]" * 100_000 + "}",
                        "huge integer": '{"any": ' + good.replace('"GROUP_SIZE_M": 2', '"GROUP_SIZE_M": ' + "2" * 5000)
                        + "}",
                        "out of range": '{"any": ' + good.replace('"GROUP_SIZE_M": 2', '"GROUP_SIZE_M": 2147483648')
                        + "}"}[broken])
    aiter_gemm.reload_configs()
    aiter_gemm.warmup(("gemm_a8w8_blockscale",), on_gpu=False)
    XQ, WQ, xs, ws = _inputs(5, 128, 384, device)
    with caplog.at_level(logging.WARNING):
        for M in (5, 5, 40):
            got = get_GEMM_A8W8_BLOCKSCALE_config(M, 128, 384, on_gpu=False)
            assert (got["matched"], got["kernelName"]) == ("json", SMALL["swapAB"].name), got
        out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]
    warned = [r.getMessage() for r in caplog.records if str(bad) in r.getMessage()]
    assert len(warned) == 1 and "skipped" in warned[0], warned
    if broken == "duplicate key":
        assert "'M_LEQ_16': written twice" in warned[0]
    if broken == "directory":
        assert "a directory" in warned[0]
    why = {"deep nesting": "nested too deeply", "huge integer": "integer string conversion",
           "out of range": "key 'any': invalid A8W8 block-scale config"}.get(broken, "")
    assert why in warned[0] and len(warned[0]) < 1000


@pytest.mark.parametrize("body", ['{"M_LEQ_16": {}, "M_LEQ_16": {}}', '{"any": {"variant": "base", "variant": "x"}}'])
def test_json_duplicate_keys_are_errors(tmp_path, body):
    """json.loads keeps the last of two equal keys silently (issue 31); a bucket or an entry's field written twice
    is an error naming the file and the key."""
    path = tmp_path / "dup.json"
    path.write_text(body)
    with pytest.raises(JSONConfigError, match=r"dup\.json, key '(M_LEQ_16|variant)': written twice"):
        read_json_configs(path)


@pytest.mark.parametrize("pads,expect", [
    ({}, ["M_LEQ_16", "M_LEQ_64", "M_LEQ_512", "any"]),  # no pad_m_min (AITER's rows): the buckets as before
    ({16: 16, 64: 33, 512: 257}, ["M_LEQ_15", "M_LEQ_16", "M_LEQ_32", "M_LEQ_64", "M_LEQ_256", "M_LEQ_512", "any"]),
    ({16: 1, 64: 17, 512: 65}, ["M_LEQ_16", "M_LEQ_64", "M_LEQ_512", "any"]),  # confirmed down to the previous M
])
def test_json_buckets_leave_unconfirmed_m_to_the_default(test_device, pads, expect):
    """Below a row's pad_m_min, down to the previous tuned M, a "default" bucket: the JSON serves M only where the
    tuner confirmed the config, as the padded CSV lookup does."""
    _, _, json_dir = test_device
    best = {16: SMALL["splitK_swapAB"], 64: SMALL["swapAB"], 512: SMALL["base"]}
    buckets = buckets_from_tuned(best, pads)
    assert list(buckets) == expect
    path = json_config_path(json_dir, IDENT.gfx, 128, 384)
    write_json_configs(path, buckets)
    assert [key for _, key, _ in read_json_configs(path)] == expect
    aiter_gemm.reload_configs()
    for M in (1, 15, 16, 17, 40, 64, 100, 300, 512, 5000):
        got = get_GEMM_A8W8_BLOCKSCALE_config(M, 128, 384, on_gpu=False)
        low = {m: pads.get(m, 1) for m in best}
        owner = next((m for m in sorted(best) if M <= m), None)
        if owner is not None and M < low[owner] and M > max([0] + [m for m in best if m < owner]):
            assert got["matched"] == "default", (M, got)
        else:
            assert got["matched"] == "json" and got["kernelName"] == best[owner or 512].name, (M, got)


def test_json_default_entry_is_read_and_other_strings_are_refused(tmp_path):
    path = tmp_path / "x.json"
    path.write_text('{"M_LEQ_8": "default", "any": "fast"}')
    with pytest.raises(JSONConfigError, match=r"x\.json, key 'any'.*'default'"):
        read_json_configs(path)
    path.write_text('{"M_LEQ_8": "default", "any": ' + json.dumps(SMALL["base"].to_json()) + "}")
    assert [(key, cfg) for _, key, cfg in read_json_configs(path)] == [("M_LEQ_8", None), ("any", SMALL["base"])]
    assert select_bucket(read_json_configs(path), 3) == ("M_LEQ_8", None)


def test_json_seed_buckets(tmp_path):
    """Seed 002's small_M / medium_M / large_M names: M <= 256, M <= 2048, any M."""
    path = tmp_path / "x.json"
    write_json_configs(path, {"large_M": SMALL["base"], "small_M": SMALL["swapAB"], "medium_M": SMALL["splitK"]})
    assert list(json.loads(path.read_text())) == ["small_M", "medium_M", "large_M"]
    buckets = read_json_configs(path)
    assert [select_bucket(buckets, m)[0] for m in (1, 256, 257, 2048, 2049)] == \
        ["small_M", "small_M", "medium_M", "medium_M", "large_M"]


def test_json_without_catch_all_falls_back(test_device):
    _, _, json_dir = test_device
    write_json_configs(json_config_path(json_dir, IDENT.gfx, 128, 256), {"M_LEQ_32": SMALL["swapAB"]})
    aiter_gemm.reload_configs()
    assert get_GEMM_A8W8_BLOCKSCALE_config(32, 128, 256, on_gpu=False)["matched"] == "json"
    assert get_GEMM_A8W8_BLOCKSCALE_config(33, 128, 256, on_gpu=False)["matched"] == "default"


@pytest.mark.parametrize("body,text", [
    ("[1, 2]", "non-empty object"),
    ("{not json", "not valid JSON"),
    ('{"tiny_M": {}}', "key 'tiny_M': unknown bucket"),
    ('{"M_LEQ_16": {"variant": "base"}}', "misses keys"),
    ('{"any": ' + json.dumps({**SMALL["base"].to_json(), "waves_per_eu": 2}) + "}", "unknown keys ['waves_per_eu']"),
    ('{"any": ' + json.dumps({**SMALL["base"].to_json(), "BLOCK_SIZE_K": 64}) + "}", "BLOCK_SIZE_K must be 128"),
    ('{"large_M": ' + json.dumps(SMALL["base"].to_json()) + ', "any": ' + json.dumps(SMALL["base"].to_json()) + "}",
     "same M range"),
    # issue 47: text json cannot take, values out of range, loose integers
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"any": ' + json.dumps({**SMALL["base"].to_json(), "GROUP_SIZE_M": 2**31}) + "}",
     "GROUP_SIZE_M must be in 1..1024"),
    ('{"any": ' + json.dumps({**SMALL["base"].to_json(), "NUM_KSPLIT": 1e23}) + "}", "NUM_KSPLIT must be an integer"),
    ('{"M_LEQ_\u0661\u0666": ' + json.dumps(SMALL["base"].to_json()) + "}", "unknown bucket"),  # Arabic-Indic 16
    ('{"M_LEQ_16\\n": ' + json.dumps(SMALL["base"].to_json()) + "}", "unknown bucket"),
])
def test_json_strict(tmp_path, body, text):
    path = tmp_path / "bad.json"
    path.write_text(body)
    with pytest.raises(JSONConfigError, match=re.escape(text)):
        read_json_configs(path)


def test_default_when_nothing_matches(test_device, device):
    got = get_GEMM_A8W8_BLOCKSCALE_config(3, 256, 384, on_gpu=False)
    assert (got["matched"], got["source"]) == ("default", "default heuristic")
    assert got["kernelName"] == default_config(3, 256, 384, IDENT.cu_num).name
    XQ, WQ, xs, ws = _inputs(3, 256, 384, device)
    out = gemm_a8w8_blockscale(XQ, WQ, xs, ws)
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


@pytest.mark.parametrize("M,N,K", [(1, 7168, 2304), (64, 4096, 512), (8192, 57344, 8192), (300, 256, 7168),
                                   (1, 256, 7168), (256, 2112, 7168), (1024, 2112, 7168), (16, 5120, 25600),
                                   (16, 5632, 4096), (100, 3072, 14336), (3, 4608, 7168)])
def test_default_config_choices(M, N, K):
    cfg = default_config(M, N, K, 132)
    assert config_error(cfg, M, N, K) is None
    assert VARIANTS[cfg.variant].swap_ab == (M <= 16)
    tiles = -(-M // cfg.BLOCK_SIZE_M) * -(-N // cfg.BLOCK_SIZE_N)
    k_blocks = K // 128
    # Split while doubling the programs still fits one wave and leaves >= 8 K blocks per split ...
    want = 1
    while tiles * want * 2 <= 132 and k_blocks // (2 * want) >= 8:
        want *= 2
    # ... then once more only where that wave fills under 3/4 of the SMs with >= 24 K blocks per split.
    if tiles * want < 0.75 * 132 and k_blocks // (2 * want) >= 24:
        want *= 2
    assert cfg.NUM_KSPLIT == want
    # (16, 5120, 25600): 80 swapAB tiles unsplit ran 0.92x torch's (held-out H100 run); (16, 5632, 4096): 88 tiles,
    # 16 K blocks a split: stays unsplit; (3, 4608, 7168): 72 tiles, 28 K blocks a split: split.
    assert {(16, 5120, 25600): 2, (16, 5632, 4096): 1, (3, 4608, 7168): 2, (100, 3072, 14336): 2}.get(
        (M, N, K), want) == want


# ------------------------------------------------------------------------------------------------ GPU


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("M,N,K", [(1, 7168, 2304), (17, 1536, 7168), (256, 4096, 512), (1000, 2112, 7168)])
def test_gpu_variants_bf16(variant, tma, M, N, K):
    XQ, WQ, xs, ws = _inputs(M, N, K, "cuda")
    swap = VARIANTS[variant].swap_ab
    cfg = BlockscaleConfig(variant, 16 if swap else 64, 128, 128, 1 if swap else 8,
                           4 if VARIANTS[variant].split_k else 1, 4, 3, TMA=tma)
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_a8w8_blockscale_triton(XQ, WQ, xs, ws, cfg, out)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["base-BM128_BN256_BK128_GM8_SK1_W8_S3_NS2_TMA",
                                  "base-BM256_BN128_BK128_GM8_SK1_W8_S3_NS2_TMA",
                                  "splitK-BM64_BN256_BK128_GM8_SK2_W4_S4_NS2_TMA",
                                  "base-BM128_BN128_BK128_GM8_SK1_W4_S4_NS2"])
@pytest.mark.parametrize("M,N,K", [(17, 1536, 7168), (256, 4096, 512), (1000, 2112, 7168)])
def test_gpu_n_subtiles_bf16(name, M, N, K):
    XQ, WQ, xs, ws = _inputs(M, N, K, "cuda")
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    gemm_a8w8_blockscale_triton(XQ, WQ, xs, ws, BlockscaleConfig.from_name(name), out)
    torch.cuda.synchronize()
    assert not out.isnan().any()
    assert _rel_err(out, gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)) < TOLERANCE[torch.bfloat16]


SHIPPED_DIR = Path(__file__).resolve().parent.parent / "configs" / "triton"
SHIPPED_JSON = sorted(SHIPPED_DIR.glob("*-GEMM-A8W8_BLOCKSCALE-*.json"))


@pytest.mark.parametrize("path", SHIPPED_JSON, ids=lambda p: p.name)
def test_shipped_json_configs(path):
    """Every shipped per-(N, K) file parses strictly, has a catch-all bucket, only choices that can run (torch's
    availability aside: that depends on the machine), and is what the tuner derives from the shipped CSV's rows
    (``"default"`` buckets below each row's pad_m_min included)."""
    from gradlib.blockscale import JsonSidecar

    N, K = (int(part.split("=")[1]) for part in path.stem.split("-")[-2:])
    buckets = read_json_configs(path)
    assert buckets[-1][0] is None
    for bound, key, cfg in buckets:
        M = bound or 16384
        assert cfg is None or choice_error(cfg, M, N, K) is None, (key, cfg.name)
    sidecar = JsonSidecar(DeviceIdentity("sm_90", 132, "cuda"), SHIPPED_DIR.parent / "a8w8_blockscale_tuned_gemm.csv",
                          [])
    rows = sidecar.tuned_rows(N, K)
    derived = buckets_from_tuned({m: c for m, (c, _) in rows.items()}, {m: pad for m, (_, pad) in rows.items()})
    assert {key: cfg for _, key, cfg in buckets} == derived


def test_shipped_csv_rows_run_their_shapes(clean_runtime):
    """The shipped tuned CSV (H100, sm_90 / 132) loads strictly, and each row's choice can run its shape."""
    clean_runtime.setenv("AITER_GEMM_ARCH", "sm_90")
    clean_runtime.setenv("AITER_GEMM_CU_NUM", "132")
    aiter_gemm.reload_configs()
    rows = read_csv_rows(SHIPPED_DIR.parent / "a8w8_blockscale_tuned_gemm.csv")[1]
    assert rows and {r["libtype"] for r in rows} <= {"triton", "torch", "tilelang"}
    for r in rows:
        M, N, K = int(r["M"]), int(r["N"]), int(r["K"])
        assert choice_error(parse_choice(r["kernelName"]), M, N, K) is None, r
        got = get_GEMM_A8W8_BLOCKSCALE_config(M, N, K, on_gpu=False)
        if r["libtype"] == "triton":  # torch's and TileLang's rows are misses on CPU (they need an NVIDIA GPU)
            assert (got["matched"], got["kernelName"]) == ("exact", r["kernelName"])


def test_shipped_json_dispatch(clean_runtime, caplog):
    """On an sm_90 / 132-SM identity, a shipped shape dispatches from its JSON bucket; a torch bucket is a warned
    miss where torch's block-scaled matmul cannot run (here: CPU); a "default" bucket is a miss."""
    assert SHIPPED_JSON, "no shipped A8W8_BLOCKSCALE JSON configs"
    clean_runtime.delenv("AITER_GEMM_TRITON_CONFIGS", raising=False)
    clean_runtime.setenv("AITER_GEMM_ARCH", "sm_90")
    clean_runtime.setenv("AITER_GEMM_CU_NUM", "132")
    aiter_gemm.reload_configs()
    path = SHIPPED_DIR / "sm_90-GEMM-A8W8_BLOCKSCALE-N=8192-K=8192.json"
    buckets = read_json_configs(path)
    for M in (100, 300):  # no CSV row at M nor at its padded sizes (112 / 128, 320 / 512): the JSON
        key, cfg = select_bucket(buckets, M)
        got = get_GEMM_A8W8_BLOCKSCALE_config(M, 8192, 8192, on_gpu=False)
        if cfg is None:  # a "default" bucket: the tuner did not confirm a config for M
            assert got["matched"] == "default"
        elif cfg.name == "scaled_mm_blockwise":
            assert got["matched"] == "default" and f"bucket {key}: scaled_mm_blockwise cannot run" in caplog.text
        else:
            assert got["matched"] == "json" and got["source"] == f"{path}#{key}" and got["kernelName"] == cfg.name
