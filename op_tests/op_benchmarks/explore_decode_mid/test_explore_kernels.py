"""The exploration kernels of issue 14's decode diagnosis (``gemv_mma.py`` in Triton, ``tcgemv.cu`` and
``clgemv.cu`` in CUDA, ``wsgemm.py`` in Gluon; not shipped, BENCHMARKS.md "Where a decode GEMM's time goes" and
after): numerics on odd shapes (the Triton one under the interpreter on CPU, the others on a GPU), the split-K
fix-up, names and the configs each rejects; the Gluon kernel is also compiled for sm_90 on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from op_tests.op_benchmarks.explore_decode_mid import clgemv as cl
from op_tests.op_benchmarks.explore_decode_mid import gemm_decode as gd
from op_tests.op_benchmarks.explore_decode_mid import gemv_mma as gm
from op_tests.op_benchmarks.explore_decode_mid import tcgemv as tc
from op_tests.op_benchmarks.explore_decode_mid import wsgemm as ws
from op_tests.op_benchmarks.explore_decode_mid import wsgemm_cluster as wscl

ROOT = Path(__file__).resolve().parents[3]


def reference(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    out = a.double() @ b.double().t()
    return out if bias is None else out + bias.double()


@pytest.mark.parametrize(("M", "N", "K", "cfg"), [
    (1, 40, 192, gm.GemvMmaConfig(16, 16, 64, 1, 2, 1)),     # M = 1: tokens past M re-read row 0
    (17, 100, 200, gm.GemvMmaConfig(32, 16, 64, 1, 2, 1)),   # N and K not multiples of the tile (K tail masked)
    (33, 64, 256, gm.GemvMmaConfig(64, 32, 64, 2, 4, 1)),    # split K in two, fix-up
    (97, 72, 136, gm.GemvMmaConfig(64, 32, 32, 3, 4, 2)),    # two M tiles, three splits, a K tail
])
def test_gemv_mma_matches_reference(device, M, N, K, cfg):
    torch.manual_seed(M + N + K)
    a = torch.randn(M, K, dtype=torch.bfloat16, device=device)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=device)
    assert gm.config_error(cfg, M, N, K) is None
    out = torch.full((M, N), float("nan"), dtype=torch.float32, device=device)  # unwritten -> NaN
    gm.launch_gemv_mma(a, b, out, cfg)
    torch.testing.assert_close(out, reference(a, b).float(), rtol=2e-3, atol=2e-4 * K**0.5)
    for buf in gd._COUNTERS.values():
        assert int(buf.abs().sum()) == 0, "the last split of a tile resets its counter"


def test_gemv_mma_names_and_rejections():
    cfg = gm.GemvMmaConfig(32, 64, 256, 4, 2, 3)
    assert cfg.name == "GMMA_BM32_BN64_BK256_SK4_W2_S3" and gm.GemvMmaConfig.from_name(cfg.name) == cfg
    with pytest.raises(ValueError, match="does not match"):
        gm.GemvMmaConfig.from_name("GMMA_BM32_BN64")
    assert "leaves one empty" in gm.config_error(gm.GemvMmaConfig(32, 32, 256, 9, 4, 1), 32, 64, 2048)
    assert "registers" in gm.config_error(gm.GemvMmaConfig(64, 64, 1024, 1, 2, 1), 64, 64, 4096)
    for c in gm.grid_configs(32, 1280, 8192, 132):
        assert gm.config_error(c, 32, 1280, 8192) is None


def test_tcgemv_names_rejections_and_source():
    cfg = tc.TcGemvConfig(32, 1, 4, 8, 2, 3)
    assert cfg.name == "TC_MT32_R1_WN4_U8_XS2_SK3" and tc.TcGemvConfig.from_name(cfg.name) == cfg
    assert cfg.rows == 64 and cfg.smem_bytes() == 2 * 32 * (512 + 64)  # 512-byte rows padded to an odd 64 multiple
    assert tc.TcGemvConfig(32, 1, 4, 1, 2, 1).smem_bytes() == 2 * 32 * 64  # 64-byte rows: already odd
    assert "multiple of 256" in tc.config_error(tc.TcGemvConfig(32, 1, 4, 8, 2, 1), 32, 64, 4000)
    assert "leave one empty" in tc.config_error(tc.TcGemvConfig(32, 1, 4, 4, 2, 5), 32, 64, 512)
    assert "MT must be" in tc.config_error(tc.TcGemvConfig(12, 1, 4, 4, 2, 1), 12, 64, 512)
    # One binary per config (the split count is the grid's y), every parameter a #define the kernel reads.
    assert tc.cubin_name(cfg, False, 0, False) == tc.cubin_name(tc.TcGemvConfig(32, 1, 4, 8, 2, 1), False, 0, False)
    src = tc.source(cfg, False, 0, True)
    for define in ("TC_MT 32", "TC_R 1", "TC_WN 4", "TC_U 8", "TC_XS 2", "IN_F16 0", "OUT_KIND 0", "HAS_BIAS 1"):
        assert f"#define {define}\n" in src
    for c in tc.grid_configs(17, 4096, 14336, 132):
        assert tc.config_error(c, 17, 4096, 14336) is None and c.MT == 24


def run_against_reference(launch, M: int, N: int, K: int, with_bias: bool, otype: torch.dtype,
                          bit_identical_rerun: bool = False) -> None:
    """Fresh inputs (fp16 for an fp16 output, else bf16), the output poisoned with NaN, ``launch(a, b, bias, out)``,
    then compared with the float64 reference; ``bit_identical_rerun``: a second launch into a fresh poisoned output
    must give the same bits (kernels that sum their K splits in a fixed order)."""
    torch.manual_seed(M + N)
    dtype = torch.float16 if otype == torch.float16 else torch.bfloat16
    a = torch.randn(M, K, dtype=dtype, device="cuda")
    b = torch.randn(N, K, dtype=dtype, device="cuda")
    bias = torch.randn(N, dtype=dtype, device="cuda") if with_bias else None
    out = torch.full((M, N), float("nan"), dtype=otype, device="cuda")
    launch(a, b, bias, out)
    tol = dict(rtol=2e-3, atol=2e-4 * K**0.5) if otype == torch.float32 else dict(rtol=1.6e-2, atol=1.6e-2 * K**0.5)
    torch.testing.assert_close(out, reference(a, b, bias).to(otype), **tol)
    if bit_identical_rerun:
        again = torch.full_like(out, float("nan"))
        launch(a, b, bias, again)
        assert torch.equal(out, again)


@pytest.mark.gpu
@pytest.mark.parametrize(("M", "N", "K", "cfg", "with_bias", "otype"), [
    (1, 100, 256, tc.TcGemvConfig(8, 1, 2, 2, 2, 1), True, torch.bfloat16),     # rows and tokens past N, M
    (17, 1000, 4096, tc.TcGemvConfig(24, 2, 4, 4, 3, 3), False, torch.float32),
    (33, 256, 1024, tc.TcGemvConfig(64, 1, 4, 8, 2, 2), True, torch.float16),
    (97, 4100, 512, tc.TcGemvConfig(64, 1, 2, 2, 4, 1), False, torch.bfloat16),  # two M tiles
])
def test_tcgemv_matches_reference_gpu(M, N, K, cfg, with_bias, otype):
    assert tc.config_error(cfg, M, N, K) is None
    run_against_reference(lambda a, b, bias, out: tc.launch_tcgemv(a, b, bias, out, cfg), M, N, K, with_bias, otype)


def test_clgemv_names_rejections_and_source():
    cfg = cl.ClGemvConfig(64, 4, 2, 128, 3, 8)
    assert cfg.name == "CL_MT64_WN4_R2_KC128_NS3_S8" and cl.ClGemvConfig.from_name(cfg.name) == cfg
    assert cl.ClGemvConfig.from_name("CL_MT64_WN4_R2_KC128_NS3_S8_D2") == cl.ClGemvConfig(64, 4, 2, 128, 3, 8, 2)
    with pytest.raises(ValueError):
        cl.ClGemvConfig.from_name("CL_MT64_WN8_R2_U4_B2_S4")
    # K = 4096 over 8 splits: 64 tokens x (512 k x 2 B + 16) of activation, 4 warps x 3 stages x 16 rows x (256 + 16)
    # bytes of weight rings (the 64 x 64 float32 partial tile is smaller), an mbarrier per stage for the activation
    # (4), 12 for the rings
    assert cfg.smem_bytes(4096) == 64 * 1040 + 4 * 3 * 16 * 272 + 8 * 4 + 8 * 12
    assert "multiple of S x KC" in cl.config_error(cfg, 64, 4096, 4000)
    assert "shared memory" in cl.config_error(cl.ClGemvConfig(128, 8, 2, 128, 4, 2), 128, 4096, 4096)
    assert "S must be" in cl.config_error(cl.ClGemvConfig(64, 4, 2, 128, 3, 3), 64, 4096, 4608)
    assert "MT must be" in cl.config_error(cl.ClGemvConfig(24, 4, 2, 128, 3, 8), 24, 4096, 4096)
    assert "KC a multiple of 32" in cl.config_error(cl.ClGemvConfig(64, 4, 2, 96 + 8, 3, 8), 64, 4096, 4096)
    assert "multiple of 4" in cl.config_error(cl.ClGemvConfig(64, 2, 1, 64, 3, 8), 64, 4096, 4096)  # 16 rows / 8
    assert "D must be" in cl.config_error(cl.ClGemvConfig(64, 4, 2, 128, 3, 8, 1), 64, 4096, 4096)
    assert "D must be" in cl.config_error(cl.ClGemvConfig(64, 4, 2, 128, 3, 8, 7), 64, 4096, 4096)
    assert cl.config_error(cl.ClGemvConfig(64, 4, 2, 128, 3, 8, 3), 64, 4096, 4096) is None
    src = cl.source(cfg, 4096, False, 2, True)
    for define in ("CL_MT 64", "CL_WN 4", "CL_R 2", "CL_KC 128", "CL_NS 3", "CL_S 8", "CL_KS 512", "CL_DIAG 0",
                   "IN_F16 0", "OUT_KIND 2", "HAS_BIAS 1"):
        assert f"#define {define}\n" in src
    assert "mbarrier.try_wait" in src and "extern \"C\" __global__" in src  # cuda_common.cuh, then the kernel
    assert cl.cubin_name(cfg, 4096, False, 0, False) == "CL_MT64_WN4_R2_KC128_NS3_S8_K4096_F0_O0_B0.cubin"
    for c in cl.grid_configs(17, 4096, 14336, 132):
        assert cl.config_error(c, 17, 4096, 14336) is None and c.MT == 32


@pytest.mark.gpu
@pytest.mark.parametrize(("M", "N", "K", "cfg", "with_bias", "otype"), [
    (1, 100, 256, cl.ClGemvConfig(16, 2, 1, 64, 2, 2), True, torch.bfloat16),      # rows and tokens past N, M
    (17, 1000, 4096, cl.ClGemvConfig(32, 4, 2, 128, 3, 4), False, torch.float32),  # 8 stages: ring of 3
    (33, 256, 1024, cl.ClGemvConfig(64, 8, 1, 64, 4, 8), True, torch.float16),     # 8-CTA clusters; 2 stages < ring
    (97, 4100, 512, cl.ClGemvConfig(64, 4, 4, 64, 4, 1), False, torch.bfloat16),   # two M tiles, no cluster
    (128, 4096, 4096, cl.ClGemvConfig(128, 8, 2, 64, 3, 8), True, torch.bfloat16),  # the widest token tile
    (64, 1280, 8192, cl.ClGemvConfig(64, 4, 4, 64, 3, 8), False, torch.bfloat16),  # 16 stages: ring of 3
])
def test_clgemv_matches_reference_gpu(M, N, K, cfg, with_bias, otype):
    assert cl.config_error(cfg, M, N, K) is None
    # The cluster sums in rank order: bit-identical reruns.
    run_against_reference(lambda a, b, bias, out: cl.launch_clgemv(a, b, bias, out, cfg), M, N, K, with_bias, otype,
                          bit_identical_rerun=True)


def test_wsgemm_names_rejections_and_grid():
    cfg = ws.WsGemmConfig(128, 32, 64, 4, 8, 6)
    assert cfg.name == "WS_BN128_BM32_BK64_SK4_W8_S6" and ws.WsGemmConfig.from_name(cfg.name) == cfg
    with pytest.raises(ValueError, match="does not match"):
        ws.WsGemmConfig.from_name("WS_BN128_BM32")
    assert cfg.smem_bytes() == 6 * (128 + 32) * 64 * 2
    assert ws.WsGemmConfig.from_name(cfg.name + "_D3") == ws.WsGemmConfig(128, 32, 64, 4, 8, 6, 3)
    assert "D must be" in ws.config_error(ws.WsGemmConfig(128, 32, 64, 4, 8, 6, 5), 32, 4096, 4096)
    cpa = ws.WsGemmConfig(64, 16, 128, 1, 4, 4, 0, 8)
    assert cpa.name == "WS_BN64_BM16_BK128_SK1_W4_S4_P8" and ws.WsGemmConfig.from_name(cpa.name) == cpa
    assert cpa.chunk_rows == 16 and ws.config_error(cpa, 16, 4096, 4096) is None  # 8 warps x 2 rows of 256 B
    assert "multiples of the 32 rows" in ws.config_error(ws.WsGemmConfig(64, 16, 64, 1, 4, 4, 0, 8), 16, 4096, 4096)
    assert "PW in" in ws.config_error(ws.WsGemmConfig(64, 16, 128, 1, 4, 4, 0, 3), 16, 4096, 4096)
    assert "K % 16" in ws.config_error(cpa, 16, 4096, 4104)
    ps = ws.WsGemmConfig(64, 64, 64, 1, 4, 6, 0, 0, 2, 1)
    assert ps.name == "WS_BN64_BM64_BK64_SK1_W4_S6_E2_PS1" and ws.WsGemmConfig.from_name(ps.name) == ps
    assert ps.smem_bytes() == 6 * 128 * 64 * 2 + 64 * 64 * 4  # the epilogue's conversion beside the live ring
    assert "persistent" in ws.config_error(ws.WsGemmConfig(64, 64, 64, 2, 4, 6, 0, 0, 2, 1), 64, 4096, 4096)
    assert all(c.SK == 1 and -(-4096 // c.BN) * -(-256 // c.BM) >= 1.5 * c.PS * 132
               for c in ws.grid_configs(256, 4096, 4096, 132) if c.PS)
    assert ws.config_error(ws.WsGemmConfig(64, 16, 128, 1, 4, 4), 16, 4096, 4104) is None  # TMA: 16-byte rows do
    assert "shared memory" in ws.config_error(ws.WsGemmConfig(128, 256, 128, 1, 8, 4), 256, 4096, 4096)
    assert "BM must be" in ws.config_error(ws.WsGemmConfig(64, 20, 64, 1, 4, 4), 17, 4096, 4096)
    assert "16 rows per warp" in ws.config_error(ws.WsGemmConfig(64, 32, 64, 1, 8, 4), 32, 4096, 4096)
    assert "non-empty splits" in ws.config_error(ws.WsGemmConfig(64, 32, 64, 9, 4, 4), 32, 4096, 512)  # 8 K tiles
    assert "16-byte aligned" in ws.config_error(ws.WsGemmConfig(64, 32, 64, 1, 4, 4), 32, 4096, 4100)
    grid = ws.grid_configs(32, 1280, 8192, 132)
    assert grid and all(ws.config_error(c, 32, 1280, 8192) is None and c.BM in (16, 32) for c in grid)
    # N = 1280 leaves 5-40 tiles: every config splits K until the CTAs reach 0.9-2.2 per SM.
    assert all(c.SK > 1 and 0.9 * 132 <= -(-1280 // c.BN) * (32 // c.BM) * c.SK <= 2.2 * 132 for c in grid)
    assert all(c.SK == 1 for c in ws.grid_configs(64, 28672, 4096, 132) if c.BN == 64)
    # (64, 4096, 4096): two M tiles of 32 tokens fill 128 SMs without splitting K, as cuBLAS's 64x32 tiles do.
    assert ws.WsGemmConfig(64, 32, 128, 1, 4, 9) in ws.grid_configs(64, 4096, 4096, 132)


def test_wsgemm_cluster_names_rejections_and_grid():
    cfg = ws.WsGemmConfig(64, 32, 128, 4, 4, 8, 0, 4, 0, 0, 4)
    assert cfg.name == "WS_BN64_BM32_BK128_SK4_W4_S8_P4_CL4" and ws.WsGemmConfig.from_name(cfg.name) == cfg
    assert cfg.smem_bytes() == 8 * (64 + 32) * 128 * 2 + 2 * 64 * 32 * 4  # the ring, the partial and recv buffers
    assert ws.config_error(cfg, 32, 1280, 8192) is None
    for bad in (dict(SK=2), dict(CL=3, SK=3), dict(PW=0), dict(E=1), dict(D=3), dict(BN=64, CL=32, SK=32)):
        assert "cluster" in ws.config_error(ws.WsGemmConfig(**{**cfg.__dict__, **bad}), 32, 1280, 8192), bad
    grid = ws.grid_configs(64, 1280, 8192, 132, cluster=True)
    clusters = [c for c in grid if c.CL > 1]
    assert clusters and all(c.E == 0 for c in grid) and all(c.PW == 4 and c.SK == c.CL for c in clusters)
    assert all(0.9 * 132 <= -(-1280 // c.BN) * -(-64 // c.BM) * c.CL <= 2.2 * 132 for c in clusters)
    assert not any(c.CL > 1 for c in ws.grid_configs(64, 1280, 8192, 132))


def _sm90_ptx_in_fresh_process(cfg, has_bias: bool, tmp_path) -> str:
    """wsgemm's :func:`compile_offline` of ``cfg`` at (BM, 1280, 8192), its PTX. In a fresh process: the interpreted
    kernels of the other tests leave Triton's language patched for the interpreter."""
    out = tmp_path / "k.ptx"
    code = ("import sys; from op_tests.op_benchmarks.explore_decode_mid import wsgemm as ws; "
            f"k = ws.compile_offline(ws.WsGemmConfig.from_name({cfg.name!r}), {cfg.BM}, 1280, 8192, {has_bias}); "
            f"open({str(out)!r}, 'w').write(k.asm['ptx'])")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out.read_text()


