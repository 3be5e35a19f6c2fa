"""The fused MoE's ``SWAP`` variant (issue 51: each tile computed transposed, weight rows on the MMA's M side): results
against the float32 reference (bf16 and FP8, both GEMMs swapped and mixed pairs, with the other variants), the
kernelName and its rules, where the search space offers it, and on a GPU the Qwen3-30B-A3B shapes compiled."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from aiter_gemm import current_device_identity
from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, QUANT_NONE, MoeProblem
from aiter_gemm.backends.fused_moe import triton as triton_backend
from aiter_gemm.device import REFERENCE_ARCH
from aiter_gemm.kernels.blockscale_format import FP8
from aiter_gemm.kernels.fused_moe import (
    MoeConfig,
    config_error,
    config_space,
    fused_moe_ref,
    fused_moe_triton,
    pair_error,
)
from aiter_gemm.kernels.fused_moe_config import DIRECT_MAX_PAIRS, SWAP_MAX_ROWS, expected_rows
from op_tests.test_moe_kernel import assert_close, fp8_problem, problem, routing

#: (GEMM1, GEMM2) pairs: both swapped (8-row blocks), one GEMM swapped beside a plain one, and with the other
#: variants (split-K, DIRECT, KSUM; FP8: QA, and block_n 256 where each weight row block has its own scale).
BF16_PAIRS = {
    "both": (MoeConfig(8, 32, 32, swap=True), MoeConfig(8, 32, 32, swap=True)),
    "gemm1_only": (MoeConfig(16, 32, 32, swap=True), MoeConfig(16, 32, 32)),
    "gemm2_only_ksum": (MoeConfig(16, 32, 32), MoeConfig(8, 64, 16, swap=True, ksum=True)),
    "split_direct": (MoeConfig(8, 32, 16, split_k=2, direct=True, swap=True),
                     MoeConfig(8, 32, 16, split_k=3, direct=True, swap=True)),
}
FP8_PAIRS = {
    "both_qa": (MoeConfig(8, 64, 128, quant_a=True, swap=True), MoeConfig(8, 64, 128, quant_a=True, swap=True)),
    "gemm1_only": (MoeConfig(16, 32, 64, swap=True), MoeConfig(16, 32, 128, quant_a=True)),
    "gemm2_only_direct": (MoeConfig(16, 64, 128, quant_a=True, direct=True),
                          MoeConfig(8, 64, 128, direct=True, ksum=True, swap=True)),
    "wide_split": (MoeConfig(8, 256, 128, split_k=2, swap=True), MoeConfig(8, 256, 64, swap=True, ksum=True)),
}


def skip_direct(pairs: int, *configs: MoeConfig) -> None:
    """DIRECT (one block per pair) is offered for few pairs only: the interpreter's time is not spent past them."""
    if pairs > DIRECT_MAX_PAIRS and any(c.direct for c in configs):
        pytest.skip("DIRECT is for few pairs")


@pytest.mark.parametrize("pair", sorted(BF16_PAIRS))
@pytest.mark.parametrize("T,k", [(1, 1), (1, 8), (3, 2), (37, 1), (37, 8)])
def test_swap_bf16_matches_reference(T, k, pair):
    """H 96 and I 40: masked K tails and wrapped columns; experts 3 and 11 get no token."""
    c1, c2 = BF16_PAIRS[pair]
    skip_direct(T * k, c1, c2)
    args = problem(T, k, 16, 96, 40, absent=(3, 11))
    assert_close(fused_moe_triton(*args, config1=c1, config2=c2), fused_moe_ref(*args))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("pair", sorted(FP8_PAIRS))
@pytest.mark.parametrize("T,k,inter", [(1, 8, 128), (3, 2, 192), (37, 1, 128), (37, 2, 192)])
def test_swap_fp8_matches_reference(T, k, inter, pair):
    """The per-token activation scales along the swapped tile's columns, the weight scales along its rows: I 192
    gives GEMM1 per-row-block up scales (a tile's rows span two scale blocks) and GEMM2 a ragged last K group;
    block_n 256 a per-row weight scale in GEMM2. Expert 5 gets no token."""
    c1, c2 = FP8_PAIRS[pair]
    skip_direct(T * k, c1, c2)
    x, w1, w2, tw, ti, s1, s2 = fp8_problem(T, k, 8, 256, inter, absent=(5,))
    out = fused_moe_triton(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config1=c1, config2=c2)
    assert_close(out, fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2), rel=0.04)


