"""Big config files (issue 47, item 8). A tuned CSV is checked whole at load (a bad row anywhere makes the file
unusable, as before) but its rows are built only when a lookup or an iteration first returns them; every merge rule
holds on tables of thousands of generated rows. An SGLang TileLang file of thousands of M keys checks each distinct
entry once, with the strict reader's errors."""

from __future__ import annotations

import json
import logging
import math
import random
import re

import pytest
import torch

from aiter_gemm import configs, sglang_tilelang
from aiter_gemm.configs import BF16_TUNED_COLUMNS, ConfigError, device_key, load_table
from aiter_gemm.jsonconfigs import JSONConfigError, select_bucket
from op_tests.test_sglang_tilelang import H20_NAME, H20_RAW, sglang_pick

H100 = "NVIDIA H100 80GB HBM3"
BOOLS = {True: ("True", "1", "true"), False: ("False", "0", "false")}
DTYPES = {torch.bfloat16: ("torch.bfloat16", "bf16", " bfloat16 "), torch.float32: ("torch.float32", "fp32"),
          torch.float16: ("torch.float16", "half")}
#: us cells: mostly timed (few distinct values, so ties happen), some hand-set (0), some unusable (dropped).
TIMES = ["1", "2", "3", "5.5", "8", "13", "0", "0.0", "-1", "", "nan", "inf"]


def _cell(text: str) -> str:
    return f'"{text}"' if any(c in text for c in ',"\n') else text


class _Gen:
    """Writes GEMM_BF16 files of generated rows and keeps what the merge rules (docs/configs.md) make of them."""

    def __init__(self, seed: int) -> None:
        self.rnd = random.Random(seed)
        self.best: dict[tuple, tuple[float, str, int, str]] = {}  # merge key -> (rank, path, line, kernelName)
        self.dropped: dict[str, int] = {}

    def write(self, path, n: int, gfx_column: bool = True, device_column: bool = True) -> str:
        rnd = self.rnd
        columns = [c for c in BF16_TUNED_COLUMNS if (gfx_column or c != "gfx")
                   and (device_column or c != "device_name")]
        text, line = [",".join(columns) + "\n"], 1
        for i in range(n):
            if rnd.random() < 0.02:  # blank lines count as lines, make no row
                text.append("\n" if rnd.random() < 0.5 else ",,,\n")
                line += 1
            M, N, K = rnd.randint(1, 300), rnd.choice([96, 128, 4096]), rnd.choice([80, 256])
            bias, dtype = rnd.choice([True, False]), rnd.choice(list(DTYPES))
            out = rnd.choice([dtype, torch.float32])
            gfx = rnd.choice(["gfx942", "sm_90"]) if gfx_column else None
            cu = 304 if gfx_column else rnd.choice([304, 80])
            dev = rnd.choice(["", "", "", H100, "NVIDIA_H100_80GB_HBM3"]) if device_column else ""
            us = rnd.choice(TIMES)
            kernel = f"k{i}" + ("\nsecond line" if i % 500 == 7 else "")  # a quoted field spanning two lines
            cells = {"gfx": gfx, "cu_num": str(cu), "M": rnd.choice([str(M), f" {M} "]), "N": str(N), "K": str(K),
                     "bias": rnd.choice(BOOLS[bias]), "dtype": rnd.choice(DTYPES[dtype]),
                     "outdtype": rnd.choice(DTYPES[out]), "scaleAB": "False", "bpreshuffle": rnd.choice(BOOLS[False]),
                     "libtype": rnd.choice(["torch", "hipblaslt", "asm"]), "solidx": str(rnd.randint(-1, 40)),
                     "splitK": rnd.choice(["", "0", "3"]), "us": us, "kernelName": kernel,
                     "err_ratio": "0.0", "tflops": f"{rnd.random():.2f}", "bw": "",
                     "pad_m_min": rnd.choice(["", str(rnd.randint(1, M))]),
                     "timing": rnd.choice(["", "graph", "eager"]), "device_name": dev}
            text.append(",".join(_cell(cells[c]) for c in columns) + "\n")
            line += 1 + kernel.count("\n")
            t = float(us) if us else math.nan
            if math.isnan(t) or math.isinf(t) or t < 0:
                self.dropped[str(path)] = self.dropped.get(str(path), 0) + 1
                continue
            rank = math.inf if t == 0 else t
            mk = (gfx, cu, device_key(dev), (M, N, K, bias, dtype, out, False, False))
            if mk not in self.best or rank < self.best[mk][0]:  # a tie keeps the earlier row
                self.best[mk] = (rank, str(path), line, kernel)
        path.write_text("".join(text))
        return str(path)


@pytest.fixture
def built(monkeypatch):
    """The lines of the TunedRows built, in order."""
    lines: list[int] = []

    class Counted(configs.TunedRow):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            lines.append(self.line)

    monkeypatch.setattr(configs, "TunedRow", Counted)
    return lines