@pytest.mark.skipif(ws.gluon is None, reason="Triton without Gluon")
@pytest.mark.parametrize(("cfg", "has_bias"), [
    (ws.WsGemmConfig(64, 32, 64, 3, 4, 6), True),     # one warpgroup, bias
    (ws.WsGemmConfig(128, 256, 64, 1, 8, 3), False),  # two consumer warpgroups, the widest token tile
    (ws.WsGemmConfig(64, 32, 128, 3, 4, 4, 0, 4), True),  # cp.async producers
    (ws.WsGemmConfig(64, 64, 64, 1, 4, 12, 0, 0, 1, 1), True),  # persistent, epilogue in the accumulator's layout
])
def test_wsgemm_compiles_for_sm90_on_cpu(cfg, has_bias, tmp_path):
    """Triton compiles the Gluon kernel for sm_90 without a GPU: a producer warp issuing TMA copies, consumer warps
    issuing wgmma of the tile's token width, registers handed between them (setmaxnreg)."""
    ptx = _sm90_ptx_in_fresh_process(cfg, has_bias, tmp_path)
    assert f"wgmma.mma_async.sync.aligned.m64n{cfg.BM}k16.f32.bf16.bf16" in ptx and "setmaxnreg" in ptx
    if cfg.PW:  # 16-byte cp.async (zero-filled past N, M, K), each thread arriving on the stage when they land
        assert "cp.async.bulk" not in ptx and "cp.async.mbarrier.arrive.noinc" in ptx
        assert ptx.count("cp.async.cg.shared.global") == (cfg.BN + cfg.BM) // cfg.chunk_rows
        assert all(", 0x10, " in line for line in ptx.splitlines() if "cp.async.cg.shared.global" in line)
    else:
        assert "cp.async.bulk.tensor.2d" in ptx
    # The split count is a run-time argument, folded when it is 1 (as Triton's JIT specialises an integer 1); the
    # persistent kernel has no split.
    assert ("atom.global" in ptx) == (cfg.SK > 1)


