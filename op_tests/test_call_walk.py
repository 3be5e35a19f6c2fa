"""The first call of an op walks down the layers (issue 48): while the dispatcher decides, the op's module runs only
the callables its ``OpSpec`` hands the dispatcher (its row key and row format), never a JSON entry's parsing or
fitting, which the backend the JSON level names does (``parse_json_entry``, ``fit``). Measured with
``sys.setprofile`` in a fresh process (:mod:`op_tests.call_walk`)."""

from __future__ import annotations

import pytest

from op_tests.call_walk import SCENARIOS, files_of, walk

#: Each scenario's op module and the backend file its JSON bucket's entry belongs to.
FILES = {"gemm_a16w16": ("ops/a16w16.py", "backends/triton.py"),
         "gemm_a8w8_blockscale": ("ops/a8w8_blockscale.py", "backends/a8w8_blockscale/triton.py")}


@pytest.mark.parametrize("op", SCENARIOS)
def test_a_first_call_decides_without_going_back_up_to_the_op(op):
    import aiter_gemm

    spec = aiter_gemm.get_dispatcher(op).op
    own = {f.__name__ for f in (spec.row_key, spec.row_solution, spec.key_problem) if f is not None}
    op_file, backend_file = FILES[op]
    result = walk(op)
    assert result["matched"] in ("exact", "json") and result["libtype"] == "triton", result
    deciding = [(f, name) for f, name, inside in result["calls"] if inside]
    assert sorted({name for f, name in deciding if f == op_file} - own) == []
    assert (backend_file, "parse_json_entry") in deciding  # the JSON bucket's entry, parsed by its backend
    assert not any(f.startswith("ops/") and f != op_file for f in files_of(result))


#: Runtime files a first call ran at d14cee8, before issue 48 (docs/design.md, "One call through the files").
FILES_BEFORE_ISSUE_48 = {"gemm_a16w16": 16, "gemm_a8w8_blockscale": 16}


@pytest.mark.parametrize("op", SCENARIOS)
def test_a_first_call_touches_fewer_files_than_before_issue_48(op):
    """A new file on the first call's path is a new bounce: fold it where the call already goes, or raise this
    bar with a reason in design.md."""
    files = files_of(walk(op))
    assert len(files) < FILES_BEFORE_ISSUE_48[op], files
