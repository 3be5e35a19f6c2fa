"""SGLang's TileLang config files in and out (aiter_gemm.sglang_tilelang): the runtime reads SGLang's published H20
file (op_tests/fixtures/sglang_tilelang, Apache-2.0) below the project's own rows and JSON files, nearest M as SGLang
picks it (ties included), only for this device's name; what cannot run is a miss said once per file; malformed files
are skipped with a warning naming file and key. The tuner's ``--sglang_dir`` writes the same format, merged with what
a file already holds, and the runtime reads it back. CPU only: TileLang's availability and launcher are faked.
"""

from __future__ import annotations

import json
import logging
import random
import re
import shutil
from pathlib import Path

import pytest
import torch

import aiter_gemm
from aiter_gemm import dispatch, sglang_tilelang
from aiter_gemm.backends.a8w8_blockscale import tilelang as tilelang_backend
from aiter_gemm.backends.a8w8_blockscale import triton as triton_backend
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.fileio import render_csv
from aiter_gemm.jsonconfigs import JSONConfigError, select_bucket
from aiter_gemm.kernels import a8w8_blockscale_tilelang as tl
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import BlockscaleConfig
from aiter_gemm.kernels.a8w8_blockscale_tilelang import TileLangConfig
from aiter_gemm.ops.a8w8_blockscale import BLOCKSCALE_TUNED_COLUMNS, csv_row, json_config_path, write_json_configs

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sglang_tilelang"
H20_NAME = "N=4096,K=4096,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json"
H20 = FIXTURES / H20_NAME
H20_RAW = json.loads(H20.read_text())
FP8 = torch.float8_e4m3fn
#: The probed GPU in these tests: an H100 (its own name is not the fixture's; AITER_GEMM_DEVICE_NAME says H20).
H100 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H100 80GB HBM3")
#: The same arch and SM count with no name: a row written for it serves every sm_90/132 device (README, reuse rule).
SM90 = DeviceIdentity("sm_90", 132, "cuda")


def sglang_pick(keys: list[str], M: int) -> str:
    """SGLang's ConfigLoader.find_config: ``min`` over the int keys in file order by distance to M."""
    ints = [int(k) for k in keys]
    return str(min(ints, key=lambda x: abs(x - M)))


def _cfg(key: str) -> TileLangConfig:
    """The config the H20 file's key runs here (``c_scale_local`` read and not used: the name does not carry it)."""
    return TileLangConfig.from_name(TileLangConfig.from_json(H20_RAW[key]).name)


def _problem(M: int, N: int = 4096, K: int = 4096) -> GemmProblem:
    return GemmProblem(M, N, K, False, FP8, torch.bfloat16)


@pytest.fixture
def sglang_env(clean_runtime, tmp_path):
    """TileLang faked runnable on a probed H100 renamed NVIDIA_H20, SGLang's folder = the fixture's, no tuned rows;
    returns (monkeypatch, the launcher calls, the dispatcher)."""
    mp = clean_runtime
    made: list[tuple] = []
    mp.setattr(tl, "unavailable_reason", lambda device=None: None)
    mp.setattr(tl, "launcher", lambda N, K, cfg, dtype: made.append((N, K, cfg)) or ("runner", cfg))
    mp.setattr(dispatch, "probe_gpu", lambda index=None: H100)
    mp.setattr(torch_impl, "unavailable_reason", lambda device=None: "no GPU here (test)")  # the faked GPU's torch
    empty = tmp_path / "empty.csv"
    empty.write_text(",".join(BLOCKSCALE_TUNED_COLUMNS) + "\n")
    mp.setenv("AITER_CONFIG_GEMM_A8W8_BLOCKSCALE", str(empty))
    mp.setenv("AITER_GEMM_TRITON_CONFIGS", str(tmp_path))
    mp.setenv("AITER_GEMM_SGLANG_TILELANG_DIR", str(FIXTURES))
    mp.setenv("AITER_GEMM_DEVICE_NAME", "NVIDIA_H20")
    aiter_gemm.reload_configs()
    return mp, made, aiter_gemm.get_dispatcher("gemm_a8w8_blockscale")


# ------------------------------------------------------------------------------------------------ nearest M


def test_fixture_file_name_is_sglangs():
    assert sglang_tilelang.file_name(4096, 4096, "NVIDIA_H20") == H20_NAME
    assert H100.device_name == "NVIDIA_H100_80GB_HBM3"


