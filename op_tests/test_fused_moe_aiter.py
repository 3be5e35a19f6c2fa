"""``aiter_gemm.fused_moe`` called as AITER's ``aiter.fused_moe.fused_moe`` is (issue 51's audit): its positional
order (``expert_mask`` sixth, the scales tenth and eleventh) and keywords (vLLM's call), AITER's ActivationType and
QuantType spellings and members, ``expert_mask`` (expert parallelism) against a reference over the global experts,
the arguments the op does not run refused naming them, torch.compile, and the C++ entry serving such calls."""

from __future__ import annotations

import enum

import pytest
import torch

from aiter_gemm.backends.base import Solution
from aiter_gemm.kernels.blockscale_format import FP8
from aiter_gemm.kernels.fused_moe import MoeConfig, fused_moe_ref
from aiter_gemm.ops.fused_moe import fused_moe
from op_tests.runtime_helpers import moe_call
from op_tests.test_eager_ext import built, python_path_spy, run  # noqa: F401 (the fixture is requested by name)
from op_tests.test_fused_moe import DEV, assert_close, inputs, problem


class ActivationType(enum.Enum):
    """Stands for AITER's pybind enum: ``str()`` of a member is ``ActivationType.Silu``."""

    Silu = 0
    Gelu = 1
    Swiglu = 2


class QuantType(enum.Enum):
    No = 0
    per_Tensor = 1
    per_Token = 2
    per_1x128 = 3
    per_128x128 = 4


@pytest.mark.parametrize("fp8", [False, True])
def test_aiters_positional_and_keyword_calls_match_the_reference(clean_runtime, fp8):
    """AITER's positional order, its members or their strings, and vLLM's keyword call (AITER's rarer arguments at
    their defaults, ``dtype`` the output's) give our call's result, which matches the reference."""
    (x, w1, w2, tw, ti, s1, s2), ref = inputs(problem(5, 2, E=4, fp8=fp8), seed=3)
    ours = moe_call((x, w1, w2, tw, ti, s1, s2))
    assert_close(ours, ref, rel=0.04 if fp8 else 0.02)
    qt = QuantType.per_1x128 if fp8 else QuantType.No
    calls = [
        lambda: fused_moe(x, w1, w2, tw, ti, None, ActivationType.Silu, qt, False, s1, s2),
        lambda: fused_moe(x, w1, w2, tw, ti, None, "ActivationType.Silu", str(qt), False, s1, s2, None, None),
        lambda: fused_moe(x, w1, w2, tw, ti, expert_mask=None, activation=ActivationType.Silu, quant_type=qt,
                          doweight_stage1=False, w1_scale=s1, w2_scale=s2, a1_scale=None, a2_scale=None,
                          num_local_tokens=None, dtype=torch.bfloat16, hidden_pad=0, intermediate_pad=0, bias1=None,
                          bias2=None),
        lambda: fused_moe(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, block_size_M=0, moe_sorting_dispatch_policy=1,
                          splitk=2),  # AITER's unset tile, its sorting and split-K knobs: no effect here
    ]
    if fp8:
        calls.append(lambda: fused_moe(x, w1, w2, tw, ti, quant_type=QuantType.per_128x128, w1_scale=s1, w2_scale=s2))
    for call in calls:
        assert torch.equal(call(), ours)
    gelu = fused_moe(x, w1, w2, tw, ti, None, ActivationType.Gelu, qt, False, s1, s2)
    assert torch.equal(gelu, moe_call((x, w1, w2, tw, ti, s1, s2), activation="gelu"))
    assert_close(gelu, fused_moe_ref(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, activation="gelu"),
                 rel=0.04 if fp8 else 0.02)


# ---- expert_mask ------------------------------------------------------------------------------------------------
def _ep_case(fp8: bool, seed: int = 0, T: int = 7, k: int = 3):
    """A rank of an EP layer as AITER's test_moe_ep builds one: 8 global experts and a trailing sentinel, this rank
    holding 2, 5 and 6 (``w1``/``w2`` theirs, in order); every token routed over the 9 global ids (the sentinel
    too). The reference: every global expert's weights in place (the others' random), the pairs of experts this
    rank does not hold given no weight."""
    (x, w1g, w2g, tw, _, s1g, s2g), _ = inputs(problem(T, k, E=9, fp8=fp8), seed=seed)
    gen = torch.Generator(device=DEV).manual_seed(seed)
    ti = torch.stack([torch.randperm(9, generator=gen, device=DEV)[:k] for _ in range(T)]).to(torch.int32)
    ti[0] = torch.tensor([0, 1, 8][:k], dtype=torch.int32)  # a token none of whose experts is here
    mask = torch.zeros(9, dtype=torch.int32, device=DEV)
    local = torch.tensor([2, 5, 6], device=DEV)
    mask[local] = 1
    here = mask[ti.long()] != 0
    ref = fused_moe_ref(x, w1g, w2g, tw * here, ti, w1_scale=s1g, w2_scale=s2g)
    scales = (s1g[local], s2g[local]) if fp8 else (None, None)
    return x, w1g[local].contiguous(), w2g[local].contiguous(), tw, ti, mask, scales, ref


