"""AITER drop-in behaviour of the runtime: AITER's own tuned CSVs load with the rows AITER uses (``us = 0`` included),
the shipped model configs merge by default, ``CU_NUM`` / ``GPU_ARCHS``, the INFO line of a miss, capture of padded
hits and of block-scale shapes, ``get_GEMM_A16W16_config.cache_clear()`` and ``tgemm``'s attributes."""

from __future__ import annotations

import csv
import logging
import shutil
from pathlib import Path

import pytest
import torch

import aiter_gemm
from aiter_gemm import settings as settings_mod
from aiter_gemm.configs import load_table
from aiter_gemm.device import probe_cpu
from aiter_gemm.dtypes import dtype_name
from aiter_gemm.settings import CONFIG_KINDS, load_settings
from op_tests.runtime_helpers import BF16_HEADER, bf16_row

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "aiter_configs"
F32 = torch.float32


#: The trimmed fixtures (every clone), and the full reference copies beside the repository where they are.
SOURCES = ["fixtures", *(["reference"] if REFERENCE.is_dir() else [])]


def aiter_bf16_files(source: str) -> tuple[Path, list[Path]]:
    """AITER's shipped ``bf16_tuned_gemm.csv`` and its ``model_configs/*bf16_tuned_gemm*.csv``: the full reference
    copies beside the repository, or the trimmed fixtures."""
    if source == "reference":
        return REFERENCE / "bf16_tuned_gemm.csv", sorted((REFERENCE / "model_configs").glob("*bf16_tuned_gemm*.csv"))
    return FIXTURES / "aiter_bf16_tuned_gemm.csv", sorted((FIXTURES / "aiter_model_configs").glob("*.csv"))


def aiter_table(paths: list[Path]) -> dict[tuple, dict[str, str]]:
    """The rows AITER's ``get_GEMM_A16W16_config_`` indexes, computed the way AITER does it (pandas ``read_csv``,
    ``drop_duplicates``, ``set_index`` on the key columns, every ``us`` kept), written independently of our parser.
    AITER raises on a key present twice (``to_dict('index')`` and its multi-file merge), so that fails here too."""
    table: dict[tuple, dict[str, str]] = {}
    for path in paths:
        seen: set[tuple] = set()
        with open(path, newline="") as f:
            for rec in csv.DictReader(f):
                if tuple(rec.values()) in seen:
                    continue
                seen.add(tuple(rec.values()))
                key = (rec["gfx"], int(rec["cu_num"]), int(rec["M"]), int(rec["N"]), int(rec["K"]),
                       rec["bias"] == "True", rec["dtype"], rec["outdtype"], rec["scaleAB"] == "True",
                       rec["bpreshuffle"] == "True")
                assert key not in table, f"AITER would raise on the duplicate key {key} ({path})"
                table[key] = rec
    return table


def our_table(paths: list[Path]) -> dict[tuple, object]:
    out = {}
    for row in load_table("GEMM_BF16", [str(p) for p in paths]):
        M, N, K, bias, dt, ot, scale, shuffle = row.key
        out[(row.gfx, row.cu_num, M, N, K, bias, dtype_name(dt), dtype_name(ot), scale, shuffle)] = row
    return out


def assert_same_rows(paths: list[Path]) -> int:
    theirs, ours = aiter_table(paths), our_table(paths)
    assert set(ours) == set(theirs)
    for key, rec in theirs.items():
        row = ours[key]
        assert (row.values["libtype"], row.values["solidx"], row.values["kernelName"], row.us) == \
            (rec["libtype"], int(rec["solidx"]), rec["kernelName"], float(rec["us"])), key
    return sum(1 for rec in theirs.values() if float(rec["us"]) == 0)


@pytest.mark.parametrize("source", SOURCES)
def test_aiter_bf16_csvs_load_with_the_rows_aiter_uses(source, tmp_path, monkeypatch):
    main, models = aiter_bf16_files(source)
    assert len(models) == 8  # AITER's eight model configs, so nine files with the main one
    hand_set = 0
    for path in [main, *models]:
        hand_set += assert_same_rows([path])
    assert hand_set >= (242 if source == "reference" else 18)  # the gfx1250 rows of dsv3_* and gptoss_*
    # With no variable set, AITER merges configs/bf16_tuned_gemm.csv with every model config: so do we.
    shipped_kinds_into(tmp_path)
    (tmp_path / "model_configs").mkdir()
    shutil.copy(main, tmp_path / "bf16_tuned_gemm.csv")
    for p in models:
        shutil.copy(p, tmp_path / "model_configs" / p.name)
    monkeypatch.setattr(settings_mod, "default_config_dir", lambda: tmp_path)
    paths = [Path(p) for p in load_settings({}).config_paths["GEMM_BF16"]]
    assert paths == [tmp_path / "bf16_tuned_gemm.csv", *(tmp_path / "model_configs" / p.name for p in models)]
    assert_same_rows(paths)


