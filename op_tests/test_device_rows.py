"""Device-exact rows (issue 35): the optional ``device_name`` key column. A row naming a device serves only that
device and wins over a row naming none; files without the column (AITER's) load and match as before; the tuner
writes the column and never replaces another device's row."""

from __future__ import annotations

import pytest
import torch

import aiter_gemm
from aiter_gemm.configs import BF16_TUNED_COLUMNS, device_key, load_table
from aiter_gemm.device import DeviceIdentity
from gradlib.results import CheckpointWriter, row_key

H100, H200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
KEY = (64, 128, 256, False, torch.bfloat16, torch.bfloat16, False, False)
HEADER = "gfx,cu_num,M,N,K,bias,dtype,outdtype,scaleAB,bpreshuffle,libtype,solidx,splitK,us,kernelName"


def _csv(tmp_path, rows: list[tuple[str, str, float]], name: str = "t.csv", device_column: bool = True):
    """A GEMM_BF16 file of (device_name, kernelName, us) rows for sm_90/132, M=64 N=128 K=256."""
    path = tmp_path / name
    lines = [HEADER + (",device_name" if device_column else "")]
    for dev, kernel, us in rows:
        cells = f"sm_90,132,64,128,256,False,bf16,bf16,False,False,torch,0,0,{us},{kernel}"
        lines.append(cells + (f",{dev}" if device_column else ""))
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize(("text", "expected"), [
    (H100, "NVIDIA_H100_80GB_HBM3"), ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H100_80GB_HBM3"),
    ("  NVIDIA   H200 ", "NVIDIA_H200"), ("", None), (None, None), ("   ", None),
])
def test_device_key_normalises_spaces(text, expected):
    assert device_key(text) == expected
    if expected is not None:
        assert DeviceIdentity("sm_90", 132, "cuda", text).device_name == expected


@pytest.mark.parametrize("generic_first", [True, False])
@pytest.mark.parametrize("generic_us", [0.5, 5.0])  # a faster generic row still loses to the device's own
def test_device_row_serves_only_its_device_and_wins(tmp_path, generic_first, generic_us):
    rows = [("", "generic", generic_us), (H100, "h100", 1.0)]
    table = load_table("GEMM_BF16", [_csv(tmp_path, rows if generic_first else rows[::-1])])
    assert len(table) == 2  # two keys: one per device name (none is one)
    assert table.lookup("sm_90", 132, KEY, "NVIDIA_H100_80GB_HBM3").values["kernelName"] == "h100"
    assert table.lookup("sm_90", 132, KEY, H100).values["kernelName"] == "h100"
    assert table.lookup("sm_90", 132, KEY, H200).values["kernelName"] == "generic"
    assert table.lookup("sm_90", 132, KEY).values["kernelName"] == "generic"
    assert table.lookup("sm_90", 114, KEY, H100) is None  # cu_num still keys the row


def test_device_only_row_is_a_miss_elsewhere(tmp_path):
    table = load_table("GEMM_BF16", [_csv(tmp_path, [(H100, "h100", 1.0)])])
    row = next(iter(table))
    assert row.device_name == "NVIDIA_H100_80GB_HBM3" and row.fields["device_name"] == H100
    assert table.lookup("sm_90", 132, KEY, H200) is None and table.lookup("sm_90", 132, KEY) is None
    assert row.serves("sm_90", 132, H100) and not row.serves("sm_90", 132, H200)


def test_file_without_the_column_loads_as_before(tmp_path):
    table = load_table("GEMM_BF16", [_csv(tmp_path, [("", "aiter", 1.0)], device_column=False)])
    row = next(iter(table))
    assert row.device_name is None and "device_name" not in row.fields
    for name in (H100, H200, None):
        assert table.lookup("sm_90", 132, KEY, name) is row


def test_duplicate_rows_merge_per_device(tmp_path):
    a = _csv(tmp_path, [(H100, "slow", 2.0), ("", "g1", 3.0)], "a.csv")
    b = _csv(tmp_path, [("NVIDIA_H100_80GB_HBM3", "fast", 1.0), ("", "g2", 1.0)], "b.csv")
    table = load_table("GEMM_BF16", [a, b])
    assert table.lookup("sm_90", 132, KEY, H100).values["kernelName"] == "fast"
    assert table.lookup("sm_90", 132, KEY, H200).values["kernelName"] == "g2"


@pytest.mark.parametrize(("device", "expected"), [(H100, "h100"), (H200, "generic"), ("", "generic")])
def test_dispatch_uses_the_device_name_override(tmp_path, clean_runtime, device, expected):
    """AITER_GEMM_DEVICE_NAME (with the arch and CU overrides) picks the device's row in a decision."""
    ident = aiter_gemm.current_device_identity()
    path = tmp_path / "t.csv"
    path.write_text(
        HEADER + ",device_name\n"
        f"{ident.gfx},{ident.cu_num},8,16,32,False,torch.float32,torch.float32,False,False,torch,0,0,1.0,generic,\n"
        f"{ident.gfx},{ident.cu_num},8,16,32,False,torch.float32,torch.float32,False,False,torch,0,0,2.0,h100,{H100}\n")
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    if device:
        clean_runtime.setenv("AITER_GEMM_DEVICE_NAME", device)
    aiter_gemm.reload_configs()
    cfg = aiter_gemm.get_GEMM_A16W16_config(8, 16, 32, False, torch.float32)
    assert (cfg["kernelName"], cfg["matched"]) == (expected, "exact")


