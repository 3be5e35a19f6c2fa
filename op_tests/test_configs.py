"""Config loading and merge rules: duplicates, bad times, missing files, extra columns, gfx-less files, bad rows."""

from __future__ import annotations

import csv
import hashlib
import logging
import math
from pathlib import Path

import pytest
import torch

import aiter_gemm
from aiter_gemm.configs import ConfigError, load_table, load_untuned
from aiter_gemm.device import has_tma
from aiter_gemm.dtypes import parse_dtype
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.settings import CONFIG_KINDS, default_config_dir, load_settings
from op_tests.runtime_helpers import BF16_HEADER, bf16_row

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "reference" / "aiter_configs"
FIXTURES = REPO / "op_tests" / "fixtures"
KEY = (64, 96, 80, False, torch.float32, torch.float32, False, False)


def write(tmp_path: Path, name: str, text: str) -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_duplicate_key_lowest_positive_us_wins(tmp_path):
    a = write(tmp_path, "a.csv", BF16_HEADER + bf16_row(64, 96, 80, "torch", 5.0, kernel="slow"))
    b = write(tmp_path, "b.csv", BF16_HEADER + bf16_row(64, 96, 80, "torch", 2.0, kernel="fast"))
    for paths in ([a, b], [b, a]):
        row = load_table("GEMM_BF16", paths).lookup(row_gfx(), row_cu(), KEY)
        assert row.values["kernelName"] == "fast" and row.us == 2.0


def test_duplicate_key_tie_goes_to_earlier_path(tmp_path):
    a = write(tmp_path, "a.csv", BF16_HEADER + bf16_row(64, 96, 80, "torch", 2.0, kernel="first"))
    b = write(tmp_path, "b.csv", BF16_HEADER + bf16_row(64, 96, 80, "torch", 2.0, kernel="second"))
    assert load_table("GEMM_BF16", [a, b]).lookup(row_gfx(), row_cu(), KEY).values["kernelName"] == "first"
    assert load_table("GEMM_BF16", [b, a]).lookup(row_gfx(), row_cu(), KEY).values["kernelName"] == "second"


@pytest.mark.parametrize("bad_us", ["-1", "", "nan", "NaN", "inf"])
def test_negative_or_missing_us_dropped_with_warning(tmp_path, caplog, bad_us):
    p = write(tmp_path, "t.csv", BF16_HEADER + bf16_row(64, 96, 80, us=bad_us) + bf16_row(65, 96, 80, us=3.0))
    with caplog.at_level(logging.WARNING):
        table = load_table("GEMM_BF16", [p])
    assert len(table) == 1 and table.lookup(row_gfx(), row_cu(), KEY) is None
    assert "dropped 1 row" in caplog.text and p in caplog.text


@pytest.mark.parametrize("zero", ["0", "0.0"])
def test_us_zero_row_is_hand_set_and_loses_every_merge_to_a_timed_row(tmp_path, caplog, zero):
    hand = write(tmp_path, "hand.csv", BF16_HEADER + bf16_row(64, 96, 80, us=zero, kernel="hand")
                 + bf16_row(65, 96, 80, us=zero, kernel="hand65"))
    timed = write(tmp_path, "timed.csv", BF16_HEADER + bf16_row(64, 96, 80, us=900.0, kernel="timed"))
    hand2 = write(tmp_path, "hand2.csv", BF16_HEADER + bf16_row(65, 96, 80, us=zero, kernel="second"))
    with caplog.at_level(logging.WARNING):
        alone = load_table("GEMM_BF16", [hand])
    assert "dropped" not in caplog.text  # kept, without a warning: AITER uses these rows
    row = alone.lookup(row_gfx(), row_cu(), KEY)
    assert row.values["kernelName"] == "hand" and row.hand_set and row.us == 0
    for paths in ([hand, timed], [timed, hand]):  # a timed row wins whatever the order, even a slow one
        assert load_table("GEMM_BF16", paths).lookup(row_gfx(), row_cu(), KEY).values["kernelName"] == "timed"
    key65 = (65, *KEY[1:])
    assert load_table("GEMM_BF16", [hand, hand2]).lookup(row_gfx(), row_cu(), key65).values["kernelName"] == "hand65"
    assert load_table("GEMM_BF16", [hand2, hand]).lookup(row_gfx(), row_cu(), key65).values["kernelName"] == "second"


