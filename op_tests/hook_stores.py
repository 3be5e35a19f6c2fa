"""One entry put in each hook store of torch's nn.Module, then taken out again: how the call-entry tests
(test_module_call_entry.py, test_fp8_linear.py) compare a module's call with ``nn.Module.__call__`` store by store."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from torch.nn.modules import module as impl

from aiter_gemm import call_entry


def every_store(module) -> Iterator[tuple[str, dict, str]]:
    """(name, holder, attribute) of every hook store the installed torch has (enumerated from torch itself): the
    module's own (in its ``__dict__``) and the global ones (``torch.nn.modules.module._global_*``)."""
    own, glob = call_entry.hook_stores()
    for name in own:
        yield name, module.__dict__, name
    for name in glob:
        yield name, vars(impl), "_global" + name


@contextmanager
def hook_in(holder: dict, attr: str, entry: Callable) -> Iterator[None]:
    """``entry`` in the store ``holder[attr]`` for the block: added in place to a dict (as registering a hook does),
    a set or a list; a flag (None / bool) set True. Put back as it was afterwards."""
    old = holder[attr]
    if isinstance(old, dict):
        old[10**9] = entry
    elif isinstance(old, (set, list)):
        (old.add if isinstance(old, set) else old.append)(entry)
    else:
        holder[attr] = True
    try:
        yield
    finally:
        if isinstance(old, dict):
            del old[10**9]
        elif isinstance(old, (set, list)):
            old.remove(entry)
        else:
            holder[attr] = old
