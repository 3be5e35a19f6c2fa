"""The ``fused_moe`` op (issue 51): its entry against the float32 reference (T 1, 3, 37, 129; k 1, 2, 8; experts with
no tokens; bf16 and FP8; torch's grouped_mm and loop, the Triton kernels through a tuned row), torch.compile with the
fake, the problem vocabulary it shares with the GEMMs (AITER's padded token), AITER's fmoe table (padded lookup,
colon merge, AITER's own kernels and malformed rows as misses), vLLM/SGLang JSON files (nearest M, malformed files
warned), shape capture into AITER's untuned fmoe columns, the tuner's inputs, and bad inputs named (a later call's
tensor of another layout too). Shapes are tiny: on CPU the Triton kernels are interpreted."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import aiter_gemm
from aiter_gemm.backends.base import ACT_TYPES, QUANT_BLOCK, MoeProblem, Solution, get_padded_token
from aiter_gemm.configs import load_untuned
from aiter_gemm.fileio import read_csv_rows
from aiter_gemm.kernels import fused_moe_torch as torch_impl
from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref
from aiter_gemm.kernels.blockscale_format import FP8
from aiter_gemm.kernels.fused_moe import MoeConfig, fused_moe_ref
from aiter_gemm.op_entry import EXT
from aiter_gemm.ops import fused_moe as op
from aiter_gemm.ops.fused_moe import FMOE_UNTUNED_COLUMNS, FUSED_MOE, fused_moe, get_fused_moe_config
from aiter_gemm.testbed import DEFAULT, inputs_memory, prepare_runner
from op_tests.runtime_helpers import moe_call

ON_GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if ON_GPU else "cpu")  # on CPU the Triton kernels are interpreted
H, INTER = 128, 64  # bf16 experts
H8, INTER8 = 128, 128  # FP8 experts: one scale block each way
CFG = MoeConfig(16, 32, 64, num_stages=2)
FP8_CFG = MoeConfig(16, 64, 128, num_stages=2)
HEADER = ("cu_num,token,model_dim,inter_dim,expert,topk,act_type,dtype,q_dtype_a,q_dtype_w,q_type,use_g1u1,"
          "doweight_stage1,block_m,ksplit,us1,kernelName1,err1,us2,kernelName2,err2,us,run_1stage,tflops,bw")


def problem(T: int, k: int, E: int = 8, fp8: bool = False) -> MoeProblem:
    q = FP8 if fp8 else torch.bfloat16
    return MoeProblem(T, H8 if fp8 else H, INTER8 if fp8 else INTER, E, k, ACT_TYPES["silu"], torch.bfloat16, q, q,
                      QUANT_BLOCK if fp8 else "QuantType.No")


def inputs(p: MoeProblem, seed: int = 0, routing: str = "uniform"):
    made = FUSED_MOE.make_inputs(p, seed, DEV, 0, {"routing": routing})
    return made.sets[0], made.ref


def assert_close(out: torch.Tensor, ref: torch.Tensor, rel: float = 0.02) -> None:
    """Within ``rel`` of the output's scale: a few bf16 ulps (FP8: 4%, where a bf16 intermediate an ulp off the
    reference's changes a whole group's quantization, as the kernels' own tests allow)."""
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    err = (out.float() - ref.float()).abs().max().item()
    scale = ref.float().abs().max().item()
    assert scale > 0.05 and err <= rel * scale, f"max error {err} vs output scale {scale}"


def aiter_row(p: MoeProblem, kernel1: str, kernel2: str = "", us: float = 10.0, cu_num: int | None = None,
              block_m: int = 0, ksplit: int = 0) -> str:
    cu = aiter_gemm.current_device_identity(ON_GPU).cu_num if cu_num is None else cu_num
    cells = op.FUSED_MOE.untuned_row(p)
    key = ",".join(cells[c] for c in FMOE_UNTUNED_COLUMNS)
    return f"{cu},{key},{block_m},{ksplit},{us / 2},{kernel1},0.0%,{us / 2},{kernel2 or kernel1},0.0%,{us},0,1.0,1.0"


