"""``--bench roofline`` on CPU (a timer that returns set times: nothing here depends on how fast anything runs), the
way from its rows to a ``gradlib.results.ROOFLINES`` entry, and the one lookup of both ceilings and the FP8 peak."""

from __future__ import annotations

import csv
import json
import logging

import pytest

from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.device import DeviceIdentity
from benchmarks import roofline
from benchmarks.measure import roofline_us
from benchmarks.providers import A16W16, BLOCKSCALE
from benchmarks.run import main
from gradlib import results
from gradlib.results import Roofline, fp8_peak_for, roofline_for

H100 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H100 80GB HBM3")
H200 = DeviceIdentity("sm_90", 132, "cuda", "NVIDIA H200")
BASE_US = {"mm": 20.0, "flinear": 16.0, "copy": 4.0}


class FakeTimer:
    """Per call name a base time, rounds at 1.0 / 1.1 / 0.9 of it (median: the base); records what it timed."""

    def __init__(self) -> None:
        self.seen = []

    def paired(self, calls, n_sets, mode):
        self.seen.append((mode, tuple(calls), n_sets))
        return {k: [BASE_US[k] * f for f in (1.0, 1.1, 0.9)] for k in calls}


def _run(tmp_path, *extra, timer=None):
    return main(["--bench", "roofline", "--device", "cpu", "--out", str(tmp_path), *extra], timer)


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("argv, says", [
    ([], "times on a GPU only"),
    (["--set", "shipped"], "--bench roofline has the sets peak, tiny"),
    (["--set", "tiny", "--timing", "host"], "--bench roofline times GPU work only"),
])
def test_roofline_arguments_refused_before_anything_runs(tmp_path, capsys, argv, says):
    """On CPU the peak set is refused (a GPU's ceilings are timed on that GPU), as are a set it lacks and host
    timing: exit 2 naming the problem, nothing written."""
    with pytest.raises(SystemExit) as exc:
        _run(tmp_path / "out", *argv, timer=FakeTimer() if "host" in argv else None)
    assert exc.value.code == 2 and says in capsys.readouterr().err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_roofline_rows_from_a_fake_timer(tmp_path, caplog):
    """Per matmul shape and provider its TFLOP/s, per copy size its GB/s counted read + written, from the median
    round; the env beside the CSV; one summary line naming both maxima and the ROOFLINES entry they give."""
    timer = FakeTimer()
    with caplog.at_level(logging.INFO, logger="benchmarks"):
        assert _run(tmp_path, "--set", "tiny", "--timing", "graph", "--name", "roof", timer=timer) == 0
    rows = _rows(tmp_path / "roof_cpu.csv")
    env = json.loads((tmp_path / "roof_cpu_env.json").read_text())
    assert env["bench"] == "roofline" and env["modes"] == ["graph"]
    shapes, sizes = roofline.SETS["tiny"]
    assert [(m, names) for m, names, _ in timer.seen] == (
        [("graph", ("mm", "flinear"))] * len(shapes) + [("graph", ("copy",))] * len(sizes))
    mm = [r for r in rows if r["set"] == "tiny:matmul"]
    assert [(int(r["M"]), int(r["N"]), int(r["K"]), r["provider"]) for r in mm] == [
        (*s, p) for s in shapes for p in roofline.MATMUL_PROVIDERS]
    for r in mm:
        flops = GemmProblem(int(r["M"]), int(r["N"]), int(r["K"])).flops
        assert float(r["us"]) == BASE_US[r["provider"]] and r["rounds"] == "3"
        assert float(r["tflops"]) == pytest.approx(flops / BASE_US[r["provider"]] / 1e6, abs=1e-3)
    cp = [r for r in rows if r["set"] == "tiny:copy"]
    assert [r["label"] for r in cp] == [f"{s} MiB" for s in sizes]
    for r, mib in zip(cp, sizes):
        assert float(r["gbps"]) == pytest.approx(2 * mib * roofline.MIB / BASE_US["copy"] / 1e3, abs=0.1)
        assert "read + written" in r["note"]
    best_mm = max(float(r["tflops"]) for r in mm)
    line = [m for m in caplog.messages if m.startswith("roofline ")]
    assert len(line) == 1 and f"bf16 matmul max {best_mm:.1f} TFLOP/s" in line[0]
    assert f"copy max {float(cp[-1]['gbps']):.1f} GB/s" in line[0] and "roof_cpu.csv" in line[0]