@pytest.mark.parametrize("order", ["ascending", "descending", "shuffled"])
def test_bounds_pick_what_sglang_picks_for_every_m(tmp_path, order):
    """Every M up to past the largest key, including each tie (equal distance to two keys: the key written first
    wins, as ``min`` over SGLang's dict keeps the first)."""
    keys = list(H20_RAW)
    if order == "descending":
        keys.reverse()
    elif order == "shuffled":
        random.Random(7).shuffle(keys)
    path = tmp_path / H20_NAME
    path.write_text(json.dumps({k: H20_RAW[k] for k in keys}))
    buckets = sglang_tilelang.read_file(path)
    for M in range(1, 5200):
        assert select_bucket(buckets, M)[0] == sglang_pick(keys, M), M


def test_ties_follow_file_order():
    assert sglang_tilelang.nearest_m_bounds([2, 4]) == {2: 3, 4: None}  # M=3: 2 is written first
    assert sglang_tilelang.nearest_m_bounds([4, 2]) == {2: 2, 4: None}  # M=3: 4 is written first
    assert sglang_tilelang.nearest_m_bounds([1, 2]) == {1: 1, 2: None}  # no tie between neighbours
    assert sglang_tilelang.nearest_m_bounds([64]) == {64: None}


# ------------------------------------------------------------------------------------------------ the runtime


@pytest.mark.parametrize("M,key", [
    (1, "1"), (3, "2"), (6, "4"), (7, "8"), (20, "16"), (21, "24"), (28, "24"), (40, "32"), (56, "48"),
    (80, "64"), (97, "96"), (112, "96"), (192, "128"), (193, "256"), (384, "256"), (768, "512"), (1280, "1024"),
    (1792, "1536"), (2560, "2048"), (3584, "3072"), (3585, "4096"), (5000, "4096"),
])
def test_h20_fixture_decisions_per_m(sglang_env, M, key):
    """AITER_GEMM_DEVICE_NAME=NVIDIA_H20 on any GPU: the H20 file serves (4096, 4096), its M key as SGLang picks
    it (ties 3, 6, 20, 28, 40, 56, 80, 112, 192, 384, 768, 1280, 1792, 2560 and 3584 go to the smaller key)."""
    _, made, disp = sglang_env
    dec = disp.decide(_problem(M), True)
    cfg = _cfg(key)
    assert (dec.matched, dec.solution.libtype, dec.solution.kernelName) == ("json", "tilelang", cfg.name)
    assert dec.source == f"{H20}#{key}"
    assert dec.runner == ("runner", cfg) and made == [(4096, 4096, cfg)]
    assert disp.decide(_problem(M), True).as_config()["source"].endswith(f"#{key}")


def test_rows_and_own_json_come_before_sglangs(sglang_env, tmp_path):
    """Exact and padded rows, then the project's own JSON bucket, then SGLang's file, then the default."""
    mp, _, disp = sglang_env
    own = BlockscaleConfig("swapAB", 16, 128, 128, 1, 1, 4, 3)
    write_json_configs(json_config_path(tmp_path, "sm_90", 4096, 4096), {"M_LEQ_16": own})
    row = TileLangConfig("swapAB", 64, 32, num_stages=4)
    (tmp_path / "empty.csv").write_text(render_csv(BLOCKSCALE_TUNED_COLUMNS,
                                                   [csv_row(SM90, 32, 4096, 4096, row, 9.0)]))
    aiter_gemm.reload_configs()
    picks = {M: (disp.decide(_problem(M), True).matched, disp.decide(_problem(M), True).solution.kernelName)
             for M in (8, 32, 64)}
    assert picks == {8: ("json", own.name), 32: ("exact", row.name),
                     64: ("json", TileLangConfig.from_json(H20_RAW["64"]).name)}
    assert disp.decide(_problem(64), True).source.endswith(f"{H20_NAME}#64")


@pytest.mark.parametrize("name", ["NVIDIA_H100_80GB_HBM3", "NVIDIA_H2", "nvidia_h20"])
def test_another_devices_file_is_not_used(sglang_env, name):
    mp, made, disp = sglang_env
    mp.setenv("AITER_GEMM_DEVICE_NAME", name)
    aiter_gemm.reload_configs()
    dec = disp.decide(_problem(16), True)
    assert dec.matched == "default" and made == []


def test_probed_name_with_spaces_matches_underscores(sglang_env):
    mp, _, disp = sglang_env
    mp.delenv("AITER_GEMM_DEVICE_NAME")
    mp.setattr(dispatch, "probe_gpu", lambda index=None: DeviceIdentity("sm_90", 78, "cuda", "NVIDIA H20"))
    aiter_gemm.reload_configs()
    assert disp.decide(_problem(16), True).source == f"{H20}#16"