def use_table(mp, tmp_path, *texts: str) -> list:
    paths = []
    for i, text in enumerate(texts):
        path = tmp_path / f"tuned_fmoe_{i}.csv"
        path.write_text(text)
        paths.append(path)
    mp.setenv("AITER_CONFIG_FMOE", ":".join(map(str, paths)))
    aiter_gemm.reload_configs()
    return paths


# ------------------------------------------------------------------------------------------------ results


@pytest.mark.parametrize("T", [1, 3, 37, 129])
@pytest.mark.parametrize("k", [1, 2, 8])
@pytest.mark.parametrize("name", torch_impl.NAMES)
def test_torch_experts_match_the_reference(clean_runtime, T, k, name):
    p = problem(T, k)
    args, ref = inputs(p, seed=T * 10 + k)
    out = moe_call(args, config=Solution("torch", -1, 0, name))
    assert_close(out, ref)
    if name == torch_impl.GROUPED:  # the default on CPU: the same through the cached entry, twice
        assert_close(moe_call(args), ref)
        assert torch.equal(moe_call(args), moe_call(args))


@pytest.mark.parametrize("T", [1, 3, 37, 129])
@pytest.mark.parametrize("k", [1, 2, 8])
def test_fp8_experts_match_the_reference(clean_runtime, T, k):
    """FP8 block-scale experts: the default is the Triton kernels on a GPU, on CPU torch's loop through the
    block-scaled matmul op."""
    p = problem(T, k, E=4 if k < 8 else 8, fp8=True)
    args, ref = inputs(p, seed=T + k)
    got = get_fused_moe_config(T, H8, INTER8, p.expert, k, q_dtype_w=FP8, on_gpu=ON_GPU)
    want = ("triton",) if ON_GPU else ("torch", "loop")
    assert (got["libtype"], got["kernelName"])[:len(want)] == want
    assert_close(moe_call(args), ref, rel=0.04)


@pytest.mark.parametrize("fp8,T,k,fused", [(False, 3, 2, False), (False, 37, 8, False), (True, 3, 2, False),
                                           (True, 129, 2, False), (True, 37, 8, False), (False, 1, 8, True),
                                           (True, 3, 2, True)])
def test_triton_kernels_through_a_tuned_row(clean_runtime, tmp_path, fp8, T, k, fused):
    """A tuned row's configs run (FUSED: one config for both GEMMs, in one launch)."""
    p = problem(T, k, E=max(4, k), fp8=fp8)
    cfg = FP8_CFG if fp8 else CFG
    cfg = MoeConfig(16, cfg.block_n, 128, num_stages=2, fused=True) if fused else cfg
    use_table(clean_runtime, tmp_path, HEADER + "\n" + aiter_row(p, cfg.name(), block_m=16) + "\n")
    got = get_fused_moe_config(T, p.model_dim, p.inter_dim, p.expert, k, q_dtype_w=p.q_dtype_w, on_gpu=ON_GPU)
    assert (got["matched"], got["libtype"], got["kernelName"]) == ("exact", "triton", cfg.name())
    args, ref = inputs(p, seed=5)
    assert_close(moe_call(args), ref, rel=0.04 if fp8 else 0.02)


def test_experts_without_tokens_cost_nothing(clean_runtime):
    """Experts 1 and 3 of 4 get no token: the result is the reference's and the loop runs the others' GEMMs only."""
    p = problem(9, 2, E=4, fp8=True)
    (x, w1, w2, tw, _, s1, s2), _ = inputs(p)
    ids = torch.tensor([[0, 2], [2, 0]] * 4 + [[0, 2]], dtype=torch.int32)
    calls = []

    def counting(xq, wq, xs, ws, dtype):
        calls.append(wq.data_ptr())
        return gemm_a8w8_blockscale_ref(xq, wq, xs, ws, dtype)

    out = torch_impl.launcher(p, torch_impl.LOOP, counting)(x, w1, w2, tw, ids, s1, s2)
    assert_close(out, fused_moe_ref(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2), rel=0.04)
    assert sorted(set(calls)) == sorted({w1[0].data_ptr(), w1[2].data_ptr(), w2[0].data_ptr(), w2[2].data_ptr()})
    assert len(calls) == 4
    assert_close(moe_call((x, w1, w2, tw, ids, s1, s2)), fused_moe_ref(x, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2),
                 rel=0.04)


