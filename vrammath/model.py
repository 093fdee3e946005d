"""ModelSpec: the architecture facts that memory depends on, read from a Hugging Face config.json.

Two families are understood:

* ``llama`` -- LLaMA-style decoders (model types ``llama``, ``mistral``, ``qwen2``): RMSNorm, RoPE,
  gated SiLU MLP of any intermediate size, grouped-query attention, optional explicit ``head_dim``,
  optional q/k/v (and o) biases, tied or untied embeddings.
* ``gpt`` -- GPT-2-style decoders (model type ``gpt2``): LayerNorm with bias, learned positions, a
  plain GeLU MLP (4h unless ``n_inner`` says otherwise), biases everywhere, tied embeddings. The
  models of Korthikanti et al. (2022) are described in this schema.

A config that asks for something these families cannot honour (mixture-of-experts, an unknown
model type, an activation other than the family's) is refused with an :class:`InputError`
rather than miscounted.

Examples
========

>>> spec = from_hf_config({"model_type": "llama", "hidden_size": 4096, "intermediate_size": 11008,
...     "num_hidden_layers": 32, "num_attention_heads": 32, "vocab_size": 32000}, name="llama-7b")
>>> spec.head_dim, spec.kv_heads, spec.tied_embeddings
(128, 32, False)
>>> from_hf_config({"model_type": "mixtral", "num_local_experts": 8})
Traceback (most recent call last):
...
vrammath.errors.InputError: model_type: must be one of gpt2, llama, mistral, qwen2 (got 'mixtral')
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from vrammath.errors import InputError, one_of, positive_int

Family = Literal["llama", "gpt"]

LLAMA_TYPES = ("llama", "mistral", "qwen2")
GPT_TYPES = ("gpt2",)
MODEL_TYPES = tuple(sorted(LLAMA_TYPES + GPT_TYPES))

# Keys that mean experts or other structure the two families do not have.
_REFUSED_KEYS = {
    "num_local_experts": "mixture-of-experts",
    "num_experts": "mixture-of-experts",
    "n_routed_experts": "mixture-of-experts",
    "moe_intermediate_size": "mixture-of-experts",
    "num_experts_per_tok": "mixture-of-experts",
    "cross_attention_hidden_size": "cross-attention",
    "add_cross_attention": "cross-attention",
}


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of a decoder-only transformer, as far as memory is concerned.

    All sizes are element counts. ``head_dim`` is explicit because it is not always
    ``hidden // heads`` (e.g. some Mistral and Gemma configs).
    """

    name: str
    model_type: str
    family: Family
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    max_positions: int
    sliding_window: int | None = None

    @property
    def gated_mlp(self) -> bool:
        """LLaMA's SwiGLU has three matrices (gate, up, down); GPT's GeLU MLP has two."""
        return self.family == "llama"

    @property
    def learned_positions(self) -> bool:
        """GPT-style models add a learned position embedding; LLaMA-style use RoPE (no weights)."""
        return self.family == "gpt"

    @property
    def norm(self) -> str:
        """``rmsnorm`` (weight only) or ``layernorm`` (weight and bias)."""
        return "rmsnorm" if self.family == "llama" else "layernorm"


def _get(cfg: Mapping[str, object], key: str, default: object = ...) -> object:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise InputError(key, "is required in the config and missing")
    return default


def _bool(cfg: Mapping[str, object], key: str, default: bool) -> bool:
    value = _get(cfg, key, default)
    if not isinstance(value, bool):
        raise InputError(key, "must be true or false", got=value)
    return value


def _int(cfg: Mapping[str, object], key: str, default: object = ...) -> int:
    return positive_int(key, _get(cfg, key, default))