def test_missing_path_skipped_all_missing_is_error(tmp_path, caplog):
    good = write(tmp_path, "good.csv", BF16_HEADER + bf16_row(64, 96, 80))
    missing = str(tmp_path / "nope.csv")
    with caplog.at_level(logging.WARNING):
        assert len(load_table("GEMM_BF16", [missing, good])) == 1
    assert "nope.csv" in caplog.text and "not found" in caplog.text
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        load_table("GEMM_BF16", [missing, str(tmp_path / "nope2.csv")])


@pytest.mark.parametrize("text", ["", BF16_HEADER, "\n\n", BF16_HEADER + "\n"])
def test_empty_or_header_only_file_is_valid(tmp_path, text):
    assert len(load_table("GEMM_BF16", [write(tmp_path, "e.csv", text)])) == 0


def test_extra_columns_kept_and_returned(tmp_path, clean_runtime):
    header = BF16_HEADER.strip() + ",note,err_ratio\n"
    p = write(tmp_path, "x.csv", header + bf16_row(64, 96, 80).strip() + ",hello,0.0\n")
    row = load_table("GEMM_BF16", [p]).lookup(row_gfx(), row_cu(), KEY)
    assert row.fields["note"] == "hello"
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", p)
    aiter_gemm.reload_configs()
    cfg = aiter_gemm.get_GEMM_A16W16_config(64, 96, 80, False, torch.float32, torch.float32)
    assert cfg["note"] == "hello" and cfg["matched"] == "exact" and cfg["source"] == p


def test_file_without_gfx_applies_to_any_arch_with_that_cu_num(tmp_path):
    header = BF16_HEADER.split(",", 1)[1]
    p = write(tmp_path, "nogfx.csv", header + bf16_row(64, 96, 80, cu_num=304).split(",", 1)[1])
    table = load_table("GEMM_BF16", [p])
    assert table.lookup("gfx942", 304, KEY) is not None and table.lookup("sm_90", 304, KEY) is not None
    assert table.lookup("gfx942", 80, KEY) is None


def test_arch_specific_row_preferred_over_gfx_less_row(tmp_path):
    nogfx = write(tmp_path, "a.csv", BF16_HEADER.split(",", 1)[1] + bf16_row(64, 96, 80, us=1.0, cu_num=8,
                                                                               kernel="any").split(",", 1)[1])
    own = write(tmp_path, "b.csv", BF16_HEADER + bf16_row(64, 96, 80, us=9.0, gfx="sm_90", cu_num=8, kernel="own"))
    table = load_table("GEMM_BF16", [nogfx, own])
    assert table.lookup("sm_90", 8, KEY).values["kernelName"] == "own"
    assert table.lookup("gfx942", 8, KEY).values["kernelName"] == "any"


@pytest.mark.parametrize(
    ("row", "line", "column", "message"),
    [
        ("cpu,2,6x4,96,80,False,torch.float32,torch.float32,False,False,torch,0,0,1.0,k\n", 3, "M", "bad value"),
        ("cpu,2,64,96,80,False,torch.float33,torch.float32,False,False,torch,0,0,1.0,k\n", 3, "dtype", "unknown dtype"),
        ("cpu,2,64,96,80,False,__import__('os'),torch.float32,False,False,torch,0,0,1.0,k\n", 3, "dtype",
         "unknown dtype"),
        ("cpu,2,64,96,80,False,torch.float32,torch.float32,False,False,torch,0,0,1.0\n", 3, None, "wrong field count"),
        ("cpu,2,64,96,80,maybe,torch.float32,torch.float32,False,False,torch,0,0,1.0,k\n", 3, "bias", "bad value"),
        ("cpu,2,64,96,80,False,torch.float32,torch.float32,False,False,torch,zero,0,1.0,k\n", 3, "solidx", "bad value"),
        ("cpu,2,64,96,80,False,torch.float32,torch.float32,False,False,torch,0,0,fast,k\n", 3, "us", "not a number"),
        ("cpu,2,64,96,80,False,torch.float32,torch.float32,False,False,,0,0,1.0,k\n", 3, "libtype", "empty value"),
    ],
)
def test_malformed_row_names_file_line_column(tmp_path, row, line, column, message):
    p = write(tmp_path, "bad.csv", BF16_HEADER + bf16_row(1, 96, 80) + row)
    with pytest.raises(ConfigError, match=message) as info:
        load_table("GEMM_BF16", [p])
    err = info.value
    assert (err.path, err.line, err.column) == (p, line, column)
    assert f"{p}:{line}" in str(err)