def test_no_tokens_and_gelu(clean_runtime):
    p = problem(5, 2, E=4)
    (x, w1, w2, tw, ti, _, _), _ = inputs(p)
    assert fused_moe(x[:0], w1, w2, tw[:0], ti[:0]).shape == (0, H)
    assert_close(fused_moe(x, w1, w2, tw, ti, activation="gelu"), fused_moe_ref(x, w1, w2, tw, ti, activation="gelu"))


def test_torch_compile_fullgraph_traces_the_custom_op(clean_runtime):
    p = problem(6, 2, E=4)
    (x, w1, w2, tw, ti, _, _), ref = inputs(p)

    class Experts(torch.nn.Module):
        def forward(self, x, tw, ti):
            return fused_moe(x * 1.0, w1, w2, tw, ti) + 1

    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    got = torch.compile(Experts(), fullgraph=True, backend=backend)(x, tw, ti)
    torch._dynamo.reset()
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert len(graphs) == 1 and sum("aiter_gemm.fused_moe" in t for t in targets) == 1
    assert_close(got - 1, ref)
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        fake = torch.ops.aiter_gemm.fused_moe(*(mode.from_tensor(t) for t in (x, w1, w2, tw, ti)))
    assert fake.shape == x.shape and fake.dtype == x.dtype


@pytest.mark.gpu
@pytest.mark.parametrize("fp8,libtype,name", [(False, None, None), (True, None, None), (False, "torch", "grouped_mm"),
                                              (False, "torch", "loop")])
def test_cuda_graph_capture_and_replay(clean_runtime, fp8, libtype, name):
    """Captured after one eager call (which decides and compiles), replayed: the same result, no host sync inside
    (a sync would fail the capture)."""
    p = problem(8, 2, E=8, fp8=fp8)
    made = FUSED_MOE.make_inputs(p, 0, torch.device("cuda"), 0, {})
    args = made.sets[0]
    config = None if libtype is None else Solution(libtype, -1, 0, name)
    moe_call(args, config=config)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = moe_call(args, config=config)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(got.cpu(), made.ref.to(torch.bfloat16).cpu(), rel=0.04 if fp8 else 0.02)


# ------------------------------------------------------------------------------------------------ the problem


def test_the_padded_token_is_aiters():
    assert [get_padded_token(t) for t in (0, 1, 2, 3, 5, 16, 17, 1000, 1025, 32767, 32768, 100000, 200000)] == \
        [1, 1, 2, 4, 8, 16, 32, 1024, 2048, 32768, 32768, 32768, 131072]
    p = problem(37, 8)
    assert p.M == 37 and p.padded() == (("padded", p.with_m(64)),) and not p.empty and problem(0, 8).empty
    assert FUSED_MOE.untuned_row(p) == {
        "token": "37", "model_dim": str(H), "inter_dim": str(INTER), "expert": "8", "topk": "8",
        "act_type": "ActivationType.Silu", "dtype": "torch.bfloat16", "q_dtype_a": "torch.bfloat16",
        "q_dtype_w": "torch.bfloat16", "q_type": "QuantType.No", "use_g1u1": "True", "doweight_stage1": "False"}


# ------------------------------------------------------------------------------------------------ AITER's fmoe table


