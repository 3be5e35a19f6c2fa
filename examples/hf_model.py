"""The model side of the Hugging Face examples (:mod:`~examples.hf_decode` and the modules it uses): a
causal LM built from a ``config.json`` with random weights, the switch between its patched and unpatched arms, and
prefill / decode steps that can be repeated or captured in a CUDA graph. It imports no other example module, so the
examples import each other in one direction only (hf_decode -> hf_capture, hf_profile -> hf_model)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from aiter_gemm.nn import TunedLinear, patch_linear, patch_moe

# ---------------------------------------------------------------------------------------------------------------
# model


def resolve_config(spec: str) -> Path:
    """The folder holding ``config.json``: ``spec`` itself, the folder of a ``config.json`` path, or a shipped model
    config (``configs/model_configs/<spec>``); ValueError naming the shipped ones if none."""
    path = Path(spec)
    if path.is_file() and path.name == "config.json":
        return path.parent
    if (path / "config.json").is_file():
        return path
    from aiter_gemm.settings import default_config_dir

    shipped = default_config_dir() / "model_configs" / spec
    if (shipped / "config.json").is_file():
        return shipped
    names = sorted(p.parent.name for p in (default_config_dir() / "model_configs").glob("*/config.json"))
    raise ValueError(f"--config {spec}: no config.json there and no shipped model of that name ({', '.join(names)})")


def build_model(config_dir: Path, layers: int | None, dtype: torch.dtype, device: torch.device,
                attn: str) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_config`` with random weights created on ``device`` (no download, no copy)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(config_dir))
    if layers:
        cfg.num_hidden_layers = layers
    kwargs: dict[str, Any] = {"attn_implementation": attn}
    kwargs["dtype" if _from_config_takes_dtype() else "torch_dtype"] = dtype
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, **kwargs)
    model.eval().requires_grad_(False)
    return model


def _from_config_takes_dtype() -> bool:
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return (major, minor) >= (4, 56)  # `torch_dtype` became `dtype` (the old name warns from 5.0 on)


class PatchState:
    """Which arm the model is in: patched (TunedLinear, and an MoE model's experts on ``fused_moe``) or not (its
    linears and transformers' own experts implementation, ``grouped_mm`` by default). The first patch is
    :func:`patch_linear` and :func:`~aiter_gemm.nn.patch_moe`; later switches put the same module objects back in
    their slots (no copy, and the patched modules keep their dispatch entries) and the experts configs' implementation
    name back, so switching costs ~225 dict stores and an arm's first step after a switch is like any other."""

    arms = ("without", "with")  # baseline first (hf_decode's report divides by it); --control adds an unpatched arm
    table_var = "AITER_CONFIG_GEMM_BF16"  # the table --tuned goes in front of
    fp8_suffixes: frozenset[str] = frozenset()

    def __init__(self, model: torch.nn.Module, include: list[str] | None, exclude: list[str] | None) -> None:
        self.model, self.include, self.exclude = model, include, exclude
        self.patched = False
        self.names: list[str] = []
        self.experts: list[str] = []  # the experts modules patch_moe switched to fused_moe
        self._slots: list[tuple[dict, str, torch.nn.Module, torch.nn.Module]] = []  # (parent._modules, attr, new, old)
        self._moe: list[tuple[Any, str, str]] = []  # (experts config, implementation unpatched, patched)

    def set_arm(self, arm: str) -> None:
        """The arm by name: "with" patched, any other ("without", "control") not."""
        self.set(arm == "with")
        if arm == "with" and not self.names:
            raise SystemExit("patch_linear swapped no module: check --include / --exclude")

    def set(self, patched: bool) -> None:
        if patched == self.patched:
            return
        if self._slots:
            for modules, attr, new, old in self._slots:
                modules[attr] = new if patched else old
            for cfg, old_impl, new_impl in self._moe:
                cfg._experts_implementation = new_impl if patched else old_impl
        elif patched:
            self.names = patch_linear(self.model, self.include, self.exclude)
            if not self.names:
                raise SystemExit("patch_linear swapped no module: check --include / --exclude")
            self._slots = [(parent._modules, attr, child, child._aiter_original)
                           for parent in self.model.modules() for attr, child in parent._modules.items()
                           if isinstance(child, TunedLinear)]
            self._patch_experts()
        self.patched = patched

    def _patch_experts(self) -> None:
        """:func:`~aiter_gemm.nn.patch_moe` on the model (nothing for a model without transformers experts modules),
        each experts config's implementation name before and after recorded for the switches."""
        configs = {id(m.config): (m.config, m.config._experts_implementation) for m in self.model.modules()
                   if hasattr(getattr(m, "config", None), "_experts_implementation")}
        if not configs:  # transformers without experts interfaces
            return
        self.experts = patch_moe(self.model)
        self._moe = [(cfg, old, cfg._experts_implementation) for cfg, old in configs.values()
                     if cfg._experts_implementation != old]


# ---------------------------------------------------------------------------------------------------------------
# replayable steps


class StaticSteps:
    """A static KV cache and the fixed inputs of one prefill and one decode step. Each step first puts the cache's
    write position back (transformers >= 5 keeps it in per-layer device tensors that every update advances), so a
    step can be repeated, or captured in a CUDA graph and replayed, any number of times with identical work."""

    def __init__(self, model: torch.nn.Module, batch: int, prompt_len: int, device: torch.device) -> None:
        from transformers import StaticCache

        self.model, self.batch, self.prompt_len = model, batch, prompt_len
        max_len = (prompt_len + 1 + 63) // 64 * 64
        params = inspect.signature(StaticCache.__init__).parameters
        kw: dict[str, Any] = {"config": model.config, "max_cache_len": max_len}
        for name, val in (("max_batch_size", batch), ("device", device), ("dtype", model.dtype)):
            if name in params:  # transformers 4.x sizes the cache up front
                kw[name] = val
        self.cache = StaticCache(**kw)
        vocab = model.config.vocab_size
        self.prompt = torch.randint(0, vocab, (batch, prompt_len), device=device)
        self.next_ids = torch.randint(0, vocab, (batch, 1), device=device)
        self.prefill_pos = torch.arange(prompt_len, device=device).unsqueeze(0).expand(batch, -1)
        self.decode_pos = torch.full((batch, 1), prompt_len, device=device, dtype=torch.long)
        fwd = inspect.signature(model.forward).parameters
        self.extra = {"logits_to_keep": 1} if "logits_to_keep" in fwd else \
            {"num_logits_to_keep": 1} if "num_logits_to_keep" in fwd else {}
        self.cache_position = "cache_position" in fwd  # transformers 4.x: the static cache writes there
        self.counter: torch.Tensor | None = None
        self._forward(self.prompt, self.prefill_pos)  # lazy cache allocation, then one shared position counter
        self._share_counters()
        self._check_replayable()

    def _share_counters(self) -> None:
        layers = [ly for ly in getattr(self.cache, "layers", ())
                  if isinstance(getattr(ly, "cumulative_length", None), torch.Tensor)]
        if layers:
            c0 = layers[0].cumulative_length
            self.counter = torch.zeros(len(layers), dtype=c0.dtype, device=c0.device)
            for i, ly in enumerate(layers):
                ly.cumulative_length = self.counter[i]  # a view: one fill_ resets every layer

    def _check_replayable(self) -> None:
        lengths = []
        for _ in range(2):
            self.decode()
            lengths.append(int(self.cache.get_seq_length()))
        if lengths[0] != lengths[1]:
            raise RuntimeError(f"this transformers version's StaticCache advances its write position in a way this "
                               f"script cannot reset (lengths {lengths}); replayed steps would not be identical")

    def _forward(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        kw = dict(input_ids=ids, position_ids=pos, past_key_values=self.cache, use_cache=True, **self.extra)
        if self.cache_position:
            kw["cache_position"] = pos[0]
        return self.model(**kw).logits

    def prefill(self) -> torch.Tensor:
        if self.counter is not None:
            self.counter.fill_(0)
        return self._forward(self.prompt, self.prefill_pos)

    def decode(self) -> torch.Tensor:
        if self.counter is not None:
            self.counter.fill_(self.prompt_len)
        return self._forward(self.next_ids, self.decode_pos)


def capture_graph(step: Callable[[], torch.Tensor], warmup: int = 3) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """Warm ``step`` up on a side stream (dispatch decisions, Triton compilation, cuBLAS workspaces); capture it."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    graph.replay()
    torch.cuda.synchronize()
    return graph, out
