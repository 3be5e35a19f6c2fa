"""The FP8 side of the Hugging Face examples: a model built from an FP8 checkpoint's ``config.json`` with random
weights quantized as transformers loads such a checkpoint (128x128 block scales, as DeepSeek-V3 / Qwen3-*-FP8 ship
them; no download): every ``nn.Linear`` to ``FP8Linear``, an MoE model's experts modules to transformers' ``FP8Experts``
(:func:`quantize_model`), and the three arms :mod:`~examples.hf_decode` times on it in alternating rounds:

* ``tuned``: :func:`aiter_gemm.nn.patch_linear` (every FP8Linear on ``gemm_a8w8_blockscale`` with the tuned tables,
  the bf16 lm_head on ``gemm_a16w16``) and :func:`aiter_gemm.nn.patch_moe` (the FP8 experts on ``fused_moe``);
* ``torch_blockwise``: every FP8Linear on torch's block-scaled ``F.scaled_mm`` (the op's ``torch`` backend, bound
  once per shape, x_scale written M-major as it wants), the same activation quantizer, the lm_head on F.linear; the
  FP8 experts on :data:`TORCH_EXPERTS`: fused_moe's torch loop (one GEMM pair per expert that got tokens) on the same
  matmul;
* ``bf16``: the same model with each FP8 module's slot holding its bf16 twin of the dequantized weights (F.linear;
  the experts on the model's own bf16 implementation, ``grouped_mm`` by default).

transformers' own FP8 kernels load from its kernels hub at run time, so no arm uses them. Switching arms puts module
objects back in their parents' slots (no copy) and the experts config's implementation name, as :class:`~examples.
hf_model.PatchState` does for the bf16 loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from aiter_gemm.kernels.a8w8_blockscale import SCALE_BLOCK, dequantize_weight_blockscale, quantize_weight_blockscale

ARMS = ("torch_blockwise", "tuned", "bf16")  # the baseline first: summaries divide by it
BASELINE = "torch_blockwise"
#: The experts implementation of the torch_blockwise arm, registered with transformers' FP8 experts interface.
TORCH_EXPERTS = "aiter_gemm_torch_blockwise"


def fp8_settings(config: Any) -> dict[str, Any] | None:
    """``quantization_config`` of a transformers config (dict or object) as a dict; None for a bf16 config."""
    q = getattr(config, "quantization_config", None)
    if q is None:
        return None
    return dict(q) if isinstance(q, dict) else q.to_dict()


def _block_size(qcfg: dict[str, Any]) -> tuple[int, int]:
    block = list(qcfg.get("weight_block_size") or [])
    if block != [SCALE_BLOCK, SCALE_BLOCK]:
        raise ValueError(f"quantization_config.weight_block_size {block or None}: this builder makes "
                         f"[{SCALE_BLOCK}, {SCALE_BLOCK}] blocks only")
    return SCALE_BLOCK, SCALE_BLOCK


def _children(model: nn.Module, skip: tuple[str, ...], qcfg: dict[str, Any]):
    """(parent, attribute, qualified name, child) of every child module not named by ``skip`` nor
    ``qcfg['modules_to_not_convert']``."""
    skip = tuple(skip) + tuple(qcfg.get("modules_to_not_convert") or ())
    for name, module in list(model.named_modules()):
        for attr, child in list(module._modules.items()):
            full = f"{name}.{attr}" if name else attr
            if child is not None and not any(full == s or full.endswith("." + s) for s in skip):
                yield module, attr, full, child


def quantize_model(model: nn.Module, qcfg: dict[str, Any],
                   skip: tuple[str, ...] = ("lm_head",)) -> list[tuple[str, nn.Module, nn.Module]]:
    """:func:`quantize_linears` then :func:`quantize_experts`: the model as transformers loads an FP8 checkpoint of
    it; (qualified name, FP8 module, bf16 twin) per replaced module."""
    return quantize_linears(model, qcfg, skip) + quantize_experts(model, qcfg, skip)


def quantize_linears(model: nn.Module, qcfg: dict[str, Any],
                     skip: tuple[str, ...] = ("lm_head",)) -> list[tuple[str, nn.Module, nn.Module]]:
    """Replace every ``nn.Linear`` of ``model`` (but ``skip`` and ``qcfg['modules_to_not_convert']``) by an
    ``FP8Linear`` holding its weight quantized per ``qcfg['weight_block_size']`` block (float32 scales, one layer at a
    time: no second copy of the model); the ``nn.Linear`` keeps the dequantized weight (the bf16 arm). Returns
    (qualified name, FP8Linear, nn.Linear) per replaced module."""
    from transformers.integrations.finegrained_fp8 import FP8Linear

    block = _block_size(qcfg)
    out = []
    for module, attr, full, child in _children(model, skip, qcfg):
        if type(child) is not nn.Linear:
            continue
        with torch.device("meta"):
            fp8 = FP8Linear(child.in_features, child.out_features, block_size=block,
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


def fp8_experts_class() -> type:
    """transformers' ``FP8Experts`` dispatched through its FP8 experts interface, gated, no bias (what
    ``replace_with_fp8_linear`` builds; ``use_experts_implementation`` rewrites the class in place, so once)."""
    from transformers.integrations import finegrained_fp8
    from transformers.integrations.moe import use_experts_implementation

    cls = finegrained_fp8.FP8Experts
    if not hasattr(cls.forward, "__wrapped__"):
        use_experts_implementation(cls, experts_interface=finegrained_fp8.ALL_FP8_EXPERTS_FUNCTIONS)
    return cls


def quantize_experts(model: nn.Module, qcfg: dict[str, Any],
                     skip: tuple[str, ...] = ()) -> list[tuple[str, nn.Module, nn.Module]]:
    """Replace every experts module of ``model`` (:func:`aiter_gemm.hf_moe.is_experts_module`: gate_up_proj
    (E, 2I, H), down_proj (E, H, I)) by transformers' ``FP8Experts`` holding its weights quantized per expert and
    (128, 128) block, one expert at a time; the bf16 module keeps the dequantized weights (the bf16 arm). Returns
    (qualified name, FP8Experts, bf16 module) per replaced module; ValueError naming a layout it cannot build."""
    from aiter_gemm.hf_moe import is_experts_module

    block = _block_size(qcfg)
    out = []
    for module, attr, full, child in _children(model, skip, qcfg):
        if not is_experts_module(child):
            continue
        if getattr(child, "has_bias", False) or not getattr(child, "has_gate", True) or \
                getattr(child, "is_transposed", False) or "gate_up_proj" not in child._parameters:
            raise ValueError(f"{full}: {type(child).__qualname__} is not gated [gate; up] experts without bias "
                             "(gate_up_proj (E, 2I, H), down_proj (E, H, I)): this builder makes those only")
        with torch.device("meta"):
            fp8 = fp8_experts_class()(child.config, block_size=block,
                                      activation_scheme=qcfg.get("activation_scheme", "dynamic"))
        for pname in ("gate_up_proj", "down_proj"):
            w = child._parameters[pname]
            E, N, K = w.shape
            wq = torch.empty((E, N, K), dtype=torch.float8_e4m3fn, device=w.device)
            ws = torch.empty((E, -(-N // SCALE_BLOCK), -(-K // SCALE_BLOCK)), dtype=torch.float32, device=w.device)
            for e in range(E):
                wq[e], ws[e] = quantize_weight_blockscale(w.detach()[e])
                w.data[e] = dequantize_weight_blockscale(wq[e], ws[e]).to(w.dtype)
            setattr(fp8, pname, nn.Parameter(wq, requires_grad=False))
            setattr(fp8, pname + "_scale_inv", nn.Parameter(ws, requires_grad=False))
        module._modules[attr] = fp8
        out.append((full, fp8, child))
    return out


def torch_blockwise_gemm() -> Callable[..., torch.Tensor]:
    """The ``gemm`` of the torch_blockwise arm: torch's block-scaled matmul through the op's torch backend runner,
    bound once per shape and device (what the dispatcher runs for a ``libtype=torch`` row: on a GPU its cached
    cuBLASLt plan where one is made). A w_scale whose K blocks are padded to a multiple of 4
    (:func:`~aiter_gemm.kernels.a8w8_blockscale_torch.pad_scale_blocks`) takes any whole-block K (torch's op runs
    it); a float32 output (the experts loop's first GEMM) is torch's bf16 one, widened."""
    from aiter_gemm.kernels.a8w8_blockscale_torch import launcher

    runners: dict[tuple, Callable] = {}

    def gemm(XQ, WQ, x_scale, w_scale, dtype):
        out_dtype = torch.bfloat16 if dtype == torch.float32 else dtype
        M, K = XQ.shape
        padded = w_scale.shape[-1] != -(-K // SCALE_BLOCK)
        key = (M, WQ.shape[0], K, out_dtype, XQ.device, padded)
        run = runners.get(key)
        if run is None:
            run = runners[key] = launcher(*key[:5], padded_scales=padded)
        out = run(XQ, WQ, x_scale, w_scale, out_dtype)
        return out if out_dtype == dtype else out.to(dtype)

    return gemm


def torch_blockwise_experts() -> Callable[..., torch.Tensor]:
    """The experts forward of the torch_blockwise arm (transformers' signature): ``fused_moe``'s torch loop
    (:mod:`aiter_gemm.kernels.fused_moe_torch`: one GEMM pair per expert that got tokens, after one host sync; every
    expert over every token while a CUDA graph is captured) on :func:`torch_blockwise_gemm`, activation scales
    M-major, scales K-padded once per module. Bound per module and call shape (held in the module's ``__dict__``);
    ValueError for a module it cannot run."""
    from aiter_gemm import hf_moe
    from aiter_gemm.kernels import fused_moe_torch
    from aiter_gemm.kernels.a8w8_blockscale_torch import pad_scale_blocks
    from aiter_gemm.ops.fused_moe import problem_of

    gemm = torch_blockwise_gemm()

    def forward(self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        params = self._parameters
        w1, w2 = params["gate_up_proj"], params["down_proj"]
        bound = self.__dict__.setdefault(_BOUND, {})
        key = (hidden_states.shape, top_k_index.shape, hidden_states.dtype, hidden_states.device, w1.data_ptr())
        entry = bound.get(key)
        if entry is None:
            why = hf_moe.unsupported_reason(self, hidden_states)
            if why is None and w1.dtype != torch.float8_e4m3fn:
                why = f"weights are {w1.dtype}, not FP8"
            if why is not None:
                raise ValueError(f"{TORCH_EXPERTS} experts ({hf_moe.module_label(self)}): {why}")
            s1, s2 = params["gate_up_proj_scale_inv"], params["down_proj_scale_inv"]
            p = problem_of(hidden_states, w1, w2, top_k_weights, top_k_index, s1, s2, hf_moe.activation_name(self))
            run = fused_moe_torch.launcher(p, fused_moe_torch.LOOP, gemm, m_major=True)
            entry = bound[key] = (run, pad_scale_blocks(s1), pad_scale_blocks(s2))
        run, s1, s2 = entry
        return run(hidden_states, w1, w2, top_k_weights, top_k_index, s1, s2)

    return forward


_registered: list[Callable] = []
_BOUND = "_aiter_torch_blockwise"  # an experts module's bound runners and padded scales


def register_torch_experts() -> None:
    """Register :func:`torch_blockwise_experts` as :data:`TORCH_EXPERTS` with transformers' FP8 experts interface
    (once per process)."""
    if not _registered:
        from transformers.integrations.finegrained_fp8 import ALL_FP8_EXPERTS_FUNCTIONS

        _registered.append(torch_blockwise_experts())
        type(ALL_FP8_EXPERTS_FUNCTIONS).register(TORCH_EXPERTS, _registered[0])


class ArmState:
    """Which arm the FP8 model runs: module objects per slot for each of :data:`ARMS`, put back by :meth:`set_arm`,
    and each experts config's implementation name per arm (the interface of :class:`~examples.hf_model.PatchState`;
    ``control`` is a second baseline)."""

    arms = ARMS
    table_var = "AITER_CONFIG_GEMM_A8W8_BLOCKSCALE"

    def __init__(self, model: nn.Module, swapped: list[tuple[str, nn.Module, nn.Module]],
                 include: list[str] | None, exclude: list[str] | None) -> None:
        from aiter_gemm import fp8_linear
        from aiter_gemm.kernels.a8w8_blockscale_torch import shape_error
        from aiter_gemm.nn import patch_linear

        self.model, self.arm = model, "fp8"
        gemm = torch_blockwise_gemm()
        fp8_of = {name: fp8 for name, fp8, _ in swapped}
        bf16_of = {name: twin for name, _, twin in swapped}
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
                    torch_arm = fp8_linear.from_fp8_linear(original, name, gemm=gemm, m_major=True)
                    arms = {"tuned": child, "torch_blockwise": torch_arm, "bf16": bf16_of[name]}
                else:  # a bf16 module (lm_head): patched in the tuned arm only
                    arms = {"tuned": child, "torch_blockwise": original, "bf16": original}
                self._slots.append((parent._modules, attr, arms))
        self.fp8_suffixes = frozenset(n.rsplit(".", 1)[-1] for n in self.names if n in fp8_of)
        self._impls: list[tuple[Any, dict[str, str]]] = []
        self.experts = self._experts_arms(model, {n for n, m in fp8_of.items() if not isinstance(m, nn.Linear)},
                                          bf16_of)
        self.set_arm("tuned")

    def _experts_arms(self, model: nn.Module, names: set[str], bf16_of: dict[str, nn.Module]) -> list[str]:
        """The FP8 experts modules' slots and implementation names per arm: torch_blockwise :data:`TORCH_EXPERTS`
        (also what :func:`~aiter_gemm.nn.patch_moe` records as the tuned arm's fallback: never the kernels hub),
        tuned ``fused_moe`` where patch_moe takes the module, bf16 the twin's implementation before. Returns the
        experts modules patch_moe switched."""
        from aiter_gemm.kernels.a8w8_blockscale_torch import shape_error
        from aiter_gemm.nn import patch_moe

        if not names:
            return []
        register_torch_experts()
        configs = {}
        for name in sorted(names):
            parent_name, _, attr = name.rpartition(".")
            parent = model.get_submodule(parent_name)
            fp8 = parent._modules[attr]
            for n, k in (fp8.gate_up_proj.shape[1:], fp8.down_proj.shape[1:]):
                why = shape_error(1, n, k, padded_scales=True)
                if why is not None:
                    raise SystemExit(f"{name}: torch's block-scaled matmul (the torch_blockwise arm) cannot run its "
                                     f"experts: {why}")
            configs.setdefault(id(fp8.config), (fp8.config, fp8.config._experts_implementation))
            self._slots.append((parent._modules, attr, {"tuned": fp8, "torch_blockwise": fp8, "bf16": bf16_of[name]}))
        for cfg, _ in configs.values():
            cfg._experts_implementation = TORCH_EXPERTS
        switched = patch_moe(model)
        self._impls = [(cfg, {"tuned": cfg._experts_implementation, "torch_blockwise": TORCH_EXPERTS, "bf16": bf16})
                       for cfg, bf16 in configs.values()]
        return switched

    @property
    def experts_implementations(self) -> dict[str, str] | None:
        """The experts implementation of each arm (None: no experts modules)."""
        return dict(self._impls[0][1]) if self._impls else None

    def set_arm(self, arm: str) -> None:
        arm = BASELINE if arm == "control" else arm
        if arm == self.arm:
            return
        for modules, attr, arms in self._slots:
            modules[attr] = arms[arm]
        for cfg, impls in self._impls:
            cfg._experts_implementation = impls[arm]
        self.arm = arm

    def set(self, patched: bool) -> None:
        """PatchState's switch, for the capture: patched is the tuned arm."""
        self.set_arm("tuned" if patched else BASELINE)