def test_aiter_table_is_looked_up_at_the_padded_token_and_merged(clean_runtime, tmp_path, caplog):
    """A row at token 64 (AITER's file: no gfx, no libtype) serves T = 37 through the padded lookup; of two files'
    rows of one key the faster wins; T = 65 pads to 128, where no row is: the default."""
    p64 = problem(64, 2)
    use_table(clean_runtime, tmp_path, HEADER + "\n" + aiter_row(p64, "loop", us=9.0) + "\n",
              HEADER + "\n" + aiter_row(p64, "grouped_mm", us=20.0) + "\n" + aiter_row(problem(3, 2), "loop") + "\n")
    cfg = get_fused_moe_config(37, H, INTER, 8, 2, on_gpu=ON_GPU)
    assert (cfg["matched"], cfg["libtype"], cfg["kernelName"], cfg["us"], cfg["token"]) == ("padded", "torch", "loop",
                                                                                            9.0, 37)
    assert cfg["source"].endswith("tuned_fmoe_0.csv:2") and cfg["kernelName1"] == "loop"
    assert get_fused_moe_config(3, H, INTER, 8, 2, on_gpu=ON_GPU)["matched"] == "exact"
    assert get_fused_moe_config(4, H, INTER, 8, 2, on_gpu=ON_GPU)["matched"] == "default"  # 4 pads to 4: no row
    with caplog.at_level(logging.INFO, logger="aiter_gemm"):
        assert get_fused_moe_config(65, H, INTER, 8, 2, on_gpu=ON_GPU)["matched"] == "default"
    assert "[fused_moe] shape is token:65" in caplog.text and "will use default config!" in caplog.text
    args, ref = inputs(problem(37, 2))
    assert_close(moe_call(args), ref)


def test_aiters_own_kernels_and_malformed_rows_are_misses_said_once(clean_runtime, tmp_path, caplog):
    ck = "moe_ck2stages_gemm1_256x32x64x128_1x4_TypeCast_v3_Nswizzle0_Quant0_MulRoutedWeight0_silu_B16_B16_B16"
    bad = HEADER + ",libtype\n" + aiter_row(problem(3, 2), "moe_BM16_BNxx", us=5.0) + ",triton\n" + \
        aiter_row(problem(5, 2), CFG.name(), ksplit=4) + ",triton\n"
    use_table(clean_runtime, tmp_path, HEADER + "\n" + aiter_row(problem(7, 2), ck) + "\n" +
              aiter_row(problem(9, 2), ck) + "\n", bad)
    with caplog.at_level(logging.WARNING, logger="aiter_gemm"):
        for T in (3, 5, 7, 9, 3, 5, 7):
            assert get_fused_moe_config(T, H, INTER, 8, 2, on_gpu=ON_GPU)["matched"] == "default"
    text = caplog.text
    assert text.count("column 'kernelName1'") == 1 and "tuned_fmoe_1.csv:2" in text
    assert "tuned_fmoe_1.csv:3, column 'ksplit'" in text
    assert text.count("rows with libtype 'aiter' cannot run here") == 1


def test_a_malformed_table_is_skipped_with_a_warning(clean_runtime, tmp_path, caplog):
    row = aiter_row(problem(3, 2), "loop").replace(",3,", ",three,", 1)
    with caplog.at_level(logging.WARNING):
        use_table(clean_runtime, tmp_path, HEADER + "\n" + row + "\n")
    assert "tuned_fmoe_0.csv:2, column 'token'" in caplog.text
    assert get_fused_moe_config(3, H, INTER, 8, 2, on_gpu=ON_GPU)["matched"] == "default"


# ------------------------------------------------------------------------------------------------ vLLM / SGLang JSON


VLLM = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1, "num_warps": 4,
        "num_stages": 2}


def json_folder(mp, tmp_path, files: dict[str, object]):
    folder = tmp_path / "moe"
    folder.mkdir()
    for name, data in files.items():
        (folder / name).write_text(data if isinstance(data, str) else json.dumps(data))
    mp.setenv("AITER_GEMM_FUSED_MOE_CONFIGS", str(folder))
    mp.setenv("AITER_GEMM_DEVICE_NAME", "NVIDIA H200")
    aiter_gemm.reload_configs()
    return folder