def test_tilelang_unavailable_is_a_miss_warned_once_per_file(sglang_env, caplog):
    mp, made, disp = sglang_env
    mp.setattr(tl, "unavailable_reason", lambda device=None: "tilelang is not installed (test)")
    caplog.set_level(logging.WARNING, logger="aiter_gemm")
    decs = [disp.decide(_problem(M), True) for M in (1, 16, 64, 256, 4096)]
    assert {d.matched for d in decs} == {"default"} and made == []
    warned = [r.getMessage() for r in caplog.records if H20_NAME in r.getMessage()]
    assert len(warned) == 1 and "tilelang is not installed (test)" in warned[0]
    assert "libtype 'tilelang'" not in caplog.text  # said for the file, not once more for the libtype


@pytest.mark.parametrize("entry,why", [
    ({"kernel_type": "splitK", "block_M": 64, "block_N": 16, "block_K": 128, "num_stages": 0, "threads": 128,
      "split_k": 4}, "num_stages=0 must be 1..16"),
    ({"kernel_type": "base", "block_M": 64, "block_N": 64, "block_K": 64, "num_stages": 2, "threads": 128},
     "block_K must be 128"),
    ({"kernel_type": "gemv", "block_M": 64, "block_N": 64, "block_K": 128, "num_stages": 2, "threads": 128},
     "not a TileLang config name"),
    ({"kernel_type": "base", "block_M": 64, "block_N": 64, "block_K": 128, "num_stages": 2, "threads": 128,
      "swizzle": 2**31}, "swizzle=2147483648 must be in 0..1024"),  # issue 47: ran, failed to compile every call
])
def test_unsupported_entry_is_a_miss_said_once(sglang_env, tmp_path, caplog, entry, why):
    """A value SGLang can hold but this project's kernels cannot run: that M is a miss (the default serves it, not
    another key), warned once for the file, naming why; the file's other keys still serve."""
    mp, _, disp = sglang_env
    folder = tmp_path / "sg"
    folder.mkdir()
    (folder / H20_NAME).write_text(json.dumps({"16": entry, "64": H20_RAW["64"]}))
    mp.setenv("AITER_GEMM_SGLANG_TILELANG_DIR", str(folder))
    aiter_gemm.reload_configs()
    caplog.set_level(logging.WARNING, logger="aiter_gemm")
    assert [disp.decide(_problem(M), True).matched for M in (8, 16, 17)] == ["default"] * 3
    assert disp.decide(_problem(64), True).matched == "json"
    warned = [r.getMessage() for r in caplog.records if "SGLang TileLang config" in r.getMessage()]
    assert len(warned) == 1 and why in warned[0] and str(folder / H20_NAME) in warned[0]


MALFORMED = [
    ("{not json", None, "not valid JSON"),
    ("[]", None, "non-empty object"),
    ('{"01": {}}', "01", "positive integers"),
    ('{"sixteen": {}}', "sixteen", "positive integers"),
    ('{"16": 3}', "16", "must be an object"),
    ('{"16": {"kernel_type": "base", "block_M": 64, "block_K": 128, "num_stages": 2, "threads": 128}}', "16",
     "missing keys ['block_N']"),
    ('{"16": {"kernel_type": "splitK", "block_M": 64, "block_N": 64, "block_K": 128, "num_stages": 2, '
     '"threads": 128}}', "16", "missing keys ['split_k']"),
    ('{"16": {"kernel_type": "base", "block_M": "64", "block_N": 64, "block_K": 128, "num_stages": 2, '
     '"threads": 128}}', "16", "block_M must be an integer"),
    ('{"16": {"kernel_type": "base", "block_M": 64, "block_N": 64, "block_K": 128, "num_stages": 2, '
     '"threads": 128, "a_scale_shm": 1}}', "16", "a_scale_shm must be true or false"),
    ('{"16": {"kernel_type": "base", "block_M": 64, "block_N": 64, "block_K": 128, "num_stages": 2, '
     '"threads": 128, "tile": 3}}', "16", "unknown keys ['tile']"),
    ('{"16": {}, "16": {}}', "16", "written twice"),
    # issue 47: what json or int() cannot take named no file and raised on every call of its (N, K)
    ('{"16": ' + "[" * 100_000 + "]" * 100_000 + "}", None, "nested too deeply"),
    ('{"16": {"kernel_type": "base", "block_M": ' + "6" * 5000 + "}}", None, "integer string conversion"),
    ('{"' + "1" * 30 + '": {}}', "1" * 30, "more than 18 digits"),
]


