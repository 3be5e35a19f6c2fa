"""Scratch: the fused_moe op's default vs transformers' grouped_mm experts (bf16), and the op in FP8, graph timing."""
import json, sys, time, math
import torch
import aiter_gemm
from aiter_gemm.timing import TimingConfig, time_paired
from aiter_gemm.ops.fused_moe import routing

MODELS = {"qwen3_30b": (128, 8, 2048, 768), "mixtral": (8, 2, 4096, 14336), "dsv3_ep8": (32, 8, 7168, 2048)}
TS = [int(t) for t in sys.argv[1].split(",")] if len(sys.argv) > 1 else [1, 4, 16, 64, 256, 1024, 4096]
dev = torch.device("cuda")
cfg = TimingConfig(warmup=3, reps=5, target_us=2000.0)
COPY_BW = 4.3e12
out = []

def hf_experts(E, k, H, I, w1, w2):
    try:
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts
        from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
        c = Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=k)
        c._experts_implementation = "grouped_mm"
        m = Qwen3MoeExperts(c).to(dev, torch.bfloat16)
        with torch.no_grad():
            m.gate_up_proj.copy_(w1); m.down_proj.copy_(w2)
        return m
    except Exception as exc:
        print("hf experts unavailable:", type(exc).__name__, exc, flush=True)
        return None

for name, (E, k, H, I) in MODELS.items():
    g = torch.Generator(device=dev).manual_seed(0)
    w1 = (torch.randn(E, 2 * I, H, device=dev, generator=g) * H ** -0.5).to(torch.bfloat16)
    w2 = (torch.randn(E, H, I, device=dev, generator=g) * I ** -0.5).to(torch.bfloat16)
    hf = hf_experts(E, k, H, I, w1, w2)
    from aiter_gemm.kernels.a8w8_blockscale import quantize_weight_blockscale
    q1 = [quantize_weight_blockscale(w1[e].float()) for e in range(E)]
    w1q = torch.stack([a for a, _ in q1]); w1s = torch.stack([b for _, b in q1]); del q1
    q2 = [quantize_weight_blockscale(w2[e].float()) for e in range(E)]
    w2q = torch.stack([a for a, _ in q2]); w2s = torch.stack([b for _, b in q2]); del q2
    for T in TS:
        sets = []
        for s in range(4):
            x = torch.randn(T, H, device=dev, generator=g).to(torch.bfloat16)
            tw, ids = routing(T, E, k, "uniform", g, dev)
            sets.append((x, tw.to(torch.float32), ids.to(torch.int32)))
        touched = len(torch.unique(sets[0][2]))
        floor_us = touched * 3 * H * I * 2 / COPY_BW * 1e6
        floor8_us = touched * 3 * H * I * 1 / COPY_BW * 1e6
        calls = {
            "op_bf16": lambda i: aiter_gemm.fused_moe(sets[i][0], w1, w2, sets[i][1], sets[i][2]),
            "op_fp8": lambda i: aiter_gemm.fused_moe(sets[i][0], w1q, w2q, sets[i][1], sets[i][2], w1_scale=w1s, w2_scale=w2s),
        }
        if hf is not None:
            calls["hf_grouped_mm"] = lambda i: hf(sets[i][0], sets[i][2].long(), sets[i][1].to(torch.bfloat16))
        rec = dict(model=name, T=T, touched=touched, floor_bf16_us=floor_us, floor_fp8_us=floor8_us)
        try:
            ref = aiter_gemm.fused_moe(sets[0][0], w1, w2, sets[0][1], sets[0][2]).float()
            if hf is not None:
                got = hf(sets[0][0], sets[0][2].long(), sets[0][1].to(torch.bfloat16)).float()
                rec["rel_hf_vs_op"] = float((got - ref).norm() / ref.norm())
            f8 = aiter_gemm.fused_moe(sets[0][0], w1q, w2q, sets[0][1], sets[0][2], w1_scale=w1s, w2_scale=w2s).float()
            rec["rel_fp8_vs_bf16"] = float((f8 - ref).norm() / ref.norm())
            t0 = time.time()
            res = time_paired(calls, len(sets), cfg, pairs=5)
            for kk, v in res.items():
                rec[kk] = sorted(v)[len(v) // 2]
            rec["secs"] = round(time.time() - t0, 1)
            d = aiter_gemm.get_fused_moe_config(T, H, I, E, k) if hasattr(aiter_gemm, "get_fused_moe_config") else None
            rec["decision"] = str(d)[:200]
        except Exception as exc:
            rec["error"] = f"{type(exc).__name__}: {exc}"[:500]
        print(json.dumps(rec), flush=True)
        out.append(rec)
    del w1, w2, w1q, w2q, hf
    torch.cuda.empty_cache()
