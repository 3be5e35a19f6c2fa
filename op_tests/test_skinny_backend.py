"""Backend ``skinny``: every variant on odd decode shapes (interpreter on CPU, bf16/fp16 on a GPU), bias, output
dtypes, split-K, the kernelName/solidx encoding, the config space and the GPU-only default heuristic."""

from __future__ import annotations

import re

import pytest
import torch
import triton

from aiter_gemm.backends import skinny as sb
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels.skinny import (
    GEMV_MAX_M,
    VARIANTS,
    SkinnyConfig,
    default_skinny_config,
    gemv_fold,
    launch_skinny,
    skinny_gemm,
    skinny_gemm_ref,
)
from aiter_gemm.registry import get_backend
from op_tests.runtime_helpers import BIAS_LAYOUTS, strided_bias

HAS_GPU = torch.cuda.is_available()
DEV = "cuda" if HAS_GPU else "cpu"
H100 = DeviceIdentity("sm_90", 132, "cuda", "H100")
CPU = DeviceIdentity("cpu", 2, "cpu", "cpu")
IDENT = H100 if HAS_GPU else CPU

# Relative Frobenius error against the float32 reference, by output dtype: products of 16-bit inputs are exact in
# float32 and sums stay float32 (atomics included), so the error is the output's rounding (bf16 unit roundoff 2^-8,
# fp16 2^-11); fp32 output only differs by summation order.
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "output has non-finite values"
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