@pytest.mark.parametrize("text,key,why", MALFORMED)
def test_malformed_file_is_skipped_with_one_warning(sglang_env, tmp_path, caplog, text, key, why):
    mp, _, disp = sglang_env
    folder = tmp_path / "sg"
    folder.mkdir()
    path = folder / H20_NAME
    path.write_text(text)
    with pytest.raises(JSONConfigError, match=re.escape(why)) as err:  # strict: the tuner and tests
        sglang_tilelang.read_file(path)
    assert str(path) in str(err.value) and (key is None or f"key {key!r}" in str(err.value))
    # the runtime: a warning naming file and key, the file skipped; the next folder's file serves
    mp.setenv("AITER_GEMM_SGLANG_TILELANG_DIR", f"{folder}:{FIXTURES}")
    aiter_gemm.reload_configs()
    caplog.set_level(logging.WARNING)
    assert disp.decide(_problem(16), True).source == f"{H20}#16"
    assert disp.decide(_problem(64), True).source == f"{H20}#64"
    warned = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert len(warned) == 1 and why in warned[0] and (key is None or repr(key) in warned[0])


def test_folder_setting_expands_home_and_warns_about_non_folders(clean_runtime, tmp_path, caplog):
    mp = clean_runtime
    mp.setenv("HOME", str(tmp_path))
    (tmp_path / "sg").mkdir()
    (tmp_path / "afile").write_text("")
    mp.setenv("AITER_GEMM_SGLANG_TILELANG_DIR", f"~/sg::{tmp_path / 'afile'}:{tmp_path / 'gone'}")
    caplog.set_level(logging.WARNING)
    aiter_gemm.reload_configs()
    settings = aiter_gemm.get_dispatcher("gemm_a8w8_blockscale").settings
    assert settings.sglang_tilelang_dirs == (str(tmp_path / "sg"), str(tmp_path / "afile"), str(tmp_path / "gone"))
    assert caplog.text.count("AITER_GEMM_SGLANG_TILELANG_DIR entry") == 2 and "not found" in caplog.text


def test_warm_up_reports_entries_that_cannot_run(sglang_env, tmp_path):
    """An SGLang entry these kernels cannot run is a failed warm-up job (named, with why), not a crash."""
    mp, _, disp = sglang_env
    folder = tmp_path / "sg"
    folder.mkdir()
    bad = {**H20_RAW["16"], "swizzle": 2**31}
    (folder / H20_NAME).write_text(json.dumps({"16": bad, "64": H20_RAW["64"]}))
    mp.setenv("AITER_GEMM_SGLANG_TILELANG_DIR", str(folder))
    aiter_gemm.reload_configs()
    built: list = []
    mp.setattr(tl, "precompile", lambda jobs, workers=None: built.extend(jobs) or {})
    failed = disp.warm_up(True)["failed"]
    assert [why for name, why in failed.items() if "_SW2147483648" in name] == [
        f"TileLang config {sglang_tilelang.entry_solution(bad).kernelName}: swizzle=2147483648 must be in 0..1024"]
    assert _cfg("64") in {cfg for _, _, cfg, _ in built}


def test_warm_up_compiles_this_devices_sglang_entries(sglang_env, tmp_path):
    mp, _, disp = sglang_env
    other = tmp_path / "sg"
    shutil.copytree(FIXTURES, other)
    (other / H20_NAME.replace("H20", "H100")).write_text(H20.read_text())  # another device's: not compiled
    mp.setenv("AITER_GEMM_SGLANG_TILELANG_DIR", str(other))
    aiter_gemm.reload_configs()
    jobs: list = []
    backend = disp.backend("tilelang")
    mp.setattr(type(backend), "precompile", lambda self, todo: jobs.extend(todo) or {})
    disp.warm_up(True)
    ours = [(p, s) for p, s in jobs if (p.N, p.K) == (4096, 4096)]  # the rest: the shipped table's TileLang rows
    assert {s.kernelName for _, s in ours} == {TileLangConfig.from_json(v).name for v in H20_RAW.values()}
    assert len(ours) == len(H20_RAW)


# ------------------------------------------------------------------------------------------------ writing