def test_vllm_files_give_the_config_of_the_nearest_m(clean_runtime, tmp_path):
    """vLLM's nearest M (a tie to the key written first); FP8 files carry the dtype and block shape, vLLM's
    spelling and SGLang's; another device's file is not read."""
    big = dict(VLLM, BLOCK_SIZE_M=64, num_warps=8)
    json_folder(clean_runtime, tmp_path, {
        f"E=8,N={INTER},device_name=NVIDIA_H200.json": {"1": VLLM, "16": dict(VLLM, BLOCK_SIZE_N=64), "64": big},
        f"E=4,N={INTER8},device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128, 128].json": {"8": VLLM},
        f"E=8,N={INTER8},device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json": {"8": big},
        f"E=2,N={INTER},device_name=NVIDIA_H100.json": {"1": VLLM}})
    picks = {T: get_fused_moe_config(T, H, INTER, 8, 2, on_gpu=ON_GPU) for T in (1, 3, 8, 9, 40, 41, 5000)}
    assert {T: c["source"].rsplit("#", 1)[1] for T, c in picks.items()} == \
        {1: "1", 3: "1", 8: "1", 9: "16", 40: "16", 41: "64", 5000: "64"}
    assert picks[3]["matched"] == "json" and picks[3]["libtype"] == "triton"
    assert picks[3]["kernelName"] == MoeConfig.from_vllm(VLLM).name() and picks[41]["config1"] == big
    fp8 = get_fused_moe_config(3, H8, INTER8, 4, 2, q_dtype_w=FP8, on_gpu=ON_GPU)
    assert fp8["matched"] == "json" and "block_shape=[128, 128]" in fp8["source"]
    assert "block_shape=[128,128]" in get_fused_moe_config(3, H8, INTER8, 8, 2, q_dtype_w=FP8, on_gpu=ON_GPU)["source"]
    assert get_fused_moe_config(3, H, INTER, 2, 2, on_gpu=ON_GPU)["matched"] == "default"
    args, ref = inputs(problem(3, 2))
    assert_close(moe_call(args), ref)  # the JSON config, interpreted


@pytest.mark.parametrize("text,needle", [
    ("{not json", "not valid JSON"),
    (json.dumps({"one": VLLM}), "key 'one'"),
    (json.dumps({"1": dict(VLLM, BLOCK_SIZE_M=24)}), "key '1'"),
    (json.dumps({"1": [1, 2]}), "key '1'"),
])
def test_a_malformed_vllm_file_is_skipped_with_a_warning(clean_runtime, tmp_path, caplog, text, needle):
    json_folder(clean_runtime, tmp_path, {f"E=8,N={INTER},device_name=NVIDIA_H200.json": text})
    with caplog.at_level(logging.WARNING):
        assert get_fused_moe_config(3, H, INTER, 8, 2, on_gpu=ON_GPU)["matched"] == "default"
    assert f"E=8,N={INTER},device_name=NVIDIA_H200.json" in caplog.text and needle in caplog.text


def test_a_vllm_file_with_its_triton_version_is_read(clean_runtime, tmp_path, caplog):
    """vLLM's benchmark_moe.py writes ``triton_version`` beside the M keys: the file is read (a version other than
    this Triton's logged once, not refused); a version that is not a string, or no M key, skips it naming why."""
    from aiter_gemm import moe_json

    clean_runtime.setattr(moe_json, "triton_version", lambda: "3.9.0", raising=False)
    name = f"E=8,N={INTER},device_name=NVIDIA_H200.json"
    folder = json_folder(clean_runtime, tmp_path, {name: {"triton_version": "3.4.0", "1": VLLM,
                                                          "16": dict(VLLM, BLOCK_SIZE_N=64)}})
    with caplog.at_level(logging.WARNING):
        got = [get_fused_moe_config(T, H, INTER, 8, 2, on_gpu=ON_GPU) for T in (3, 3, 12)]
    assert [(c["matched"], c["source"].rsplit("#", 1)[1]) for c in got] == [("json", "1"), ("json", "1"),
                                                                           ("json", "16")]
    assert caplog.text.count("tuned with Triton 3.4.0, this is Triton 3.9.0") == 1 and name in caplog.text
    caplog.clear()
    (folder / name).write_text(json.dumps({"triton_version": "3.9.0", "1": VLLM}))
    aiter_gemm.reload_configs()
    with caplog.at_level(logging.WARNING):
        assert get_fused_moe_config(3, H, INTER, 8, 2, on_gpu=ON_GPU)["matched"] == "json"
    assert caplog.text == ""
    for text, needle in ((json.dumps({"triton_version": 3.4, "1": VLLM}), "key 'triton_version'"),
                         (json.dumps({"triton_version": "3.4.0"}), "holds no M key")):
        (folder / name).write_text(text)
        aiter_gemm.reload_configs()
        with caplog.at_level(logging.WARNING):
            assert get_fused_moe_config(3, H, INTER, 8, 2, on_gpu=ON_GPU)["matched"] == "default"
        assert name in caplog.text and needle in caplog.text


