"""Backend ``triton``: kernel correctness on odd shapes (interpreter on CPU, bf16/fp16 on a GPU), split-K, bias,
output dtypes, the kernelName encoding, JSON config selection and the shared-memory-pruned config space."""

from __future__ import annotations

import json
import logging
import re

import pytest
import torch

from aiter_gemm.backends import triton as tb
from aiter_gemm.backends.base import GemmProblem, Solution
from aiter_gemm.device import DeviceIdentity, has_tma, smem_limit
from aiter_gemm.kernels.gemm_a16w16 import INTERPRET, GemmConfig, gemm_a16w16_ref, launch_gemm_a16w16
from aiter_gemm.ops import a16w16 as a16
from aiter_gemm.registry import get_backend
from aiter_gemm.settings import default_config_dir
from op_tests.runtime_helpers import BF16_HEADER, BIAS_LAYOUTS, bf16_row, strided_bias

HAS_GPU = torch.cuda.is_available()
DEV = "cuda" if HAS_GPU else "cpu"
IDENT = DeviceIdentity("sm_90", 132, "cuda", "H100") if HAS_GPU else DeviceIdentity("cpu", 2, "cpu", "cpu")

# Relative Frobenius error against the float32 reference, by output dtype. The products of 16-bit inputs are exact
# in float32 and accumulate in float32, so what is left is the rounding of the output: unit roundoff 2^-8 (bf16),
# 2^-11 (fp16), and for fp32 output only accumulation order (~K * 2^-24 worst case, far less in norm).
TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}