@pytest.mark.parametrize("fp8", [False, True])
def test_expert_mask_gives_the_local_experts_contribution(clean_runtime, fp8):
    """Positional (AITER's sixth) or by name, int32 or bool: the output is the local experts' share, the token
    routed only elsewhere a zero row; the torch loop, grouped_mm and the Triton kernels (which take the masked
    pairs as ids of no expert) agree."""
    x, w1, w2, tw, ti, mask, (s1, s2), ref = _ep_case(fp8)
    rel = 0.04 if fp8 else 0.02
    got = fused_moe(x, w1, w2, tw, ti, mask, "silu", None, False, s1, s2)
    assert_close(got, ref, rel=rel)
    assert torch.equal(got[0], torch.zeros_like(got[0]))
    assert torch.equal(fused_moe(x, w1, w2, tw, ti, expert_mask=mask.bool(), w1_scale=s1, w2_scale=s2), got)
    assert torch.equal(fused_moe(x, w1, w2, tw, ti.long(), expert_mask=mask.long(), w1_scale=s1, w2_scale=s2), got)
    cfg = MoeConfig(16, 64, 128, num_stages=2) if fp8 else MoeConfig(16, 32, 64, num_stages=2)
    for config in (Solution("torch", -1, 0, "loop"), Solution("triton", -1, 0, cfg.name()),
                   *(() if fp8 else (Solution("torch", -1, 0, "grouped_mm"),))):
        assert_close(fused_moe(x, w1, w2, tw, ti, mask, w1_scale=s1, w2_scale=s2, config=config), ref, rel=rel)


def test_a_bad_expert_mask_is_named(clean_runtime):
    """The mask's shape, dtype and values, the experts it marks against w1's, ids outside it; our old positional
    call (scales sixth and seventh) lands the scale in expert_mask's place and is told to name them."""
    x, w1, w2, tw, ti, mask, _, _ = _ep_case(False)
    cases = [
        (mask.view(3, 3), r"expert_mask \(shape \(3, 3\).* must be a 1-D 0/1 mask"),
        (mask.float(), r"expert_mask \(shape \(9,\), dtype torch.float32"),
        (mask * 2, r"expert_mask \(shape \(9,\).* holds values in \[0, 2\]"),
        (torch.ones(9, dtype=torch.int32), r"expert_mask \(shape \(9,\).* marks 9 local experts, but w1 and w2 hold 3"),
        (mask[:8], r"topk_ids \(shape \(7, 3\).* outside \[0, 8\) \(expert_mask's global experts\)"),
    ]
    for bad, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            fused_moe(x, w1, w2, tw, ti, bad)
    (x, w1, w2, tw, ti, s1, s2), _ = inputs(problem(4, 2, E=4, fp8=True))
    with pytest.raises(ValueError, match=r"activation \(a tensor of shape \(4, 1, 1\)\).*pass the scales by name"):
        fused_moe(x, w1, w2, tw, ti, s1, s2)
    with pytest.raises(ValueError, match=r"expert_mask \(shape \(4, 2, 1\).*pass w1_scale= and w2_scale= by name"):
        fused_moe(x, w1, w2, tw, ti, s1)


# ---- what the op does not run --------------------------------------------------------------------------------------
def test_a_quant_type_the_op_does_not_run_is_named(clean_runtime):
    (x, w1, w2, tw, ti, _, _), _ = inputs(problem(4, 2, E=4))
    for qt in ("QuantType.per_Token", QuantType.per_Tensor, "fp8"):
        with pytest.raises(ValueError, match=rf"quant_type '{qt}' is not supported: the op runs QuantType.No"):
            fused_moe(x, w1, w2, tw, ti, quant_type=qt)
    with pytest.raises(ValueError, match="quant_type QuantType.per_1x128 does not match w1's dtype torch.bfloat16"):
        fused_moe(x, w1, w2, tw, ti, None, "silu", QuantType.per_1x128)
    (x, w1, w2, tw, ti, s1, s2), _ = inputs(problem(4, 2, E=4, fp8=True))
    with pytest.raises(ValueError, match=rf"quant_type QuantType.No does not match w1's dtype {FP8}"):
        fused_moe(x, w1, w2, tw, ti, quant_type="QuantType.No", w1_scale=s1, w2_scale=s2)
    with pytest.raises(ValueError, match="activation 'ActivationType.Swiglu' is not one of"):
        fused_moe(x, w1, w2, tw, ti, activation=ActivationType.Swiglu, w1_scale=s1, w2_scale=s2)