def test_rows_are_built_when_looked_up_not_at_load(tmp_path, built):
    gen = _Gen(1)
    path = gen.write(tmp_path / "t.csv", 300)
    table = load_table("GEMM_BF16", [path])
    assert built == [] and len(table) == len(gen.best)
    (gfx, cu, dev, key), (_, _, line, _) = next(iter(gen.best.items()))
    row = table.lookup(gfx, cu, key, dev)
    assert built == [line] and row.line == line
    assert table.lookup(gfx, cu, key, dev) is row and built == [line]  # kept once built
    assert sorted(r.line for r in table) == sorted(b[2] for b in gen.best.values())
    assert sorted(built) == sorted(b[2] for b in gen.best.values())  # each row built once


def test_every_merge_rule_holds_on_big_tables(tmp_path, built, caplog):
    """Three files (one without gfx, one without device_name): duplicates within and across files (lowest positive
    us wins, ties to the earlier file or line), us = 0 rows lose to timed ones, unusable times dropped with a warning
    per file, device-named rows beside generic ones, quoted cells spanning lines, blank lines."""
    gen = _Gen(2)
    paths = [gen.write(tmp_path / "a.csv", 3000), gen.write(tmp_path / "b.csv", 3000, device_column=False),
             gen.write(tmp_path / "c.csv", 2000, gfx_column=False)]
    with caplog.at_level(logging.WARNING):
        table = load_table("GEMM_BF16", paths)
    assert built == [] and len(table) == len(gen.best)
    for path in paths:
        assert f"{path}: dropped {gen.dropped[path]} row(s)" in caplog.text
    for (gfx, cu, dev, key), (rank, path, line, kernel) in gen.best.items():
        # an arch no file names finds the gfx-less rows; a device name finds its rows before the generic ones
        row = table.lookup(gfx or "gfx000", cu, key, dev)
        assert (row.source, row.line, row.values["kernelName"]) == (path, line, kernel)
        assert (row.gfx, row.cu_num, row.device_name, row.key) == (gfx, cu, dev, key)
        assert (math.inf if row.us == 0 else row.us) == rank and row.hand_set == (row.us == 0)
        assert row.typed["us"] == row.us and row.typed["M"] == key[0] and row.fields["kernelName"] == kernel
    assert len(built) == len(gen.best)
    assert {(r.source, r.line) for r in table} == {(b[1], b[2]) for b in gen.best.values()}
    assert len(built) == len(gen.best)  # iterating reuses the rows lookups built


def _big_with(tmp_path, at: int, column: str, text: str, us: str = "1") -> str:
    """A generated file whose row ``at`` has ``column`` = ``text`` (and ``us``); returns its path."""
    path = tmp_path / "big.csv"
    _Gen(3).write(path, 2000, device_column=False)
    lines = path.read_text().split("\n")
    header = lines[0].split(",")
    cells = lines[at - 1].split(",")
    assert len(cells) == len(header), "pick a line with no quoted cell"
    cells[header.index(column)] = text
    cells[header.index("us")] = us
    lines[at - 1] = ",".join(cells)
    path.write_text("\n".join(lines))
    return str(path)


@pytest.mark.parametrize("column,text,message", [
    ("M", "0", "must be a positive integer"),  # "0" is a valid solidx on earlier rows: each column parses its own
    ("bias", "", "empty value"),  # an empty key cell is an error, an empty splitK takes its default
    ("dtype", "bf17", "unknown dtype"),
    ("solidx", "zero", "bad value"),
    ("cu_num", "x", "bad value"),
    ("timing", "warm", "must be one of"),
    ("pad_m_min", "100000", "is above the row's M"),
    ("us", "fast", "not a number"),
])
def test_a_bad_cell_deep_in_a_big_file_makes_it_unusable(tmp_path, caplog, column, text, message):
    bad = _big_with(tmp_path, 1500, column, text, us=text if column == "us" else "1")
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        load_table("GEMM_BF16", [bad])
    assert (err.value.path, err.value.line, err.value.column) == (bad, 1500, column)
    good = _Gen(4).write(tmp_path / "good.csv", 50)
    with caplog.at_level(logging.WARNING):
        table = load_table("GEMM_BF16", [bad, good], strict=False)
    assert table.sources == (good,) and {r.source for r in table} == {good}
    assert f"{bad}:1500, column {column!r}" in caplog.text and "cannot be used, skipped" in caplog.text


def test_a_dropped_row_is_not_checked_past_its_time(tmp_path):
    """As before: a row with an unusable time is dropped before its value cells are read (its key cells are read)."""
    path = _big_with(tmp_path, 1500, "solidx", "zero", us="-1")
    assert all(r.line != 1500 for r in load_table("GEMM_BF16", [path]))
    with pytest.raises(ConfigError, match="column 'M'"):
        load_table("GEMM_BF16", [_big_with(tmp_path, 1500, "M", "x", us="-1")])


# ------------------------------------------------------------------------------------------------ SGLang's files