@pytest.mark.skipif(not wscl.HAS_CLUSTER, reason="Gluon inline_asm on shared memory: Triton >= 3.9")
@pytest.mark.parametrize("cfg", [ws.WsGemmConfig(64, 32, 128, 2, 4, 8, 0, 4, 0, 0, 2),
                                 ws.WsGemmConfig(128, 64, 64, 4, 8, 5, 0, 4, 0, 0, 4)])
def test_wsgemm_cluster_compiles_for_sm90_on_cpu(cfg, tmp_path):
    """The cluster kernel compiles for sm_90 as one CTA, and its PTX holds the exchange: the mbarriers'
    initialisation fenced to the cluster, one cluster-barrier arrive per partition and one wait, a local 16-byte
    store per 4 rows, a proxy fence, one bulk copy to each CTA of the cluster completing on its receive mbarrier, and
    a relaxed arrive on each CTA's done mbarrier; no release arrive (ptxas: a GPU-scope membar each), no atomics."""
    ptx = _sm90_ptx_in_fresh_process(cfg, True, tmp_path)
    assert ptx.count("fence.mbarrier_init.release.cluster") == 1
    assert ptx.count("barrier.cluster.arrive.relaxed.aligned") == 2 and ptx.count("barrier.cluster.wait") == 1
    per_thread = cfg.BN * cfg.BM // (cfg.W * 32)
    assert ptx.count("st.shared.v4.f32 [a]") == per_thread // 4 and "fence.proxy.async.shared::cta;" in ptx
    assert ptx.count("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes") == cfg.CL
    assert ptx.count("mbarrier.arrive.relaxed.cluster.shared::cluster.b64") == cfg.CL
    assert "mbarrier.arrive.release.cluster" not in ptx and "st.async" not in ptx
    assert "atom.global" not in ptx and ".reqntid " + str((cfg.W + cfg.PW) * 32) in ptx  # no idle warps