def test_entry_round_trip_keeps_sglangs_keys():
    for raw in H20_RAW.values():
        cfg = TileLangConfig.from_json(raw)
        out = sglang_tilelang.sglang_entry(cfg, raw["latency_ms"], raw["tflops"])
        assert out == raw or out == {**raw, "c_scale_local": cfg.c_scale_local}
        assert sglang_tilelang.entry_solution(out) == Solution("tilelang", -1, cfg.split_k if cfg.split_k > 1
                                                               else 0, cfg.name)


def test_merge_file_keeps_other_keys_and_refuses_a_file_it_cannot_read(tmp_path):
    shutil.copy(H20, tmp_path / H20_NAME)
    new = TileLangConfig("swapAB", 64, 16, num_stages=8)
    path = sglang_tilelang.merge_file(tmp_path, "NVIDIA_H20", 4096, 4096,
                                      {16: sglang_tilelang.sglang_entry(new, 0.005, 100.0),
                                       5: sglang_tilelang.sglang_entry(new, 0.004, 40.0)})
    data = json.loads(path.read_text())
    assert list(data) == sorted(data, key=int) and set(data) == set(H20_RAW) | {"5"}
    assert {k: v for k, v in data.items() if k not in ("5", "16")} == {k: v for k, v in H20_RAW.items()
                                                                     if k != "16"}
    assert TileLangConfig.from_json(data["16"]) == new and data["16"]["latency_ms"] == 0.005
    path.write_text('{"16": {"kernel_type": "base"}}')
    with pytest.raises(JSONConfigError, match="missing keys"):
        sglang_tilelang.merge_file(tmp_path, "NVIDIA_H20", 4096, 4096, {32: data["16"]})
    assert path.read_text() == '{"16": {"kernel_type": "base"}}'  # left as the user wrote it


def _candidate(cfg, us: float, phase: str = "full", ok: bool = True):
    from gradlib.records import Candidate, ItemResult

    sol = cfg if isinstance(cfg, Solution) else (
        tilelang_backend.solution_of(cfg) if isinstance(cfg, TileLangConfig) else triton_backend.solution_of(cfg))
    return Candidate(sol, phase, ItemResult(0, 0, ok, us if ok else float("inf"), 0.0), True)


def _outcome(M: int, winner, candidates, N: int = 4096, K: int = 4096):
    from gradlib.records import ShapeOutcome

    return ShapeOutcome(M, _problem(M, N, K), winner, None, candidates, [], 1.0)


def test_tuner_writes_sglang_files_that_the_runtime_reads_back(sglang_env, tmp_path):
    """A fake tuning outcome through the tuner's sidecar: per M the fastest TileLang config (the winner when it is
    one; else the fastest correct TileLang candidate, here where Triton won), latency_ms and tflops from its time,
    merged into an existing file whose other keys stay; then the runtime serves those M from it."""
    from gradlib.blockscale import JsonSidecar

    mp, _, disp = sglang_env
    out_dir = tmp_path / "sglang_out"
    out_dir.mkdir()
    theirs = sglang_tilelang.file_name(4096, 4096, H100.device_name)
    (out_dir / theirs).write_text(json.dumps({"16": H20_RAW["16"], "2048": H20_RAW["2048"]}, indent=4))
    fast, slow = TileLangConfig("splitK_swapAB", 64, 16, num_stages=4, split_k=4), TileLangConfig("swapAB", 64, 16)
    big = TileLangConfig("base", 128, 128, num_stages=4, threads=256, swizzle=8)
    trit = BlockscaleConfig("swapAB", 16, 128, 128, 1, 1, 4, 3)
    problems = [_problem(16), _problem(64), _problem(128, 1024, 512)]
    side = JsonSidecar(H100, tmp_path / "tuned.csv", problems, tmp_path / "json", sglang_dir=out_dir)
    side.add(_outcome(16, _candidate(trit, 5.0), [_candidate(slow, 10.0), _candidate(fast, 8.0),
                                                  _candidate(trit, 5.0), _candidate(big, 1.0, ok=False)]))
    side.add(_outcome(64, _candidate(big, 20.0, "confirm"), [_candidate(big, 19.0), _candidate(slow, 30.0)]))
    side.add(_outcome(128, _candidate(trit, 3.0), [_candidate(trit, 3.0)], 1024, 512))  # no TileLang: no file
    side.flush()
    assert side.sglang_written == [out_dir / theirs] and sorted(p.name for p in out_dir.iterdir()) == [theirs]
    data = json.loads((out_dir / theirs).read_text())
    assert list(data) == ["16", "64", "2048"] and data["2048"] == H20_RAW["2048"]
    assert data["16"]["latency_ms"] == pytest.approx(0.008)
    assert data["16"]["tflops"] == pytest.approx(2 * 16 * 4096 * 4096 / 8e-6 / 1e12)
    assert data["64"]["latency_ms"] == pytest.approx(0.020) and data["64"]["swizzle"] == 8
    assert "SGLang file(s)" in side.summary()
    mp.setenv("AITER_GEMM_SGLANG_TILELANG_DIR", str(out_dir))
    mp.delenv("AITER_GEMM_DEVICE_NAME")  # the probed H100's own name: the file the tuner named after it
    aiter_gemm.reload_configs()
    got = {M: disp.decide(_problem(M), True) for M in (16, 40, 41, 64, 1056, 1057, 4096)}
    assert {M: d.solution.kernelName for M, d in got.items()} == {
        16: fast.name, 40: fast.name, 41: big.name, 64: big.name, 1056: big.name, 1057: _cfg("2048").name,
        4096: _cfg("2048").name}
    assert {d.matched for d in got.values()} == {"json"}