def _config(solidx: int, split: int, K: int) -> SkinnyConfig:
    """A small tile of variant ``solidx``; split-K variants use ``split`` (odd: 3). BK 64 leaves a ragged K tail
    at K=97/200; 512 at K=4100 keeps the interpreter to ~9 iterations per program (plus a 4-element tail)."""
    var = VARIANTS[solidx]
    bk = 512 if K > 1000 else 64
    return SkinnyConfig(solidx, 16 if var.use_dot else 8, bk, split if var.splits_k else 1, 4, 2 if var.use_dot else 1)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype,otype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                                         (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("solidx", sorted(VARIANTS))
@pytest.mark.parametrize("M,N,K", [(1, 97, 200), (3, 200, 4100), (16, 97, 200), (5, 64, 97)])
def test_every_variant_matches_reference(M, N, K, solidx, dtype, otype, bias):
    torch.manual_seed(M * 7919 + N * 31 + K + solidx)
    a = torch.randn(M, K, dtype=dtype, device=DEV)
    b = torch.randn(N, K, dtype=dtype, device=DEV)
    bvec = torch.randn(N, dtype=dtype, device=DEV) if bias else None
    if VARIANTS[solidx].gemv and M > GEMV_MAX_M:
        with pytest.raises(ValueError, match=rf"takes M <= {GEMV_MAX_M}, got A \({M}, {K}\)"):
            launch_skinny(a, b, bvec, otype, _config(solidx, 3, K))
        return
    out = launch_skinny(a, b, bvec, otype, _config(solidx, 3, K))
    assert out.shape == (M, N) and out.dtype == otype
    assert _rel_err(out, skinny_gemm_ref(a, b, bvec, torch.float32)) < TOL[otype]


@pytest.mark.parametrize("layout", BIAS_LAYOUTS)
@pytest.mark.parametrize("solidx", sorted(VARIANTS))
def test_bias_read_by_its_stride(solidx, layout):
    """Every variant's bias read (one-pass store, atomic split 0, gemv, and the two-pass reduce) follows the bias's
    stride: a strided, column-of-2-D or stride-0 bias (issue 31: off by 5.9 at M = 4 on the H100)."""
    torch.manual_seed(solidx)
    a = torch.randn(4, 200, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(40, 200, dtype=torch.bfloat16, device=DEV)
    bias = strided_bias(layout, 40, torch.bfloat16, DEV)
    out = launch_skinny(a, b, bias, torch.float32, _config(solidx, 3, 200))
    assert _rel_err(out, skinny_gemm_ref(a, b, bias.contiguous(), torch.float32)) < TOL[torch.float32]


@pytest.mark.parametrize("M", [1, 16])
def test_default_config_and_strided_operands(M):
    a = torch.randn(200, M, dtype=torch.float16, device=DEV).t()  # (M, 200), K not unit-stride
    b = torch.randn(97, 400, dtype=torch.float16, device=DEV)[:, ::2]
    out = skinny_gemm(a, b, None, torch.float32)
    assert _rel_err(out, skinny_gemm_ref(a, b, None, torch.float32)) < TOL[torch.float32]


def test_rejects_m_above_16():
    a = torch.randn(17, 64, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(32, 64, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(ValueError, match=r"M <= 16.*\(17, 64\)"):
        skinny_gemm(a, b)


@pytest.mark.parametrize("name", ["fma_BN16_BK512_SK1_W4_S1", "dot_atomic_BN32_BK256_SK4_W4_S3",
                                  "fma_2pass_BN8_BK1024_SK16_W8_S1", "gemv_BN1_BK2048_SK1_W8_S1_EF",
                                  "gemv_2pass_BN4_BK1024_SK4_W32_S1", "fma_BN8_BK1024_SK1_W4_S1_EF",
                                  "gemv_BN1_BK2048_SK1_W4_S1_EF_PDL", "gemv_BN2_BK1024_SK1_W8_S1_PDLW",
                                  "dot_BN64_BK128_SK1_W4_S5_SP"])
def test_kernel_name_round_trip(name):
    assert SkinnyConfig.from_name(name).name == name


@pytest.mark.parametrize("name", ["", "fma", "gemm_BN16_BK512_SK1_W4_S1", "fma_BN16_BK512_SK4_W4_S1",
                                  "gemv_BN1_BK2048_SK1_W8_S1_XX", "gemv_BN1_BK2048_SK1_W64_S1",
                                  "dot_2pass_BN16_BK512_SK1_W4_S3", "dot_BN8_BK512_SK1_W4_S3",
                                  "fma_BN12_BK512_SK1_W4_S1", "dot_BN32_BK128_SK1_W4_S3_PDL",
                                  "gemv_2pass_BN2_BK512_SK2_W4_S1_PDL", "gemv_BN1_BK2048_SK1_W4_S1_PDL_EF"])
def test_kernel_name_rejects_malformed(name):
    with pytest.raises(ValueError):
        SkinnyConfig.from_name(name)


@pytest.mark.parametrize("name,why", [  # issue 47: out of range, passed, then failed on every call
    ("fma_BN16_BK512_SK1_W4_S9", "num_stages=9 in 1..8"),
    ("fma_BN16_BK512_SK1_W4_S2147483648", "num_stages=2147483648 in 1..8"),
    ("fma_2pass_BN8_BK1024_SK512_W4_S1", "NUM_KSPLIT in 2..256, got 512"),
    ("gemv_BN1024_BK2048_SK1_W4_S1", "weight tile"),
    ("fma_BN16_BK512_SK1_W4_S" + "1" * 5000, "more than 18 digits"),
    ("fma_BN\u0661\u0666_BK512_SK1_W4_S1", "ASCII digits"),  # Arabic-Indic 16
])
def test_kernel_name_ranges(name, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        SkinnyConfig.from_name(name)
    assert SkinnyConfig.from_name("fma_2pass_BN8_BK1024_SK256_W4_S8").NUM_KSPLIT == 256


@pytest.mark.parametrize("M,N,K", [(1, 4096, 4096), (16, 1280, 8192), (8, 97, 4100), (3, 4096, 4096)])
def test_config_space_fits(M, N, K):
    space = sb.config_space(M, N, K, "sm_90", 132)
    solidxs = {c.solidx for c in space}
    # FMA tiles shrink with M (64 accumulators per thread): at M=16 only the one-pass 8-warp ones remain. The gemv
    # variants take M <= 8 (one-pass only where N / BN rows already give every SM 2 programs).
    gemv = {v for v in VARIANTS if VARIANTS[v].gemv}
    if M == 1:
        assert solidxs == set(VARIANTS)
    elif M <= GEMV_MAX_M:
        assert solidxs == set(VARIANTS) - ({7} if N >= 2 * 132 else set())
    else:
        assert not solidxs & gemv and solidxs >= {v for v in VARIANTS if VARIANTS[v].use_dot}
    for c in space:
        assert c.smem_bytes() <= 227 * 1024 and c.NUM_KSPLIT <= -(-K // c.BLOCK_SIZE_K)
        assert c.variant.use_dot or c.acc_regs_per_thread(M) <= 64
    assert sb.config_space(17, N, K, "sm_90", 132) == []


def test_registered_and_default_only_on_gpu():
    backend = get_backend("skinny")
    assert backend.name == "skinny" and backend.is_available(), backend.unavailable_reason()
    assert backend.default_priority > 0
    decode = GemmProblem(1, 4096, 4096)
    assert backend.default_for(decode, CPU) is None  # never the CPU default, even under the interpreter
    sol = backend.default_for(decode, H100)
    assert sol is not None and sol.libtype == "skinny" and SkinnyConfig.from_name(sol.kernelName).solidx == sol.solidx
    assert backend.default_for(GemmProblem(17, 4096, 4096), H100) is None
    assert backend.default_for(GemmProblem(1, 4096, 4096, scaleAB=True), H100) is None
    assert backend.default_for(GemmProblem(1, 4096, 4096, dtype=torch.float32, otype=torch.float32), H100) is None


def test_default_config_by_m():
    """M == 1: the gemv tile measured best across shipped and held-out shapes (one row per program: even N=1280
    gives ~10 programs per SM, no split). M >= 2: dot on 32-row slabs, split-K while the slabs underfill the GPU."""
    for N, K in ((1280, 8192), (28672, 4096), (3584, 3584)):
        assert default_skinny_config(1, N, K, 132).name == "gemv_BN1_BK2048_SK1_W4_S1_EF"
    assert default_skinny_config(2, 1280, 8192, 132).NUM_KSPLIT > 1
    assert default_skinny_config(2, 28672, 4096, 132).NUM_KSPLIT == 1
    assert default_skinny_config(16, 4096, 4096, 132).solidx == 3


@pytest.mark.parametrize("M,N,K,claims", [
    (1, 28672, 4096, True), (1, 4096, 4096, True), (1, 7168, 8192, True), (1, 4096, 14336, True),
    (1, 1280, 8192, True), (1, 3072, 8192, True), (1, 4608, 3584, True), (1, 28672, 3584, True),
    (1, 3072, 3072, True), (1, 8192, 1024, True), (1, 3584, 18944, True),  # gemv: 1.05-1.44x in the sweep
    (1, 1024, 4096, False),  # N < 1280: narrower than anything measured
    (1, 4096, 4100, False), (1, 4096, 512, False), (1, 4096, 20480, False),  # K off the measured grid or range
    (2, 4096, 4096, False), (8, 28672, 4096, False), (16, 3584, 14336, False),  # M >= 2 stays with F.linear
])
def test_default_claims_only_the_measured_region(M, N, K, claims):
    """The skinny default claims a shape only where the H100 sweep showed it beating F.linear with margin."""
    got = sb.BACKEND.default_for(GemmProblem(M, N, K), H100)
    assert (got is not None) == claims
    if claims:
        assert SkinnyConfig.from_name(got.kernelName) == default_skinny_config(M, N, K, 132)


def test_default_claims_nothing_on_unmeasured_devices():
    assert sb.BACKEND.default_for(GemmProblem(1, 28672, 4096), DeviceIdentity("sm_90", 114, "cuda", "H100 PCIe")) \
        is None
    assert sb.BACKEND.default_for(GemmProblem(1, 28672, 4096), DeviceIdentity("gfx942", 304, "hip")) is None
    assert sb.BACKEND.default_for(GemmProblem(1, 28672, 4096), DeviceIdentity("cpu", 2, "cpu")) is None


def test_prepare_solidx_and_kernel_name():
    problem = GemmProblem(4, 97, 200)
    assert sb.BACKEND.prepare(problem, Solution("skinny", 3, 1, "fma_BN16_BK512_SK1_W4_S1"), IDENT) is None
    assert sb.BACKEND.prepare(problem, Solution("skinny", 9, 0, ""), IDENT) is None
    assert sb.BACKEND.prepare(GemmProblem(17, 97, 200), Solution("skinny", 0, 0, ""), IDENT) is None
    assert sb.BACKEND.prepare(GemmProblem(9, 97, 200), Solution("skinny", 6, 1, ""), IDENT) is None  # gemv: M <= 8
    a = torch.randn(4, 200, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(97, 200, dtype=torch.bfloat16, device=DEV)
    ref = skinny_gemm_ref(a, b, None, torch.float32)
    for solidx in sorted(VARIANTS):  # a row with only solidx (+ splitK) set gets that variant's heuristic tile
        run = sb.BACKEND.prepare(problem, Solution("skinny", solidx, 2, ""), IDENT)
        assert run is not None, solidx
        assert _rel_err(run(a, b, None, torch.bfloat16, None, None, None), ref) < TOL[torch.bfloat16]


@pytest.mark.parametrize("M,N,K", [(2, 97, 4100)])
def test_candidates_all_prepare(M, N, K):
    problem = GemmProblem(M, N, K)
    cands = sb.BACKEND.candidates(problem, IDENT)
    assert cands and all(sb.BACKEND.prepare(problem, s, IDENT) is not None for s in cands)
    if HAS_GPU:  # run a sample of the space on the GPU
        a = torch.randn(M, K, dtype=torch.bfloat16, device=DEV)
        b = torch.randn(N, K, dtype=torch.bfloat16, device=DEV)
        ref = skinny_gemm_ref(a, b, None, torch.float32)
        for sol in cands[::15]:
            out = sb.BACKEND.prepare(problem, sol, IDENT)(a, b, None, torch.bfloat16, None, None, None)
            assert _rel_err(out, ref) < TOL[torch.bfloat16], sol.kernelName


# Odd M=1 shapes for the gemv kernel (N and K compile-time constants: every mask combination): N not a multiple of
# BN, K not a multiple of BK or of the split, one row, a 4100-long K; with evict_first, bias and split-K.
@pytest.mark.parametrize("cfg", ["gemv_BN1_BK512_SK1_W4_S1", "gemv_BN8_BK64_SK1_W4_S1_EF",
                                 "gemv_BN4_BK512_SK1_W8_S1_EF", "gemv_2pass_BN2_BK64_SK3_W4_S1_EF",
                                 "gemv_2pass_BN16_BK512_SK2_W4_S1", "gemv_BN4_BK64_SK1_W4_S1_EF_PDL",
                                 "gemv_BN2_BK64_SK1_W4_S1_PDLW"])
@pytest.mark.parametrize("N,K", [(1, 4100), (3, 97), (17, 200), (97, 1024), (256, 512)])
@pytest.mark.parametrize("bias", [False, True])
def test_gemv_odd_shapes(N, K, cfg, bias):
    torch.manual_seed(N * 131 + K)
    a = torch.randn(1, K, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=DEV)
    bvec = torch.randn(N, dtype=torch.bfloat16, device=DEV) if bias else None
    for otype in (torch.bfloat16, torch.float32):
        out = launch_skinny(a, b, bvec, otype, SkinnyConfig.from_name(cfg))
        assert out.shape == (1, N) and out.dtype == otype
        assert _rel_err(out, skinny_gemm_ref(a, b, bvec, torch.float32)) < TOL[otype], (cfg, otype)


# The gemv kernel at M = 2..8 (M a compile-time constant; BLOCK_SIZE_M the next power of two, rows past M re-read
# row M - 1 and are not stored): odd M, N and K (N not a multiple of BN, K of BK or of the split), BN 1-4 rows, bias,
# split-K, strided activations; bf16 and fp32 output.
@pytest.mark.parametrize("M,N,K,cfg,bias", [
    (2, 3, 97, "gemv_BN1_BK64_SK1_W2_S1", True),
    (3, 17, 4100, "gemv_BN1_BK512_SK1_W4_S1_EF", False),
    (5, 97, 1024, "gemv_BN2_BK256_SK1_W2_S1", True),
    (8, 17, 200, "gemv_BN4_BK64_SK1_W2_S1_EF", True),
    (4, 97, 4100, "gemv_2pass_BN2_BK512_SK3_W4_S1", False),
    (7, 3, 97, "gemv_2pass_BN1_BK64_SK2_W2_S1_EF", True),
    (2, 256, 512, "gemv_BN4_BK128_SK1_W4_S1", False),
    (8, 97, 1024, "gemv_BN1_BK1024_SK1_W4_S1", True),
    (6, 97, 1024, "gemv_BN8_BK256_SK1_W2_S1_EF", False),
    (5, 33, 200, "gemv_BN8_BK64_SK1_W2_S1", True),
])
def test_gemv_several_rows(M, N, K, cfg, bias):
    torch.manual_seed(M * 17 + N * 131 + K)
    a = torch.randn(M, K, dtype=torch.bfloat16, device=DEV)
    if M == 3:  # rows not contiguous with each other (stride_am > K)
        a = torch.randn(M, K + 8, dtype=torch.bfloat16, device=DEV)[:, :K]
    b = torch.randn(N, K, dtype=torch.bfloat16, device=DEV)
    bvec = torch.randn(N, dtype=torch.bfloat16, device=DEV) if bias else None
    for otype in (torch.bfloat16, torch.float32):
        out = launch_skinny(a, b, bvec, otype, SkinnyConfig.from_name(cfg))
        assert out.shape == (M, N) and out.dtype == otype
        assert _rel_err(out, skinny_gemm_ref(a, b, bvec, torch.float32)) < TOL[otype], (cfg, otype)


def test_gemv_space_rows():
    """At M >= 2 the gemv space keeps BN 1-8 rows with >= 8 K elements per thread (16-byte loads, no layout
    conversion in the K loop) and <= 64 accumulators (folded by 8 along K from M = 3), all allowed by config_error;
    none above GEMV_MAX_M."""
    for M in range(2, GEMV_MAX_M + 1):
        space = sb.gemv_space(M, 4096, 4096, 132)
        assert space and all(c.BLOCK_SIZE_N <= 8 and c.BLOCK_SIZE_K // (32 * c.num_warps) >= 8 for c in space)
        assert all(c.acc_regs_per_thread(M) <= 64 for c in space)
        fold = 8 if M >= 3 else 1  # the kernel folds 8 products per accumulator from 4 rows (BLOCK_SIZE_M)
        assert gemv_fold(triton.next_power_of_2(M)) == fold
        assert SkinnyConfig.from_name("gemv_BN2_BK1024_SK1_W4_S1").acc_regs_per_thread(M) == (
            triton.next_power_of_2(M) * 2 * 1024 // fold // 128)
        assert all(sb.config_error(c, M, 4096, 4096, "sm_90") is None for c in space)
        assert any(c.BLOCK_SIZE_N > 1 for c in space)
        assert {c.solidx for c in sb.config_space(M, 4096, 4096, "sm_90", 132)} >= {6}
    assert not any(c.variant.gemv for c in sb.config_space(GEMV_MAX_M + 1, 4096, 4096, "sm_90", 132))


def test_gemv_space_holds_inductors_m1_tiles():
    """Inductor's coordinate descent picked these (XBLOCK, R0_BLOCK, warps) for the shipped M=1 shapes on the H100
    (docs/exploration.md); the tuner's space must contain each as a gemv tile with evict_first."""
    seen = {(4096, 4096): [(2, 4096, 16), (2, 4096, 32), (8, 512, 4)], (6144, 4096): [(2, 2048, 16)],
            (28672, 4096): [(2, 4096, 16), (1, 2048, 16)], (4096, 14336): [(8, 512, 8), (2, 2048, 16)],
            (1280, 8192): [(8, 512, 4), (1, 1024, 16)], (8192, 1024): [(2, 1024, 8), (1, 1024, 4), (2, 1024, 16)],
            (7168, 8192): [(1, 2048, 16)], (8192, 3584): [(4, 512, 4), (1, 2048, 16), (2, 2048, 4)]}
    for (N, K), tiles in seen.items():
        space = set(sb.config_space(1, N, K, "sm_90", 132))
        for bn, bk, warps in tiles:
            assert SkinnyConfig(6, bn, bk, 1, warps, 1, True) in space, (N, K, bn, bk, warps)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="programmatic dependent launch needs a GPU (sm_90+)")
@pytest.mark.parametrize("name", ["gemv_BN1_BK2048_SK1_W4_S1_EF_PDL", "gemv_BN1_BK2048_SK1_W4_S1_EF_PDLW",
                                  "gemv_BN4_BK512_SK1_W8_S1_PDLW"])
@pytest.mark.parametrize("graph", [False, True])
def test_gemv_pdl_waits_for_the_kernel_that_writes_its_activation(name, graph):
    """A PDL gemv may start while the kernel before it runs: each step writes the activation with a kernel right
    before the gemv (and the gemv's output feeds the next step's activation), eagerly and in a CUDA graph; every
    step must see the fresh activation. A missing wait reads a stale or half-written one."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("programmatic dependent launch needs sm_90+")
    cfg = SkinnyConfig.from_name(name)
    N = K = 4096
    torch.manual_seed(0)
    w = (torch.randn(N, K, device="cuda") / K ** 0.5).bfloat16()
    x0 = torch.randn(1, K, device="cuda").bfloat16()
    steps = 8

    def chain(x):
        outs = []
        for i in range(steps):
            x = torch.tanh(x * (1.0 + 0.1 * i))  # the kernel right before the gemv writes its activation
            x = launch_skinny(x, w, None, torch.bfloat16, cfg)
            outs.append(x)
        return torch.cat(outs)

    def chain_ref(x):
        outs = []
        for i in range(steps):
            x = torch.tanh(x * (1.0 + 0.1 * i))
            x = skinny_gemm_ref(x, w, None, torch.bfloat16)
            outs.append(x)
        return torch.cat(outs)

    ref = chain_ref(x0)
    if graph:
        xs = x0.clone()
        chain(xs)  # compile and warm up outside the capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = chain(xs)
        for _ in range(3):
            g.replay()
    else:
        out = chain(x0)
    torch.cuda.synchronize()
    assert _rel_err(out, ref) < 3 * TOL[torch.bfloat16], name
