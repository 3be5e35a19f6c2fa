"""The decode-regime kernel family (``gemm_decode.py`` beside this file: issue 14's exploration, not shipped):
numerics of every variant (plain, swapped, split-K two-pass / fix-up, stream-K; TMA and pointer loads) on odd
shapes, determinism, the config name, the reasons of ``config_supported`` and the pruning of ``config_space``.

CPU: the Triton interpreter (conftest sets ``TRITON_INTERPRET=1``) on small shapes with small tiles; bf16 goes through
the interpreter's float32 upcast of ``tl.dot`` operands. GPU (``@pytest.mark.gpu``): the shipped shapes in bf16.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from op_tests.op_benchmarks.explore_decode_mid import gemm_decode as gd
from op_tests.op_benchmarks.explore_decode_mid.gemm_decode import (
    DecodeConfig,
    config_space,
    config_supported,
    default_config,
)

SHIPPED = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (1280, 8192), (8192, 1024), (7168, 8192),
           (8192, 3584)]
MS = [17, 32, 64, 128, 256]

# Small-tile configs covering every code path; on CPU the interpreter emulates TMA descriptors too.
CPU_CONFIGS = [
    DecodeConfig(32, 32, 32, 1, 4, 2),                                   # plain, pointer loads
    DecodeConfig(32, 64, 32, 1, 4, 2, TMA=True),                         # plain, TMA
    DecodeConfig(16, 32, 64, 1, 4, 2, SWAP_AB=True, TMA=True),           # swapped, TMA
    DecodeConfig(32, 32, 32, 3, 4, 2, REDUCE="2P", TMA=True),            # split-K two-pass
    DecodeConfig(16, 32, 32, 2, 4, 2, SWAP_AB=True, REDUCE="FX"),        # split-K fix-up, pointer
    DecodeConfig(32, 32, 32, 1, 4, 2, STREAM_K=2, TMA=True),             # stream-K
    DecodeConfig(16, 32, 32, 1, 4, 2, SWAP_AB=True, STREAM_K=1),         # stream-K swapped, pointer
]


def tolerance(otype: torch.dtype, K: int) -> dict:
    """Against a float64 reference of bf16 inputs: fp32 output carries only the accumulation-order error; bf16 output
    adds a half-ulp (2^-9) rounding of |out| ~ sqrt(K)."""
    if otype == torch.float32:
        return dict(rtol=2e-3, atol=2e-4 * K**0.5)
    return dict(rtol=1.6e-2, atol=1.6e-2 * K**0.5)


def reference(a, b, bias, otype):
    out = a.double() @ b.double().t()
    if bias is not None:
        out = out + bias.double()
    return out.to(otype)


def run(cfg, a, b, bias=None, otype=torch.bfloat16, num_sms=4):
    out = torch.full((a.shape[0], b.shape[0]), float("nan"), dtype=otype, device=a.device)  # unwritten -> NaN
    return gd.launch_gemm_decode(a, b, bias, out, cfg, num_sms)


@pytest.mark.parametrize("cfg", CPU_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize(("M", "N", "K", "with_bias", "otype"), [
    (17, 100, 200, True, torch.float32),    # N, K not multiples of the tile; M one past 16
    (33, 64, 256, False, torch.bfloat16),   # exact N and K tiles
    (97, 72, 136, True, torch.bfloat16),    # several M tiles, K tail of 8
])
def test_matches_reference_cpu(device, cfg, M, N, K, with_bias, otype):
    torch.manual_seed(M + N + K)
    a = torch.randn(M, K, dtype=torch.bfloat16, device=device)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    bias = torch.randn(N, dtype=torch.bfloat16, device=device) if with_bias else None
    assert config_supported(cfg, M, N, K, "cpu" if device == "cpu" else "sm_90") is None
    out = run(cfg, a, b, bias, otype)
    assert out.dtype == otype and out.shape == (M, N)
    torch.testing.assert_close(out, reference(a, b, bias, otype), **tolerance(otype, K))


@pytest.mark.parametrize("offset", [8, 3])  # 8 bf16 = 16 bytes: TMA-eligible slice; 3: pointer fallback
def test_column_slice_activation(device, offset):
    torch.manual_seed(offset)
    M, N, K = 17, 80, 128
    base = torch.randn(M, K + 24, dtype=torch.bfloat16, device=device)
    a = base[:, offset:offset + K]  # row stride K + 24 (non-contiguous)
    assert not a.is_contiguous() and gd.tma_operand_ok(a) == (offset == 8)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    for cfg in (DecodeConfig(32, 32, 64, 1, 4, 2, TMA=True), DecodeConfig(16, 32, 32, 2, 4, 2, True, "FX", 0, True)):
        out = run(cfg, a, b, None, torch.float32)
        torch.testing.assert_close(out, reference(a, b, None, torch.float32), **tolerance(torch.float32, K))


def test_fixup_equals_two_pass_bit_for_bit_and_is_deterministic(device):
    torch.manual_seed(0)
    M, N, K = 33, 96, 320
    a = torch.randn(M, K, dtype=torch.bfloat16, device=device)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    bias = torch.randn(N, dtype=torch.bfloat16, device=device)
    two_pass = run(DecodeConfig(32, 32, 32, 4, 4, 2, REDUCE="2P"), a, b, bias, torch.float32)
    fixup = run(DecodeConfig(32, 32, 32, 4, 4, 2, REDUCE="FX"), a, b, bias, torch.float32)
    again = run(DecodeConfig(32, 32, 32, 4, 4, 2, REDUCE="FX"), a, b, bias, torch.float32)
    # Both sum the float32 partials in split order from zero: the same additions, the same bits.
    assert torch.equal(two_pass, fixup) and torch.equal(fixup, again)


def test_counters_left_zero(device):
    torch.manual_seed(1)
    a = torch.randn(20, 96, dtype=torch.bfloat16, device=device)
    b = torch.randn(70, 96, dtype=torch.bfloat16, device=device)
    run(DecodeConfig(16, 32, 32, 3, 4, 2, REDUCE="FX"), a, b)
    run(DecodeConfig(16, 32, 32, 1, 4, 2, STREAM_K=1), a, b, num_sms=5)
    for buf in gd._COUNTERS.values():
        assert int(buf.abs().sum()) == 0


@pytest.mark.parametrize("num_sms", [1, 3, 7])
def test_streamk_any_program_count(device, num_sms):
    """Pieces of a tile split between 2+ programs (and programs spanning 2+ tiles) are summed correctly."""
    torch.manual_seed(num_sms)
    M, N, K = 20, 80, 224  # 2 M-tiles x 3 N-tiles x 7 K-steps = 42 iterations over 1..7 programs
    a = torch.randn(M, K, dtype=torch.bfloat16, device=device)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    bias = torch.randn(N, dtype=torch.bfloat16, device=device)
    cfg = DecodeConfig(16, 32, 32, 1, 4, 2, STREAM_K=1)
    progs, ipp = gd.streamk_plan(M, N, K, cfg, num_sms)
    assert progs == min(num_sms, 42) and (progs - 1) * ipp < 42 <= progs * ipp
    out = run(cfg, a, b, bias, torch.float32, num_sms)
    torch.testing.assert_close(out, reference(a, b, bias, torch.float32), **tolerance(torch.float32, K))
    assert torch.equal(out, run(cfg, a, b, bias, torch.float32, num_sms))


# ---- config name, support, space --------------------------------------------------------------------------

# Tile-major weight (B_TILED): pointer and TMA loads, plain, swapped and split (fix-up and two-pass).
TILED_CONFIGS = [
    DecodeConfig(32, 32, 32, 1, 4, 2, B_TILED=True),
    DecodeConfig(32, 32, 64, 1, 4, 2, TMA=True, B_TILED=True),
    DecodeConfig(16, 32, 32, 2, 4, 2, SWAP_AB=True, REDUCE="FX", TMA=True, B_TILED=True),
    DecodeConfig(16, 64, 32, 4, 4, 2, SWAP_AB=True, REDUCE="2P", B_TILED=True),
]


@pytest.mark.parametrize("cfg", TILED_CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize(("M", "N", "K"), [(17, 64, 256), (3, 128, 128), (97, 64, 512)])
def test_tiled_weight_matches_reference(device, cfg, M, N, K):
    torch.manual_seed(M * 7 + N + K)
    a = torch.randn(M, K, dtype=torch.bfloat16, device=device)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    bias = torch.randn(N, dtype=torch.bfloat16, device=device)
    assert config_supported(cfg, M, N, K, "cpu" if device == "cpu" else "sm_90") is None
    bt = gd.tile_weight(b, cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K)
    # tile (1, 2) is b[bn:2bn, 2bk:3bk], contiguous
    bn, bk = cfg.BLOCK_SIZE_N, cfg.BLOCK_SIZE_K
    if N >= 2 * bn and K >= 3 * bk:
        assert torch.equal(bt[1, 2], b[bn:2 * bn, 2 * bk:3 * bk])
    out = torch.full((M, N), float("nan"), dtype=torch.float32, device=device)
    gd.launch_gemm_decode(a, bt, bias, out, cfg, 4)
    torch.testing.assert_close(out, reference(a, b, bias, torch.float32), **tolerance(torch.float32, K))


def test_tiled_weight_rejects_other_layouts(device):
    cfg = DecodeConfig(32, 32, 32, 1, 4, 2, B_TILED=True)
    a = torch.randn(17, 64, dtype=torch.bfloat16, device=device)
    b = torch.randn(64, 64, dtype=torch.bfloat16, device=device)
    out = torch.empty(17, 64, dtype=torch.float32, device=device)
    with pytest.raises(ValueError, match="tile_weight"):
        gd.launch_gemm_decode(a, b, None, out, cfg, 4)  # the plain (N, K) weight
    with pytest.raises(ValueError, match="tile_weight"):
        gd.launch_gemm_decode(a, gd.tile_weight(b, 32, 16), None, out, cfg, 4)  # another tile
    with pytest.raises(ValueError, match="not a multiple"):
        gd.tile_weight(b[:, :40], 32, 32)
    assert "multiples of the tile" in config_supported(cfg, 17, 100, 64, "cpu")


def test_name_round_trip():
    names = set()
    for (N, K), M in itertools.product(SHIPPED, MS):
        for cfg in config_space(M, N, K, 132):
            assert DecodeConfig.from_name(cfg.name) == cfg
            names.add(cfg.name)
    for cfg in CPU_CONFIGS:
        assert DecodeConfig.from_name(cfg.name) == cfg
    assert DecodeConfig.from_name("BM64_BN128_BK128_SK4_W4_S4_TMA") == DecodeConfig(64, 128, 128, 4, 4, 4, TMA=True)
    assert DecodeConfig(32, 64, 128, 8, 4, 5, True, "FX", 0, True).name == "BM32_BN64_BK128_SK8_W4_S5_SW_FX_TMA"
    assert DecodeConfig(64, 64, 128, 1, 4, 4, STREAM_K=2).name == "BM64_BN64_BK128_SK1_W4_S4_STK2"
    for cfg in TILED_CONFIGS:
        assert cfg.name.endswith("_BT") and DecodeConfig.from_name(cfg.name) == cfg
    # With a single split there is nothing to reduce: the reduction is normalised away (one name per kernel).
    assert DecodeConfig(64, 64, 128, 1, 4, 4, REDUCE="FX") == DecodeConfig(64, 64, 128, 1, 4, 4)
    assert len(names) > 50


@pytest.mark.parametrize("bad", ["BM64_BN128_BK128_SK4_W4", "BM64_BN128_BK128_GM8_SK1_W4_S4", "bm64_bn128",
                                 "BM48_BN128_BK128_SK1_W4_S4", "BM64_BN128_BK128_SK2_W4_S4_STK1",
                                 "BM64_BN128_BK128_SK1_W3_S4"])
def test_bad_names(bad):
    with pytest.raises(ValueError):
        DecodeConfig.from_name(bad)


@pytest.mark.parametrize(("cfg", "M", "N", "K", "arch", "dtype", "needle"), [
    (DecodeConfig(256, 256, 128, 1, 8, 4), 256, 4096, 4096, "sm_90", torch.bfloat16, "KiB of shared memory"),
    (DecodeConfig(64, 128, 128, 1, 4, 4), 64, 4096, 4096, "sm_89", torch.bfloat16, "KiB of shared memory"),
    (DecodeConfig(64, 128, 128, 1, 4, 3, TMA=True), 64, 4096, 4096, "sm_80", torch.bfloat16, "TMA needs sm_90"),
    (DecodeConfig(64, 128, 128, 1, 4, 3, TMA=True), 64, 4096, 1001, "sm_90", torch.bfloat16, "16-byte aligned"),
    (DecodeConfig(64, 128, 128, 16, 4, 3), 64, 4096, 1024, "sm_90", torch.bfloat16, "> 8 K tiles"),
    (DecodeConfig(64, 128, 128, 4, 4, 3), 64, 4096, 9 * 128, "sm_90", torch.bfloat16, "leaves a split empty"),
    (DecodeConfig(64, 128, 128, 1, 4, 3), 64, 4096, 4096, "sm_90", torch.float32, "not bf16/fp16"),
    (DecodeConfig(256, 256, 64, 1, 4, 2), 256, 4096, 4096, "sm_90", torch.bfloat16, "accumulators per thread"),
])
def test_config_supported_reasons(cfg, M, N, K, arch, dtype, needle):
    why = config_supported(cfg, M, N, K, arch, dtype)
    assert why is not None and needle in why, why


def test_config_supported_checks_operand_alignment():
    cfg = DecodeConfig(64, 64, 64, 1, 4, 3, TMA=True)
    base = torch.zeros(17, 304, dtype=torch.bfloat16)  # 608-byte rows: 16-byte aligned
    assert config_supported(cfg, 17, 64, 256, "sm_90", a=base[:, 8:264]) is None
    assert "address % 16" in config_supported(cfg, 17, 64, 256, "sm_90", a=base[:, 3:259])
    assert "stride" in config_supported(cfg, 17, 64, 256, "sm_90", b=torch.zeros(256, 64, dtype=torch.bfloat16).t())
    assert config_supported(DecodeConfig(64, 64, 64, 4, 4, 3), 17, 64, 1024, "sm_90") is None


@pytest.mark.parametrize(("N", "K"), SHIPPED + [(1000, 1000), (4608, 3584), (3584, 18944)])
@pytest.mark.parametrize("M", MS + [97, 255])
def test_space_pruned_and_supported(M, N, K):
    space = config_space(M, N, K, 132)
    assert 4 <= len(space) <= 60, len(space)
    assert len({c.name for c in space}) == len(space)
    tiles_of = lambda c: -(-M // c.BLOCK_SIZE_M) * -(-N // c.BLOCK_SIZE_N)  # noqa: E731
    for c in space:
        assert config_supported(c, M, N, K, "sm_90") is None
        assert c.TMA == ((K * 2) % 16 == 0)  # TMA wherever the weight rows allow it on sm_90
        assert c.smem_bytes() <= 225 * 1024 and c.acc_regs_per_thread() <= 128
        assert c.BLOCK_SIZE_M >= min(M, 64) or c.SWAP_AB  # no tile that re-reads the weight for small M
        if c.NUM_KSPLIT > 1:  # split only where the tiles alone leave SMs idle, keeping >= 4 K tiles per split
            assert tiles_of(c) < 132 and -(-K // c.BLOCK_SIZE_K) >= 4 * c.NUM_KSPLIT
        if c.STREAM_K:  # stream-K only over a single M-tile (else the weight is read once per M-tile)
            assert -(-M // c.BLOCK_SIZE_M) == 1
    dflt = default_config(M, N, K, 132)
    assert config_supported(dflt, M, N, K, "sm_90") is None
    if (N, K) in SHIPPED and M in MS:  # the untuned choice is one the tuner also times
        assert dflt in space, dflt.name


def test_space_without_tma_off_hopper():
    space = config_space(64, 4096, 4096, 108, "sm_80")
    assert space and not any(c.TMA for c in space)
    assert all(config_supported(c, 64, 4096, 4096, "sm_80") is None for c in space)


@pytest.mark.parametrize(("M", "N", "K"), [(17, 100, 200), (1, 8, 16), (200, 64, 40)])
def test_default_config_runs_odd_shapes(device, M, N, K):
    torch.manual_seed(M)
    a = torch.randn(M, K, dtype=torch.bfloat16, device=device)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    arch = "cpu" if device == "cpu" else gd._arch_of(a)
    cfg = default_config(M, N, K, 4, arch)
    assert config_supported(cfg, M, N, K, arch) is None, cfg
    out = gd.gemm_decode(a, b, None, torch.float32, cfg, num_sms=4)
    torch.testing.assert_close(out, reference(a, b, None, torch.float32), **tolerance(torch.float32, K))


def test_reference():
    a = torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16)
    b = torch.tensor([[3.0, 4.0], [5.0, 6.0]], dtype=torch.bfloat16)
    out = gd.gemm_decode_ref(a, b, torch.tensor([0.5, -1.0]), torch.float32)
    assert out.tolist() == [[11.5, 16.0]]


# ---- GPU: the real shapes in bf16 -----------------------------------------------------------------------------

def _gpu_configs(M: int, N: int, K: int) -> list[DecodeConfig]:
    """The default plus one config of each kind from the space (plain, split 2P, split FX, stream-K, swapped)."""
    space = config_space(M, N, K, torch.cuda.get_device_properties(0).multi_processor_count, gd._arch_of(
        torch.empty(0, device="cuda")))
    kinds = {}
    for c in space:
        kind = (c.NUM_KSPLIT > 1, c.REDUCE, c.STREAM_K > 0, c.SWAP_AB)
        kinds.setdefault(kind, c)
    return [default_config(M, N, K, 132)] + list(kinds.values())


@pytest.mark.gpu
@pytest.mark.parametrize(("N", "K"), SHIPPED)
@pytest.mark.parametrize("M", [17, 64, 256])
def test_gpu_shipped_shapes(N, K, M):
    torch.manual_seed(N + K + M)
    a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
    ref = gd.gemm_decode_ref(a, b, None, torch.float32)
    for cfg in _gpu_configs(M, N, K):
        out = run(cfg, a, b, None, torch.bfloat16, 132)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        assert torch.isfinite(out).all() and err < 1e-2, (cfg.name, err)


@pytest.mark.gpu
@pytest.mark.parametrize(("M", "N", "K"), [(17, 1000, 1000), (97, 1280, 8192), (255, 4096, 4096), (33, 4104, 1032)])
@pytest.mark.parametrize("otype", [torch.float32, torch.bfloat16])
def test_gpu_odd_shapes_bias_and_slices(M, N, K, otype):
    torch.manual_seed(M)
    base = torch.randn(M, K + 64, dtype=torch.bfloat16, device="cuda")
    a = base[:, 8:8 + K]  # a column slice: strided rows, TMA-eligible when K + 64 keeps 16-byte rows
    b = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
    bias = torch.randn(N, dtype=torch.bfloat16, device="cuda")
    configs = [c for c in _gpu_configs(M, N, K)] + [DecodeConfig(64, 64, 64, 2, 4, 3, REDUCE="FX")]
    for cfg in configs:
        if config_supported(cfg, M, N, K, "sm_90", a=None) is not None:
            continue
        out = run(cfg, a, b, bias, otype, 132)
        torch.testing.assert_close(out, reference(a, b, bias, otype), **tolerance(otype, K), msg=cfg.name)


@pytest.mark.gpu
def test_gpu_fixup_deterministic_and_graph_capture():
    torch.manual_seed(3)
    M, N, K = 64, 4096, 14336
    a = torch.randn(M, K, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(N, K, dtype=torch.bfloat16, device="cuda")
    fx = DecodeConfig(64, 64, 128, 4, 4, 4, REDUCE="FX", TMA=True)
    two = DecodeConfig(64, 64, 128, 4, 4, 4, REDUCE="2P", TMA=True)
    stk = DecodeConfig(64, 128, 128, 1, 4, 4, STREAM_K=1, TMA=True)
    ref_fx = run(fx, a, b, None, torch.float32, 132)
    assert torch.equal(ref_fx, run(two, a, b, None, torch.float32, 132))
    for _ in range(3):
        assert torch.equal(ref_fx, run(fx, a, b, None, torch.float32, 132))
    ref_stk = run(stk, a, b, None, torch.float32, 132)
    for _ in range(3):
        assert torch.equal(ref_stk, run(stk, a, b, None, torch.float32, 132))
    # Capture after a warm-up on the capture stream (compiles, allocates the counters), replay on new inputs.
    out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for cfg in (fx, two, stk):
            gd.launch_gemm_decode(a, b, None, out, cfg, 132)
    s.synchronize()
    outs = [torch.empty(M, N, dtype=torch.bfloat16, device="cuda") for _ in range(3)]
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for cfg, o in zip((fx, two, stk), outs):
            gd.launch_gemm_decode(a, b, None, o, cfg, 132)
    a.copy_(torch.randn_like(a))
    g.replay()
    torch.cuda.synchronize()
    ref = gd.gemm_decode_ref(a, b, None, torch.float32)
    for o in outs:
        assert ((o.float() - ref).norm() / ref.norm()).item() < 1e-2