def test_hand_set_row_is_dispatched_on_its_device(clean_runtime):
    """A gfx1250 ``us = 0`` Triton row of AITER's gptoss config serves its shape, found through AITER's CU_NUM and
    GPU_ARCHS (the Triton backend runs AITER's ``auto`` kernelName: its built-in config choice)."""
    path = FIXTURES / "aiter_model_configs" / "gptoss_bf16_tuned_gemm.csv"
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    clean_runtime.setenv("GPU_ARCHS", "gfx942;gfx1250")
    clean_runtime.setenv("CU_NUM", "256")
    aiter_gemm.reload_configs()
    cfg = aiter_gemm.get_dispatcher().decide(aiter_gemm.GemmProblem(1, 128, 2880, True), False).as_config()
    assert (cfg["matched"], cfg["libtype"], cfg["kernelName"], cfg["us"], cfg["gfx"], cfg["cu_num"]) == \
        ("exact", "triton", "auto", 0.0, "gfx1250", 256)


def shipped_kinds_into(folder: Path) -> None:
    """Every kind's shipped file copied into ``folder`` (a reload loads every op's table: the block-scale op's too)."""
    for _, fname in CONFIG_KINDS.values():
        shutil.copy(settings_mod.default_config_dir() / fname, folder / fname)


def test_default_merges_model_configs_and_the_variable_replaces_them(tmp_path, monkeypatch, clean_runtime):
    shipped_kinds_into(tmp_path)
    (tmp_path / "model_configs").mkdir()
    (tmp_path / "bf16_tuned_gemm.csv").write_text(BF16_HEADER + bf16_row(64, 96, 80, us=5.0, kernel="main"))
    (tmp_path / "model_configs" / "zeta_bf16_tuned_gemm.csv").write_text(
        BF16_HEADER + bf16_row(64, 96, 80, us=2.0, kernel="model") + bf16_row(3, 96, 80, us=0, kernel="hand"))
    (tmp_path / "model_configs" / "zeta_bf16_untuned_gemm.csv").write_text("M,N,K\n3,96,80\n")
    (tmp_path / "model_configs" / "zeta_a8w8_tuned_gemm.csv").write_text("gfx\n")
    monkeypatch.setattr(settings_mod, "default_config_dir", lambda: tmp_path)
    assert load_settings({}).config_paths["GEMM_BF16"] == (
        str(tmp_path / "bf16_tuned_gemm.csv"), str(tmp_path / "model_configs" / "zeta_bf16_tuned_gemm.csv"))
    assert load_settings({}).config_paths["GEMM_A8W8"][1:] == (str(tmp_path / "model_configs" /
                                                                    "zeta_a8w8_tuned_gemm.csv"),)
    aiter_gemm.reload_configs()
    disp = aiter_gemm.get_dispatcher()
    hit = disp.decide(aiter_gemm.GemmProblem(64, 96, 80, False, F32, F32), False).as_config()
    assert (hit["kernelName"], hit["source"]) == ("model", str(tmp_path / "model_configs" /
                                                               "zeta_bf16_tuned_gemm.csv"))
    assert disp.decide(aiter_gemm.GemmProblem(3, 96, 80, False, F32, F32), False).as_config()["kernelName"] == "hand"
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tmp_path / "bf16_tuned_gemm.csv"))
    aiter_gemm.reload_configs()  # a variable names the files: nothing else is merged, as in AITER
    assert aiter_gemm.get_dispatcher().decide(aiter_gemm.GemmProblem(64, 96, 80, False, F32, F32),
                                              False).as_config()["kernelName"] == "main"


@pytest.mark.parametrize(
    ("env", "arch", "cu"),
    [({"GPU_ARCHS": "gfx942"}, "gfx942", None), ({"GPU_ARCHS": "gfx942;gfx950"}, "gfx950", None),
     ({"GPU_ARCHS": "native", "CU_NUM": "0"}, None, None), ({"CU_NUM": "304"}, None, 304),
     ({"GPU_ARCHS": "gfx942", "AITER_GEMM_ARCH": "sm_90", "CU_NUM": "304", "AITER_GEMM_CU_NUM": "132"}, "sm_90", 132)],
)
def test_aiter_device_overrides(env, arch, cu, clean_runtime):
    s = load_settings(env)
    assert (s.arch, s.cu_num) == (arch, cu)
    for name, value in env.items():
        clean_runtime.setenv(name, value)
    aiter_gemm.reload_configs()
    ident = aiter_gemm.current_device_identity(False)
    assert ident.gfx == (arch or "cpu") and ident.cu_num == (cu or probe_cpu().cu_num)