@pytest.mark.parametrize("missing", ["M", "dtype", "libtype", "us", "cu_num"])
def test_missing_required_column(tmp_path, missing):
    cols = BF16_HEADER.strip().split(",")
    i = cols.index(missing)
    vals = bf16_row(64, 96, 80).strip().split(",")
    p = write(tmp_path, "m.csv", ",".join(cols[:i] + cols[i + 1:]) + "\n" + ",".join(vals[:i] + vals[i + 1:]) + "\n")
    with pytest.raises(ConfigError, match="missing required column") as info:
        load_table("GEMM_BF16", [p])
    assert info.value.column == missing and info.value.line == 1


def test_dtype_table_spellings():
    for names, dt in [(("torch.bfloat16", "bf16"), torch.bfloat16), (("torch.float16", "f16", "fp16"), torch.float16),
                      (("torch.float32", "f32"), torch.float32), (("torch.int8", "i8"), torch.int8),
                      (("torch.float8_e4m3fn",), torch.float8_e4m3fn),
                      (("torch.float8_e4m3fnuz",), torch.float8_e4m3fnuz)]:
        for n in names:
            assert parse_dtype(n) is dt
    with pytest.raises(KeyError):
        parse_dtype("torch.complex64")


def test_settings_paths_colon_separated_and_defaults(tmp_path):
    s = load_settings({"AITER_CONFIG_GEMM_BF16": "/a.csv:/b.csv", "AITER_CONFIG_FMOE": ""})
    assert s.config_paths["GEMM_BF16"] == ("/a.csv", "/b.csv")
    for kind, (_, fname) in CONFIG_KINDS.items():
        if kind != "GEMM_BF16":
            assert s.config_paths[kind] == (str(default_config_dir() / fname),)
            assert Path(s.config_paths[kind][0]).is_file(), "every kind ships a (header-only) default file"
    with pytest.raises(ValueError, match="AITER_GEMM_CU_NUM"):
        load_settings({"AITER_GEMM_CU_NUM": "many"})
    with pytest.raises(ValueError, match="CU_NUM"):
        load_settings({"CU_NUM": "-3"})


@pytest.mark.parametrize("name", ["AITER_TUNE_GEMM", "AITER_LOG_TUNED_CONFIG"])
def test_boolean_settings_refuse_other_values_naming_them(name):
    """Issue 31: AITER_TUNE_GEMM=2 or =maybe and AITER_LOG_TUNED_CONFIG=2 were silently off."""
    attr = {"AITER_TUNE_GEMM": "tune_gemm", "AITER_LOG_TUNED_CONFIG": "log_tuned_config"}[name]
    for raw, on in (("1", True), (" TRUE ", True), ("yes", True), ("On", True), ("0", False), ("false", False),
                    ("no", False), ("OFF", False), ("", False)):
        assert getattr(load_settings({name: raw}), attr) is on, raw
    assert getattr(load_settings({}), attr) is False
    for raw in ("2", "maybe", "-1"):
        with pytest.raises(ValueError, match=f"{name} must be 1/true/yes/on/t/y or 0/false/no/off/f/n, got '{raw}'"):
            load_settings({name: raw})


