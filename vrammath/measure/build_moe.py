"""transformers configs and model classes of the mixture-of-experts decoders (Mixtral, Qwen-MoE,
DeepSeek-V3).

:mod:`vrammath.measure.build` asks here for the model types whose MoE training is estimated
(every reader that sets :class:`~vrammath.model.spec.Experts`). The experts run transformers' grouped
matmul (``_experts_implementation = "grouped_mm"``), which takes bf16 inputs only; torch and
transformers are imported inside the functions.
"""

from __future__ import annotations

from typing import Any

from vrammath.measure.build_decoders import (
    NO_TOKEN_IDS,
    base_fields,
    decoder_fields,
)
from vrammath.model.spec import ModelSpec

MODEL_TYPES: tuple[str, ...] = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
"""The model types this module builds."""


def moe_config(spec: ModelSpec, layers: int) -> Any:
    """The transformers config of ``spec`` (one of :data:`MODEL_TYPES`) with ``layers`` layers;
    the MoE layers are the spec's (the others listed in ``mlp_only_layers``)."""
    import transformers

    ex = spec.experts
    assert ex is not None
    if spec.latent is not None:
        return _deepseek_config(spec, layers)
    common = {
        **decoder_fields(spec, layers),
        "num_experts_per_tok": ex.top_k,
        "output_router_logits": False,
    }
    if spec.model_type == "mixtral":
        # Mixtral's MLP width is its experts'
        return transformers.MixtralConfig(
            **{**common, "intermediate_size": ex.intermediate}, num_local_experts=ex.count
        )
    qwen: dict[str, Any] = {
        **common,
        "moe_intermediate_size": ex.intermediate,
        "num_experts": ex.count,
        "norm_topk_prob": ex.norm_topk,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [i for i in range(layers) if i not in ex.layers],
        "use_sliding_window": False,
    }
    if spec.model_type == "qwen2_moe":
        return transformers.Qwen2MoeConfig(
            **qwen,
            qkv_bias=spec.qkv_bias,
            shared_expert_intermediate_size=ex.shared_intermediate,
        )
    return transformers.Qwen3MoeConfig(**qwen, attention_bias=spec.qkv_bias)


def _deepseek_config(spec: ModelSpec, layers: int) -> Any:
    """DeepSeek-V3: latent attention, the first ``L - L_e`` layers dense, shared experts as
    ``n_shared_experts`` multiples of the routed experts' size, group-limited routing."""
    import transformers

    ex, lat = spec.experts, spec.latent
    assert ex is not None
    assert lat is not None
    return transformers.DeepseekV3Config(
        **base_fields(spec, layers),
        num_key_value_heads=spec.heads,
        q_lora_rank=lat.q_rank,
        kv_lora_rank=lat.kv_rank,
        qk_nope_head_dim=lat.nope_dim,
        qk_rope_head_dim=lat.rope_dim,
        v_head_dim=lat.v_dim,
        n_routed_experts=ex.count,
        num_experts_per_tok=ex.top_k,
        moe_intermediate_size=ex.intermediate,
        n_shared_experts=ex.shared_intermediate // ex.intermediate,
        n_group=ex.groups,
        topk_group=ex.groups_chosen,
        norm_topk_prob=ex.norm_topk,
        first_k_dense_replace=min(ex.layers, default=layers),
        output_router_logits=False,
        **NO_TOKEN_IDS,
    )


__all__ = ["MODEL_TYPES", "moe_config"]
