"""``python -m gradlib.ship``: benchmark winners and tuner runs into the shipped tables, by the rules they were shipped
with (``--min_gain`` over F.linear, faster than the dispatch, no wrong outputs)."""

from __future__ import annotations

import csv
import json

import pytest

from aiter_gemm.configs import BF16_TUNED_COLUMNS
from aiter_gemm.fileio import read_csv_rows
from gradlib import ship

HEADER = "bench,set,label,M,N,K,bias,provider,mode,us,vs,ratio\n"


def _bench_csv(path, lines: list[str]) -> str:
    path.write_text(HEADER + "".join(line + "\n" for line in lines))
    return str(path)


def test_winner_rule():
    times = {"flinear": 10.0, "dispatch": 9.5, "skinny:gemv_A": 9.0, "skinny:gemv_B": 9.7, "cublaslt:v1:ab": 8.0,
             "triton": 7.0}
    # cuBLASLt and the unnamed backend default are not shipped by this command; 9.0 * 1.02 <= 10 and 9.0 < 9.5
    assert ship.winner(times, 1.02) == ("skinny:gemv_A", 9.0)
    assert ship.winner(times, 1.2) is None  # not 1.2x faster than F.linear
    assert ship.winner({**times, "dispatch": 8.9}, 1.02) is None  # the shipped row is faster already
    assert ship.winner({k: v for k, v in times.items() if k != "dispatch"}, 1.02) is None  # no dispatch timed


def test_medians_take_one_mode_and_unbiased_rows(tmp_path):
    path = _bench_csv(tmp_path / "b.csv", [
        "bf16,s,l,1,64,32,False,flinear,graph,10.0,,", "bf16,s,l,1,64,32,False,dispatch,graph,9.0,flinear,1.11",
        "bf16,s,l,1,64,32,False,dispatch,eager,19.0,flinear,0.9", "bf16,s,l,1,64,32,True,flinear,graph,11.0,,",
        "bf16,s,l,1,64,32,False,skinny:x,graph,,flinear,"])
    assert ship.medians(read_csv_rows(path)[1]) == {(1, 64, 32): {"flinear": 10.0, "dispatch": 9.0}}


def _tuned_row(m: int, libtype: str, us: str, name: str = "k") -> dict[str, str]:
    row = dict.fromkeys(BF16_TUNED_COLUMNS, "")
    row.update(gfx="sm_90", cu_num="132", M=str(m), N="64", K="32", bias="False", dtype="torch.bfloat16",
               outdtype="torch.bfloat16", scaleAB="False", bpreshuffle="False", libtype=libtype, solidx="3",
               splitK="1", us=us, kernelName=name, err_ratio="0.0", tflops="2.00", bw="100.00")
    return row


def test_min_gain_keeps_torch_rows_for_small_wins(tmp_path):
    tuned = [_tuned_row(1, "skinny", "9.90"), _tuned_row(2, "cublaslt", "8.00"), _tuned_row(4, "torch", "10.0")]
    summary = [{**{k: r[k] for k in ("gfx", "cu_num", "M", "N", "K", "bias", "dtype", "outdtype", "scaleAB",
                                     "bpreshuffle")}, "torch_us": "10.0"} for r in tuned]
    summary[0].update(dtype="bf16", outdtype="bf16", bias="0")  # another spelling of the same key: still matched
    rows, swapped = ship.apply_min_gain(tuned, summary, 1.02)
    assert swapped == 1
    assert (rows[0]["libtype"], rows[0]["kernelName"], rows[0]["us"], rows[0]["tflops"]) == (
        "torch", "F.linear", "10.0000", "1.98")
    assert rows[1] == tuned[1] and rows[2] == tuned[2]
    # the command merges into --out: its other rows stay
    out = tmp_path / "out.csv"
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(BF16_TUNED_COLUMNS))
        w.writeheader()
        w.writerow(_tuned_row(8, "triton", "5.0"))
        w.writerow({**_tuned_row(2, "skinny", "9.0"), "dtype": "bf16", "outdtype": "bf16"})  # replaced by M=2's row
    for name, rs in (("t.csv", tuned), ("s.csv", summary)):
        with open(tmp_path / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rs[0]))
            w.writeheader()
            w.writerows(rs)
    assert ship.main(["min-gain", "--tuned", str(tmp_path / "t.csv"), "--summary", str(tmp_path / "s.csv"),
                      "--out", str(out)]) == 0
    got = [(r["M"], r["libtype"]) for r in read_csv_rows(out)[1]]
    assert got == [("8", "triton"), ("2", "cublaslt"), ("1", "torch"), ("4", "torch")]


