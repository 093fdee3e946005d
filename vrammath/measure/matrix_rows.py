"""The rows of the validation matrix (:mod:`vrammath.measure.matrix`): the configs they measure
and one dict per row (model, batch, sequence, precision, attention, recomputation, ZeRO-3 ranks).

The mixture-of-experts rows (small Mixtral, Qwen2-MoE with a shared expert and a dense layer,
Qwen3-MoE with q/k norms; Mixtral-8x7B and Qwen3-30B-A3B themselves) run transformers'
grouped-matmul experts, which take bf16 inputs only: their fp32 and autocast memory cannot be
counted in fake mode, so every MoE row is bf16. The DeepSeek-V3 rows add latent attention, a
dense first layer, group-limited sigmoid routing, shared experts and fp32 routers.

>>> sorted({r["model"] for r in ROWS if r["model"].startswith(("small-mixtral", "small-qwen"))})
['small-mixtral', 'small-mixtral-v128', 'small-qwen2-moe', 'small-qwen3-moe']
"""

from __future__ import annotations

from typing import Any

SMALL_GQA = {
    "model_type": "llama",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "vocab_size": 1000,
}
"""GQA (6 query heads, 2 KV heads), head_dim 24 given explicitly (a d = 144 != h = 96), odd I."""

SMALL_TIED = {
    "model_type": "qwen2",
    "hidden_size": 80,
    "intermediate_size": 136,
    "num_hidden_layers": 2,
    "num_attention_heads": 5,
    "num_key_value_heads": 1,
    "vocab_size": 777,
    "tie_word_embeddings": True,
}
"""Qwen2 with q/k/v biases, one KV head (MQA), tied embeddings, odd vocabulary."""

GPT_TANH = {
    "model_type": "gpt2",
    "n_embd": 256,
    "n_layer": 4,
    "n_head": 8,
    "vocab_size": 5000,
    "n_positions": 1024,
    "activation_function": "gelu_pytorch_tanh",
}
"""GPT-2 with PyTorch's fused tanh GeLU: where Korthikanti et al.'s assumptions should hold."""

SMALL_MIXTRAL = {
    "model_type": "mixtral",
    "hidden_size": 64,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
}
"""Mixtral: 8 experts, top-2, fp32 routing weights; k I_e = V as in Mixtral-8x7B (28672 vs 32000)."""

SMALL_MIXTRAL_V128 = {**SMALL_MIXTRAL, "vocab_size": 128}
"""The same with a small vocabulary: the top MoE block's backward, not the loss, sets the peak."""

SMALL_QWEN2_MOE = {
    "model_type": "qwen2_moe",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 96,
    "shared_expert_intermediate_size": 192,
    "mlp_only_layers": [1],
}
"""Qwen2-MoE: a shared expert with its sigmoid gate, q/k/v biases, one dense middle layer."""

SMALL_QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 64,
    "intermediate_size": 160,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "vocab_size": 512,
    "num_experts": 16,
    "num_experts_per_tok": 4,
    "moe_intermediate_size": 64,
    "norm_topk_prob": True,
}
"""Qwen3-MoE: 16 experts, top-4 with normalised weights, q/k norms, head_dim 24 (a d != h)."""

SMALL_DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 1000,
    "q_lora_rank": 40,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 24,
    "n_routed_experts": 8,
    "num_experts_per_tok": 3,
    "n_group": 4,
    "topk_group": 2,
    "moe_intermediate_size": 48,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
}
"""DeepSeek-V3: latent attention (low-rank q and kv, v_head_dim = qk_head_dim so SDPA runs its
flash kernel on a CPU too), one dense layer, one shared expert, 4 groups of 2 experts with 2
chosen, top-3, fp32 routers."""

SMALL_DEEPSEEK_V3_V128 = {**SMALL_DEEPSEEK_V3, "vocab_size": 128}
"""The same with a small vocabulary: the MoE blocks, not the loss, set the peaks."""

CONFIGS: dict[str, Any] = {
    "small-gqa": SMALL_GQA,
    "small-tied-mqa": SMALL_TIED,
    "gpt-tanh": GPT_TANH,
    "small-mixtral": SMALL_MIXTRAL,
    "small-mixtral-v128": SMALL_MIXTRAL_V128,
    "small-qwen2-moe": SMALL_QWEN2_MOE,
    "small-qwen3-moe": SMALL_QWEN3_MOE,
    "small-deepseek-v3": SMALL_DEEPSEEK_V3,
    "small-deepseek-v3-v128": SMALL_DEEPSEEK_V3_V128,
}


