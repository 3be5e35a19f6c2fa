"""The ``deepgemm`` provider of ``--bench moe`` (:mod:`benchmarks.moe_deepgemm`): with :mod:`op_tests.fake_deep_gemm`
as ``deep_gemm``, its output against ``fused_moe``'s float32 reference and the contiguous layouts it hands DeepGEMM;
unavailable, with the reason, for bf16 experts and without a usable ``deep_gemm``."""

from __future__ import annotations

import sys
import types

import pytest
import torch

import op_tests.fake_deep_gemm as fake
from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, MoeProblem
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels.fused_moe import fused_moe_ref
from aiter_gemm.ops.fused_moe import FUSED_MOE
from benchmarks import moe_deepgemm, providers
from op_tests.test_fused_moe import assert_close

FP8 = torch.float8_e4m3fn
E, K, H, INTER = 4, 2, 256, 128


def _problem(T: int, fp8: bool = True) -> MoeProblem:
    q = FP8 if fp8 else torch.bfloat16
    return MoeProblem(T, H, INTER, E, K, ACT_TYPES["silu"], torch.bfloat16, q, q,
                      QUANT_BLOCK if fp8 else "QuantType.No")


def _ctx(p: MoeProblem, sets: list[tuple]) -> providers.Context:
    return providers.Context(p, providers.MOE, sets, DeviceIdentity("sm_90", 132, "cuda"), torch.device("cpu"),
                             "graph")


def _sets_without_expert_3(T: int, invalid: bool) -> tuple[list[tuple], torch.Tensor]:
    """One FP8 set whose tokens pick two distinct experts of 0..2 (expert 3 gets none), one pair's id out of range
    if ``invalid``; its float32 reference."""
    x, w1, w2, tw, _, s1, s2 = FUSED_MOE.make_inputs(_problem(T), 0, torch.device("cpu"), 0, {}).sets[0]
    gen = torch.Generator().manual_seed(1)
    ids = torch.stack([torch.randperm(3, generator=gen)[:K] for _ in range(T)]).to(torch.int32)
    if invalid:
        ids[T // 2, 1] = E
    ref = fused_moe_ref(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2, activation="silu")
    return [(x, w1, w2, tw, ids, s1, s2)], ref


@pytest.fixture
def fake_dg(monkeypatch):
    fake.install(monkeypatch)
    return fake


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the fake's NaN padding rows, quantized: not used
@pytest.mark.parametrize("align", [128, 8])
@pytest.mark.parametrize("T,invalid", [(3, False), (17, False), (17, True)])
def test_deepgemm_moe_matches_the_reference(fake_dg, monkeypatch, T, invalid, align):
    """Two contiguous grouped GEMMs on each expert's rows, runs aligned (the fake checks each aligned block holds
    one expert's rows, then -1 padding, and writes NaN on padding rows: none reaches the output); expert 3 has no
    rows; an out-of-range id contributes nothing, as in the reference."""
    monkeypatch.setattr(fake, "ALIGNMENT", align)
    sets, ref = _sets_without_expert_3(T, invalid)
    provider, arg = providers.resolve(providers.MOE, "deepgemm")
    out = provider.build(_ctx(_problem(T), sets), arg)(0)
    assert_close(out, ref, rel=0.04)
    rel = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert rel < provider.max_rel_err(_problem(T)) / 2  # the benchmark's check passes it, with room
    assert [(c["N"], c["K"], c["G"]) for c in fake.CALLS] == [(2 * INTER, H, E), (H, INTER, E)]
    layout = fake.CALLS[0]["layout"]
    assert torch.equal(layout, fake.CALLS[1]["layout"]) and 3 not in layout.tolist()
    ids = sets[0][4]
    for e in range(3):
        assert (layout == e).sum().item() == (ids == e).sum().item()
    assert layout.numel() == align * (T * K // align + min(E, T * K))


def test_layout_rows_read_their_tokens():
    """Each row of an expert's run reads a token routed to that expert, in the tokens' order."""
    ids = torch.tensor([[2, 0], [0, 1], [2, 1]], dtype=torch.int32)
    lay = moe_deepgemm.contiguous_layout(ids, E, 4)
    assert lay.groups.tolist() == [0, 0, -1, -1, 1, 1, -1, -1, 2, 2, -1, -1] + [-1] * 8
    assert lay.rows[lay.groups >= 0].tolist() == [0, 1, 1, 2, 0, 2]
    assert lay.pair_rows.tolist() == [0, 1, 4, 5, 8, 9]


def test_bf16_sets_and_missing_deep_gemm_say_why(monkeypatch, fake_dg):
    provider, arg = providers.resolve(providers.MOE, "deepgemm")
    with pytest.raises(providers.Unavailable, match="take FP8 experts"):
        provider.build(_ctx(_problem(3, fp8=False), []), arg)
    with pytest.raises(ValueError, match="takes no argument"):
        providers.resolve(providers.MOE, "deepgemm:x")
    bare = types.ModuleType("deep_gemm")
    bare.fp8_gemm_nt = fake.fp8_gemm_nt
    monkeypatch.setitem(sys.modules, "deep_gemm", bare)
    with pytest.raises(providers.Unavailable, match="has no m_grouped_fp8_gemm_nt_contiguous"):
        provider.build(_ctx(_problem(3), []), arg)
    odd = MoeProblem(3, H, 64, E, K, ACT_TYPES["silu"], torch.bfloat16, FP8, FP8, QUANT_BLOCK)
    monkeypatch.setitem(sys.modules, "deep_gemm", fake.fake_module())
    with pytest.raises(providers.Unavailable, match="GEMM2: K=64"):
        provider.build(_ctx(odd, []), arg)


def test_without_deep_gemm_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "deep_gemm", None)
    provider, arg = providers.resolve(providers.MOE, "deepgemm")
    with pytest.raises(providers.Unavailable, match="deep_gemm is not installed"):
        provider.build(_ctx(_problem(3), []), arg)