def test_a_merge_keeps_the_files_triton_version_and_writes_its_own(tmp_path, clean_runtime, caplog):
    """A new file gets this Triton's version first; a merge into a file tuned with another keeps the file's (its
    other M keys were tuned with it; logged), unless the merge replaces all its M keys."""
    from aiter_gemm import moe_json

    clean_runtime.setattr(moe_json, "triton_version", lambda: "3.9.0", raising=False)
    p = problem(3, 2)
    path = moe_json.merge_file(tmp_path, "NVIDIA_H200", p, {16: VLLM}, MoeConfig.from_vllm)
    assert path.read_text().startswith('{\n    "triton_version": "3.9.0",')
    path.write_text(json.dumps({"triton_version": "3.4.0", "64": VLLM, "1": VLLM}))
    with caplog.at_level(logging.WARNING):
        moe_json.merge_file(tmp_path, "NVIDIA_H200", p, {16: dict(VLLM, BLOCK_SIZE_N=64)}, MoeConfig.from_vllm)
    data = json.loads(path.read_text())
    assert list(data) == ["triton_version", "1", "16", "64"] and data["triton_version"] == "3.4.0"
    assert data["64"] == VLLM and data["16"]["BLOCK_SIZE_N"] == 64
    assert "keeps triton_version 3.4.0" in caplog.text and str(path) in caplog.text
    moe_json.merge_file(tmp_path, "NVIDIA_H200", p, {m: VLLM for m in (1, 16, 64)}, MoeConfig.from_vllm)
    assert list(json.loads(path.read_text()).items())[0] == ("triton_version", "3.9.0")


# ------------------------------------------------------------------------------------------------ capture, inputs


def test_calls_are_captured_in_aiters_untuned_fmoe_columns(clean_runtime, tmp_path):
    clean_runtime.setenv("AITER_TUNE_GEMM", "1")
    clean_runtime.setenv("AITER_UNTUNED_GEMM_FILE", str(tmp_path / "bf16_untuned_gemm.csv"))
    aiter_gemm.reload_configs()
    for T in (3, 3, 5):
        moe_call(inputs(problem(T, 2, E=4))[0])
    aiter_gemm.get_dispatcher("fused_moe").flush_capture()
    path = tmp_path / "untuned_fmoe.csv"
    header, rows = read_csv_rows(str(path))
    assert tuple(header) == FMOE_UNTUNED_COLUMNS
    assert [(r["token"], r["expert"], r["act_type"], r["q_type"]) for r in rows] == \
        [("3", "4", "ActivationType.Silu", "QuantType.No"), ("5", "4", "ActivationType.Silu", "QuantType.No")]
    assert [key[0] for key in load_untuned(path, "FMOE")] == [3, 5]  # the tuner reads them back


def test_the_tuners_helpers_take_a_moe_problem(clean_runtime):
    """A runner prepared as the tuner's workers prepare one (the default, a named solution, one that cannot run),
    and the inputs' memory bound."""
    p = problem(5, 2, E=4)
    ident = aiter_gemm.current_device_identity(ON_GPU)
    fits, what = inputs_memory(p, DEV)
    assert fits and "(float32 experts, hidden states and reference of token=5 model_dim=128" in what
    assert p.inputs_bytes()[0] == 4 * (4 * 3 * INTER * H + 2 * 5 * H)
    args, ref = inputs(p)
    runner, sol, why = prepare_runner("fused_moe", p, DEFAULT, ident)
    assert why is None and sol.libtype == ("triton" if ON_GPU else "torch")
    assert_close(FUSED_MOE.call_runner(runner, args, p), ref)
    fp8 = problem(5, 2, E=4, fp8=True)
    runner, _, why = prepare_runner("fused_moe", fp8, Solution("torch", -1, 0, "grouped_mm"), ident)
    assert runner is None and why.startswith("grouped_mm cannot run token=5 model_dim=128")