# Small tiles keep the interpreter fast; SK3 splits K unevenly (odd split count, ragged last split).
CONFIGS = {
    "nosplit": GemmConfig(16, 32, 32, 1, 1, 4, 2),
    "splitk3": GemmConfig(32, 64, 64, 4, 3, 4, 2),
    # N and K compiled in (_SP): the masks of ragged N / K tails become constants.
    "nosplit_sp": GemmConfig(16, 32, 32, 1, 1, 4, 2, SPECIALIZE=True),
    "splitk3_sp": GemmConfig(32, 64, 64, 4, 3, 4, 2, SPECIALIZE=True),
}


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(out).all(), "output has non-finite values (unwritten elements?)"
    return ((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("dtype,otype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32),
                                         (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("N,K", [(97, 200), (200, 97), (64, 4100)])
@pytest.mark.parametrize("M", [1, 3, 16, 17, 33])
def test_kernel_matches_reference(M, N, K, dtype, otype, config, bias):
    torch.manual_seed(M * 7919 + N * 31 + K)
    a = torch.randn(M, K, dtype=dtype, device=DEV)
    b = torch.randn(N, K, dtype=dtype, device=DEV)
    bvec = torch.randn(N, dtype=dtype, device=DEV) if bias else None
    out = torch.full((M, N), float("nan"), dtype=otype, device=DEV)  # poisoned: every element must be written
    launch_gemm_a16w16(a, b, bvec, out, CONFIGS[config])
    assert _rel_err(out, gemm_a16w16_ref(a, b, bvec, torch.float32)) < TOL[otype]


def test_non_contiguous_operands():
    """Any strides: A transposed in memory, B a column slice."""
    a = torch.randn(40, 17, dtype=torch.float16, device=DEV).t()  # (17, 40), stride (1, 17)
    b = torch.randn(97, 80, dtype=torch.float16, device=DEV)[:, ::2]  # (97, 40), stride (80, 2)
    out = torch.empty(17, 97, dtype=torch.float32, device=DEV)
    launch_gemm_a16w16(a, b, None, out, CONFIGS["splitk3"])
    assert _rel_err(out, gemm_a16w16_ref(a, b, None, torch.float32)) < TOL[torch.float32]


@pytest.mark.parametrize("layout", BIAS_LAYOUTS)
@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_bias_read_by_its_stride(config, layout):
    """A strided, column-of-2-D or stride-0 bias, in the kernel's epilogue and in split-K's reduce (issue 31: read
    as contiguous, it was off by 3-4.5 here and by 5.6 on the H100)."""
    torch.manual_seed(1)
    a = torch.randn(3, 64, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(40, 64, dtype=torch.bfloat16, device=DEV)
    bias = strided_bias(layout, 40, torch.bfloat16, DEV)
    out = torch.full((3, 40), float("nan"), dtype=torch.float32, device=DEV)
    launch_gemm_a16w16(a, b, bias, out, CONFIGS[config])
    assert _rel_err(out, gemm_a16w16_ref(a, b, bias.contiguous(), torch.float32)) < TOL[torch.float32]


@pytest.mark.parametrize("name", ["BM128_BN128_BK64_GM8_SK1_W8_S3", "BM16_BN64_BK128_GM1_SK4_W4_S4",
                                  "BM128_BN256_BK64_GM8_SK1_W8_S3_TMA", "BM128_BN256_BK64_GM8_SK1_W8_S3_TMAF",
                                  "BM32_BN64_BK128_GM8_SK2_W4_S4_SP"])
def test_kernel_name_round_trip(name):
    assert GemmConfig.from_name(name).name == name


@pytest.mark.parametrize("name", ["", "auto", "BM128_BN128_BK64_GM8_SK1_W8", "BM100_BN128_BK64_GM8_SK1_W8_S3",
                                  "BM128_BN128_BK64_GM8_SK2_W8_S3_TMA", "bm128_BN128_BK64_GM8_SK1_W8_S3",
                                  "BM128_BN128_BK64_GM8_SK1_W8_S3_X", "BM128_BN128_BK64_GM8_SK1_W8_S3_TMAX",
                                  "BM128_BN128_BK64_GM8_SK1_W8_S3_SP_TMA", "BM128_BN128_BK64_GM8_SK1_W8_S3_TMA_SP"])
def test_kernel_name_rejects_malformed(name):
    with pytest.raises(ValueError):
        GemmConfig.from_name(name)


#: Out of range (issue 47: each passed, then failed to compile on every call) or not ASCII digits.
OUT_OF_RANGE = [
    ("BM16_BN32_BK32_GM2147483648_SK1_W4_S2", "GROUP_SIZE_M=2147483648 must be in 1..1024"),
    ("BM16_BN32_BK32_GM1025_SK1_W4_S2", "GROUP_SIZE_M=1025 must be in 1..1024"),
    ("BM16_BN32_BK32_GM1_SK257_W4_S2", "NUM_KSPLIT=257 must be in 1..256"),
    ("BM16_BN32_BK32_GM1_SK1_W4_S9", "num_stages=9 must be in 1..8"),
    ("BM1024_BN1024_BK16_GM1_SK1_W16_S1", "a 1024x1024 accumulator tile is above 65536 elements"),
    ("BM16_BN32_BK131072_GM1_SK1_W4_S2", "Triton compiles none above 1048576"),
    ("BM16_BN32_BK32_GM" + "1" * 5000 + "_SK1_W4_S2", "more than 18 digits"),
    ("BM\u0661\u0666_BN32_BK32_GM1_SK1_W4_S2", "ASCII digits"),  # Arabic-Indic 16
]


@pytest.mark.parametrize("name,why", OUT_OF_RANGE)
def test_kernel_name_ranges(name, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        GemmConfig.from_name(name)
    for limit in ("BM16_BN32_BK1024_GM1024_SK256_W4_S8", "BM1024_BN64_BK1024_GM1_SK1_W8_S1"):
        assert GemmConfig.from_name(limit).name == limit


@pytest.mark.parametrize("name,why", OUT_OF_RANGE[:2])
def test_out_of_range_row_is_a_miss_warned_once(tmp_path, clean_runtime, caplog, name, why):
    """Issue 47: a row naming GROUP_SIZE_M 2**31 passed validation and failed on every call (the interpreter's int32
    overflow; a CompilationError on the H200). Now it is a miss: the default runs, one warning names file and line."""
    import aiter_gemm

    path = tmp_path / "t.csv"
    path.write_text(BF16_HEADER + bf16_row(4, 32, 32, "triton", dtype="torch.bfloat16", kernel=name))
    clean_runtime.setenv("AITER_CONFIG_GEMM_BF16", str(path))
    aiter_gemm.reload_configs()
    a, b = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(32, 32, dtype=torch.bfloat16)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            out = aiter_gemm.gemm_a16w16(a, b)
            assert _rel_err(out, gemm_a16w16_ref(a, b)) < TOL[torch.bfloat16]
    assert aiter_gemm.get_GEMM_A16W16_config(4, 32, 32, False, torch.bfloat16)["matched"] == "default"
    warned = [r.getMessage() for r in caplog.records if f"{path}:2" in r.getMessage()]
    assert len(warned) == 1 and why in warned[0] and "row ignored" in warned[0]


def _write(path, data):
    path.write_text(json.dumps(data))


def _entry(bm, **kw):
    base = dict(BLOCK_SIZE_M=bm, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1, NUM_KSPLIT=1, num_warps=4,
                num_stages=3)
    base.update(kw)
    return base


def test_json_selection_order_and_override(tmp_path):
    tdir = tmp_path / "triton"
    tdir.mkdir()
    # Keys deliberately out of order in the file: lookup must sort them ascending, 'any' last.
    _write(tdir / "sm_90-GEMM-A16W16.json", {"any": _entry(128), "M_LEQ_64": _entry(64), "M_LEQ_16": _entry(16)})
    _write(tdir / "sm_90-GEMM-A16W16-N=256-K=512.json", {"M_LEQ_32": _entry(32, NUM_KSPLIT=2, waves_per_eu=2)})
    a16.clear_config_cache()
    pick = lambda m, n=100, k=100: a16.json_config(m, n, k, "sm_90", [tdir]).BLOCK_SIZE_M  # noqa: E731
    assert [pick(1), pick(16), pick(17), pick(64), pick(65), pick(10**6)] == [16, 16, 64, 64, 128, 128]
    assert pick(20, 256, 512) == 32 and a16.json_config(20, 256, 512, "sm_90", [tdir]).NUM_KSPLIT == 2
    assert pick(33, 256, 512) == 64  # N-K file has no matching key: the arch file answers
    assert a16.json_config(1, 1, 1, "gfx942", [tdir]) is None


@pytest.mark.parametrize("content,needle", [
    ({"M_LE_16": _entry(16)}, "'M_LE_16'"),
    ({"any": {**_entry(16), "BLOCK_SIZE_Q": 1}}, "BLOCK_SIZE_Q"),
    ({"any": {k: v for k, v in _entry(16).items() if k != "num_warps"}}, "num_warps"),
    ({"M_LEQ_8": _entry(24)}, "BLOCK_SIZE_M=24"),
    ({"any": [1, 2]}, "'any'"),
    ({"any": _entry(16, GROUP_SIZE_M=2**31)}, "GROUP_SIZE_M=2147483648 must be in 1..1024"),  # issue 47
    ({"any": _entry(16, GROUP_SIZE_M=1e23)}, "GROUP_SIZE_M must be an integer, got 1e+23"),
    ({"any": _entry(16, num_stages=float("inf"))}, "num_stages must be an integer, got inf"),
    ({"any": _entry(16, num_warps=True)}, "num_warps must be an integer, got True"),
    ({"any": _entry(16, GROUP_SIZE_M="4_0")}, "GROUP_SIZE_M must be an integer, got '4_0'"),
])
def test_json_errors_name_file_and_key(tmp_path, content, needle):
    (tmp_path / "triton").mkdir()
    _write(tmp_path / "triton" / "sm_90-GEMM-A16W16.json", content)
    a16.clear_config_cache()
    with pytest.raises(ValueError, match="sm_90-GEMM-A16W16.json") as exc:
        a16.json_config(4, 8, 8, "sm_90", [tmp_path / "triton"])
    assert needle in str(exc.value)


@pytest.mark.parametrize("text,why", [
    ('{"any": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    ('{"any": {"BLOCK_SIZE_M": ' + "1" * 5000 + "}}", "integer string conversion"),
])
def test_json_text_json_cannot_take_names_the_file(tmp_path, text, why):
    """Issue 47: a RecursionError or int()'s digit-limit ValueError left the reader naming no file."""
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "sm_90-GEMM-A16W16.json").write_text(text)
    a16.clear_config_cache()
    with pytest.raises(ValueError, match=rf"sm_90-GEMM-A16W16\.json: not readable as JSON: .*{why}"):
        a16.json_config(4, 8, 8, "sm_90", [tmp_path / "triton"])


def test_invalid_json_reports_line(tmp_path):
    (tmp_path / "triton").mkdir()
    (tmp_path / "triton" / "sm_90-GEMM-A16W16.json").write_text('{\n  "any": {,}\n}')
    a16.clear_config_cache()
    with pytest.raises(ValueError, match=r"line 2"):
        a16.json_config(4, 8, 8, "sm_90", [tmp_path / "triton"])


def test_shipped_json_files_parse_and_fit():
    """Every shipped configs/triton file parses, and each config fits its arch (shared memory, TMA)."""
    files = sorted((default_config_dir() / "triton").glob("*-GEMM-A16W16*.json"))
    assert files, "sm_90 configs are shipped"
    a16.clear_config_cache()
    for path in files:
        arch = path.name.split("-GEMM-")[0]
        for _bound, _key, cfg in a16.json_buckets(path):
            assert cfg.smem_bytes() <= smem_limit(arch), f"{path.name}: {cfg.name}"
            assert not cfg.TMA_PERSISTENT or has_tma(arch), f"{path.name}: {cfg.name}"


@pytest.mark.parametrize("M", [1, 64, 4096])
def test_config_space_pruned_by_shared_memory(M):
    space = tb.config_space(M, 4096, 4096, "sm_90", 132)
    assert space and all(c.smem_bytes() <= 227 * 1024 for c in space)
    assert any(c.TMA_PERSISTENT for c in space) == (M >= 64 and not INTERPRET)  # no TMA in the interpreter
    big = GemmConfig(128, 256, 128, 8, 1, 8, 4)  # 4 * (128 + 256) * 128 * 2 B = 384 KiB: cannot launch on Hopper
    assert not tb.config_supported(big, M, 4096, 4096, "sm_90")
    assert tb.config_supported(GemmConfig(128, 256, 64, 8, 1, 8, 3), M, 4096, 4096, "sm_90")
    mi300 = tb.config_space(M, 4096, 4096, "gfx942", 304)
    assert all(c.smem_bytes() <= 64 * 1024 and not c.TMA_PERSISTENT for c in mi300)


def test_split_k_only_when_tiles_underfill():
    assert any(c.NUM_KSPLIT > 1 for c in tb.config_space(1, 1280, 8192, "sm_90", 132))
    assert all(c.NUM_KSPLIT == 1 for c in tb.config_space(4096, 4096, 4096, "sm_90", 132))


def test_registered_and_not_a_default():
    backend = get_backend("triton")
    assert backend.name == "triton" and backend.is_available(), backend.unavailable_reason()
    assert backend.default_priority == 0
    assert backend.default_for(GemmProblem(1, 4096, 4096), IDENT) is None


def test_prepare_rejects_unsupported():
    backend = tb.BACKEND
    sol = Solution("triton", 0, 0, "")
    assert backend.prepare(GemmProblem(4, 8, 8, dtype=torch.float32, otype=torch.float32), sol, IDENT) is None
    assert backend.prepare(GemmProblem(4, 8, 8, scaleAB=True), sol, IDENT) is None
    assert backend.prepare(GemmProblem(4, 8, 8), Solution("triton", 0, 0, "garbage"), IDENT) is None
    too_big = Solution("triton", 0, 1, "BM256_BN256_BK128_GM1_SK1_W8_S4")
    assert backend.prepare(GemmProblem(4096, 4096, 4096), too_big, DeviceIdentity("sm_90", 132, "cuda")) is None
    tma = Solution("triton", 0, 1, "BM128_BN128_BK64_GM8_SK1_W8_S3_TMA")
    assert backend.prepare(GemmProblem(256, 256, 256), tma, DeviceIdentity("gfx942", 304, "hip")) is None


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("M,N,K", [(3, 97, 200), (33, 64, 4100)])
def test_candidates_all_prepare_and_run(M, N, K, bias):
    """Tuner space == what prepare accepts; a sample of candidates computes the right thing through the runner."""
    problem = GemmProblem(M, N, K, bias, torch.bfloat16, torch.bfloat16)
    cands = tb.BACKEND.candidates(problem, IDENT)
    assert cands and all(tb.BACKEND.prepare(problem, s, IDENT) is not None for s in cands)
    a = torch.randn(M, K, dtype=torch.bfloat16, device=DEV)
    b = torch.randn(N, K, dtype=torch.bfloat16, device=DEV)
    bvec = torch.randn(N, dtype=torch.bfloat16, device=DEV) if bias else None
    ref = gemm_a16w16_ref(a, b, bvec, torch.float32)
    # On a GPU every 12th candidate (compiles cost ~1 s each); the interpreter runs the plainest and most split.
    sample = cands[::12] if HAS_GPU else [
        min(cands, key=lambda s: (GemmConfig.from_name(s.kernelName).NUM_KSPLIT, s.kernelName)),
        max(cands, key=lambda s: GemmConfig.from_name(s.kernelName).NUM_KSPLIT)]
    for sol in sample:
        run = tb.BACKEND.prepare(problem, sol, IDENT)
        out = run(a, b, bvec, torch.bfloat16, None, None, None)
        assert out.shape == (M, N) and out.dtype == torch.bfloat16
        assert _rel_err(out, ref) < TOL[torch.bfloat16], sol.kernelName


def test_json_tma_config_degrades_on_unaligned_rows(tmp_path, monkeypatch):
    """A JSON TMA config on K=97 (194-byte rows, not 16-byte aligned) runs the same tile on the classic kernel."""
    (tmp_path / "triton").mkdir()
    _write(tmp_path / "triton" / "sm_90-GEMM-A16W16.json", {"any": _entry(64, TMA_PERSISTENT=True)})
    monkeypatch.setattr(a16, "_config_dirs", lambda: (tmp_path / "triton",))
    a16.clear_config_cache()
    cfg = a16.select_config(GemmProblem(64, 64, 97), Solution("triton"), "sm_90")
    assert cfg.BLOCK_SIZE_M == 64 and not cfg.TMA_PERSISTENT
    a16.clear_config_cache()


def test_default_row_uses_json_or_builtin():
    problem = GemmProblem(5, 97, 200, False, torch.float16, torch.float32)
    run = tb.BACKEND.prepare(problem, Solution("triton", 0, 0, "auto"), IDENT)
    a = torch.randn(5, 200, dtype=torch.float16, device=DEV)
    b = torch.randn(97, 200, dtype=torch.float16, device=DEV)
    out = run(a, b, None, torch.float32, None, None, None)
    assert _rel_err(out, gemm_a16w16_ref(a, b, None, torch.float32)) < TOL[torch.float32]


@pytest.mark.gpu
@pytest.mark.parametrize("suffix", ["_TMA", "_TMAF"])
@pytest.mark.parametrize("M", [64, 200, 1000])
def test_tma_persistent_on_gpu(M, suffix):
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA needs sm_90+")
    a = torch.randn(M, 1000, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(520, 1000, dtype=torch.bfloat16, device="cuda")
    bvec = torch.randn(520, dtype=torch.bfloat16, device="cuda")
    out = torch.full((M, 520), float("nan"), dtype=torch.bfloat16, device="cuda")
    launch_gemm_a16w16(a, b, bvec, out, GemmConfig.from_name("BM128_BN128_BK64_GM8_SK1_W8_S3" + suffix), 132)
    assert _rel_err(out, gemm_a16w16_ref(a, b, bvec, torch.float32)) < TOL[torch.bfloat16]


def test_env_config_dirs_searched_first_and_reload_rereads(tmp_path, clean_runtime):
    """AITER_GEMM_TRITON_CONFIGS folders come before the shipped ones; reload_configs() re-reads edited files."""
    import aiter_gemm

    a16.clear_config_cache()
    _write(tmp_path / "sm_90-GEMM-A16W16-N=4096-K=4096.json", {"any": _entry(16)})
    clean_runtime.setenv("AITER_GEMM_TRITON_CONFIGS", str(tmp_path))
    aiter_gemm.reload_configs()
    assert a16.json_config(1, 4096, 4096, "sm_90").BLOCK_SIZE_M == 16
    _write(tmp_path / "sm_90-GEMM-A16W16-N=4096-K=4096.json", {"any": _entry(32)})
    assert a16.json_config(1, 4096, 4096, "sm_90").BLOCK_SIZE_M == 16, "parsed once until reload"
    aiter_gemm.reload_configs()
    assert a16.json_config(1, 4096, 4096, "sm_90").BLOCK_SIZE_M == 32
