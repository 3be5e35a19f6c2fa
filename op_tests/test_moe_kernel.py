"""The Triton fused-MoE kernel (issue 51): token alignment invariants, bf16 / fp16 / FP8 block-scale results against
the float32 reference, split-K, GELU, bad ids, configs (vLLM JSON, kernelName, search space, defaults) and input
validation. Shapes are tiny: on CPU every kernel is interpreted."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from aiter_gemm import current_device_identity
from aiter_gemm.accuracy import rel_error
from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, MoeProblem
from aiter_gemm.backends.fused_moe import triton as triton_backend
from aiter_gemm.device import REFERENCE_ARCH
from aiter_gemm.kernels import fused_moe as fm
from aiter_gemm.kernels.a8w8_blockscale import quantize_weight_blockscale
from aiter_gemm.kernels.blockscale_format import FP8, FP8_ROUNDING
from aiter_gemm.kernels.fused_moe import (
    MoeConfig,
    config_error,
    config_space,
    default_config,
    fused_moe_ref,
    fused_moe_triton,
    pair_error,
)
from aiter_gemm.kernels.moe_align import moe_align_block_size, padded_bound

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def routing(T: int, k: int, E: int, seed: int = 0, absent: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weight float32, topk_ids int32) of softmax top-k routing; experts in ``absent`` get no token."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g)
    logits[:, list(absent)] = -float("inf")
    weight, ids = torch.topk(logits.softmax(-1), k, dim=-1)
    return weight.to(DEV), ids.to(torch.int32).to(DEV)


def problem(T: int, k: int, E: int, H: int, inter: int, dtype=torch.bfloat16, seed: int = 0, absent=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(dtype).to(DEV)
    w1 = (torch.randn(E, 2 * inter, H, generator=g) / H**0.5).to(dtype).to(DEV)
    w2 = (torch.randn(E, H, inter, generator=g) / inter**0.5).to(dtype).to(DEV)
    return (x, w1, w2, *routing(T, k, E, seed, absent))


def fp8_problem(T: int, k: int, E: int, H: int, inter: int, seed: int = 0, absent=()):
    x, w1, w2, tw, ti = problem(T, k, E, H, inter, torch.float32, seed, absent)
    q1 = [quantize_weight_blockscale(w) for w in w1]
    q2 = [quantize_weight_blockscale(w) for w in w2]
    return (x.to(torch.bfloat16), torch.stack([q for q, _ in q1]), torch.stack([q for q, _ in q2]), tw, ti,
            torch.stack([s for _, s in q1]), torch.stack([s for _, s in q2]))


def assert_close(out: torch.Tensor, ref: torch.Tensor, rel: float = 0.02) -> None:
    """Elementwise within ``rel`` of the output's scale: a few bf16 ulps (each pair's row is rounded once)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    err = (out.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    assert scale > 0.1 and err <= rel * scale, f"max error {err} vs output scale {scale}"


# ------------------------------------------------------------------------------------------------- alignment


@pytest.mark.parametrize("T,k,E,block_m", [(1, 8, 128, 16), (3, 2, 4, 16), (37, 1, 8, 32), (129, 8, 8, 16)])
def test_align_invariants(T, k, E, block_m):
    _, ids = routing(T, k, E, absent=(E - 1,) if E > k else ())
    if T >= 3:
        ids[1, 0] = E  # a bad id: a run of its own after the experts
        ids[2, k - 1] = -1
    sorted_ids, expert_ids, num_post = moe_align_block_size(ids, E, block_m)
    sorted_ids, expert_ids, n = sorted_ids.cpu(), expert_ids.cpu(), int(num_post.item())
    flat = ids.reshape(-1).cpu().long()
    numel = flat.numel()
    assert sorted_ids.numel() == padded_bound(numel, E, block_m) <= numel + (E + 1) * (block_m - 1)
    assert n % block_m == 0 and expert_ids.numel() * block_m >= sorted_ids.numel()
    used = sorted_ids[:n]
    real = used[used != numel].long()
    assert sorted(real.tolist()) == list(range(numel))  # every (t, j) exactly once
    assert (sorted_ids[n:] == numel).all()  # past the end: only the sentinel
    present = []
    for b in range(n // block_m):
        rows = used[b * block_m:(b + 1) * block_m].long()
        rows = rows[rows != numel]
        assert rows.numel() > 0, "a block with no pair"
        e = int(expert_ids[b])
        want = flat[rows]
        if e == -1:
            assert ((want < 0) | (want >= E)).all()
        else:
            assert (want == e).all()
            present.append(e)
    assert present == sorted(present)  # runs in ascending expert order
    assert set(present) == {e for e in flat.tolist() if 0 <= e < E}  # absent experts have no block
    assert (expert_ids[n // block_m:] == -1).all()


# ------------------------------------------------------------------------------------------------- results


@pytest.mark.parametrize("T,k,E,cfg", [
    (1, 1, 1, None),
    (3, 2, 4, None),
    (37, 8, 8, MoeConfig(16, 32, 32)),
    (129, 2, 8, MoeConfig(32, 64, 64, group_m=4)),
])
def test_bf16_matches_reference(T, k, E, cfg):
    args = problem(T, k, E, 96, 40)  # H and I not multiples of any block: masked K tails, wrapped columns
    assert_close(fused_moe_triton(*args, config1=cfg, config2=cfg), fused_moe_ref(*args))


def test_expert_without_tokens_fp16_gelu():
    x, w1, w2, tw, ti = problem(9, 2, 8, 64, 48, torch.float16, absent=(0, 5))
    ref = fused_moe_ref(x, w1, w2, tw, ti, activation="gelu")
    assert_close(fused_moe_triton(x, w1, w2, tw, ti, activation="gelu"), ref)
    assert (fused_moe_ref(x, w1, w2, tw, ti) - ref).abs().max() > 1e-2  # gelu and silu differ here


@pytest.mark.parametrize("split1,split2,bk2", [(2, 1, 16), (1, 2, 16), (3, 8, 16), (2, 2, 64)])
def test_split_k(split1, split2, bk2):
    """K = 96 and 40 in blocks of 16: 6 and 3 blocks; split_k above the blocks (8 of 3, 2 of 1 at bk2 = 64) runs
    fewer splits (one: the plain path)."""
    args = problem(5, 2, 4, 96, 40)
    c1, c2 = MoeConfig(16, 32, 16, split_k=split1), MoeConfig(16, 32, bk2, split_k=split2)
    assert_close(fused_moe_triton(*args, config1=c1, config2=c2), fused_moe_ref(*args))


@pytest.mark.parametrize("T,inter,cfg", [
    (3, 128, None),
    (4, 192, MoeConfig(16, 64, 64, split_k=2)),  # ragged I: partial scale blocks in both GEMMs
])
def test_fp8_blockscale(T, inter, cfg):
    x, w1, w2, tw, ti, s1, s2 = fp8_problem(T, 2, 4, 256, inter)
    out = fused_moe_triton(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config1=cfg, config2=cfg)
    # 4%: where the kernel's bf16 intermediate differs from the reference's by an ulp (float32 summation order),
    # the group's fp8 scale and roundings change for a whole row (the quantization noise itself is ~5%).
    assert_close(out, fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2), rel=0.04)


def test_bad_ids_contribute_nothing_when_unchecked(monkeypatch):
    """Under graph capture the ids are not checked: the kernels must read no weight for them and add nothing (and,
    with KSUM, still count their arrival, or their token's row would never be written)."""
    monkeypatch.setattr(fm, "is_capturing", lambda t: True)
    x, w1, w2, tw, ti = problem(4, 2, 4, 64, 32)
    ti[0, 1], ti[2, 0] = 4, -7
    for cfg in (MoeConfig(16, 32, 32), MoeConfig(16, 32, 32, split_k=2)):
        assert_close(fused_moe_triton(x, w1, w2, tw, ti, config1=cfg, config2=cfg), fused_moe_ref(x, w1, w2, tw, ti))
    for direct in (False, True):
        c1, c2 = MoeConfig(16, 32, 32, direct=direct), MoeConfig(16, 32, 32, direct=direct, ksum=True)
        assert_close(fused_moe_triton(x, w1, w2, tw, ti, config1=c1, config2=c2), fused_moe_ref(x, w1, w2, tw, ti))
    fused = MoeConfig(16, 16, 32, fused=True)  # the bad ids still arrive: every token's row is written
    assert_close(fused_moe_triton(x, w1, w2, tw, ti, config1=fused), fused_moe_ref(x, w1, w2, tw, ti))


@pytest.mark.parametrize("direct, T, H", [(False, 37, 512), (True, 3, 4096)])
def test_ksum_counters_are_cleared_past_one_chunk(monkeypatch, direct, T, H):
    """GEMM1 clears GEMM2's KSUM counters in runtime-sized chunks (``ZERO_CHUNK`` per store): with more counters per
    GEMM1 program than one chunk and stale values in the counters' memory, every token's row is still written."""
    k, E, inter = 2, 4, 32
    c1, c2 = MoeConfig(16, 32, 32, direct=direct), MoeConfig(16, 32, 32, direct=direct, ksum=True)
    pairs = T * k
    programs = (pairs if direct else padded_bound(pairs, E, 16) // 16) * -(-inter // 32)
    assert T * (H // 32) > programs * fm.ZERO_CHUNK.value  # more than one chunk per program
    empty = torch.empty

    def stale(*args, **kw):  # int32 scratch (the counters) comes back holding old arrivals
        t = empty(*args, **kw)
        return t.fill_(1) if t.dtype == torch.int32 else t

    x, w1, w2, tw, ti = problem(T, k, E, H, inter)
    want = fused_moe_ref(x, w1, w2, tw, ti)
    monkeypatch.setattr(torch, "empty", stale)
    assert_close(fused_moe_triton(x, w1, w2, tw, ti, config1=c1, config2=c2), want)


# ------------------------------------------------------------------------------------------------- variants

#: (GEMM1, GEMM2) configs of the variants: no sorting, the k-sum in GEMM2, both; FP8 adds in-kernel quantization.
BF16_VARIANTS = {
    "direct": (MoeConfig(16, 32, 32, direct=True), MoeConfig(16, 32, 32, direct=True)),
    "ksum": (MoeConfig(16, 32, 32), MoeConfig(16, 32, 32, ksum=True)),
    "direct_ksum": (MoeConfig(16, 32, 32, direct=True), MoeConfig(16, 32, 32, direct=True, ksum=True)),
}
FP8_VARIANTS = {
    "qa": (MoeConfig(16, 32, 128, quant_a=True), MoeConfig(16, 32, 128, quant_a=True)),
    "qa_gemm2_split": (MoeConfig(16, 32, 128, split_k=2), MoeConfig(16, 32, 128, split_k=2, quant_a=True)),
    "qa_direct_ksum": (MoeConfig(16, 32, 128, quant_a=True, direct=True),
                       MoeConfig(16, 32, 128, quant_a=True, direct=True, ksum=True)),
}


@pytest.mark.parametrize("variant", sorted(BF16_VARIANTS))
@pytest.mark.parametrize("T,k", [(1, 8), (3, 2), (37, 1), (129, 8)])
def test_variants_bf16(T, k, variant):
    """H 96 and I 40: masked K tails and wrapped columns; experts 3 and 11 get no token. DIRECT (one block per pair)
    runs to T = 37: the tuner offers it only for few pairs."""
    if T > 37 and "direct" in variant:
        pytest.skip("DIRECT is for few pairs")
    args = problem(T, k, 16, 96, 40, absent=(3, 11))
    c1, c2 = BF16_VARIANTS[variant]
    assert_close(fused_moe_triton(*args, config1=c1, config2=c2), fused_moe_ref(*args))


@pytest.mark.parametrize("variant", sorted(FP8_VARIANTS))
@pytest.mark.parametrize("T,k,inter", [(1, 8, 128), (3, 2, 192), (37, 1, 128)])
def test_variants_fp8(T, k, inter, variant):
    """QA quantizes each activation tile in the kernel by the quantizer's rule: the reference's quantization. I 192:
    a ragged last group in GEMM2's quantization."""
    x, w1, w2, tw, ti, s1, s2 = fp8_problem(T, k, 8, 256, inter)
    c1, c2 = FP8_VARIANTS[variant]
    out = fused_moe_triton(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config1=c1, config2=c2)
    assert_close(out, fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2), rel=0.04)


def test_variant_names_and_rules():
    flagged = MoeConfig(16, 64, 128, quant_a=True, direct=True, ksum=True)
    assert flagged.name() == "moe_BM16_BN64_BK128_GM1_SK1_W4_S3_QA_DIRECT_KSUM"
    assert MoeConfig.parse(flagged.name()) == flagged
    assert MoeConfig.parse("moe_BM16_BN64_BK128_GM1_SK1_W4_S3_DIRECT") == MoeConfig(16, 64, 128, direct=True)
    assert MoeConfig(16, 64, 128).plain and not flagged.plain
    with pytest.raises(ValueError, match="kernelName"):
        MoeConfig.parse("moe_BM16_BN64_BK128_GM1_SK1_W4_S3_KSUM_QA")  # flags in the grammar's order only
    with pytest.raises(ValueError, match="split-K adds"):
        MoeConfig(16, 64, 128, split_k=2, ksum=True)
    assert "not FP8" in config_error(MoeConfig(16, 64, 128, quant_a=True), fp8=False)
    assert "block_k=128" in config_error(MoeConfig(16, 64, 64, quant_a=True), fp8=True)
    ksum = MoeConfig(16, 64, 128, ksum=True)
    assert config_error(ksum, fp8=True, stage=2) is None
    assert "GEMM2 config only" in config_error(ksum, fp8=True, stage=1)
    assert "GEMM2 config only" in config_error(ksum, fp8=True)
    # One accumulator (GEMM2): FP8 128 x 128 on 8 warps holds the accumulator and one K block's product.
    big = MoeConfig(128, 128, 128, 16, 8, 3)
    assert config_error(big, fp8=True, stage=2) is None and "registers" in config_error(big, fp8=True, stage=1)
    with pytest.raises(ValueError, match="config1 .*GEMM2 config only"):
        fused_moe_triton(*problem(2, 2, 4, 64, 32), config1=ksum)


@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("T,k,act", [(1, 8, "silu"), (3, 2, "gelu"), (5, 8, "silu"), (37, 1, "silu"), (1, 1, "gelu")])
def test_fused_matches_reference(T, k, act, fp8):
    """FUSED (both GEMMs in one launch) against the reference whose FP8 intermediate enters GEMM2 unquantized, as
    the kernel takes it; 16 experts, some without a token (3 and 11 for bf16). Up to 40 pairs: the tuner offers FUSED
    for few."""
    cfg = MoeConfig(16, 64, 128, num_warps=4, num_stages=2, fused=True)
    if fp8:
        x, w1, w2, tw, ti, s1, s2 = fp8_problem(T, k, 16, 256, 128)
    else:
        (x, w1, w2, tw, ti), s1, s2 = problem(T, k, 16, 256, 128, absent=(3, 11)), None, None
    out = fused_moe_triton(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, activation=act, config1=cfg, config2=cfg)
    ref = partial(fused_moe_ref, x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, activation=act)
    assert_close(out, ref(quant_inter=False), rel=0.02)
    if fp8:  # the option matters (the unfused path's quantized intermediate is further off), by one fp8 rounding
        exact, quantized = ref(quant_inter=False), ref()
        assert (exact.float() - quantized.float()).abs().max() > 0
        assert rel_error(quantized, exact) <= FP8_ROUNDING


@pytest.mark.parametrize("fp8,T,k,H,inter,cfg", [
    (False, 5, 2, 96, 40, MoeConfig(16, 16, 32, fused=True)),  # masked H tails, columns past I wrapped
    (False, 2, 8, 256, 128, MoeConfig(16, 32, 256, num_warps=8, fused=True)),  # block_k 256
    (True, 3, 2, 192, 192, MoeConfig(16, 32, 128, num_warps=2, fused=True)),  # ragged groups: up rows' scales vary
    (True, 3, 2, 320, 192, MoeConfig(16, 32, 256, num_warps=4, fused=True)),  # 2 groups a step, H's last one partial
    (True, 2, 4, 512, 256, MoeConfig(16, 16, 512, num_warps=8, fused=True)),  # 4 groups a step, whole
    (False, 2, 4, 640, 64, MoeConfig(16, 16, 512, num_warps=8, fused=True)),  # bf16 block_k 512, masked tail
])
def test_fused_ragged_shapes(fp8, T, k, H, inter, cfg):
    if fp8:
        x, w1, w2, tw, ti, s1, s2 = fp8_problem(T, k, 8, H, inter)
    else:
        (x, w1, w2, tw, ti), s1, s2 = problem(T, k, 8, H, inter), None, None
    out = fused_moe_triton(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config1=cfg)  # config2: config1's
    assert_close(out, fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, quant_inter=False))


#: FUSED FP8's relative Frobenius distance from the op's reference (whose intermediate is quantized as the unfused
#: kernels quantize it); the tuner checks FUSED FP8 against its own reference (the backend's reference variant).
FUSED_FP8_MAX_REL_ERR = 5e-2


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("T,cfg", [(4, MoeConfig(16, 32, 128, num_warps=2, fused=True)),
                                   (2, MoeConfig(16, 32, 256, num_warps=8, fused=True))])
def test_fused_fp8_stays_near_the_ops_reference(T, cfg):
    """On the tuner's inputs FUSED FP8 lies within FUSED_FP8_MAX_REL_ERR / 2 of the op's reference, and nearer the
    reference of its own arithmetic (backend's :meth:`reference`) than the op's."""
    from aiter_gemm.ops.fused_moe import FUSED_MOE

    p = MoeProblem(T, 256, 128, 8, 4, ACT_TYPES["silu"], torch.bfloat16, FP8, FP8, QUANT_BLOCK)
    inputs = FUSED_MOE.make_inputs(p, 0, torch.device("cpu"), 0, {}).sets[0]
    out = fused_moe_triton(*inputs[:5], w1_scale=inputs[5], w2_scale=inputs[6], config1=cfg).float()
    ops = fused_moe_ref(*inputs[:5], w1_scale=inputs[5], w2_scale=inputs[6]).float()
    backend = triton_backend.BACKEND
    own = backend.reference(p, inputs, backend.reference_variant(p, triton_backend.solution_of(cfg)))

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return ((a - b).norm() / b.norm()).item()

    assert rel(out, ops) < FUSED_FP8_MAX_REL_ERR / 2
    assert rel(out, own) < rel(out, ops) / 2


def test_fused_names_and_rules():
    """``_FUSED`` in the kernelName (not in vLLM's JSON, which has no key for it); the one rule's messages: its
    fixed fields, FP8's block_k, spilling tiles, and the same config for both GEMMs."""
    fused = MoeConfig(16, 64, 128, num_warps=4, num_stages=4, fused=True)
    assert fused.name() == "moe_BM16_BN64_BK128_GM1_SK1_W4_S4_FUSED" and MoeConfig.parse(fused.name()) == fused
    assert not fused.plain and "FUSED" not in str(fused.to_vllm())
    with pytest.raises(ValueError, match="unknown keys"):
        MoeConfig.from_vllm({**fused.to_vllm(), "FUSED": 1})
    for bad in (MoeConfig(32, 64, 128, fused=True), MoeConfig(16, 64, 128, split_k=2, fused=True),
                MoeConfig(16, 64, 128, quant_a=True, fused=True), MoeConfig(16, 64, 128, direct=True, fused=True)):
        assert "FUSED runs one pair per program" in config_error(bad, fp8=True)
    for bk in (32, 64):
        assert "needs block_k a multiple of 128" in config_error(MoeConfig(16, 64, bk, fused=True), fp8=True)
    for bk in (256, 512):  # whole groups a K step
        assert config_error(MoeConfig(16, 16, bk, num_warps=8, fused=True), fp8=True) is None
    assert config_error(MoeConfig(16, 64, 64, fused=True), fp8=False) is None
    assert "registers" in config_error(MoeConfig(16, 64, 128, num_warps=2, fused=True), fp8=True)
    for stage in (1, 2, None):
        assert config_error(fused, fp8=True, stage=stage) is None
    plain = MoeConfig(16, 64, 128)
    assert pair_error(fused, fused) is None and pair_error(plain, plain) is None
    assert "must be the same one" in pair_error(fused, plain) and "must be the same one" in pair_error(plain, fused)
    args = problem(2, 2, 4, 64, 32)
    for c1, c2 in ((fused, plain), (plain, fused)):
        with pytest.raises(ValueError, match="FUSED runs both GEMMs in one launch"):
            fused_moe_triton(*args, config1=c1, config2=c2)


@pytest.mark.parametrize("fp8", [False, True])
def test_fused_space_for_few_pairs(fp8):
    """The search space offers FUSED configs (a dozen or two, every one valid) up to DIRECT_MAX_PAIRS pairs only."""
    for quick in (True, False):
        few = [c for c in config_space(fp8=fp8, quick=quick, tokens=1, topk=8) if c.fused]
        assert 12 <= len(few) <= 24 and all(config_error(c, fp8=fp8) is None for c in few)
        assert few == [c for c in config_space(fp8=fp8, quick=quick, tokens=8, topk=8) if c.fused]
        assert not any(c.fused for c in config_space(fp8=fp8, quick=quick, tokens=9, topk=8))
        assert not any(c.fused for c in config_space(fp8=fp8, quick=quick))


def test_fused_backend_pairs_and_precompile_partners():
    """The backend offers a FUSED config only as both GEMMs' and refuses it beside another; the precompile's
    counter-clearing partners never pair one with another config."""
    p = MoeProblem(1, 256, 128, 16, 8, ACT_TYPES["silu"], torch.bfloat16, FP8, FP8, QUANT_BLOCK)
    backend = triton_backend.BACKEND
    pairs = [triton_backend.configs_of(s) for s in backend.quick_candidates(p, current_device_identity(False))]
    fused = [c1 for c1, _ in pairs if c1.fused]
    assert fused and all(c1 == c2 for c1, c2 in pairs if c1.fused or c2.fused)
    plain, ksum = MoeConfig(16, 64, 128), MoeConfig(16, 64, 128, ksum=True)
    mixed = triton_backend.solution_of(fused[0], plain)
    assert "must be the same one" in backend.shape_why_not(p, mixed, REFERENCE_ARCH)
    jobs = [(p, triton_backend.solution_of(fused[0])), (p, triton_backend.solution_of(plain, ksum)),
            (p, triton_backend.solution_of(plain))]
    partners = [triton_backend.configs_of(s) for _, s in triton_backend.ksum_partners(jobs)]
    assert not any(c.fused for pair in partners for c in pair)


@pytest.mark.parametrize("fp8", [False, True])
def test_variant_space(fp8):
    """Decode token counts add the flagged variants (DIRECT up to DIRECT_MAX_PAIRS pairs, KSUM for GEMM2 only),
    prefill ones the large tiles; every config valid for its stage."""
    both = config_space(fp8=fp8, quick=True, tokens=4, topk=8)
    gemm2 = config_space(fp8=fp8, quick=True, tokens=4, topk=8, stage=2)
    assert any(c.direct for c in both) and not any(c.ksum for c in both) and any(c.ksum for c in gemm2)
    assert any(c.quant_a for c in both) == fp8
    assert not any(c.direct for c in config_space(fp8=fp8, quick=True, tokens=64, topk=8))
    prefill = config_space(fp8=fp8, quick=True, tokens=4096, topk=8, stage=2)
    assert any(c.block_m * c.block_n >= 128 * 128 and c.num_warps == 8 for c in prefill)
    for stage, space in ((None, both), (2, gemm2), (2, prefill)):
        assert len(set(space)) == len(space)
        assert all(config_error(c, fp8=fp8, stage=stage) is None for c in space)


def test_no_tokens():
    x, w1, w2, tw, ti = problem(0, 2, 4, 64, 32)
    out = fused_moe_triton(x, w1, w2, tw, ti)
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16


# ------------------------------------------------------------------------------------------------- configs


def test_config_vllm_and_name_round_trip():
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 4}
    cfg = MoeConfig.from_vllm(entry)
    assert cfg == MoeConfig(16, 64, 128, 1, 4, 4, 1) and cfg.to_vllm() == entry
    split = MoeConfig.from_vllm({**entry, "SPLIT_K": 4, "waves_per_eu": 0})
    assert split.split_k == 4 and split.to_vllm() == {**entry, "SPLIT_K": 4}
    assert cfg.name() == "moe_BM16_BN64_BK128_GM1_SK1_W4_S4"
    for c in (cfg, split, MoeConfig(128, 256, 64, 16, 8, 2, 1)):
        assert MoeConfig.parse(c.name()) == c and MoeConfig.from_vllm(c.to_vllm()) == c


@pytest.mark.parametrize("change,field", [
    ({"BLOCK_SIZE_M": 24}, "BLOCK_SIZE_M"),
    ({"BLOCK_SIZE_N": 8}, "BLOCK_SIZE_N"),
    ({"BLOCK_SIZE_K": "64"}, "BLOCK_SIZE_K"),
    ({"GROUP_SIZE_M": 0}, "GROUP_SIZE_M"),
    ({"num_warps": 3}, "num_warps"),
    ({"num_stages": 99}, "num_stages"),
    ({"SPLIT_K": 1000}, "SPLIT_K"),
    ({"num_stages": True}, "num_stages"),
    ({"BLOCK_SIZE_MM": 16}, "BLOCK_SIZE_MM"),
])
def test_config_bad_values_named(change, field):
    entry = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4,
             "num_stages": 4, **change}
    with pytest.raises(ValueError, match=field):
        MoeConfig.from_vllm(entry)


def test_config_missing_key_and_bad_name():
    with pytest.raises(ValueError, match="num_stages"):
        MoeConfig.from_vllm({"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
                             "num_warps": 4})
    with pytest.raises(ValueError, match="kernelName"):
        MoeConfig.parse("moe_BM16_BN64_BK128_GM1_W4_S4")
    with pytest.raises(ValueError, match="block_m"):
        MoeConfig.parse("moe_BM12_BN64_BK128_GM1_SK1_W4_S4")


@pytest.mark.parametrize("fp8", [False, True])
def test_config_space(fp8):
    quick, full = config_space(fp8=fp8, quick=True), config_space(fp8=fp8)
    assert 20 <= len(quick) <= 40 and 150 <= len(full) <= 900
    assert len(set(full)) == len(full)
    for cfg in quick + full:
        assert config_error(cfg, fp8=fp8) is None
    assert any(c.split_k > 1 for c in quick) and any(c.block_m == 16 for c in quick)
    if fp8:
        assert {c.block_k for c in full} == {64, 128}


def test_default_config():
    decode = default_config(1, 128, 8, 768, 2048, fp8=False)  # Qwen3-30B-A3B GEMM1, T = 1
    prefill = default_config(4096, 8, 2, 4096, 14336, fp8=True)  # Mixtral GEMM2, T = 4096
    assert decode.block_m == 16 and prefill.block_m >= 64 and prefill.split_k == 1
    assert default_config(1, 8, 1, 256, 8192, fp8=False).split_k > 1  # 4 tiles over 64 K blocks: split
    for tokens in (1, 16, 64, 512, 4096):
        for fp8 in (False, True):
            assert config_error(default_config(tokens, 32, 8, 2048, 7168, fp8=fp8), fp8=fp8) is None


def test_backend_space_pairs_stage_configs():
    """The Triton backend's quick space at decode on FP8 experts: the variants, GEMM2-only configs only as GEMM2,
    every pair one the backend runs."""
    p = MoeProblem(4, 256, 128, 16, 8, ACT_TYPES["silu"], torch.bfloat16, FP8, FP8, QUANT_BLOCK)
    sols = triton_backend.BACKEND.quick_candidates(p, current_device_identity(False))
    pairs = [triton_backend.configs_of(s) for s in sols]
    assert any(c2.ksum for _, c2 in pairs) and not any(c1.ksum for c1, _ in pairs)
    assert any(c1.direct and c1.quant_a for c1, _ in pairs)
    assert all(triton_backend.BACKEND.shape_why_not(p, s, REFERENCE_ARCH) is None for s in sols)


# ------------------------------------------------------------------------------------------------- bad input


def test_bad_ids_raise_naming_topk_ids():
    x, w1, w2, tw, ti = problem(3, 2, 4, 64, 32)
    ti[1, 1] = 4
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe_triton(x, w1, w2, tw, ti)
    ti[1, 1] = -1
    with pytest.raises(ValueError, match=r"topk_ids.*\[-1, "):
        fused_moe_triton(x, w1, w2, tw, ti)


def test_bad_inputs_named():
    x, w1, w2, tw, ti = problem(3, 2, 4, 64, 32)
    with pytest.raises(ValueError, match=r"w1 \(shape \(4, 64, 48\)"):
        fused_moe_triton(x, w1[:, :, :48].contiguous(), w2, tw, ti)
    with pytest.raises(ValueError, match=r"w2 \(shape \(4, 64, 32\), dtype torch.float16"):
        fused_moe_triton(x, w1, w2.half(), tw, ti)
    with pytest.raises(ValueError, match="w1 .*must be contiguous"):
        fused_moe_triton(x, w1.transpose(1, 2).contiguous().transpose(1, 2), w2, tw, ti)
    with pytest.raises(ValueError, match="w2 .*device meta"):
        fused_moe_triton(x, w1, w2.to("meta"), tw, ti)
    with pytest.raises(ValueError, match="topk_weight"):
        fused_moe_triton(x, w1, w2, tw[:, :1].contiguous(), ti)
    with pytest.raises(ValueError, match="topk_ids"):
        fused_moe_triton(x, w1, w2, tw, ti.float())
    with pytest.raises(ValueError, match="activation"):
        fused_moe_triton(x, w1, w2, tw, ti, activation="relu")


def test_bad_fp8_inputs_named():
    x, w1, w2, tw, ti, s1, s2 = fp8_problem(2, 2, 4, 256, 128)
    with pytest.raises(ValueError, match="w1_scale and w2_scale are required"):
        fused_moe_triton(x, w1, w2, tw, ti)
    with pytest.raises(ValueError, match=r"w2_scale \(shape \(4, 1, 2\)"):
        fused_moe_triton(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2.transpose(1, 2).contiguous())
    with pytest.raises(ValueError, match="config1 .*block_k=256"):
        fused_moe_triton(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config1=MoeConfig(16, 32, 256))
    assert w1.dtype == FP8


# ------------------------------------------------------------------------------------------------- GPU


@pytest.mark.gpu
def test_cuda_graph_capture_has_no_host_sync():
    """Captured with bad ids too (no check under capture); replays match the reference on new routing."""
    x, w1, w2, tw, ti = problem(8, 2, 8, 256, 128)
    ti_bad = ti.clone()
    ti_bad[0, 0] = 99
    fused_moe_triton(x, w1, w2, tw, ti)  # compile outside capture
    cfg = MoeConfig(16, 64, 64, split_k=2)
    fused_moe_triton(x, w1, w2, tw, ti, config1=cfg, config2=cfg)
    torch.cuda.synchronize()
    graphs = []
    for c in (None, cfg):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = fused_moe_triton(x, w1, w2, tw, ti, config1=c, config2=c)
        graphs.append((g, out))
    new_w, new_ids = routing(8, 2, 8, seed=1)
    tw.copy_(new_w)
    ti.copy_(new_ids)
    for g, out in graphs:
        g.replay()
        torch.cuda.synchronize()
        assert_close(out, fused_moe_ref(x, w1, w2, tw, ti))
    ti.copy_(ti_bad)
    for g, out in graphs:
        g.replay()
        torch.cuda.synchronize()
        assert_close(out, fused_moe_ref(x, w1, w2, tw, ti))


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("T", [1, 3, 37])
def test_variants_compiled(T, fp8):
    """The variants and the large one-accumulator GEMM2 tiles compiled, on odd T (I 192: ragged scale groups),
    against the reference; KSUM's sum is deterministic (two runs agree bit for bit), also when graph-replayed."""
    if fp8:
        x, w1, w2, tw, ti, s1, s2 = fp8_problem(T, 8, 16, 256, 192)
        pairs = [FP8_VARIANTS["qa"], FP8_VARIANTS["qa_direct_ksum"],
                 (MoeConfig(64, 64, 128, 16, 4, 3), MoeConfig(128, 128, 128, 16, 8, 3, quant_a=True)),
                 (MoeConfig(16, 64, 128, split_k=2, quant_a=True), MoeConfig(16, 64, 128, quant_a=True, ksum=True))]
    else:
        x, w1, w2, tw, ti = problem(T, 8, 16, 256, 192)
        s1 = s2 = None
        pairs = [*BF16_VARIANTS.values(), (MoeConfig(64, 128, 64, 16, 4, 3), MoeConfig(128, 256, 64, 16, 8, 3))]
    ref = fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2)
    for c1, c2 in pairs:
        run = partial(fused_moe_triton, x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config1=c1, config2=c2)
        first = run()
        assert_close(first, ref, rel=0.04 if fp8 else 0.02)
        assert torch.equal(first, run()), f"{c1.name()};{c2.name()} differs between runs"
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = run()
        for _ in range(2):
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, first), f"{c1.name()};{c2.name()} differs under graph replay"


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("T", [1, 3, 8])
def test_fused_compiled(T, fp8):
    """FUSED compiled (its atomics and arrival counters on the GPU), k 8 over 16 experts, I 192 (FP8: ragged up
    scales): against the reference, twice within float32 summation order, and graph-replayed with new routing and a
    bad id (each token's row still written)."""
    if fp8:
        x, w1, w2, tw, ti, s1, s2 = fp8_problem(T, 8, 16, 256, 192)
    else:
        (x, w1, w2, tw, ti), s1, s2 = problem(T, 8, 16, 256, 192), None, None
    for cfg in (MoeConfig(16, 64, 128, num_warps=4, num_stages=4, fused=True),
                MoeConfig(16, 16, 128, num_warps=2, num_stages=2, fused=True)):
        run = partial(fused_moe_triton, x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config1=cfg)
        ref = partial(fused_moe_ref, x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, quant_inter=False)
        first = run()
        assert_close(first, ref())
        torch.testing.assert_close(run().float(), first.float(), rtol=1e-2, atol=1e-2)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = run()
        new_w, new_ids = routing(T, 8, 16, seed=1)
        tw.copy_(new_w)
        ti.copy_(new_ids)
        ti[0, 0] = 99
        g.replay()
        torch.cuda.synchronize()
        assert_close(out, ref())
        ti.copy_(new_ids)