def test_vllm_files_are_merged_keeping_their_other_keys(tmp_path):
    from aiter_gemm import moe_json
    from aiter_gemm.jsonconfigs import JSONConfigError

    p = problem(3, 2, fp8=True)
    path = moe_json.merge_file(tmp_path, "NVIDIA_H200", p, {16: VLLM}, MoeConfig.from_vllm)
    assert path.name == f"E=8,N={INTER8},device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json"
    moe_json.merge_file(tmp_path, "NVIDIA_H200", p, {1: dict(VLLM, BLOCK_SIZE_N=64)}, MoeConfig.from_vllm)
    assert list(json.loads(path.read_text())) == ["triton_version", "1", "16"]  # vLLM's keys, its order
    before = path.read_text()
    with pytest.raises(JSONConfigError, match="key '2'"):
        moe_json.merge_file(tmp_path, "NVIDIA_H200", p, {2: dict(VLLM, num_warps=3)}, MoeConfig.from_vllm)
    assert path.read_text() == before


def test_inputs_rotate_past_the_cache_and_route_uniformly_or_skewed():
    p = problem(64, 4, E=16)
    made = FUSED_MOE.make_inputs(p, 0, torch.device("cpu"), 1 << 20, {})
    per_set = sum(t.numel() * t.element_size() for t in made.sets[0] if t is not None)
    assert len(made.sets) * per_set > 2 << 20 and made.sets[1][1].data_ptr() != made.sets[0][1].data_ptr()
    counts = {}
    for kind in op.ROUTINGS:
        weight, ids = op.routing(4096, 16, 4, kind, torch.Generator().manual_seed(1))
        assert ids.dtype == torch.int32 and weight.dtype == torch.float32
        assert all(len(set(row)) == 4 for row in ids.tolist()) and torch.allclose(weight.sum(1), torch.ones(4096))
        counts[kind] = torch.bincount(ids.flatten().long(), minlength=16)
    assert counts["uniform"].max() < 1.2 * counts["uniform"].float().mean()
    assert counts["skewed"].max() > 2 * counts["skewed"].float().mean()
    with pytest.raises(ValueError, match="routing 'zipf' is not one of"):
        FUSED_MOE.make_inputs(p, 0, torch.device("cpu"), 0, {"routing": "zipf"})


# ------------------------------------------------------------------------------------------------ bad input


def test_an_expert_id_out_of_range_raises_naming_topk_ids_on_every_call(clean_runtime):
    (x, w1, w2, tw, ti, _, _), _ = inputs(problem(4, 2, E=4))
    fused_moe(x, w1, w2, tw, ti)  # the key is decided with good ids
    for bad in (4, -1):
        ids = ti.clone()
        ids[2, 1] = bad
        with pytest.raises(ValueError, match=r"topk_ids \(shape \(4, 2\).*outside \[0, 4\)"):
            fused_moe(x, w1, w2, tw, ids)


def test_mismatched_inputs_are_named(clean_runtime):
    (x, w1, w2, tw, ti, _, _), _ = inputs(problem(4, 2, E=4))
    cases = [
        ((x, w1, w2[:, :, :32], tw, ti), r"w2 \(shape \(4, 128, 32\), dtype torch.bfloat16, stride"),
        ((x, w1, w2.half(), tw, ti), r"w2 \(shape .* dtype torch.float16"),
        ((x, w1, w2, tw[:3], ti), r"topk_weight \(shape \(3, 2\)"),
        ((x, w1, w2, tw, ti.float()), r"topk_ids \(shape \(4, 2\), dtype torch.float32"),
        ((x, w1, w2.to("meta"), tw, ti), rf"w2 \(shape .* device meta\) is not on hidden_states' device {DEV.type}"),
        ((x, w1.transpose(1, 2), w2, tw, ti), r"w1 \(shape \(4, 128, 128\)"),
    ]
    for args, pattern in cases:
        with pytest.raises(ValueError, match=pattern):
            fused_moe(*args)
    with pytest.raises(ValueError, match="activation 'relu'"):
        fused_moe(x, w1, w2, tw, ti, activation="relu")