def _row(
    model: str,
    batch: int,
    seq: int,
    precision: str,
    attention: str,
    recompute: str = "none",
    *,
    zero3: int | None = None,
    quick: bool = False,
    implementation: str = "foreach",
) -> dict[str, Any]:
    rid = f"{model}/b{batch}/s{seq}/{precision}/{attention}/rc-{recompute}"
    if zero3:
        rid += f"/zero3x{zero3}"
    if implementation != "foreach":
        rid += f"/{implementation}"
    return {
        "id": rid,
        "model": model,
        "batch": batch,
        "seq": seq,
        "precision": precision,
        "attention": attention,
        "recompute": recompute,
        "optimizer": "adamw",
        "implementation": implementation,
        "zero3_ranks": zero3,
        "quick": quick,
    }


ROWS: list[dict[str, Any]] = [
    # small configs: GQA + explicit head_dim + odd sizes; tied embeddings + MQA + biases
    _row("small-gqa", 1, 512, "bf16", "sdpa", quick=True),
    _row("small-gqa", 4, 512, "bf16", "eager", quick=True),
    _row("small-gqa", 4, 512, "fp32", "sdpa", quick=True),
    _row("small-gqa", 1, 4096, "autocast-bf16", "sdpa", quick=True),
    _row("small-gqa", 4, 512, "autocast-bf16", "eager", "full", quick=True),
    _row("small-gqa", 4, 512, "fp32", "eager", "full", quick=True, implementation="for-loop"),
    _row("small-tied-mqa", 4, 512, "bf16", "eager", quick=True),
    _row("small-tied-mqa", 1, 4096, "fp32", "sdpa", "full", quick=True),
    _row("small-gqa", 4, 512, "bf16", "sdpa", zero3=8, quick=True),
    _row("small-tied-mqa", 4, 512, "fp32", "sdpa", zero3=8, quick=True),
    # GPT-2 style
    _row("gpt-tanh", 4, 512, "bf16", "eager", quick=True),
    _row("gpt-tanh", 1, 512, "fp32", "eager", "full", quick=True),
    _row("gpt2", 4, 512, "bf16", "eager"),
    # real configs
    _row("llama-7b", 1, 512, "bf16", "sdpa"),
    _row("llama-7b", 1, 512, "bf16", "eager"),
    _row("llama-7b", 1, 512, "fp32", "sdpa"),
    _row("llama-7b", 4, 4096, "bf16", "sdpa"),
    _row("llama-7b", 1, 4096, "autocast-bf16", "sdpa", "full"),
    _row("qwen2-72b", 1, 4096, "bf16", "sdpa", "full"),
    # mixture of experts (bf16: the grouped matmul takes bf16 inputs only)
    _row("small-mixtral", 2, 256, "bf16", "sdpa", quick=True),
    _row("small-mixtral", 2, 256, "bf16", "sdpa", "full", quick=True),
    _row("small-mixtral-v128", 2, 256, "bf16", "sdpa", quick=True),
    _row("small-qwen2-moe", 2, 256, "bf16", "sdpa", quick=True),
    _row("small-qwen2-moe", 1, 512, "bf16", "sdpa", "full", quick=True),
    _row("small-qwen3-moe", 2, 256, "bf16", "sdpa", quick=True),
    _row("small-qwen3-moe", 2, 256, "bf16", "sdpa", "full", quick=True),
    _row("small-qwen3-moe", 4, 1024, "bf16", "sdpa", zero3=8, quick=True),
    _row("mixtral-8x7b", 1, 1024, "bf16", "sdpa", "full"),
    _row("qwen3-30b-a3b", 1, 2048, "bf16", "sdpa", "full"),
    _row("small-deepseek-v3", 2, 512, "bf16", "sdpa", quick=True),
    _row("small-deepseek-v3", 2, 256, "bf16", "sdpa", "full", quick=True),
    _row("small-deepseek-v3-v128", 2, 256, "bf16", "sdpa", quick=True),
    _row("small-deepseek-v3-v128", 2, 256, "bf16", "sdpa", "full", quick=True),
]


GPU_ROWS: list[dict[str, Any]] = [
    _row("small-gqa", 1, 512, "bf16", "sdpa", implementation="fused"),
    _row("llama-7b", 1, 512, "bf16", "sdpa", implementation="fused"),
    _row("llama-7b", 1, 512, "bf16", "eager", implementation="fused"),
    _row("llama-7b", 1, 4096, "bf16", "sdpa", implementation="fused"),
    _row("llama-7b", 1, 4096, "bf16", "sdpa", "full", implementation="fused"),
    _row("llama-7b", 1, 512, "autocast-bf16", "sdpa", implementation="foreach"),
    _row("gpt2", 4, 512, "bf16", "eager", implementation="fused"),
]
"""Rows ``tools/gpu_measure.sh`` measures with the CUDA allocator (they fit one 80+ GB GPU)."""

__all__ = ["CONFIGS", "GPU_ROWS", "ROWS"]