def test_triton_json_from_two_runs(tmp_path):
    a, b, c = "BM16_BN64_BK256_GM1_SK1_W4_S4", "BM32_BN32_BK256_GM1_SK1_W4_S4", "BM64_BN64_BK64_GM8_SK1_W4_S3"
    run1 = _bench_csv(tmp_path / "r1.csv", [
        f"bf16,s,l,16,64,32,False,triton:{a},graph,5.0,,", f"bf16,s,l,16,64,32,False,triton:{b},graph,6.0,,",
        f"bf16,s,l,64,64,32,False,triton:{a},graph,9.0,,", f"bf16,s,l,64,64,32,False,triton:{b},graph,7.0,,",
        f"bf16,s,l,64,64,32,False,triton:{c},graph,1.0,,"])  # c: timed in one run only, not a candidate
    run2 = _bench_csv(tmp_path / "r2.csv", [
        f"bf16,s,l,16,64,32,False,triton:{a},graph,5.0,,", f"bf16,s,l,16,64,32,False,triton:{b},graph,6.0,,",
        f"bf16,s,l,64,64,32,False,triton:{a},graph,9.0,,", f"bf16,s,l,64,64,32,False,triton:{b},graph,7.0,,"])
    files = ship.triton_json([run1, run2], "sm_90")
    assert sorted(files) == ["sm_90-GEMM-A16W16-N=64-K=32.json", "sm_90-GEMM-A16W16.json"]
    per_shape = files["sm_90-GEMM-A16W16-N=64-K=32.json"]
    assert list(per_shape) == ["M_LEQ_16", "any"]
    assert per_shape["M_LEQ_16"] == {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 256, "GROUP_SIZE_M": 1,
                                     "NUM_KSPLIT": 1, "num_warps": 4, "num_stages": 4, "TMA_PERSISTENT": False,
                                     "TMA_FLATTEN": False}
    assert per_shape["any"]["BLOCK_SIZE_M"] == 32
    assert ship.main(["triton-json", "--results", run1, run2, "--out", str(tmp_path / "j")]) == 0
    from aiter_gemm.ops.a16w16 import json_buckets

    assert [(m, key) for m, key, _ in json_buckets(tmp_path / "j" / "sm_90-GEMM-A16W16-N=64-K=32.json")] == [
        (16, "M_LEQ_16"), (None, "any")]
    assert json.loads((tmp_path / "j" / "sm_90-GEMM-A16W16.json").read_text()) == per_shape


def test_bad_min_gain_exits_2(tmp_path):
    with pytest.raises(SystemExit) as e:
        ship.main(["rows", "--results", "x.csv", "--out", str(tmp_path / "o.csv"), "--min_gain", "0.9"])
    assert e.value.code == 2


@pytest.mark.parametrize("argv,expected", [
    (["min-gain", "--tuned", "{tmp}/missing.csv", "--summary", "{tmp}/s.csv", "--out", "{tmp}/o.csv"],
     "{tmp}/missing.csv: not found"),
    (["triton-json", "--results", "{tmp}/s.csv", "{tmp}/missing.csv", "--out", "{tmp}/j"],
     "{tmp}/missing.csv: not found"),
    (["min-gain", "--tuned", "{tmp}/s.csv", "--summary", "{tmp}/s.csv", "--out", "{tmp}/s.csv/o.csv"],
     "--out {tmp}/s.csv/o.csv: "),
    (["triton-json", "--results", "{tmp}/s.csv", "--out", "{tmp}/s.csv"], "--out {tmp}/s.csv: {tmp}/s.csv is not a "
     "folder"),
    (["min-gain", "--tuned", "{tmp}/s.csv", "--summary", "{tmp}/s.csv", "--out", "{tmp}/o.csv", "--min_gain", "nan"],
     "argument --min_gain: must be a number >= 1.0, got 'nan'"),
])
def test_bad_inputs_and_outputs_exit_2_before_anything_runs(tmp_path, capsys, argv, expected):
    """Issue 47: a missing input was a traceback, an output that cannot be written failed after the work, and
    ``--min_gain nan`` passed the ``< 1`` check."""
    (tmp_path / "s.csv").write_text(HEADER)
    with pytest.raises(SystemExit) as e:
        ship.main([a.format(tmp=tmp_path) for a in argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("usage: ")
    prog, _, message = err.splitlines()[-1].partition(": error: ")  # the subcommand's parser: its own prog
    assert prog.startswith("python -m gradlib.ship") and message.startswith(expected.format(tmp=tmp_path)), err
    assert not (tmp_path / "o.csv").exists() and not (tmp_path / "j").exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the CPU's answer to rows")
def test_rows_without_a_gpu_exits_2(tmp_path, capsys):
    results = _bench_csv(tmp_path / "b.csv", ["bf16,s,l,1,64,32,False,flinear,graph,16.7,,"])
    with pytest.raises(SystemExit) as e:
        ship.main(["rows", "--results", results, "--out", str(tmp_path / "o.csv")])
    assert e.value.code == 2 and "rows measures each winner's err_ratio on a CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_rows_ship_a_benchmark_winner_with_its_measured_error(tmp_path):
    """A gemv tile timed faster than F.linear and the dispatch becomes an exact-use row with err_ratio 0."""
    results = _bench_csv(tmp_path / "b.csv", [
        "bf16,s,l,1,4096,4096,False,flinear,graph,16.7,,", "bf16,s,l,1,4096,4096,False,dispatch,graph,13.0,flinear,",
        "bf16,s,l,1,4096,4096,False,skinny:gemv_BN1_BK2048_SK1_W4_S1_EF,graph,12.6,flinear,"])
    out = tmp_path / "tuned.csv"
    assert ship.main(["rows", "--results", results, "--out", str(out)]) == 0
    (row,) = read_csv_rows(out)[1]
    assert (row["M"], row["libtype"], row["kernelName"], row["us"], row["err_ratio"], row["pad_m_min"]) == (
        "1", "skinny", "gemv_BN1_BK2048_SK1_W4_S1_EF", "12.6000", "0.0000", "1")