@pytest.mark.parametrize("raw", ["inf", "nan", "-1", "1e300", "soon", "3_0"])
def test_flush_interval_must_be_a_usable_number_of_seconds(raw):
    """Issue 31: AITER_TUNE_GEMM_FLUSH_S=inf killed the timer thread with a traceback; nan and -1 were taken."""
    with pytest.raises(ValueError, match=f"AITER_TUNE_GEMM_FLUSH_S must be a number of seconds .*got '{raw}'"):
        load_settings({"AITER_TUNE_GEMM_FLUSH_S": raw})
    assert load_settings({"AITER_TUNE_GEMM_FLUSH_S": "0"}).capture_flush_s == 0
    assert load_settings({"AITER_TUNE_GEMM_FLUSH_S": " 2.5 "}).capture_flush_s == 2.5
    assert load_settings({}).capture_flush_s == 30


def test_home_expanded_in_every_path_setting(monkeypatch, tmp_path):
    """Issue 31: ``~`` in a path setting was taken literally (a folder named ``~`` in the working directory)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    s = load_settings({"AITER_CONFIG_GEMM_BF16": "~/a.csv: ~/b.csv", "AITER_UNTUNED_GEMM_FILE": "~/u.csv",
                       "AITER_GEMM_TRITON_CONFIGS": "~/triton:/abs"})
    assert s.config_paths["GEMM_BF16"] == (str(tmp_path / "a.csv"), str(tmp_path / "b.csv"))
    assert s.untuned_file == str(tmp_path / "u.csv")
    assert s.triton_config_dirs[:2] == (str(tmp_path / "triton"), "/abs")


@pytest.mark.parametrize("what", ["directory", "symlink loop", "dangling symlink", "missing"])
def test_config_path_that_is_no_file_says_what_it_is(tmp_path, caplog, what):
    """Issue 31: a directory or a symlink loop given as a config path was reported as "not found"."""
    good = write(tmp_path, "good.csv", BF16_HEADER + bf16_row(64, 96, 80))
    bad = tmp_path / "bad.csv"
    if what == "directory":
        bad.mkdir()
    elif what == "symlink loop":
        bad.symlink_to(tmp_path / "loop.csv")
        (tmp_path / "loop.csv").symlink_to(bad)
    elif what == "dangling symlink":
        bad.symlink_to(tmp_path / "gone.csv")
    with caplog.at_level(logging.WARNING):
        assert len(load_table("GEMM_BF16", [str(bad), good])) == 1
    said = {"directory": "a directory", "symlink loop": "a symlink loop",
            "dangling symlink": f"a dangling symlink to '{tmp_path / 'gone.csv'}'", "missing": "not found"}[what]
    assert f"{bad}: {said}; skipped" in caplog.text


def test_json_config_folder_that_is_no_folder_says_what_it_is(tmp_path, caplog):
    """The folders of AITER_GEMM_TRITON_CONFIGS: one that is a file, missing or a symlink loop held no config
    without a word."""
    (tmp_path / "file").write_text("")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    with caplog.at_level(logging.WARNING):
        s = load_settings({"AITER_GEMM_TRITON_CONFIGS": f"{tmp_path}:{tmp_path / 'file'}:{tmp_path / 'gone'}:"
                                                        f"{tmp_path / 'loop'}"})
    assert s.triton_config_dirs[:4] == (str(tmp_path), str(tmp_path / "file"), str(tmp_path / "gone"),
                                        str(tmp_path / "loop"))
    for name, what in (("file", "a file"), ("gone", "not found"), ("loop", "a symlink loop")):
        assert f"entry {tmp_path / name} is no folder ({what})" in caplog.text
    assert f"entry {tmp_path} is" not in caplog.text


def test_shipped_token_puts_the_shipped_files_where_it_stands(tmp_path, clean_runtime):
    """``@shipped`` in an AITER_CONFIG_* list is what the kind reads with the variable unset (shipped file and model
    configs), in the token's place; ``./@shipped`` is a file of that name."""
    shipped = load_settings({}).config_paths
    s = load_settings({"AITER_CONFIG_GEMM_BF16": "/mine.csv:@shipped:/last.csv", "AITER_CONFIG_FMOE": " @shipped "})
    assert s.config_paths["GEMM_BF16"] == ("/mine.csv", *shipped["GEMM_BF16"], "/last.csv")
    assert s.config_paths["FMOE"] == shipped["FMOE"]
    assert load_settings({"AITER_CONFIG_GEMM_BF16": "./@shipped"}).config_paths["GEMM_BF16"] == ("./@shipped",)
    # End to end: a user's row for one shape in front of the shipped H100 table; the shipped rows still serve.
    mine = tmp_path / "mine.csv"
    mine.write_text(BF16_HEADER + bf16_row(3, 96, 80, gfx="sm_90", cu_num=132, dtype="torch.bfloat16"))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", f"{mine}:@shipped")
    clean_runtime.setenv("AITER_GEMM_ARCH", "sm_90")
    clean_runtime.setenv("AITER_GEMM_CU_NUM", "132")
    aiter_gemm.reload_configs()
    assert aiter_gemm.get_GEMM_A16W16_config(3, 96, 80, False, torch.bfloat16)["source"] == str(mine)
    got = aiter_gemm.get_GEMM_A16W16_config(1, 4096, 4096, False, torch.bfloat16)
    assert got["matched"] == "exact" and got["source"] == str(default_config_dir() / "bf16_tuned_gemm.csv")
    assert aiter_gemm.tgemm.tune_path == f"{mine}:{default_config_dir() / 'bf16_tuned_gemm.csv'}"


