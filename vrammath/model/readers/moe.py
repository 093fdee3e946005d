"""Readers of mixture-of-experts and latent attention: mixtral, qwen2_moe, qwen3_moe, deepseek_v3.

Examples
========

>>> MIXTRAL.keys["num_experts_per_tok"]
'experts.top_k'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from vrammath.model.readers.keys import (
    _ATTENTION_BIAS,
    Extra,
    Keys,
    Parts,
    bounded_int,
    divisors_text,
)
from vrammath.model.readers.llama import _decoder_parts as _dense_parts
from vrammath.model.readers.llama import _decoder_reader, _mistral
from vrammath.model.spec import Experts, LatentAttention
from vrammath.notation.errors import InputError

_MOE_HARMLESS: tuple[str, ...] = ("router_aux_loss_coef",)
"""The auxiliary load-balancing loss's weight scales a scalar; it keeps no tensor."""


def _routing(k: Keys, experts_key: str) -> tuple[int, int]:
    """``(experts, top_k)``, with ``top_k <= experts``; ``output_router_logits`` must be off."""
    k.off(
        "output_router_logits",
        False,
        "must be false (the router logits returned for the auxiliary loss are not modelled)",
    )
    count = k.size(experts_key)
    top_k = k.size("num_experts_per_tok")
    if top_k > count:
        raise InputError("num_experts_per_tok", f"must be at most {experts_key}={count}", got=top_k)
    return count, top_k


def _no_attention_dropout(k: Keys) -> None:
    """The MoE layers' activations are measured without attention dropout: refused here."""
    if k.probability("attention_dropout", 0.0) != 0:
        raise InputError(
            "attention_dropout",
            f"must be 0.0 (dropout in {k.cfg.get('model_type')} attention is not modelled)",
            got=k.raw("attention_dropout"),
        )


def _decoder_parts(
    k: Keys, *, qkv_bias: bool, o_bias: bool, mlp_bias: bool, window: None, window_layers: int
) -> Parts:
    _no_attention_dropout(k)
    return _dense_parts(
        k,
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=mlp_bias,
        window=window,
        window_layers=window_layers,
    )


def _mixtral(k: Keys) -> Parts:
    k.off("router_jitter_noise", 0.0, "must be 0.0 (router jitter noise is not modelled)")
    _no_attention_dropout(k)
    return _mistral(k)


def _top_k_experts(
    k: Keys, count_key: str, intermediate_key: str, moe_layers: Callable[[int], tuple[int, ...]]
) -> Experts:
    """The routed experts of a top-k block (Mixtral's, Qwen's): count, top-k and width from the
    config's keys, the MoE layers from ``moe_layers(num_hidden_layers)``."""
    count, top_k = _routing(k, count_key)
    layers = k.size("num_hidden_layers")
    return Experts(count, top_k, k.size(intermediate_key), moe_layers(layers))


def _mixtral_extra(k: Keys) -> Extra:
    experts = replace(
        _top_k_experts(k, "num_local_experts", "intermediate_size", lambda n: tuple(range(n))),
        norm_topk=True,
        routing_weight_bytes=4,
        expert_names=("w1", "w3", "w2"),
        peft_v4_names=("w1", "w3", "w2"),
    )
    return experts, None, 0


def _sparse_layers(k: Keys, layers: int) -> tuple[int, ...]:
    """Qwen-MoE's MoE layers: every ``decoder_sparse_step``-th, minus ``mlp_only_layers``."""
    step = k.size("decoder_sparse_step", 1)
    dense = k.raw("mlp_only_layers", [])
    if not isinstance(dense, list) or any(
        isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < layers for i in dense
    ):
        raise InputError(
            "mlp_only_layers", f"must be a list of layer indices 0..{layers - 1}", got=dense
        )
    return tuple(i for i in range(layers) if i not in dense and (i + 1) % step == 0)


def _qwen_moe_extra(k: Keys, *, shared: bool) -> Extra:
    experts = replace(
        _top_k_experts(k, "num_experts", "moe_intermediate_size", lambda n: _sparse_layers(k, n)),
        shared_intermediate=k.size("shared_expert_intermediate_size", 5632) if shared else 0,
        shared_gate=shared,
        norm_topk=k.flag("norm_topk_prob", False),
        peft_v4_names=None if shared else ("gate_proj", "up_proj", "down_proj"),
    )
    return experts, None, 0


def _no_window(k: Keys) -> None:
    if k.flag("use_sliding_window", False):
        raise InputError(
            "use_sliding_window",
            f"must be false (sliding windows in {k.cfg.get('model_type')} are not modelled)",
            got=True,
        )