def test_eager_smoke_rows_give_no_entry(tmp_path, caplog):
    """A CPU smoke run times eagerly: its rows are written, and the summary says they give no ROOFLINES entry."""
    with caplog.at_level(logging.INFO, logger="benchmarks"):
        assert _run(tmp_path, "--set", "tiny", timer=FakeTimer()) == 0
    assert {r["mode"] for r in _rows(tmp_path / "roofline_cpu.csv")} == {"eager"}
    assert any("no ROOFLINES entry" in m for m in caplog.messages)


def test_the_logged_entry_is_what_the_table_looks_up(monkeypatch):
    """The entry a run gives, added to ROOFLINES, is found for its device (and only it): the bf16 roofline from its
    maxima, and the block-scale op's from the FP8 peak with its bandwidth."""
    timer = FakeTimer()
    rows = [roofline.matmul_row("peak", GemmProblem(8192, 8192, 8192), p, "graph", [BASE_US[p]] * 3)
            for p in roofline.MATMUL_PROVIDERS]
    rows += [roofline.copy_row("peak", mib * roofline.MIB, "graph", timer.paired({"copy": None}, 1, "graph")["copy"])
             for mib in (256, 1024)]
    rows.append({**rows[0], "mode": "eager", "tflops": "99999.0"})  # eager rows never set a ceiling
    text = roofline.entry_text(rows, H200, "benchmarks/results/roofline/h200_abc1234/roofline_H200.csv")
    entry = eval(text, {"Roofline": Roofline})[0]
    assert entry[:3] == ("sm_90", 132, "H200")
    others = tuple(e for e in results.ROOFLINES if e[2] != "H200")
    monkeypatch.setattr(results, "ROOFLINES", (*others, entry))
    roof = roofline_for(H200)
    assert roof is entry[3] and roofline_for(H100) is results.ROOFLINES[0][3]
    assert roof.flops == pytest.approx(2 * 8192 ** 3 / BASE_US["flinear"] * 1e6, rel=2e-3)
    assert roof.bytes == pytest.approx(2 * 1024 * roofline.MIB / BASE_US["copy"] * 1e6, rel=5e-3)
    assert "h200_abc1234/roofline_H200.csv" in roof.source
    p = GemmProblem(1, 8192, 8192)
    assert roofline_us(A16W16, p, H200) == pytest.approx(p.min_bytes() / roof.bytes * 1e6)
    assert roofline_us(BLOCKSCALE, GemmProblem(8192, 8192, 8192), H200) == pytest.approx(
        2 * 8192 ** 3 / results.HOPPER_SXM_FP8 * 1e6)


@pytest.mark.parametrize("ident, peak", [(H100, 1979e12), (H200, 1979e12),
                                         (DeviceIdentity("sm_90", 114, "cuda", "NVIDIA H100 PCIe"), None),
                                         (DeviceIdentity("sm_89", 142, "cuda", "NVIDIA L40S"), None)])
def test_fp8_peak_found_by_the_roofline_match(ident, peak):
    """The datasheet FP8 peak is looked up as ROOFLINES are, (gfx, cu_num, name substring): the H100 and H200 SXM
    have it, other devices none."""
    assert fp8_peak_for(ident) == peak


def test_each_measured_entry_is_its_raw_files_maxima():
    """Every ROOFLINES entry that names a raw file under benchmarks/results/ holds that file's graph maxima, as
    entry_text rounds them (no typed number)."""
    import csv
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    checked = 0
    for gfx, cu, name, roof in results.ROOFLINES:
        path = next((w for w in roof.source.split() if w.startswith("benchmarks/results/")), None)
        if path is None:
            continue
        rows = list(csv.DictReader((repo / path).open()))
        ident = DeviceIdentity(gfx, cu, "cuda", f"NVIDIA {name}")
        assert eval(roofline.entry_text(rows, ident, path), {"Roofline": Roofline})[0] == (gfx, cu, name, roof)
        checked += 1
    assert checked