def test_every_shipped_default_config_loads():
    s = load_settings({})
    for kind in CONFIG_KINDS:
        load_table(kind, s.config_paths[kind])


def _sha(paths):
    return {p: hashlib.sha256(Path(p).read_bytes()).hexdigest() for p in paths}


def _reference_csvs() -> list[Path]:
    """AITER's CSVs of every kind: the trimmed copies under op_tests/fixtures (every clone has them), and the full
    reference files beside the repository where they are."""
    fixtures = [FIXTURES / "aiter_bf16_tuned_gemm.csv", *sorted((FIXTURES / "aiter_model_configs").glob("*.csv")),
                *sorted((FIXTURES / "aiter_configs").rglob("*.csv"))]
    return fixtures + (sorted(SHARED.rglob("*.csv")) if SHARED.is_dir() else [])


@pytest.mark.parametrize("path", _reference_csvs(),
                         ids=lambda p: f"{'fixture' if FIXTURES in p.parents else 'reference'}:{p.name}")
def test_every_aiter_reference_csv_loads_and_indexes(path):
    kind = ("GEMM_A8W8_BLOCKSCALE" if "blockscale" in path.name else "GEMM_A8W8" if "a8w8" in path.name
            else "GEMM_BF16")
    before = _sha([path])
    header = path.read_text().splitlines()[0].split(",")
    if "us" in [h.strip() for h in header]:
        table = load_table(kind, [path])
        for row in table:
            assert table.lookup(row.gfx, row.cu_num, row.key) is row
            assert math.isfinite(row.us) and row.us >= 0
    else:
        assert load_untuned(path, kind)
    assert _sha([path]) == before


def row_cu() -> int:
    return aiter_gemm.current_device_identity().cu_num


def row_gfx() -> str:
    return aiter_gemm.current_device_identity().gfx


# ---- integers of config text are ASCII digits (issue 47) --------------------------------------------------------
@pytest.mark.parametrize(("column", "value", "message"), [
    ("M", "4_0", "ASCII digits"),  # int() reads 40
    ("N", "\u0669\u0666", "ASCII digits"),  # Arabic-Indic 96: int() reads 96
    ("K", "+80", "ASCII digits"),
    ("cu_num", "1_0", "ASCII digits"),
    ("solidx", "-1_0", "ASCII digits"),
    ("us", "1_0", "not a number"),  # float() reads 10
    ("us", "\u0661", "not a number"),
    ("M", "4" * 19, "more than 18 digits"),
])
def test_config_integers_are_ascii_digits(tmp_path, column, value, message):
    cells = {"M": 4, "N": 96, "K": 80, "cu_num": None, "solidx": -1, "us": 1.0} | {column: value}
    p = write(tmp_path, "t.csv", BF16_HEADER + bf16_row(cells.pop("M"), cells.pop("N"), cells.pop("K"), **cells))
    with pytest.raises(ConfigError, match=message) as info:
        load_table("GEMM_BF16", [p])
    assert (info.value.path, info.value.line, info.value.column) == (p, 2, column)
    if column in ("M", "N", "K"):  # the untuned shape lists the tuner reads
        fields = {"M": "4", "N": "96", "K": "80"} | {column: value}
        u = write(tmp_path, "u.csv", "M,N,K\n" + ",".join(fields.values()) + "\n")
        with pytest.raises(ConfigError, match=message) as info:
            load_untuned(u)
        assert (info.value.line, info.value.column) == (2, column)