def _qwen2_moe(k: Keys) -> Parts:
    _no_window(k)
    layers, embeddings, attention, mlp, norms = _decoder_parts(
        k, qkv_bias=False, o_bias=False, mlp_bias=False, window=None, window_layers=0
    )
    # transformers' Qwen2MoeModel builds a sliding-window mask even with the window off
    attention = replace(attention, qkv_bias=k.flag("qkv_bias", True), frame_mask=True)
    return layers, embeddings, attention, mlp, norms


def _qwen3_moe(k: Keys) -> Parts:
    _no_window(k)
    bias = k.flag("attention_bias", False)
    layers, embeddings, attention, mlp, norms = _decoder_parts(
        k, qkv_bias=bias, o_bias=bias, mlp_bias=False, window=None, window_layers=0
    )
    return layers, embeddings, replace(attention, qk_norm="head"), mlp, norms


def _deepseek_v3(k: Keys) -> Parts:
    k.off("attention_bias", False, "must be false (biases in latent attention are not modelled)")
    k.off(
        "moe_layer_freq", 1, "must be 1 (transformers makes every layer after the dense ones MoE)"
    )
    heads = k.size("num_attention_heads")
    # DeepseekV3Config defaults to 128 KV heads, not to num_attention_heads
    if k.size("num_key_value_heads", 128) != heads:
        raise InputError(
            "num_key_value_heads",
            f"must equal num_attention_heads={heads} (latent attention expands K/V per head)",
            got=k.raw("num_key_value_heads", 128),
        )
    rope = k.size("qk_rope_head_dim")
    if rope % 2:
        raise InputError("qk_rope_head_dim", "must be even (RoPE rotates pairs)", got=rope)
    nope = k.size("qk_nope_head_dim")
    # DeepseekV3Config derives both; a config that states them otherwise contradicts itself
    for key, value, rule in (
        ("qk_head_dim", nope + rope, "qk_nope_head_dim + qk_rope_head_dim"),
        ("head_dim", rope, "qk_rope_head_dim"),
    ):
        if k.has(key) and k.raw(key) != value:
            raise InputError(
                key, f"must equal {rule} = {value} (DeepseekV3Config sets it so)", got=k.raw(key)
            )
    # hidden_size need not be a multiple of the heads: the head dimension of q and k is
    # nope + rope (values have v_head_dim, LatentAttention), read in place of head_dim
    shaped = Keys({**k.cfg, "head_dim": nope + rope}, k.table)
    layers, embeddings, attention, mlp, norms = _decoder_parts(
        shaped, qkv_bias=False, o_bias=False, mlp_bias=False, window=None, window_layers=0
    )
    return layers, embeddings, attention, mlp, norms


_ROUTER_KINDS = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}