@pytest.mark.parametrize("raw", ["NVIDIA H200", "  NVIDIA  H100 80GB HBM3 "])
def test_device_name_override_is_read_once_and_written_with_underscores(raw, clean_runtime):
    assert load_settings({}).device_name is None
    clean_runtime.setenv("AITER_GEMM_DEVICE_NAME", raw)
    aiter_gemm.reload_configs()
    ident = aiter_gemm.current_device_identity(False)
    assert ident.name == raw.strip() and ident.device_name == "_".join(raw.split())
    assert (ident.gfx, ident.cu_num) == (probe_cpu().gfx, probe_cpu().cu_num)  # the other fields stay probed


def test_miss_logs_aiters_info_line_once_per_shape(clean_runtime, tmp_path, caplog):
    tuned = tmp_path / "t.csv"
    tuned.write_text(BF16_HEADER + bf16_row(16, 96, 80))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    aiter_gemm.reload_configs()
    b = torch.randn(96, 80)
    with caplog.at_level(logging.INFO, logger="aiter_gemm"):
        for m in (17, 17, 16, 9, 700):  # 17: miss (twice: one line); 16 exact, 9 -> 16 padded: no line; 700: miss
            aiter_gemm.gemm_a16w16(torch.randn(m, 80), b)
    lines = [r.getMessage() for r in caplog.records if "not found tuned config" in r.getMessage()]
    assert lines == [f"shape is M:{m}, N:96, K:80 dtype='torch.float32' otype='torch.float32' bias=False, "
                     f"scaleAB=False, bpreshuffle=False, not found tuned config in {tuned}, will use default config! "
                     "using torch solution:0" for m in (17, 700)]


def test_capture_of_block_scale_shapes_goes_to_aiters_file(clean_runtime, tmp_path):
    folder = tmp_path / "captured"
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(folder / "bf16_untuned_gemm.csv"))
    aiter_gemm.reload_configs()
    from aiter_gemm.ops.a8w8_blockscale import get_GEMM_A8W8_BLOCKSCALE_config

    for m in (3, 3, 40):
        assert get_GEMM_A8W8_BLOCKSCALE_config(m, 256, 384, on_gpu=False)["matched"] == "default"
    aiter_gemm.get_dispatcher("gemm_a8w8_blockscale").flush_capture()
    aiter_gemm.get_dispatcher().flush_capture()
    with open(folder / "a8w8_blockscale_untuned_gemm.csv", newline="") as f:
        assert list(csv.reader(f)) == [["M", "N", "K"], ["3", "256", "384"], ["40", "256", "384"]]
    assert not (folder / "bf16_untuned_gemm.csv").exists()  # no a16w16 call: nothing captured there


def test_cache_clear_rereads_the_variable_and_files(clean_runtime, tmp_path):
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text(BF16_HEADER + bf16_row(64, 96, 80, kernel="first"))
    second.write_text(BF16_HEADER + bf16_row(64, 96, 80, kernel="second"))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(first))
    aiter_gemm.reload_configs()
    get = aiter_gemm.get_GEMM_A16W16_config
    problem = aiter_gemm.GemmProblem(64, 96, 80, False, F32, F32)
    assert aiter_gemm.get_dispatcher().decide(problem, False).as_config()["kernelName"] == "first"
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(second))
    assert aiter_gemm.get_dispatcher().decide(problem, False).as_config()["kernelName"] == "first"  # cached
    get.cache_clear()  # what AITER's tuners call after pointing the variable at a new file
    assert aiter_gemm.get_dispatcher().decide(problem, False).as_config()["kernelName"] == "second"


def test_tgemm_has_aiters_attributes(clean_runtime, tmp_path):
    tgemm = aiter_gemm.tgemm
    assert tgemm.save_gemm == 0
    tuned = tmp_path / "t.csv"
    tuned.write_text(BF16_HEADER)
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(tmp_path / "shapes.csv"))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", f"{tuned}:{tmp_path / 'other.csv'}")
    aiter_gemm.reload_configs()
    assert tgemm.save_gemm == 1
    assert tgemm.untune_path == str(tmp_path / "shapes.csv")
    assert tgemm.tune_path == f"{tuned}:{tmp_path / 'other.csv'}"