def _hopper() -> bool:
    return torch.cuda.is_available() and torch.version.hip is None and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.gpu
@pytest.mark.skipif(ws.gluon is None or not _hopper(), reason="wgmma, TMA and warp specialisation: NVIDIA sm_90+")
@pytest.mark.parametrize(("M", "N", "K", "cfg", "with_bias", "otype"), [
    (1, 100, 256, ws.WsGemmConfig(64, 16, 64, 1, 4, 3), True, torch.bfloat16),     # rows and tokens past N, M
    (17, 1000, 4104, ws.WsGemmConfig(64, 32, 64, 5, 4, 6), False, torch.float32),  # K tail, 5 splits
    (33, 256, 1024, ws.WsGemmConfig(128, 64, 128, 2, 8, 4), True, torch.float16),  # two warpgroups
    (97, 4100, 512, ws.WsGemmConfig(128, 64, 64, 1, 4, 8), False, torch.bfloat16),  # two M tiles, ring > K tiles
    (255, 1280, 8192, ws.WsGemmConfig(256, 256, 64, 4, 8, 3), True, torch.bfloat16),
    (1, 100, 272, ws.WsGemmConfig(64, 16, 128, 1, 4, 3, 0, 8), True, torch.bfloat16),     # cp.async: masks
    (17, 1000, 4112, ws.WsGemmConfig(64, 32, 64, 5, 4, 6, 0, 4), False, torch.float32),
    (97, 4100, 512, ws.WsGemmConfig(128, 64, 128, 2, 8, 4, 0, 4), True, torch.float16),  # two M tiles
    (255, 4100, 520, ws.WsGemmConfig(64, 32, 64, 1, 4, 6, 0, 0, 1, 1), True, torch.bfloat16),  # persistent: 8 x 65
    (97, 8200, 1024, ws.WsGemmConfig(64, 64, 128, 1, 4, 4, 0, 0, 2, 2), False, torch.float16),  # tiles, 2 per SM
])
def test_wsgemm_matches_reference_gpu(M, N, K, cfg, with_bias, otype):
    assert ws.config_error(cfg, M, N, K) is None
    # Splits summed in split order: bit-identical reruns.
    run_against_reference(lambda a, b, bias, out: ws.launch_wsgemm(a, b, bias, out, cfg), M, N, K, with_bias, otype,
                          bit_identical_rerun=True)
    for buf in gd._COUNTERS.values():
        assert int(buf.abs().sum()) == 0, "the last split of a tile resets its counter"


