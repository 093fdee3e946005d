"""transformers configs and model classes of the newer decoders (Qwen3, OLMo-2, Phi-3, StarCoder2).

:mod:`vrammath.measure.build` asks here for the model types of
:mod:`vrammath.model.readers.decoders`; torch and transformers are imported inside the functions.
"""

from __future__ import annotations

from typing import Any

from vrammath.model.spec import ModelSpec

MODEL_TYPES: tuple[str, ...] = ("olmo2", "phi3", "qwen3", "starcoder2")
"""The model types this module builds."""


def base_fields(spec: ModelSpec, layers: int) -> dict[str, Any]:
    """The config fields every decoder here spells alike: widths, heads, layers, vocabulary."""
    return {
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": spec.heads,
        "vocab_size": spec.vocab,
        "tie_word_embeddings": spec.tied_embeddings,
        "max_position_embeddings": spec.max_positions,
    }


def decoder_fields(spec: ModelSpec, layers: int) -> dict[str, Any]:
    """:func:`base_fields` with the KV heads and the head dimension (GQA/MQA, explicit head_dim)."""
    return {
        **base_fields(spec, layers),
        "num_key_value_heads": spec.kv_heads,
        "head_dim": spec.head_dim,
    }


NO_TOKEN_IDS: dict[str, None] = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
"""The defaults' token ids may lie outside a small test vocabulary (Phi-3's pad is 32000)."""


def decoder_config(spec: ModelSpec, layers: int) -> Any:
    """The transformers config of ``spec`` (one of :data:`MODEL_TYPES`) with ``layers`` layers."""
    import transformers

    common = {**decoder_fields(spec, layers), **NO_TOKEN_IDS}
    if spec.model_type == "qwen3":
        return transformers.Qwen3Config(
            **common, attention_bias=spec.qkv_bias, use_sliding_window=False
        )
    if spec.model_type == "olmo2":
        return transformers.Olmo2Config(**common, attention_bias=spec.qkv_bias)
    if spec.model_type == "phi3":
        return transformers.Phi3Config(**common, sliding_window=spec.sliding_window)
    return transformers.Starcoder2Config(
        **common,
        embedding_dropout=spec.embeddings.dropout,
        attention_dropout=spec.attention.dropout,
        residual_dropout=spec.mlp.dropout,
        use_bias=spec.qkv_bias,
        sliding_window=spec.sliding_window,
        hidden_act=spec.mlp.activation,
    )


def transformers_class(name: str) -> Any:
    """transformers' class ``name`` (transformers imported here, not when this module is)."""
    import transformers

    return getattr(transformers, name)


CLASS_NAMES = {
    "gpt2": "GPT2LMHeadModel",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
}
"""The causal-LM class of each model type the harness builds; the other readers' types are
Llama-shaped and build as ``LlamaForCausalLM``."""


def causal_lm_class(spec: ModelSpec) -> Any:
    """The transformers causal-LM class of ``spec``'s model type."""
    return transformers_class(CLASS_NAMES.get(spec.model_type, "LlamaForCausalLM"))