#: A later call's tensor of another layout, with the shapes, dtypes and devices of the key's first call: the
#: argument's index and the tensor made from the first call's (the last layout is one the kernels take).
LAYOUTS = {
    "topk_ids_column_major": (4, lambda t: t.t().contiguous().t()),
    "topk_weight_column_major": (3, lambda t: t.t().contiguous().t()),
    "w1_k_major": (1, lambda t: t.transpose(1, 2).contiguous().transpose(1, 2)),
    "hidden_states_column_major": (0, lambda t: t.t().contiguous().t()),
    "topk_ids_expanded": (4, lambda t: t[:1].expand(t.shape)),
    "hidden_states_rows_strided": (0, lambda t: torch.zeros(t.shape[0], 3 * t.shape[1], dtype=t.dtype,
                                                            device=t.device)[:, t.shape[1]:2 * t.shape[1]].copy_(t)),
}
ARG_NAMES = ("hidden_states", "w1", "w2", "topk_weight", "topk_ids")
#: A tuned row's kernelName per backend the layouts run through: the Triton kernels' three kinds, torch's.
LAYOUT_KERNELS = {"fused": MoeConfig(16, 32, 128, num_stages=2, fused=True).name(),
                  "direct": MoeConfig(16, 32, 64, num_stages=2, direct=True).name(), "sorted": CFG.name(),
                  "torch": torch_impl.GROUPED}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("kernel", list(LAYOUT_KERNELS))
def test_a_later_call_of_another_layout_is_checked_as_a_first_call(clean_runtime, tmp_path, kernel, layout):
    """The key holds the strides the first call's checks read: a later call with the same shapes but a tensor of
    another layout gets what a first call of it gets, through the C++ entry and the Python one: the check's error
    naming the tensor (shape, dtype, stride), or (a layout the kernels take) the reference's result."""
    p = problem(5, 2, E=4)
    name = LAYOUT_KERNELS[kernel]
    row = aiter_row(p, name, block_m=0 if kernel == "torch" else 16)
    use_table(clean_runtime, tmp_path, HEADER + "\n" + row + "\n")
    assert get_fused_moe_config(5, H, INTER, 4, 2, on_gpu=ON_GPU)["kernelName"] == name
    args, ref = inputs(p)
    assert_close(moe_call(args), ref)
    assert EXT is None or EXT.cached(fused_moe) == 1  # the C++ entry serves the key from now on
    index, relayout = LAYOUTS[layout]
    other = list(args)
    t = other[index] = relayout(args[index])
    assert (t.shape, t.dtype, t.device) == (args[index].shape, args[index].dtype, args[index].device)
    try:
        op.problem_of(*other)  # the scales are its sixth and seventh arguments
        want = None
    except ValueError as exc:
        want = str(exc)
        assert f"{ARG_NAMES[index]} (shape {tuple(t.shape)}, dtype {t.dtype}, stride {t.stride()}" in want
    for entry in (fused_moe, op.fused_moe_python):
        if want is None:
            assert_close(entry(*other[:5], w1_scale=other[5], w2_scale=other[6]), fused_moe_ref(*other[:5]))
            continue
        with pytest.raises(ValueError) as got:
            entry(*other[:5], w1_scale=other[5], w2_scale=other[6])
        assert str(got.value) == want
    assert want is not None or layout == "hidden_states_rows_strided"


def test_fp8_scale_layouts_are_named(clean_runtime):
    (x, w1, w2, tw, ti, s1, s2), _ = inputs(problem(4, 2, E=4, fp8=True))
    with pytest.raises(ValueError, match=r"w1_scale \(shape \(4, 1, 1\).* must be float32 \(4, 2, 1\)"):
        fused_moe(x, w1, w2, tw, ti, w1_scale=s1[:, :1], w2_scale=s2)
    with pytest.raises(ValueError, match="w1_scale and w2_scale are required"):
        fused_moe(x, w1, w2, tw, ti)
    with pytest.raises(ValueError, match="cannot run"):
        fused_moe(x, w1, w2, tw, ti, w1_scale=s1, w2_scale=s2, config=Solution("torch", -1, 0, "grouped_mm"))