def test_swap_gelu_and_bad_ids_unchecked(monkeypatch):
    """GELU through the swapped GEMM1; under graph capture (ids unchecked) a bad id's rows read no weight, add
    nothing, and with KSUM still arrive."""
    from aiter_gemm.kernels import fused_moe as fm

    x, w1, w2, tw, ti = problem(4, 2, 4, 64, 32)
    c1, c2 = MoeConfig(8, 32, 32, swap=True), MoeConfig(8, 32, 32, swap=True, ksum=True)
    assert_close(fused_moe_triton(x, w1, w2, tw, ti, activation="gelu", config1=c1, config2=c2),
                 fused_moe_ref(x, w1, w2, tw, ti, activation="gelu"))
    monkeypatch.setattr(fm, "is_capturing", lambda t: True)
    ti[0, 1], ti[2, 0] = 4, -7
    assert_close(fused_moe_triton(x, w1, w2, tw, ti, config1=c1, config2=c2), fused_moe_ref(x, w1, w2, tw, ti))


def test_swap_names_and_rules():
    """``_SWAP`` in the kernelName (last of the flags), 8-row blocks only with it, no ``FUSED`` with it, any pairing
    with the other GEMM's config (the intermediate is the same), no vLLM JSON key."""
    cfg = MoeConfig(8, 64, 128, num_stages=4, quant_a=True, direct=True, swap=True)
    assert cfg.name() == "moe_BM8_BN64_BK128_GM1_SK1_W4_S4_QA_DIRECT_SWAP" and MoeConfig.parse(cfg.name()) == cfg
    ksum = MoeConfig.parse("moe_BM16_BN128_BK128_GM1_SK2_W4_S3_SWAP")
    assert ksum == MoeConfig(16, 128, 128, split_k=2, swap=True) and not ksum.plain
    with pytest.raises(ValueError, match="kernelName"):
        MoeConfig.parse("moe_BM8_BN64_BK128_GM1_SK1_W4_S4_SWAP_QA")  # flags in the grammar's order only
    with pytest.raises(ValueError, match="block_m=8 must be a power of two >= 16 .*SWAP"):
        MoeConfig(8, 64, 128)
    with pytest.raises(ValueError, match="block_m=4 must be a power of two >= 8"):
        MoeConfig(4, 64, 128, swap=True)
    with pytest.raises(ValueError, match="BLOCK_SIZE_M"):
        MoeConfig.from_vllm({**MoeConfig(16, 64, 128).to_vllm(), "BLOCK_SIZE_M": 8})
    assert "SWAP" not in str(cfg.to_vllm())
    assert "no QA, DIRECT, KSUM or SWAP" in config_error(MoeConfig(16, 64, 128, fused=True, swap=True), fp8=True)
    plain = MoeConfig(16, 64, 128)
    for fp8 in (False, True):
        for stage in (1, 2, None):
            assert config_error(MoeConfig(8, 64, 128, swap=True), fp8=fp8, stage=stage) is None
    assert pair_error(cfg, plain) is None and pair_error(plain, cfg) is None


def qwen3(T: int, fp8: bool) -> MoeProblem:
    q = FP8 if fp8 else torch.bfloat16
    quant = QUANT_BLOCK if fp8 else QUANT_NONE
    return MoeProblem(T, 2048, 768, 128, 8, ACT_TYPES["silu"], torch.bfloat16, q, q, quant)


