"""One home per concept (issue 48): each is defined once and imported by every user (the source scan proves it),
the modules that shared one form no import circle, and the behaviour the merged copies now share."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from op_tests.runtime_helpers import repo_env

REPO = Path(__file__).resolve().parent.parent
SOURCES = sorted(p for pkg in ("aiter_gemm", "gradlib", "benchmarks") for p in (REPO / pkg).rglob("*.py"))


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere in its file (functions and TYPE_CHECKING blocks too)."""
    mods = {_module(p): p for p in SOURCES}
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                # ``from pkg import mod`` imports the module; ``from mod import name`` the module holding it
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                         for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != m:
                    graph[m].add(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in graph:
        if v not in index:
            visit(v)
    return out


@pytest.mark.parametrize("package", ["aiter_gemm.kernels", "aiter_gemm.ops", "aiter_gemm.backends", "gradlib"])
def test_no_import_circle(package):
    """act_quant and the block-scale kernel imported each other (SCALE_BLOCK one way, FP8 the other), and gradlib's
    pool -> tasks -> tune_ops -> search -> pool went round (search's records under TYPE_CHECKING): a lazy import
    does not count, every import statement is an edge here."""
    circles = [sorted(c) for c in _cycles(_import_graph()) if any(m.startswith(package) for m in c)]
    assert circles == []


#: (what, a pattern of its definition, the one file allowed to hold it).
DEFINITIONS = [
    ("SCALE_BLOCK", r"^\s*SCALE_BLOCK\s*=", "aiter_gemm/kernels/blockscale_format.py"),
    ("the fp8 dtype constant", r"^\w+\s*=\s*torch\.float8_e4m3fn\s*$", "aiter_gemm/kernels/blockscale_format.py"),
    ("the float dtype tuples", r"\(torch\.bfloat16, torch\.float16(, torch\.float32)?\)", "aiter_gemm/dtypes.py"),
    ("boolean words", r"\"yes\"", "aiter_gemm/configs.py"),
    ("environment writes", r"os\.environ\[[^\]]+\]\s*=|os\.environ\.pop\(", "aiter_gemm/settings.py"),
    ("CSV record reading", r"csv\.reader\(", "aiter_gemm/fileio.py"),
    ("a problem's key cells", r"\"cu_num\": str\(", "aiter_gemm/opspec.py"),
    ("setmaxnreg's register rule", r"def \w*math_registers\(", "aiter_gemm/kernels/a8w8_blockscale_tilelang_config.py"),
    ("kernelName grammars", r"class KernelName\b|_NAME_RE\s*=", "aiter_gemm/kernels/common.py"),
]


@pytest.mark.parametrize("what,pattern,home", DEFINITIONS, ids=[d[0] for d in DEFINITIONS])
def test_one_definition(what, pattern, home):
    regex = re.compile(pattern, re.MULTILINE)
    holders = sorted(str(p.relative_to(REPO)) for p in SOURCES if regex.search(p.read_text()))
    assert holders == [home], f"{what} is defined in {holders}"


def test_one_describe_in_the_blockscale_op():
    text = (REPO / "aiter_gemm" / "ops" / "a8w8_blockscale.py").read_text()
    assert len(re.findall(r"^def _describe\(", text, re.MULTILINE)) == 1


# ---- boolean words: one set for CSV cells, AITER_* switches and --sort ---------------------------------------------
@pytest.mark.parametrize("word,value", [("t", True), ("Y", True), ("on", True), (" yes ", True), ("TRUE", True),
                                        ("1", True), ("f", False), ("n", False), ("OFF", False), ("no", False),
                                        ("False", False), ("0", False)])
def test_every_reader_takes_the_same_boolean_words(tmp_path, word, value):
    from aiter_gemm.configs import load_untuned
    from aiter_gemm.settings import load_settings
    from gradlib.aiter_flags import str2bool

    path = tmp_path / "untuned.csv"
    path.write_text(f"M,N,K,bias\n1,2,3,{word}\n")
    assert load_untuned(path)[0][3] is value  # the bias cell
    assert load_settings({"AITER_TUNE_GEMM": word}).tune_gemm is value
    assert str2bool(word) is value


@pytest.mark.parametrize("word", ["2", "maybe", "yess"])
def test_other_words_are_refused_naming_the_accepted_ones(tmp_path, word):
    import argparse

    from aiter_gemm.configs import ConfigError, load_untuned
    from aiter_gemm.settings import load_settings
    from gradlib.aiter_flags import str2bool

    words = "1/true/yes/on/t/y or 0/false/no/off/f/n"
    path = tmp_path / "untuned.csv"
    path.write_text(f"M,N,K,bias\n1,2,3,{word}\n")
    with pytest.raises(ConfigError, match=rf"untuned\.csv:2, column 'bias'.*{words}"):
        load_untuned(path)
    with pytest.raises(ValueError, match=f"AITER_TUNE_GEMM must be {words}"):
        load_settings({"AITER_TUNE_GEMM": word})
    with pytest.raises(argparse.ArgumentTypeError, match=words):
        str2bool(word)


def test_triton_interpret_is_read_as_triton_reads_it():
    """TRITON_INTERPRET=true made Triton interpret the kernels while INTERPRET (== "1") said they were compiled, so
    the kernels skipped the interpreter's float32 upcast of tl.dot operands."""
    code = "import triton; from aiter_gemm.kernels.common import INTERPRET; print(INTERPRET)"
    res = subprocess.run([sys.executable, "-c", code], env=repo_env(TRITON_INTERPRET="true"), cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True"


# ---- CSV reading ----------------------------------------------------------------------------------------------------
def test_a_record_of_blank_cells_is_skipped_by_every_reader(tmp_path):
    """The tables' reader skipped a line of blank cells, the merge reader took it as a row of empty values (a shape
    list read through it then failed on an empty M)."""
    from aiter_gemm.configs import load_untuned
    from aiter_gemm.fileio import merge_csv_rows, read_csv_rows

    path = tmp_path / "u.csv"
    path.write_text("M,N,K\n1,2,3\n , ,\n\n4,5,6\n")
    assert [r["M"] for r in read_csv_rows(path)[1]] == ["1", "4"]
    assert [k[:3] for k in load_untuned(path)] == [(1, 2, 3), (4, 5, 6)]
    assert merge_csv_rows(path, ("M", "N", "K"), [{"M": "7", "N": "8", "K": "9"}], ("M", "N", "K")) == (1, 0)
    assert path.read_text() == "M,N,K\n1,2,3\n4,5,6\n7,8,9\n"


# ---- environment scoping --------------------------------------------------------------------------------------------
def test_scoped_env_sets_unsets_and_restores_on_error(monkeypatch):
    from aiter_gemm.settings import scoped_env

    monkeypatch.setenv("I48_SET", "old")
    monkeypatch.delenv("I48_UNSET", raising=False)
    with pytest.raises(RuntimeError), scoped_env({"I48_SET": None, "I48_UNSET": "new"}):
        assert "I48_SET" not in os.environ and os.environ["I48_UNSET"] == "new"
        raise RuntimeError("inside")
    assert os.environ["I48_SET"] == "old" and "I48_UNSET" not in os.environ


# ---- kernelName grammars --------------------------------------------------------------------------------------------
NAMES = [
    ("aiter_gemm.kernels.gemm_a16w16", "GemmConfig", "BM128_BN256_BK64_GM8_SK1_W8_S3_TMAF"),
    ("aiter_gemm.kernels.skinny", "SkinnyConfig", "gemv_BN1_BK2048_SK1_W4_S1_EF_PDL"),
    ("aiter_gemm.kernels.a8w8_blockscale", "BlockscaleConfig", "base-BM128_BN256_BK128_GM8_SK1_W8_S3_NS2_TMA_WS"),
    ("aiter_gemm.kernels.a8w8_blockscale_tilelang_config", "TileLangConfig",
     "ws_swapAB-BM64_BN48_BK128_S6_T384_SK1_MB2"),
]


@pytest.mark.parametrize("module,cls,name", NAMES, ids=[n[1] for n in NAMES])
def test_one_grammar_writes_and_reads_each_family(module, cls, name):
    """Each family's name is written and parsed by its module's one grammar (NAME), and a malformed name is refused
    with that grammar's spelling."""
    import importlib

    mod = importlib.import_module(module)
    config = getattr(mod, cls).from_name(name)
    assert config.name == name == mod.NAME.format(mod.NAME.parse(name))
    with pytest.raises(ValueError, match=re.escape(mod.NAME.spelling)):
        getattr(mod, cls).from_name(name + "_X")


# ---- key spelling ---------------------------------------------------------------------------------------------------
def test_the_runtime_and_the_tuner_spell_a_key_alike():
    from aiter_gemm.backends.base import GemmProblem
    from aiter_gemm.device import DeviceIdentity
    from aiter_gemm.ops.a8w8_blockscale import GEMM_A8W8_BLOCKSCALE
    from aiter_gemm.ops.a16w16 import GEMM_A16W16
    from gradlib.tune_ops import tune_op

    ident = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H100")
    p = GemmProblem(5, 64, 96, True, torch.bfloat16, torch.float32)
    assert GEMM_A16W16.untuned_row(p) == {"M": "5", "N": "64", "K": "96", "bias": "True", "dtype": "torch.bfloat16",
                                          "outdtype": "torch.float32", "scaleAB": "False", "bpreshuffle": "False"}
    for spec in (GEMM_A16W16, GEMM_A8W8_BLOCKSCALE):
        tuner = tune_op(spec.name)
        assert tuner.key_of(ident, p) == {"gfx": "sm_90", "cu_num": "132", **spec.untuned_row(p)}
        assert tuple(tuner.key_of(ident, p)) == tuner.key_columns == spec.key_columns


# ---- setmaxnreg -----------------------------------------------------------------------------------------------------
def test_one_register_rule_gives_both_launch_shapes_their_numbers():
    """The automatic (producer warpgroups = math ones, the whole register file) and the hand-scheduled (one producer,
    the launch's pool) kernels ask setmaxnreg what they asked before the rule was shared."""
    from aiter_gemm.kernels import a8w8_blockscale_tilelang_config as cfg

    assert [cfg.auto_ws_math_registers(t) for t in (128, 256, 384)] == [0, 232, 144]
    assert [cfg.ws_math_registers(g) for g in (2, 3, 4)] == [240, 160, 112] and cfg.ws_math_registers(2, 2) == 104