@pytest.mark.gpu
@pytest.mark.skipif(not wscl.HAS_CLUSTER or not _hopper(), reason="clusters and DSMEM: NVIDIA sm_90+, Triton >= 3.9")
@pytest.mark.parametrize(("M", "N", "K", "cfg", "with_bias", "otype"), [
    (1, 100, 272, ws.WsGemmConfig(64, 16, 64, 2, 4, 4, 0, 4, 0, 0, 2), True, torch.bfloat16),  # rows, tokens past N, M
    (17, 1000, 4112, ws.WsGemmConfig(64, 32, 128, 4, 4, 6, 0, 4, 0, 0, 4), False, torch.float32),  # K tail
    (33, 1280, 8192, ws.WsGemmConfig(64, 16, 128, 8, 4, 5, 0, 4, 0, 0, 8), True, torch.float16),  # 8 CTAs, 3 M tiles
    (97, 4100, 528, ws.WsGemmConfig(128, 64, 64, 2, 8, 5, 0, 4, 0, 0, 2), True, torch.bfloat16),  # two warpgroups
    (255, 1280, 8192, ws.WsGemmConfig(64, 128, 64, 4, 4, 6, 0, 4, 0, 0, 4), False, torch.bfloat16),
])
def test_wsgemm_cluster_matches_reference_gpu(M, N, K, cfg, with_bias, otype):
    assert ws.config_error(cfg, M, N, K) is None
    # The splits are summed in split order in the owning CTA: bit-identical reruns, and no counters involved.
    run_against_reference(lambda a, b, bias, out: ws.launch_wsgemm(a, b, bias, out, cfg), M, N, K, with_bias, otype,
                          bit_identical_rerun=True)