def _sglang_file(tmp_path, n: int, bad: tuple[str, object] | None = None, raw: str | None = None) -> str:
    """An SGLang file of M = 1..n, entries cycling through the H20 file's (own latencies); ``bad`` sets one key of
    the entry of M = n // 2, ``raw`` replaces that entry's JSON text."""
    rnd = random.Random(5)
    refs = list(H20_RAW.values())
    data = {}
    for m in range(1, n + 1):
        entry = dict(refs[m % len(refs)], latency_ms=rnd.uniform(0.01, 2), tflops=rnd.uniform(1, 500))
        if bad is not None and m == n // 2:
            entry[bad[0]] = bad[1]
        data[str(m)] = entry
    text = json.dumps(data, indent=4)
    if raw is not None:
        text = text.replace(f'"{n // 2}": ' + json.dumps(data[str(n // 2)], indent=4).replace("\n", "\n    "),
                            f'"{n // 2}": {raw}', 1)
        assert raw in text
    path = tmp_path / H20_NAME
    path.write_text(text)
    return str(path)


def _checked_path(monkeypatch):
    """read_file without its fast path: the strict reader entry by entry."""
    monkeypatch.setattr(sglang_tilelang, "_plainly_valid", lambda path: None)


def test_a_big_sglang_file_checks_each_distinct_entry_once(tmp_path, monkeypatch):
    path = _sglang_file(tmp_path, 3000)
    calls = []
    real = sglang_tilelang.entry_solution
    monkeypatch.setattr(sglang_tilelang, "entry_solution", lambda entry: calls.append(1) or real(entry))
    buckets = sglang_tilelang.read_file(path)
    assert 0 < len(calls) <= len({json.dumps(e, sort_keys=True) for e in H20_RAW.values()})
    keys = [str(m) for m in range(1, 3001)]
    for M in [1, 2, 3, 1499, 1500, 1501, 2999, 3000, 3001, 10**6]:
        assert select_bucket(buckets, M)[0] == sglang_pick(keys, M)
    _checked_path(monkeypatch)
    assert sglang_tilelang.read_file(path) == buckets


@pytest.mark.parametrize("bad,raw,key,why", [
    (("block_M", True), None, "1500", "block_M must be an integer, got True"),  # True == 1: told apart by type
    (("block_M", 64.0), None, "1500", "block_M must be an integer, got 64.0"),
    (("num_stages", [2]), None, "1500", "num_stages must be an integer"),
    (("a_scale_shm", 1), None, "1500", "a_scale_shm must be true or false"),
    (("latency_ms", True), None, "1500", "latency_ms must be a number"),
    (("tile", 3), None, "1500", "unknown keys ['tile']"),
    (None, '{"kernel_type": "base", "kernel_type": "base"}', "kernel_type", "written twice"),
    (("block_M", {"a": 1}), None, "1500", "block_M must be an integer, got {'a': 1}"),
    (None, "7", "1500", "must be an object"),
])
def test_one_bad_entry_in_a_big_sglang_file_is_found(tmp_path, bad, raw, key, why):
    path = _sglang_file(tmp_path, 3000, bad=bad, raw=raw)
    with pytest.raises(JSONConfigError, match=re.escape(why)) as err:
        sglang_tilelang.read_file(path)
    assert f"key {key!r}" in str(err.value) and path in str(err.value)


def test_a_repeated_m_key_in_a_big_sglang_file_is_found(tmp_path):
    path = _sglang_file(tmp_path, 3000)
    text = open(path).read()
    with open(path, "w") as f:
        f.write(text.replace('"1500": {', '"1499": {', 1))
    with pytest.raises(JSONConfigError, match="key '1499'.*written twice"):
        sglang_tilelang.read_file(path)


def test_a_big_sglang_file_with_a_colon_in_a_string_reads_as_checked(tmp_path, monkeypatch):
    """The fast path counts ``:`` to rule out repeated keys; a ``:`` inside a string sends it to the checked path."""
    path = _sglang_file(tmp_path, 500, bad=("kernel_type", "base:v2"))
    buckets = sglang_tilelang.read_file(path)
    assert dict((k, s) for _, k, s in buckets)["250"].kernelName.startswith("base:v2")
    _checked_path(monkeypatch)
    assert sglang_tilelang.read_file(path) == buckets


@pytest.mark.parametrize("enabled", [True, False])
def test_reading_an_sglang_file_leaves_the_collector_as_it_was(tmp_path, enabled):
    """The fast path pauses the cyclic collector while it builds the file's objects; it is as it was after, whether
    the file reads or raises."""
    import gc

    good = _sglang_file(tmp_path, 50)
    (tmp_path / "bad").mkdir()
    bad = _sglang_file(tmp_path / "bad", 50, bad=("block_M", True))
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        sglang_tilelang.read_file(good)
        assert gc.isenabled() == enabled
        with pytest.raises(JSONConfigError):
            sglang_tilelang.read_file(bad)
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()