def from_hf_config(cfg: Mapping[str, object], name: str | None = None) -> ModelSpec:
    """Build a :class:`ModelSpec` from a parsed Hugging Face ``config.json``.

    Raises :class:`InputError` naming the field for anything missing, mistyped or unsupported.

    >>> spec = from_hf_config({"model_type": "qwen2", "hidden_size": 8192,
    ...     "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64,
    ...     "num_key_value_heads": 8, "vocab_size": 152064})
    >>> spec.qkv_bias, spec.o_bias, spec.kv_heads
    (True, False, 8)
    """
    if not isinstance(cfg, Mapping):
        raise InputError("config", "must be a JSON object", got=type(cfg).__name__)
    model_type = cfg.get("model_type")
    if model_type not in MODEL_TYPES:
        raise one_of("model_type", model_type, MODEL_TYPES)
    for key, what in _REFUSED_KEYS.items():
        value = cfg.get(key)
        if value not in (None, 0, 1, False):
            raise InputError(key, f"{what} is not supported yet (dense decoders only)", got=value)
    label = name if name is not None else str(cfg.get("_name_or_path") or model_type)
    if model_type in GPT_TYPES:
        return _from_gpt2(cfg, label)
    return _from_llama(cfg, label, str(model_type))


def _from_llama(cfg: Mapping[str, object], name: str, model_type: str) -> ModelSpec:
    hidden = _int(cfg, "hidden_size")
    heads = _int(cfg, "num_attention_heads")
    kv_heads = _int(cfg, "num_key_value_heads", heads)
    if heads % kv_heads:
        raise InputError(
            "num_key_value_heads",
            f"must divide num_attention_heads={heads} (allowed: "
            + ", ".join(str(k) for k in range(1, heads + 1) if heads % k == 0)
            + ")",
            got=kv_heads,
        )
    if "head_dim" in cfg and cfg["head_dim"] is not None:
        head_dim = _int(cfg, "head_dim")
    else:
        if hidden % heads:
            raise InputError(
                "head_dim",
                f"is required when hidden_size={hidden} is not a multiple of "
                f"num_attention_heads={heads}",
            )
        head_dim = hidden // heads
    act = _get(cfg, "hidden_act", "silu")
    if act != "silu":
        raise one_of("hidden_act", act, ["silu"])
    if model_type == "qwen2":
        qkv_bias, o_bias = True, False
        window = _int(cfg, "sliding_window") if _bool(cfg, "use_sliding_window", False) else None
    elif model_type == "llama":
        qkv_bias = o_bias = _bool(cfg, "attention_bias", False)
        window = None
    else:  # mistral
        qkv_bias = o_bias = False
        raw = cfg.get("sliding_window")
        window = None if raw is None else positive_int("sliding_window", raw)
    return ModelSpec(
        name=name,
        model_type=model_type,
        family="llama",
        hidden=hidden,
        intermediate=_int(cfg, "intermediate_size"),
        layers=_int(cfg, "num_hidden_layers"),
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=_int(cfg, "vocab_size"),
        tied_embeddings=_bool(cfg, "tie_word_embeddings", False),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        mlp_bias=_bool(cfg, "mlp_bias", False),
        max_positions=_int(cfg, "max_position_embeddings", 2048),
        sliding_window=window,
    )


def _from_gpt2(cfg: Mapping[str, object], name: str) -> ModelSpec:
    hidden = _int(cfg, "n_embd")
    heads = _int(cfg, "n_head")
    if hidden % heads:
        raise InputError("n_head", f"must divide n_embd={hidden}", got=heads)
    act = _get(cfg, "activation_function", "gelu_new")
    allowed = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh")
    if act not in allowed:
        raise one_of("activation_function", act, allowed)
    return ModelSpec(
        name=name,
        model_type="gpt2",
        family="gpt",
        hidden=hidden,
        intermediate=_int(cfg, "n_inner", 4 * hidden),
        layers=_int(cfg, "n_layer"),
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        vocab=_int(cfg, "vocab_size"),
        tied_embeddings=_bool(cfg, "tie_word_embeddings", True),
        qkv_bias=True,
        o_bias=True,
        mlp_bias=True,
        max_positions=_int(cfg, "n_positions", 1024),
    )


__all__ = ["GPT_TYPES", "LLAMA_TYPES", "MODEL_TYPES", "ModelSpec", "from_hf_config"]
