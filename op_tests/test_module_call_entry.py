"""The nn.Module call entry (C++, or Python without the extension) against the installed torch (issue 35): the hook
stores come from torch itself, the set-up check refuses stores it does not know, and for every store the entry
behaves as ``nn.Module.__call__``."""

from __future__ import annotations

import types

import pytest

from aiter_gemm import call_entry
from op_tests.test_eager_ext import built, run  # noqa: F401 (the fixture is requested by name)


def test_installed_torch_hook_stores_are_the_known_ones():
    own, glob = call_entry.hook_stores()
    assert set(call_entry.CALL_HOOKS) <= set(own) and set(call_entry.CALL_HOOKS) <= set(glob)
    why = call_entry.call_internals_error(own, glob)
    assert why is None, f"this torch's nn.Module changed ({why}): see aiter_gemm/call_entry.py"


@pytest.mark.parametrize(("change", "needle"), [
    ("new global kind", "_forward_hooks_v2"),
    ("new module kind", "_forward_hooks_v2"),
    ("global store gone", "_backward_pre_hooks"),
    ("global store not a dict", "_forward_hooks"),
])
def test_set_up_check_refuses_unknown_or_missing_stores(change, needle):
    """A torch that adds a hook kind (or drops or changes one the entry checks) turns the entry off at set-up."""
    from torch.nn.modules import module as impl

    fake = types.SimpleNamespace(**{k: v for k, v in vars(impl).items() if k.startswith("_global_")})
    own, glob = call_entry.hook_stores(fake)
    if change == "new global kind":
        glob["_forward_hooks_v2"] = {}
    elif change == "new module kind":
        own = [*own, "_forward_hooks_v2"]
    elif change == "global store gone":
        del glob["_backward_pre_hooks"]
    else:
        glob["_forward_hooks"] = []
    why = call_entry.call_internals_error(own, glob)
    assert why is not None and needle in why


@pytest.mark.parametrize("impl", ["cpp", "python"])
def test_entry_matches_module_call_for_every_hook_store_of_this_torch(impl, request):
    """For each hook store torch's nn.Module has (enumerated from torch, per module and global), one entry put in
    it: TunedLinear's call (the call entry, C++ or without the extension Python, where it serves) and
    ``nn.Module.__call__`` give the same output, the same gradient and call the entry the same number of times; with
    every store empty the entry serves the call (nn.Module.__call__ not run)."""
    env = {}
    if impl == "cpp":
        request.getfixturevalue("built")
    else:
        env["AITER_GEMM_EAGER_EXT"] = "off"
    out = run("""
        import torch
        from aiter_gemm import call_entry
        from aiter_gemm.nn import TunedLinear
        from op_tests.hook_stores import every_store, hook_in
        assert call_entry.GLOBAL_CALL_HOOKS is not None, "the call entry is set up on this torch"
        own, glob = call_entry.hook_stores()
        tl = TunedLinear.from_linear(torch.nn.Linear(8, 16))
        x = torch.randn(2, 3, 8)
        module_call, module_calls = torch.nn.Module.__call__, []

        def counting(*args, **kwargs):
            module_calls.append(1)
            return module_call(*args, **kwargs)

        with torch.no_grad():
            tl(x)                                                   # decided: plain F.linear on CPU
            if call_entry.c_call is not None:
                assert call_entry.c_call(tl, x) is not None         # bare: the C++ entry serves it
            torch.nn.Module.__call__ = counting
            try:
                tl(x)
            finally:
                torch.nn.Module.__call__ = module_call
            assert not module_calls, "a bare call went through nn.Module.__call__"

        def run_once(call, calls):
            xi = x.clone().requires_grad_()
            y = call(xi)
            y.sum().backward()
            return y.detach(), xi.grad, len(calls)

        checked = []
        for name, holder, attr in every_store(tl):
            results = []
            for call in (tl.__call__, lambda xi: torch.nn.Module.__call__(tl, xi)):
                calls = []
                with hook_in(holder, attr, lambda *args, _calls=calls, **kwargs: _calls.append(args)):
                    results.append(run_once(call, calls))
            (ya, ga, na), (yb, gb, nb) = results
            assert torch.equal(ya, yb) and torch.equal(ga, gb) and na == nb, (name, na, nb)
            checked.append(name)
        print(len(checked), len(own) + len(glob), call_entry.c_call is not None)
    """, **env)
    done, total, cpp = out.split()
    assert done == total and int(total) >= 8 and cpp == str(impl == "cpp")