def test_aiters_arguments_the_op_does_not_run_are_named(clean_runtime):
    (x, w1, w2, tw, ti, _, _), _ = inputs(problem(4, 2, E=4))
    scale = torch.ones(4, 1)
    cases = [
        ({"doweight_stage1": True}, "doweight_stage1=True .* is not supported"),
        ({"a1_scale": scale}, r"a1_scale \(a tensor of shape \(4, 1\)\) is not supported: AITER's given activation"),
        ({"a2_scale": scale}, r"a2_scale \(a tensor"),
        ({"block_size_M": 32}, "block_size_M=32 is not supported: AITER's a forced tile M"),
        ({"num_local_tokens": torch.tensor([3])}, r"num_local_tokens \(a tensor"),
        ({"hidden_pad": 64}, "hidden_pad=64 is not supported: AITER's padded weights"),
        ({"intermediate_pad": 64}, "intermediate_pad=64"),
        ({"bias1": torch.zeros(4, 128)}, r"bias1 \(a tensor"), ({"bias2": torch.zeros(4, 128)}, r"bias2 \(a tensor"),
        ({"dtype": torch.float16}, "dtype torch.float16 is not supported: the output has hidden_states' dtype"),
    ]
    for kw, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            fused_moe(x, w1, w2, tw, ti, **kw)
        with pytest.raises(ValueError, match=pattern):  # the tuner's config= path too
            fused_moe(x, w1, w2, tw, ti, config=Solution("torch", -1, 0, "loop"), **kw)


def test_torch_compile_traces_aiters_call_with_a_mask(clean_runtime):
    """AITER's positional call with a mask compiles to one custom-op node (fullgraph) and gives the eager result."""
    x, w1, w2, tw, ti, mask, _, ref = _ep_case(False, seed=1)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def layer(x, tw, ti):
        return fused_moe(x * 1.0, w1, w2, tw, ti, mask, "ActivationType.Silu", "QuantType.No", False) + 1

    torch._dynamo.reset()
    got = torch.compile(layer, fullgraph=True, backend=backend)(x, tw, ti)
    torch._dynamo.reset()
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert len(graphs) == 1 and sum("aiter_gemm.fused_moe" in t for t in targets) == 1
    assert_close(got - 1, ref)


# ---- the C++ entry -------------------------------------------------------------------------------------------------
SPY = """
    import enum
    import torch
    from aiter_gemm.ops import fused_moe as ops
    from aiter_gemm.ops.fused_moe import FUSED_MOE, fused_moe
    from aiter_gemm.backends.base import ACT_TYPES, MoeProblem""" + python_path_spy(
    "ops.FUSED_MOE_ENTRY", "ops.fused_moe_python", "fused_moe") + """
    class ActivationType(enum.Enum):
        Silu = 0
    x, w1, w2, tw, ti, _, _ = FUSED_MOE.make_inputs(MoeProblem(3, 128, 64, 4, 2, ACT_TYPES["silu"]), 0,
                                                    torch.device("cpu"), 0, {}).sets[0]
    mask = torch.tensor([1, 0, 1, 1, 1, 0], dtype=torch.int32)
"""


def test_the_cpp_entry_serves_aiters_calls(built):  # noqa: F811 (the fixture)
    """Each key's first call decides in Python; repeats of AITER's positional call (string spellings), vLLM's
    keyword call and a masked call are served by the C++ entry; an enum member keys in Python only, still one
    decision."""
    out = run(SPY + """
    plain = fused_moe(x, w1, w2, tw, ti)
    for call in (lambda: fused_moe(x, w1, w2, tw, ti),
                 lambda: fused_moe(x, w1, w2, tw, ti, None, "ActivationType.Silu", "QuantType.No", False, None, None),
                 lambda: fused_moe(x, w1, w2, tw, ti, expert_mask=None, activation="silu", quant_type="QuantType.No",
                                   doweight_stage1=False, w1_scale=None, w2_scale=None, a1_scale=None,
                                   a2_scale=None, num_local_tokens=None, dtype=torch.bfloat16, hidden_pad=0,
                                   intermediate_pad=0, bias1=None, bias2=None),
                 lambda: fused_moe(x, w1, w2, tw, ti, mask)):
        first, second = python_calls(call), python_calls(call)
        print("repeat", first[0], second[0])
        assert torch.equal(first[1], second[1])
    n = [python_calls(lambda: fused_moe(x, w1, w2, tw, ti, None, ActivationType.Silu)) for _ in range(2)]
    print("member", n[0][0], n[1][0], torch.equal(n[1][1], plain))
    """)
    lines = out.strip().splitlines()
    assert lines[:4] == ["repeat 0 0", "repeat 1 0", "repeat 1 0", "repeat 1 0"]  # the first: decided by `plain`
    assert lines[4] == "member 1 1 True"