@pytest.mark.parametrize("fp8", [False, True])
def test_swap_space_small_t_only(fp8):
    """SWAP configs (a few in the quick space, every one valid for its stage) up to SWAP_MAX_ROWS expected rows per
    expert only: Qwen3's E 128, k 8 to T 128, not from T 256; without the expert count, every pair on one expert."""
    def swapped(**kw) -> list[MoeConfig]:
        return [c for c in config_space(fp8=fp8, **kw) if c.swap]

    assert expected_rows(128, 128, 8) <= SWAP_MAX_ROWS < expected_rows(256, 128, 8)
    for quick, most in ((True, 8), (False, 120)):
        for T in (1, 4, 16, 64, 128):
            few = swapped(quick=quick, tokens=T, topk=8, experts=128)
            assert 4 <= len(few) <= most and all(config_error(c, fp8=fp8) is None for c in few)
            assert all(c.quant_a for c in few) == (fp8 and quick)
            assert {c.block_m for c in few} >= {8, 16} and {c.block_n for c in few} == {64, 128}
            gemm2 = swapped(quick=quick, tokens=T, topk=8, experts=128, stage=2)
            assert all(config_error(c, fp8=fp8, stage=2) is None for c in gemm2)
        assert any(c.direct for c in swapped(quick=quick, tokens=1, topk=8, experts=128))
        for kw in (dict(tokens=256, topk=8, experts=128), dict(tokens=4096, topk=8, experts=128), dict(),
                   dict(tokens=4, topk=8)):
            assert swapped(quick=quick, **kw) == [], kw
        assert swapped(quick=quick, tokens=2, topk=8)


@pytest.mark.parametrize("fp8", [False, True])
def test_backend_offers_swap_pairs_the_tuner_accepts(fp8):
    """The Triton backend's quick and full candidates hold SWAP pairs at Qwen3's T 1 and 64, none at 1024; every
    one runs (shape_why_not), and the tuner's per-stage pairing takes a SWAP GEMM1 beside a plain GEMM2 and back."""
    from gradlib.moe import _triton_pair

    backend, ident = triton_backend.BACKEND, current_device_identity(False)
    for space in (backend.quick_candidates, backend.candidates):
        for T, offered in ((1, True), (64, True), (1024, False)):
            p = qwen3(T, fp8)
            sols = space(p, ident)
            pairs = [triton_backend.configs_of(s) for s in sols]
            assert any(c1.swap or c2.swap for c1, c2 in pairs) == offered, (space.__name__, T)
            assert all(backend.shape_why_not(p, s, REFERENCE_ARCH) is None for s in sols)
            assert all(backend.reference_variant(p, s) is None for s, (c1, _) in zip(sols, pairs) if c1.swap)
    p = qwen3(4, fp8)
    swap = MoeConfig(8, 64, 128, num_stages=4, quant_a=fp8, swap=True).name()
    plain = MoeConfig(16, 64, 128, num_stages=4, ksum=True).name()
    assert _triton_pair(p, swap, plain) is not None
    assert _triton_pair(p, MoeConfig(16, 64, 128).name(), swap) is not None
    assert _triton_pair(p, MoeConfig(16, 64, 128, fused=True).name(), swap) is None  # FUSED names both


# ------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("T", [1, 4, 16, 64])
def test_swap_compiled_qwen3(T, fp8):
    """Every SWAP config of the quick space at Qwen3-30B-A3B's experts (E 128, k 8, H 2048, I 768) compiled, as both
    GEMMs' and beside the default's other GEMM, against the reference; without split-K bit-identical across runs
    and under graph replay."""
    p = qwen3(T, fp8)
    H, inter, E, k = p.model_dim, p.inter_dim, p.expert, p.topk
    if fp8:
        x, w1, w2, tw, ti, s1, s2 = fp8_problem(T, k, E, H, inter)
    else:
        (x, w1, w2, tw, ti), s1, s2 = problem(T, k, E, H, inter), None, None
    ref = fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2)
    routed = tw.clone(), ti.clone()
    default1, default2 = triton_backend.FusedMoeTritonBackend._defaults(p, torch.cuda.get_device_properties(0)
                                                                        .multi_processor_count)
    swaps = [c for c in config_space(fp8=fp8, quick=True, tokens=T, topk=k, experts=E) if c.swap]
    assert swaps
    for c in swaps:
        for c1, c2 in ((c, c), (c, default2), (default1, c)):
            run = partial(fused_moe_triton, x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config1=c1, config2=c2)
            first = run()
            assert_close(first, ref, rel=0.04 if fp8 else 0.02)
            if c1.split_k == 1 and c2.split_k == 1 and (c1, c2) == (c, c):
                assert torch.equal(first, run()), f"{c1.name()};{c2.name()} differs between runs"
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    out = run()
                new_w, new_ids = routing(T, k, E, seed=1)
                tw.copy_(new_w)
                ti.copy_(new_ids)
                g.replay()
                torch.cuda.synchronize()
                assert_close(out, fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2),
                             rel=0.04 if fp8 else 0.02)
                tw.copy_(routed[0])
                ti.copy_(routed[1])