@pytest.mark.parametrize("raw", ["1_32", "\u0661\u0663\u0662", "+132", "9" * 5000])
def test_cu_num_settings_are_ascii_integers(raw):
    for var in ("AITER_GEMM_CU_NUM", "CU_NUM"):
        with pytest.raises(ValueError, match=f"aiter_gemm: {var} .*digits") as info:
            load_settings({var: raw})
        assert len(str(info.value)) < 200
    assert load_settings({"AITER_GEMM_CU_NUM": " 132 "}).cu_num == 132
    assert not has_tma("sm_\u0669\u0660"), "an arch's number is ASCII digits too"


# ---- encodings, BOM, non-positive sizes, typed config values (issue 17) ------------------------------------------
BOM = b"\xef\xbb\xbf"


def test_bom_file_loads_with_its_gfx_column(tmp_path, caplog):
    """Excel's "CSV UTF-8" starts with a BOM: the first column must still be found (M of an untuned list, gfx of
    a tuned file, which must keep rows to their arch instead of applying them to any)."""
    untuned = tmp_path / "u.csv"
    untuned.write_bytes(BOM + b"M,N,K\n4,96,80\n")
    assert load_untuned(untuned)[0][:3] == (4, 96, 80)
    tuned = tmp_path / "t.csv"
    tuned.write_bytes(BOM + (BF16_HEADER + bf16_row(64, 96, 80, gfx="sm_test", cu_num=8)).encode())
    table = load_table("GEMM_BF16", [str(tuned)])
    assert table.lookup("sm_test", 8, KEY) is not None
    assert table.lookup("gfx942", 8, KEY) is None, "a BOM must not turn gfx into an unknown column"


def test_non_utf8_bytes_name_file_and_line(tmp_path):
    p = tmp_path / "latin1.csv"
    p.write_bytes((BF16_HEADER + bf16_row(1, 96, 80)).encode() + b"cpu,2,64,96,80,False,torch.float32,"
                  b"torch.float32,False,False,torch,0,0,1.0,caf\xe9\n")
    with pytest.raises(ConfigError, match="UTF-8") as info:
        load_table("GEMM_BF16", [str(p)])
    assert (info.value.path, info.value.line) == (str(p), 3) and f"{p}:3" in str(info.value)
    u = tmp_path / "u.csv"
    u.write_bytes(BOM + b"M,N,K\n\xff4,96,80\n")
    with pytest.raises(ConfigError, match="UTF-8") as info:
        load_untuned(u)
    assert (info.value.path, info.value.line) == (str(u), 2)


@pytest.mark.parametrize(("col", "value"), [("M", "-4"), ("M", "0"), ("N", "-96"), ("K", "0")])
def test_non_positive_sizes_are_errors(tmp_path, col, value):
    fields = dict(zip(("M", "N", "K"), ("64", "96", "80")))
    fields[col] = value
    p = write(tmp_path, "t.csv", BF16_HEADER + bf16_row(*fields.values()))
    with pytest.raises(ConfigError, match="positive") as info:
        load_table("GEMM_BF16", [p])
    assert (info.value.line, info.value.column) == (2, col)
    u = write(tmp_path, "u.csv", "M,N,K\n" + ",".join(fields.values()) + "\n")
    with pytest.raises(ConfigError, match="positive") as info:
        load_untuned(u)
    assert (info.value.path, info.value.line, info.value.column) == (u, 2, col)


