"""One eager entry for every op (aiter_gemm/op_entry.py, csrc/eager_fast.cpp): an op declared the way the real ones
are (a toy op shaped like the coming ``fused_moe``: several tensors, one optional, an activation string, an int,
one tensor out) is served by the C++ entry on its repeat calls with no C++ of its own, and by the same Python entry
without the extension; the declaration's checks; the block-scale op's x_scale layouts in a cache of their own."""

from __future__ import annotations

import pytest
import torch

from aiter_gemm.dispatch import DecisionCache
from aiter_gemm.op_entry import BYPASS, OPTIONAL_TENSOR, TENSOR, VALUE, Arg, Decided, OpEntry
from op_tests.test_eager_ext import built, run  # noqa: F401 (the fixture is requested by name)

TOY = """
    import torch
    import torch.nn.functional as F
    from aiter_gemm import op_entry
    from aiter_gemm.dispatch import DecisionCache
    from aiter_gemm.op_entry import OPTIONAL_TENSOR, VALUE, Arg, Decided, OpEntry

    decided, fallback = [], []
    ACTS = {"silu": F.silu, "gelu": F.gelu}

    def decide(x, w1, w2, scale=None, activation="silu", topk=2):
        if activation not in ACTS:
            raise ValueError(f"toy_moe: activation {activation!r} is not one of {sorted(ACTS)}")
        decided.append((tuple(x.shape), scale is not None, activation, topk))
        act = ACTS[activation]

        def runner(x, w1, w2, scale, activation, topk):
            out = act(x @ w1.T) @ w2.T
            return out * scale if scale is not None else out

        return Decided(runner, runner)  # cached in Python, and served by the C++ entry

    cache = DecisionCache()
    toy = OpEntry("toy_moe", (Arg("x"), Arg("w1"), Arg("w2"), Arg("scale", OPTIONAL_TENSOR, None),
                              Arg("activation", VALUE, "silu", choices=tuple(ACTS)), Arg("topk", VALUE, 2)),
                  cache, decide, module="toy", doc="A toy op declared as the real ops are.")
    op, ext = toy.entry, op_entry.EXT
    if ext is not None:
        def spy(*args, **kwargs):
            fallback.append(1)
            return toy.python(*args, **kwargs)
        assert toy.install(spy) is op                                      # count the calls C++ hands to Python

    def counts():
        return len(decided), len(fallback), -1 if ext is None else ext.cached(op)

    x, w1, w2 = torch.randn(3, 8), torch.randn(16, 8), torch.randn(8, 16)
    ref = F.silu(x @ w1.T) @ w2.T
    for call in (lambda: op(x, w1, w2), lambda: op(x, w1, w2, None, "silu"), lambda: op(x, w1, w2, activation="silu"),
                 lambda: op(x, w1, w2, topk=2, scale=None), lambda: op(x=x, w1=w1, w2=w2)):
        assert torch.equal(call(), ref)
    print("one key", *counts())
    s = torch.tensor(2.0)
    assert torch.equal(op(x, w1, w2, s), 2 * ref) and torch.equal(op(x, w1, w2, s), 2 * ref)
    gelu = F.gelu(x @ w1.T) @ w2.T
    assert torch.equal(op(x, w1, w2, activation="gelu"), gelu) and torch.equal(op(x, w1, w2, None, "gelu"), gelu)
    op(x, w1, w2, topk=3), op(x, w1, w2, topk=3)
    print("four keys", *counts())
    for _ in range(2):                                                     # not among the choices: Python refuses it
        try:
            op(x, w1, w2, activation="relu")
        except ValueError as exc:
            assert "relu" in str(exc)
        else:
            raise AssertionError("an unknown activation accepted")
    class Sub(torch.Tensor):
        pass
    assert torch.equal(op(x.as_subclass(Sub), w1, w2), ref)               # a subclass: the Python entry, same key
    print("python only", *counts())
    cache.clear()                                                          # reload_configs: every map dropped
    assert torch.equal(op(x, w1, w2), ref) and torch.equal(op(x, w1, w2), ref)
    print("reloaded", *counts())
"""


@pytest.mark.parametrize("impl", ["cpp", "python"])
def test_a_new_op_needs_no_cpp(impl, request):
    """A toy op declared with OpEntry: each key decided once; with the extension the C++ entry serves every repeat
    call (its map holds the op's keys, its Python fallback ran once per key, plus the calls it does not serve);
    without it the Python entry does the same work."""
    env = {}
    if impl == "cpp":
        request.getfixturevalue("built")
    else:
        env["AITER_GEMM_EAGER_EXT"] = "off"
    lines = dict(line.split(" ", 1) for line in run(TOY, **env).strip().splitlines())
    cpp = impl == "cpp"
    # (decisions, calls handed to Python, keys in the C++ map)
    assert lines["one"] == ("key 1 1 1" if cpp else "key 1 0 -1")
    assert lines["four"] == ("keys 4 4 4" if cpp else "keys 4 0 -1")
    assert lines["python"] == ("only 4 7 4" if cpp else "only 4 0 -1")  # 2 unknown activations, 1 subclass
    assert lines["reloaded"] == ("5 8 1" if cpp else "5 0 -1")


def _toy(calls: list, **kw) -> OpEntry:
    def decide(x, flag=None, mode="a"):
        calls.append(x.shape)
        return Decided(lambda x, flag: x + 1)  # the arguments before the bypass one

    args = kw.pop("args", (Arg("x", marks=("is_special",)), Arg("flag", VALUE, None), Arg("mode", BYPASS, "a")))
    return OpEntry("toy", args, DecisionCache(), decide, module=__name__, doc="toy", bypass=lambda *a: "bypassed",
                   **kw)


