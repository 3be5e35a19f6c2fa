"""Shape capture: misses recorded once, merged with existing rows, safe across concurrent processes."""

from __future__ import annotations

import csv
import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import aiter_gemm
from aiter_gemm.configs import load_untuned
from op_tests.runtime_helpers import BF16_HEADER, bf16_row

REPO = Path(__file__).resolve().parents[1]
PREEXISTING = ("M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,note\n"
               "7,7,7,False,torch.float32,torch.float32,False,False,mine\n")


def rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_capture_records_every_shape_without_an_exact_row_once(clean_runtime, tmp_path):
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER + bf16_row(8, 96, 80))
    out = tmp_path / "untuned.csv"
    out.write_text(PREEXISTING)
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(tuned))
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(out))
    aiter_gemm.reload_configs()
    b = torch.randn(96, 80)
    for m in (8, 8, 3, 3, 5, 9, 20):  # 8: exact hit; 5 -> 8 at gl1: padded hit (recorded: AITER records every
        # call, and only a row for M=5 itself can be tuned for it); 3, 9, 20 pad to 4/16/32: misses
        aiter_gemm.gemm_a16w16(torch.randn(m, 80), b)
    assert rows(out)[0]["note"] == "mine", "nothing is written per call"
    aiter_gemm.get_dispatcher().flush_capture()
    got = rows(out)
    assert got[0] == {"M": "7", "N": "7", "K": "7", "bias": "False", "dtype": "torch.float32",
                      "outdtype": "torch.float32", "scaleAB": "False", "bpreshuffle": "False", "note": "mine"}
    assert sorted((r["M"], r["N"], r["K"]) for r in got[1:]) == [("20", "96", "80"), ("3", "96", "80"),
                                                                 ("5", "96", "80"), ("9", "96", "80")]
    keys = load_untuned(out)
    assert len(keys) == 5
    assert tuned.read_text() == BF16_HEADER + bf16_row(8, 96, 80), "tuned input file untouched"


def test_capture_never_writes_inside_package(clean_runtime):
    from aiter_gemm.settings import default_config_dir

    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(default_config_dir() / "bf16_untuned_gemm.csv"))
    with pytest.raises(ValueError, match="inside the package"):
        aiter_gemm.reload_configs()


def test_capture_flushes_on_timer(clean_runtime, tmp_path):
    import time

    out = tmp_path / "u.csv"
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(out))
    clean_runtime.setenv("AITER_TUNE_GEMM_FLUSH_S", "0.2")
    aiter_gemm.reload_configs()
    aiter_gemm.gemm_a16w16(torch.randn(3, 16), torch.randn(8, 16))
    deadline = time.time() + 10
    while not out.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert [r["M"] for r in rows(out)] == ["3"]


WORKER = textwrap.dedent("""
    import sys, torch, aiter_gemm
    rank = int(sys.argv[1])
    b = torch.randn(24, 32)
    for m in [1, 2, 100 + rank, 200 + rank, 300 + rank]:  # M=1, 2 shared by every rank
        aiter_gemm.gemm_a16w16(torch.randn(m, 32), b)
""")


def test_four_processes_share_one_file(tmp_path):
    out = tmp_path / "shared_untuned.csv"
    out.write_text(PREEXISTING)
    tuned = tmp_path / "tuned.csv"
    tuned.write_text(BF16_HEADER)
    before = hashlib.sha256(tuned.read_bytes()).hexdigest()
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("AITER_")}
    env.update(AITER_TUNE_GEMM="1", AITER_UNTUNED_GEMM_FILE=str(out), AITER_CONFIG_GEMM_BF16=str(tuned),
               PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r)], env=env, cwd=tmp_path) for r in range(4)]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    got = rows(out)
    assert got[0]["note"] == "mine"
    ms = sorted(int(r["M"]) for r in got[1:])
    assert ms == sorted([1, 2] + [base + r for base in (100, 200, 300) for r in range(4)])
    assert hashlib.sha256(tuned.read_bytes()).hexdigest() == before
    assert not list(tmp_path.glob(".shared_untuned.csv.*.tmp")), "no temp file left behind"