def test_a_device_row_that_cannot_run_here_gives_way_to_the_class_row(tmp_path, clean_runtime):
    """A device-exact row whose backend is missing here (an H200 TileLang row without TileLang; here an AMD ``asm``
    row) is a miss of that row only: the class row of the same key serves, matched exact (it fell to the default)."""
    ident = aiter_gemm.current_device_identity()
    path = tmp_path / "t.csv"
    path.write_text(
        HEADER + ",device_name\n"
        f"{ident.gfx},{ident.cu_num},8,16,32,False,torch.float32,torch.float32,False,False,torch,0,0,2.0,generic,\n"
        f"{ident.gfx},{ident.cu_num},8,16,32,False,torch.float32,torch.float32,False,False,asm,0,0,1.0,mine,{H200}\n")
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    clean_runtime.setenv("AITER_GEMM_DEVICE_NAME", H200)
    aiter_gemm.reload_configs()
    cfg = aiter_gemm.get_GEMM_A16W16_config(8, 16, 32, False, torch.float32)
    assert (cfg["kernelName"], cfg["matched"], cfg["libtype"]) == ("generic", "exact", "torch")


def _outcome_row(ident: DeviceIdentity, kernel: str) -> dict[str, str]:
    return {"gfx": ident.gfx, "cu_num": str(ident.cu_num), "M": "64", "N": "128", "K": "256", "bias": "False",
            "dtype": "torch.bfloat16", "outdtype": "torch.bfloat16", "scaleAB": "False", "bpreshuffle": "False",
            "libtype": "torch", "solidx": "0", "splitK": "0", "us": "1.0", "kernelName": kernel,
            "device_name": ident.device_name}


def test_tuner_keeps_other_devices_rows_and_writes_its_own(tmp_path):
    """The checkpoint writer keys rows by device: another device's row stays; a row naming no device is this
    device's for the replace rule (kept unless stale or --all)."""
    h100, h200 = DeviceIdentity("sm_90", 132, "cuda", H100), DeviceIdentity("sm_90", 132, "cuda", H200)
    path = _csv(tmp_path, [(H100, "h100", 1.0)])
    writer = CheckpointWriter(path, h200, 1, replace_existing=True)
    writer.tuned.rows.append(_outcome_row(h200, "h200"))
    assert writer.tuned.write() == (1, 0)
    table = load_table("GEMM_BF16", [path])
    assert {r.values["kernelName"]: r.device_name for r in table} == {"h100": "NVIDIA_H100_80GB_HBM3",
                                                                      "h200": "NVIDIA_H200"}
    key = row_key("gemm_a16w16", device_name=h100.device_name)
    generic = dict(_outcome_row(h100, "g"), device_name="")
    assert key(generic) == key(_outcome_row(h100, "x")) != key(_outcome_row(h200, "x"))
    assert "device_name" in BF16_TUNED_COLUMNS


def test_resume_with_keep_class_rows_counts_only_this_devices_rows(tmp_path):
    """``--keep_class_rows`` (``exact_only``): a class row no longer marks its shape done for a named device, so the
    shape is tuned for it; an unnamed device's own rows are class rows, so for it they still count."""
    from gradlib.results import tuned_keys

    path = _csv(tmp_path, [("", "g", 1.0)])
    named, unnamed = DeviceIdentity("sm_90", 132, "cuda", H200), DeviceIdentity("sm_90", 132, "cuda", "")
    assert tuned_keys(path, named, "gemm_a16w16") == {KEY}
    assert tuned_keys(path, named, "gemm_a16w16", exact_only=True) == set()
    assert tuned_keys(path, unnamed, "gemm_a16w16", exact_only=True) == {KEY}


@pytest.mark.parametrize("generic_first", [True, False])
def test_the_tuner_reads_a_devices_own_row_before_the_class_row(tmp_path, generic_first):
    """What serves a device, for ``--compare``'s incumbent, ``--candidates_from`` and ``--recheck``: its own row
    where the file has one, wherever the rows stand in the file; the class row for the other devices."""
    from gradlib.results import device_rows, row_solutions

    rows = [("", "generic", 1.0), (H200, "h200", 1.0)]
    path = _csv(tmp_path, rows if generic_first else rows[::-1])
    h100, h200 = DeviceIdentity("sm_90", 132, "cuda", H100), DeviceIdentity("sm_90", 132, "cuda", H200)
    assert [r.values["kernelName"] for r in device_rows(path, h200, "gemm_a16w16")] == ["h200"]
    assert [r.values["kernelName"] for r in device_rows(path, h100, "gemm_a16w16")] == ["generic"]
    assert row_solutions(path, h200, "gemm_a16w16")[KEY].kernelName == "h200"