def test_python_entry_from_the_declaration():
    """The Python entry (the one the C++ entry falls back to) keys every declared field: tensor shape, dtype and
    device, a mark, a value; a bypass argument skips the cache; a non-tensor reaches decide (whose checks name it)."""
    calls: list = []
    toy = _toy(calls)
    x = torch.zeros(2, 3)
    assert torch.equal(toy.python(x), x + 1) and torch.equal(toy.python(x, None), x + 1) and len(calls) == 1
    assert toy.key(x) == (x.shape, x.dtype, x.device, False, None) and list(toy.calls) == [toy.key(x)]
    toy.python(x, True), toy.python(x.double()), toy.python(torch.zeros(3, 3))
    marked = torch.zeros(2, 3)
    marked.is_special = True
    toy.python(marked)
    assert len(calls) == 5 and len(toy.calls) == 5
    assert toy.python(x, mode="b") == "bypassed" and len(calls) == 5
    with pytest.raises(AttributeError):  # decide reads x.shape: its own error, nothing cached under None
        toy.python([1.0])
    assert None not in toy.calls


STRIDED = """
    import torch
    from aiter_gemm import op_entry
    from aiter_gemm.dispatch import DecisionCache
    from aiter_gemm.op_entry import Arg, Decided, OpEntry

    decided, fallback = [], []

    def decide(x, w):
        decided.append(x.stride())
        if x.stride(-1) != 1:
            raise ValueError(f"toy: x (stride {x.stride()}) must have contiguous rows")
        return Decided(torch.matmul, torch.matmul)

    toy = OpEntry("toy_strided", (Arg("x", strides=True), Arg("w")), DecisionCache(), decide, module="toy",
                  doc="A toy op whose decide checks x's layout.")
    op, ext = toy.entry, op_entry.EXT
    if ext is not None:
        def spy(*args):
            fallback.append(1)
            return toy.python(*args)
        assert toy.install(spy) is op
    x, w = torch.randn(4, 4), torch.randn(4, 4)
    assert torch.equal(op(x, w), x @ w) and torch.equal(op(x, w), x @ w)
    for entry in (op, toy.python):                                         # another layout: checked, not served
        try:
            entry(x.t().contiguous().t(), w)
        except ValueError as exc:
            assert "stride (1, 4)" in str(exc)
        else:
            raise AssertionError("a column-major x served from the row-major key")
    wide = torch.randn(4, 8)[:, :4]                                        # another layout decide accepts: its key
    assert wide.is_contiguous() is False and torch.equal(op(wide, w), wide @ w)
    print("counts", len(decided), len(fallback), -1 if ext is None else ext.cached(op))
"""


@pytest.mark.parametrize("impl", ["cpp", "python"])
def test_declared_strides_key_the_call(impl, request):
    """An argument declared with strides keys them, in the C++ entry and the Python one: a call of another layout
    goes to decide (whose check names it) instead of the first layout's value."""
    env = {}
    if impl == "cpp":
        request.getfixturevalue("built")
    else:
        env["AITER_GEMM_EAGER_EXT"] = "off"
    out = run(STRIDED, **env).strip()
    # decisions (row-major, column-major twice, wide rows), calls the C++ entry handed to Python (all but the
    # repeat), keys in its map
    assert out == ("counts 4 3 2" if impl == "cpp" else "counts 4 0 -1")
    toy = _toy([], args=(Arg("x", strides=True), Arg("flag", VALUE, None), Arg("mode", BYPASS, "a")))
    x = torch.zeros(2, 3)
    assert toy.key(x) == (x.shape, x.dtype, x.device, (3, 1), None)


@pytest.mark.parametrize(("declare", "needle"), [
    (lambda: Arg("x", kind="tensor!"), "kind must be one of"),
    (lambda: Arg("value"), "a name the entry uses"),
    (lambda: Arg("f", VALUE, None, marks=("m",)), "only tensor arguments carry marks"),
    (lambda: Arg("f", VALUE, None, strides=True), "only tensor arguments carry marks or key strides"),
    (lambda: Arg("config", BYPASS), "a bypass argument needs a default"),
    (lambda: _toy([], args=(Arg("x", OPTIONAL_TENSOR, None), Arg("y"))), "without a default follows"),
    (lambda: _toy([], args=(Arg("x"), Arg("c", BYPASS, None), Arg("y", TENSOR, None)), runner_args=3),
     "runner_args 3 must be 0..1"),
])
def test_declaration_errors_say_what_is_wrong(declare, needle):
    with pytest.raises(ValueError, match=needle):
        declare()


def test_x_scale_layouts_have_their_own_cache():
    """x_scale_m_major's answers live in their own cache (no tagged entries among the op's call keys), cleared by
    reload_configs with the op's decisions."""
    import aiter_gemm
    from aiter_gemm.ops import a8w8_blockscale as bs

    cache = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale").cache
    aiter_gemm.reload_configs()
    assert bs.x_scale_m_major(16, 256, 512, torch.bfloat16, False) in (True, False)
    assert not cache.calls and list(cache.derived("x_scale_m_major")) == [(16, 256, 512, torch.bfloat16, False)]
    aiter_gemm.reload_configs()
    assert not cache.derived("x_scale_m_major")