def _deepseek_v3_extra(k: Keys) -> Extra:
    for key, only in _ROUTER_KINDS.items():
        k.choice(key, only, (only,))
    count, top_k = _routing(k, "n_routed_experts")
    groups = k.size("n_group", 8)  # transformers' defaults: 8 groups, 4 chosen
    if count % groups:
        raise InputError(
            "n_group", f"must divide n_routed_experts={count} ({divisors_text(count)})", got=groups
        )
    if count // groups < 2:
        raise InputError(
            "n_group",
            f"must leave at least 2 of n_routed_experts={count} per group (transformers scores a "
            "group by its top two)",
            got=groups,
        )
    chosen = k.size("topk_group", 4)
    if chosen > groups or top_k > chosen * (count // groups):
        raise InputError(
            "topk_group",
            f"must be at most n_group={groups} and leave num_experts_per_tok={top_k} experts "
            "to choose from",
            got=chosen,
        )
    layers = k.size("num_hidden_layers")
    dense = bounded_int("first_k_dense_replace", k.raw("first_k_dense_replace", 3), low=0)
    # transformers' DeepseekV3DecoderLayer builds a MoE block only where layer_idx >=
    # first_k_dense_replace: a larger value makes every layer dense
    dense = min(dense, layers)
    intermediate = k.size("moe_intermediate_size")
    shared = bounded_int("n_shared_experts", k.raw("n_shared_experts", 1), low=0)
    experts = Experts(
        count,
        top_k,
        intermediate,
        tuple(range(dense, layers)),
        shared_intermediate=shared * intermediate,
        router_bias=True,
        router_fp32=True,
        norm_topk=k.flag("norm_topk_prob", True),
        scoring="sigmoid",
        groups=groups,
        groups_chosen=chosen,
        block="deepseek-v3",
        routing_weight_bytes=4,
        peft_v4_names=("gate_proj", "up_proj", "down_proj"),
    )
    q_rank = k.size("q_lora_rank") if k.has("q_lora_rank") else None
    latent = LatentAttention(
        q_rank=q_rank,
        kv_rank=k.size("kv_lora_rank"),
        nope_dim=k.size("qk_nope_head_dim"),
        rope_dim=k.size("qk_rope_head_dim"),
        v_dim=k.size("v_head_dim"),
    )
    mtp = bounded_int("num_nextn_predict_layers", k.raw("num_nextn_predict_layers", 0), low=0)
    return experts, latent, mtp


_MOE_ROUTING_KEYS: dict[str, str] = {
    "num_experts_per_tok": "experts.top_k",
    "output_router_logits": "(false only)",
}

_QWEN_MOE_KEYS: dict[str, str] = {
    **_MOE_ROUTING_KEYS,
    "num_experts": "experts.count",
    "moe_intermediate_size": "experts.intermediate",
    "norm_topk_prob": "experts.norm_topk",
    "decoder_sparse_step": "experts.layers (every n-th layer)",
    "mlp_only_layers": "experts.layers (these are dense)",
    "use_sliding_window": "(false only)",
}
_QWEN_MOE_HARMLESS = (*_MOE_HARMLESS, "max_window_layers", "sliding_window")
"""With ``use_sliding_window`` false, transformers reads neither the window nor its layers."""

MIXTRAL = _decoder_reader(
    "mixtral",
    _mixtral,
    {
        **_MOE_ROUTING_KEYS,
        "sliding_window": "attention.sliding_window (every layer)",
        "num_local_experts": "experts.count",
        "router_jitter_noise": "(0 only)",
    },
    harmless=_MOE_HARMLESS,
    extra=_mixtral_extra,
)

QWEN2_MOE = _decoder_reader(
    "qwen2_moe",
    _qwen2_moe,
    {
        **_QWEN_MOE_KEYS,
        "qkv_bias": "attention.qkv_bias",
        "shared_expert_intermediate_size": "experts.shared_intermediate (with a sigmoid gate)",
    },
    harmless=_QWEN_MOE_HARMLESS,
    extra=lambda k: _qwen_moe_extra(k, shared=True),
)

QWEN3_MOE = _decoder_reader(
    "qwen3_moe",
    _qwen3_moe,
    {**_QWEN_MOE_KEYS, **_ATTENTION_BIAS},
    harmless=_QWEN_MOE_HARMLESS,
    extra=lambda k: _qwen_moe_extra(k, shared=False),
)

DEEPSEEK_V3 = _decoder_reader(
    "deepseek_v3",
    _deepseek_v3,
    {
        **_MOE_ROUTING_KEYS,
        "attention_bias": "(false only)",
        "head_dim": "(qk_rope_head_dim only: transformers sets it)",
        "qk_head_dim": "(qk_nope_head_dim + qk_rope_head_dim only: transformers sets it)",
        "q_lora_rank": "latent.q_rank",
        "kv_lora_rank": "latent.kv_rank",
        "qk_nope_head_dim": "latent.nope_dim",
        "qk_rope_head_dim": "latent.rope_dim (even)",
        "v_head_dim": "latent.v_dim",
        "n_routed_experts": "experts.count",
        "n_shared_experts": "experts.shared_intermediate (x moe_intermediate_size)",
        "moe_intermediate_size": "experts.intermediate",
        "first_k_dense_replace": "experts.layers (the first k are dense)",
        "moe_layer_freq": "(1 only)",
        "n_group": "router groups (must divide n_routed_experts)",
        "topk_group": "router groups chosen per token",
        "norm_topk_prob": "experts.norm_topk",
        "scoring_func": "experts.scoring (sigmoid only)",
        "topk_method": "router (noaux_tc only: transformers' router)",
        "num_nextn_predict_layers": "mtp_layers (not built by transformers)",
    },
    harmless=(
        "auto_map",
        "aux_loss_alpha",
        "ep_size",
        "quantization_config",
        "rope_interleave",
        "routed_scaling_factor",
        "seq_aux",
    ),
    extra=_deepseek_v3_extra,
)
"""``auto_map`` names the Hub's remote code (transformers has its own); ``ep_size`` is that
code's inference setting; ``quantization_config`` is the fp8 format the weights are published in
(the setup's precision decides the bytes); ``routed_scaling_factor`` scales routing weights in
place; ``seq_aux`` / ``aux_loss_alpha`` configure a training loss transformers does not build."""
