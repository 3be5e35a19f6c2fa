"""Every row of every shipped tuned CSV on its own shape: on CPU, the row parses and its backend accepts the shape (as
far as the CPU can tell: cuBLASLt rows decode, torch's block-scaled rows fit its layouts); on a GPU of the rows'
device class, each row runs its shape through the op and matches the float32 reference."""

from __future__ import annotations

import pytest
import torch

import aiter_gemm
from aiter_gemm.backends.base import GemmProblem
from aiter_gemm.backends.cublaslt import decode_algo
from aiter_gemm.configs import load_table
from aiter_gemm.device import DeviceIdentity
from aiter_gemm.kernels import a8w8_blockscale_torch as torch_bs
from aiter_gemm.kernels.common import INTERPRET
from aiter_gemm.ops.a8w8_blockscale import GEMM_A8W8_BLOCKSCALE
from aiter_gemm.ops.a16w16 import GEMM_A16W16
from aiter_gemm.ops.fused_moe import FUSED_MOE
from aiter_gemm.registry import get_backend
from aiter_gemm.settings import default_config_dir

OPS = [GEMM_A16W16, GEMM_A8W8_BLOCKSCALE]
FILES = {GEMM_A16W16.name: "bf16_tuned_gemm.csv", GEMM_A8W8_BLOCKSCALE.name: "a8w8_blockscale_tuned_gemm.csv",
         FUSED_MOE.name: "tuned_fmoe.csv"}
FP8 = torch.float8_e4m3fn


def _rows(op):
    return list(load_table(op.kind, [default_config_dir() / FILES[op.name]]))


def _problem(op, row) -> GemmProblem:
    if op is FUSED_MOE:
        return op.key_problem(row.key)
    if op is GEMM_A8W8_BLOCKSCALE:
        return GemmProblem(*row.key, False, FP8, torch.bfloat16)
    return GemmProblem(*row.key)


@pytest.mark.parametrize("op", [*OPS, FUSED_MOE], ids=lambda op: op.name)
def test_every_shipped_row_parses_and_its_backend_accepts_its_shape(op):
    rows = _rows(op)
    assert rows, f"{FILES[op.name]} ships rows"
    for row in rows:
        sol = op.row_solution(row)
        device = DeviceIdentity(row.gfx or "sm_90", row.cu_num, "cuda", "shipped")
        backend = get_backend(sol.libtype, op.backends)
        where = f"{FILES[op.name]}:{row.line} ({sol.libtype} {sol.kernelName[:40]})"
        pad = row.values.get("pad_m_min")
        assert pad is None or 1 <= pad <= row.key[0], where
        if sol.libtype == "cublaslt":  # replaying needs the library: on CPU, the struct must decode
            assert sol.solidx == -1 or len(decode_algo(sol.kernelName)[1]) == 64, where
        elif op is GEMM_A8W8_BLOCKSCALE and sol.libtype == "torch":
            assert torch_bs.shape_error(*row.key) is None, where
        else:
            why = backend.why_not(_problem(op, row), sol, device)
            if why is not None and INTERPRET and "needs TMA" in why:
                why = None  # the interpreter has no TMA; the row's sm_90 does (checked on a GPU below)
            assert why is None, where


@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_device_exact_shipped_rows_keep_a_row_for_the_device_class(op):
    """A shipped row tuned for one device (``device_name``, e.g. the H100) sits beside the row of its key that serves
    every device of its ``gfx`` and ``cu_num`` (the H200 is sm_90 / 132 too): an exact row never takes a tuned row
    away from the devices it was not measured on."""
    rows = _rows(op)
    generic = {(r.gfx, r.cu_num, r.key) for r in rows if r.device_name is None}
    for row in rows:
        if row.device_name is not None:
            assert (row.gfx, row.cu_num, row.key) in generic, f"{FILES[op.name]}:{row.line} ({row.device_name})"


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS, ids=lambda op: op.name)
def test_gpu_every_shipped_row_runs_its_shape_against_the_reference(op, clean_runtime):
    ident = aiter_gemm.current_device_identity(on_gpu=True)
    rows = [r for r in _rows(op) if r.cu_num == ident.cu_num and r.gfx in (None, ident.gfx)]
    if not rows:
        pytest.skip(f"no shipped {op.name} rows for {ident.gfx}/{ident.cu_num}")
    # A row whose backend cannot run here (cublaslt without nvmath-python) is a miss by design, not a broken row.
    dispatcher = aiter_gemm.get_dispatcher(op.name)
    missing = {lib for lib in {r.fields["libtype"] for r in rows} if not dispatcher.backend(lib).is_available()}
    rows = [r for r in rows if r.fields["libtype"] not in missing]
    if not rows:
        pytest.skip(f"the backends of every shipped {op.name} row are unavailable here: {sorted(missing)}")
    from aiter_gemm.kernels.a8w8_blockscale import gemm_a8w8_blockscale_ref, quantize_blockscale
    from aiter_gemm.ops.a8w8_blockscale import gemm_a8w8_blockscale, get_GEMM_A8W8_BLOCKSCALE_config

    for row in rows:
        M, N, K = row.key[:3]
        gen = torch.Generator(device="cuda").manual_seed(M + N + K)
        x = torch.randn(M, K, generator=gen, device="cuda")
        w = torch.randn(N, K, generator=gen, device="cuda") / K ** 0.5
        if op is GEMM_A8W8_BLOCKSCALE:
            XQ, WQ, xs, ws = quantize_blockscale(x, w)
            assert get_GEMM_A8W8_BLOCKSCALE_config(M, N, K)["matched"] == "exact"
            out, ref = gemm_a8w8_blockscale(XQ, WQ, xs, ws), gemm_a8w8_blockscale_ref(XQ, WQ, xs, ws, torch.float32)
        else:
            a, b = x.to(row.key[4]), w.to(row.key[4])
            assert aiter_gemm.get_GEMM_A16W16_config(M, N, K, row.key[3], row.key[4])["matched"] == "exact"
            out, ref = aiter_gemm.gemm_a16w16(a, b), a.float() @ b.float().t()
        err = float((out.double() - ref.double()).norm() / ref.double().norm())
        assert err < 1e-2, f"{FILES[op.name]}:{row.line}: relative error {err:.3g}"