def test_sglang_files_get_only_what_sglang_runs(sglang_env, tmp_path):
    """Where this project's own TileLang kernels win (``ws``, ``ws_swapAB``, stages of several scale groups), SGLang's
    file gets the fastest config of SGLang's four types with one scale group a stage: what SGLang's kernels can run."""
    from gradlib.blockscale import JsonSidecar, best_tilelang

    ws = TileLangConfig("ws", 128, 64, num_stages=4, threads=384)
    wide = TileLangConfig("swapAB", 64, 16, 512, num_stages=3)
    ksplit = TileLangConfig("ws_swapAB", 64, 16, 256, num_stages=6, threads=384)
    plain = TileLangConfig("swapAB", 64, 16)
    assert not ws.runs_in_sglang and not wide.runs_in_sglang and not ksplit.runs_in_sglang and plain.runs_in_sglang
    cands = [_candidate(wide, 7.0), _candidate(plain, 9.0), _candidate(ws, 6.0), _candidate(ksplit, 5.0)]
    assert best_tilelang(_outcome(16, _candidate(wide, 7.0, "confirm"), cands)).solution.kernelName == plain.name
    assert best_tilelang(_outcome(16, _candidate(ksplit, 5.0, "confirm"), cands)).solution.kernelName == plain.name
    assert best_tilelang(_outcome(16, _candidate(ws, 6.0, "confirm"), cands[::2])) is None
    out_dir = tmp_path / "sg"
    out_dir.mkdir()
    side = JsonSidecar(H100, tmp_path / "tuned.csv", [_problem(16)], tmp_path / "json", sglang_dir=out_dir)
    side.add(_outcome(16, _candidate(wide, 7.0, "confirm"), cands))
    side.flush()
    data = json.loads((out_dir / sglang_tilelang.file_name(4096, 4096, H100.device_name)).read_text())
    assert data["16"]["block_K"] == 128 and data["16"]["latency_ms"] == pytest.approx(0.009)


def test_tuner_leaves_an_sglang_file_it_cannot_read(sglang_env, tmp_path, caplog):
    from gradlib.blockscale import JsonSidecar

    out_dir = tmp_path / "sglang_out"
    out_dir.mkdir()
    path = out_dir / sglang_tilelang.file_name(4096, 4096, H100.device_name)
    path.write_text('{"16": {"kernel_type": "base", "block_M": 64}}')
    side = JsonSidecar(H100, tmp_path / "tuned.csv", [_problem(16)], tmp_path / "json", sglang_dir=out_dir)
    side.add(_outcome(16, None, [_candidate(TileLangConfig("swapAB", 64, 16), 9.0)]))
    side.flush()
    assert path.read_text() == '{"16": {"kernel_type": "base", "block_M": 64}}' and side.sglang_written == []
    assert "missing keys" in caplog.text and str(path) in caplog.text


@pytest.mark.parametrize("extra,why", [
    ([], "tilelang is not timed here"),
    (["--libtype", "triton"], "tilelang is not timed here"),
])
def test_tuner_cli_refuses_sglang_dir_without_tilelang(cpu_tuner_workers, tmp_path, capsys, extra, why):
    from gradlib import tune_a8w8_blockscale

    rc = tune_a8w8_blockscale.main(["--nk", "256,256", "--m", "16", "-o", str(tmp_path / "t.csv"),
                                    "--sglang_dir", str(tmp_path / "sg"), *extra])
    err = capsys.readouterr().err
    assert rc == 2 and "--sglang_dir" in err and why in err