def test_write_csv_unions_the_keys_and_skips_empty(tmp_path):
    from op_tests.op_benchmarks.explore_decode_mid.explore_decode_mid_h100 import write_csv

    write_csv(tmp_path / "r.csv", [dict(config="a", err="x"), dict(config="b", err="1e-3", us=2.5)])
    assert (tmp_path / "r.csv").read_text().splitlines() == ["config,err,us", "a,x,", "b,1e-3,2.5"]
    write_csv(tmp_path / "none.csv", [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv"]  # no empty file, no temp file left


@pytest.mark.parametrize(("n", "programs", "block", "inter"), [(1000, 3, 128, 0), (4100, 5, 256, 1), (97, 4, 64, 0)])
def test_probe_read_floor_kernel_sums_each_slice(device, n, programs, block, inter):
    """The pure-read probe's kernel reads every element once: its per-program sums add up to the buffer's sum."""
    from op_tests.op_benchmarks.explore_decode_mid import probe_read_floor as prf
    w = torch.randn(n, dtype=torch.bfloat16, device=device)
    out = torch.zeros(programs, dtype=torch.float32, device=device)
    prf.launch_read(w, out, programs, block, 4, inter, "evict_first")
    torch.testing.assert_close(out.sum(), w.float().sum(), rtol=1e-4, atol=1e-3)
    assert prf.read_configs(132) and all(b // (w_ * 32) >= 8 for _, _, b, w_, _, _ in prf.read_configs(132))