def test_config_dict_values_are_typed(tmp_path, clean_runtime):
    """AITER returns numbers and bools, not their text: ``if cfg['bias']`` must be False for a bias-free row."""
    header = BF16_HEADER.strip() + ",err_ratio,tflops,bw,note\n"
    p = write(tmp_path, "x.csv", header + bf16_row(64, 96, 80, us=2.5, solidx=3).strip() + ",0.01,1.5,,hi\n")
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", p)
    aiter_gemm.reload_configs()
    cfg = aiter_gemm.get_GEMM_A16W16_config(64, 96, 80, False, torch.float32, torch.float32)
    for name in ("bias", "scaleAB", "bpreshuffle"):
        assert cfg[name] is False, (name, cfg[name])
    assert (cfg["M"], cfg["solidx"], cfg["splitK"], cfg["cu_num"]) == (64, 3, 0, row_cu())
    assert all(type(cfg[c]) is int for c in ("M", "N", "K", "solidx", "splitK", "cu_num"))
    assert cfg["us"] == 2.5 and cfg["err_ratio"] == 0.01 and cfg["tflops"] == 1.5 and cfg["bw"] is None
    assert cfg["note"] == "hi" and cfg["libtype"] == "torch" and cfg["kernelName"] == "k"


# ---- a broken configured file does not stop the runtime (issue 17) ----------------------------------------------
@pytest.mark.parametrize("broken", ["missing", "malformed", "latin1", "huge field", "huge integer"])
def test_broken_config_file_is_skipped_with_a_warning(tmp_path, clean_runtime, caplog, broken):
    """The runtime runs on the other files' rows (or the defaults) and says which file it skipped and why; only
    load_table(strict=True), the validating reader, raises. Issue 47: a cell longer than csv's field_size_limit
    raised a bare csv.Error out of every reader."""
    bad = tmp_path / "bad.csv"
    if broken == "malformed":
        bad.write_text(BF16_HEADER + bf16_row(-3, 96, 80))
    elif broken == "latin1":
        bad.write_bytes(BF16_HEADER.encode() + bf16_row(3, 96, 80, kernel="caf\xe9").encode("latin-1"))
    elif broken == "huge field":
        bad.write_text(BF16_HEADER + bf16_row(3, 96, 80, kernel="k" * (csv.field_size_limit() + 1)))
    elif broken == "huge integer":
        bad.write_text(BF16_HEADER + bf16_row("9" * 5000, 96, 80))
    good = write(tmp_path, "good.csv", BF16_HEADER + bf16_row(64, 96, 80))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", f"{bad}:{good}")
    with caplog.at_level(logging.WARNING):
        aiter_gemm.reload_configs()
    assert str(bad) in caplog.text and ("not found" if broken == "missing" else "cannot be used") in caplog.text
    assert aiter_gemm.get_GEMM_A16W16_config(64, 96, 80, False, torch.float32)["matched"] == "exact"
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(bad))
    aiter_gemm.reload_configs()
    out = aiter_gemm.gemm_a16w16(torch.ones(3, 80), torch.ones(96, 80))
    assert out.shape == (3, 96)
    assert aiter_gemm.get_GEMM_A16W16_config(3, 96, 80, False, torch.float32)["matched"] == "default"
    if broken != "missing":
        with pytest.raises(ConfigError, match=str(bad)) as info:
            load_table("GEMM_BF16", [str(bad)])
        assert info.value.line == 2 and len(str(info.value)) < 300, "names the line, not the whole cell"
    if broken == "huge field":
        with pytest.raises(ConfigError, match=f"{bad}:2: not readable as CSV"):
            read_csv_rows(bad)  # the tuner's and capture's reader


def test_import_survives_a_broken_configured_file(tmp_path):
    import subprocess
    import sys

    from op_tests.runtime_helpers import repo_env

    env = repo_env(AITER_CONFIG_GEMM_BF16=str(tmp_path / "typo.csv"))
    res = subprocess.run([sys.executable, "-c", "import aiter_gemm; print('ok')"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr
    assert "typo.csv" in res.stderr and "default heuristic" in res.stderr
