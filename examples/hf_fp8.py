"""The FP8 side of the Hugging Face examples: a model built from an FP8 checkpoint's ``config.json`` with random
weights quantized to transformers' ``FP8Linear`` (128x128 block scales, as DeepSeek-V3 / Qwen3-*-FP8 ship them; no
download), and the three arms :mod:`~examples.hf_decode` times on it in alternating rounds:

* ``tuned``: :func:`aiter_gemm.nn.patch_linear` (every FP8Linear on ``gemm_a8w8_blockscale`` with the tuned tables,
  the bf16 lm_head on ``gemm_a16w16``);
* ``torch_blockwise``: every FP8Linear on torch's block-scaled ``F.scaled_mm`` (the op's ``torch`` backend, bound
  once per shape, x_scale written M-major as it wants), the same activation quantizer, the lm_head on F.linear;
* ``bf16``: the same model with each FP8Linear's slot holding an ``nn.Linear`` of the dequantized weight (F.linear).

Switching arms puts module objects back in their parents' slots (no copy), as :class:`~examples.hf_model.
PatchState` does for the bf16 loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from aiter_gemm.kernels.a8w8_blockscale import SCALE_BLOCK, dequantize_weight_blockscale, quantize_weight_blockscale

ARMS = ("torch_blockwise", "tuned", "bf16")  # the baseline first: summaries divide by it
BASELINE = "torch_blockwise"


def fp8_settings(config: Any) -> dict[str, Any] | None:
    """``quantization_config`` of a transformers config (dict or object) as a dict; None for a bf16 config."""
    q = getattr(config, "quantization_config", None)
    if q is None:
        return None
    return dict(q) if isinstance(q, dict) else q.to_dict()


def quantize_linears(model: nn.Module, qcfg: dict[str, Any],
                     skip: tuple[str, ...] = ("lm_head",)) -> list[tuple[str, nn.Module, nn.Module]]:
    """Replace every ``nn.Linear`` of ``model`` (but ``skip`` and ``qcfg['modules_to_not_convert']``) by an
    ``FP8Linear`` holding its weight quantized per ``qcfg['weight_block_size']`` block (float32 scales, one layer at a
    time: no second copy of the model); the ``nn.Linear`` keeps the dequantized weight (the bf16 arm). Returns
    (qualified name, FP8Linear, nn.Linear) per replaced module."""
    from transformers.integrations.finegrained_fp8 import FP8Linear

    block = list(qcfg.get("weight_block_size") or [])
    if block != [SCALE_BLOCK, SCALE_BLOCK]:
        raise ValueError(f"quantization_config.weight_block_size {block or None}: this builder makes "
                         f"[{SCALE_BLOCK}, {SCALE_BLOCK}] blocks only")
    skip = tuple(skip) + tuple(qcfg.get("modules_to_not_convert") or ())
    out = []
    for name, module in list(model.named_modules()):
        for attr, child in list(module._modules.items()):
            full = f"{name}.{attr}" if name else attr
            if type(child) is not nn.Linear or any(full == s or full.endswith("." + s) for s in skip):
                continue
            with torch.device("meta"):
                fp8 = FP8Linear(child.in_features, child.out_features, block_size=tuple(block),
                                activation_scheme=qcfg.get("activation_scheme", "dynamic"),
                                has_bias=child.bias is not None)
            wq, ws = quantize_weight_blockscale(child.weight.detach())
            fp8.weight = nn.Parameter(wq, requires_grad=False)
            fp8.weight_scale_inv = nn.Parameter(ws, requires_grad=False)
            if child.bias is not None:
                fp8.bias = child.bias
            child.weight.data = dequantize_weight_blockscale(wq, ws).to(child.weight.dtype)
            module._modules[attr] = fp8
            out.append((full, fp8, child))
    return out


def torch_blockwise_gemm() -> Callable[..., torch.Tensor]:
    """The ``gemm`` of the torch_blockwise arm: torch's block-scaled matmul through the op's torch backend runner,
    bound once per shape (what the dispatcher runs for a ``libtype=torch`` row)."""
    from aiter_gemm.kernels.a8w8_blockscale_torch import launcher

    runners: dict[tuple, Callable] = {}

    def gemm(XQ, WQ, x_scale, w_scale, dtype):
        key = (XQ.shape[0], WQ.shape[0], XQ.shape[1], dtype)
        run = runners.get(key)
        if run is None:
            run = runners[key] = launcher(*key)
        return run(XQ, WQ, x_scale, w_scale, dtype)

    return gemm


class ArmState:
    """Which arm the FP8 model runs: module objects per slot for each of :data:`ARMS`, put back by :meth:`set_arm`
    (the interface of :class:`~examples.hf_model.PatchState`; ``control`` is a second baseline)."""

    arms = ARMS
    table_var = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE"
    experts: tuple[str, ...] = ()  # the FP8 loop patches linears only (PatchState's experts on fused_moe)

    def __init__(self, model: nn.Module, swapped: list[tuple[str, nn.Module, nn.Module]],
                 include: list[str] | None, exclude: list[str] | None) -> None:
        from aiter_gemm import fp8_linear
        from aiter_gemm.kernels.a8w8_blockscale_torch import shape_error
        from aiter_gemm.nn import patch_linear

        self.model, self.arm = model, "fp8"
        gemm = torch_blockwise_gemm()
        fp8_of = {name: fp8 for name, fp8, _ in swapped}
        self.names = patch_linear(model, include, exclude)  # the tuned arm: whatever patch_linear swaps
        if not self.names:
            raise SystemExit("patch_linear swapped no module: check --include / --exclude")
        self._slots: list[tuple[dict, str, dict[str, nn.Module]]] = []
        for parent in model.modules():
            for attr, child in parent._modules.items():
                original = child.__dict__.get("_aiter_original") if child is not None else None
                if original is None:
                    continue
                name = child.__dict__.get("_aiter_name")
                if name in fp8_of:
                    why = shape_error(1, original.out_features, original.in_features)
                    if why is not None:
                        raise SystemExit(f"{name}: torch's block-scaled matmul (the torch_blockwise arm) cannot run "
                                         f"it: {why}")
                    bf16 = next(lin for n, _, lin in swapped if n == name)
                    torch_arm = fp8_linear.from_fp8_linear(original, name, gemm=gemm, m_major=True)
                    arms = {"tuned": child, "torch_blockwise": torch_arm, "bf16": bf16}
                else:  # a bf16 module (lm_head): patched in the tuned arm only
                    arms = {"tuned": child, "torch_blockwise": original, "bf16": original}
                self._slots.append((parent._modules, attr, arms))
        self.fp8_suffixes = frozenset(n.rsplit(".", 1)[-1] for n in self.names if n in fp8_of)
        self.set_arm("tuned")

    def set_arm(self, arm: str) -> None:
        arm = BASELINE if arm == "control" else arm
        if arm == self.arm:
            return
        for modules, attr, arms in self._slots:
            modules[attr] = arms[arm]
        self.arm = arm

    def set(self, patched: bool) -> None:
        """PatchState's switch, for the capture: patched is the tuned arm."""
        self.set_arm("tuned" if patched else BASELINE)
