"""One reader per Hugging Face ``model_type``: which config keys set which part of a ModelSpec.

Explanation
===========

A :class:`Reader` is a small table: ``keys`` maps every config key it models to the part field
it sets, ``harmless`` lists the keys known not to change memory (RoPE base and scaling, token
ids, initialisation, norm epsilon, ...), and ``parts`` reads the modelled keys into the parts of
:mod:`vrammath.model`. Every key of a config is therefore one of three things:

* modelled -- read, checked and recorded in a part (a value the formulas do not describe, such
  as ``attention_dropout`` > 0, is refused with an :class:`~vrammath.errors.InputError`);
* known harmless -- ignored on purpose (:data:`COMMON_HARMLESS` plus the reader's own list);
* unknown -- kept as a one-line warning in ``ModelSpec.warnings``.

Adding an architecture means adding one reader to :data:`READERS`.

Examples
========

>>> spec = read_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 176,
...     "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "rope_theta": 1e4,
...     "my_new_key": 3})
>>> print(*spec.warnings)
my_new_key: unknown to the llama reader, ignored (it may change memory)
>>> READERS["gpt2"].keys["n_inner"]
'mlp.intermediate'
>>> read_config({"model_type": "llama", "hidden_size": 10**160})
Traceback (most recent call last):
...
vrammath.errors.InputError: hidden_size: must be at most 2**40 (MAX_SIZE) (got a 532-bit integer)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from vrammath.activations import GELU_KEPT
from vrammath.errors import InputError, one_of
from vrammath.model import (
    MLP,
    Attention,
    Embeddings,
    Experts,
    LatentAttention,
    ModelSpec,
    Norms,
)

MAX_SIZE = 2**40
"""Largest integer a config may hold for a size or count (elements, heads, layers, positions)."""

Parts = tuple[int, Embeddings, Attention, MLP, Norms]
"""What a reader returns: the layer count and the four parts."""

Extra = tuple[Experts | None, LatentAttention | None, int]
"""What a mixture-of-experts reader adds: experts, latent attention, multi-token-prediction
modules (see :func:`Reader.extra`)."""

# Keys that mean structure no reader models: refused unless they say "none" (0, 1, false).
REFUSED_KEYS: Mapping[str, str] = {
    "num_local_experts": "mixture-of-experts",
    "num_experts": "mixture-of-experts",
    "n_routed_experts": "mixture-of-experts",
    "moe_intermediate_size": "mixture-of-experts",
    "num_experts_per_tok": "mixture-of-experts",
    "cross_attention_hidden_size": "cross-attention",
    "add_cross_attention": "cross-attention",
}

COMMON_HARMLESS: tuple[str, ...] = (
    "_name_or_path",
    "_vrammath_source",
    "architectures",
    "bos_token_id",
    "chunk_size_feed_forward",
    "decoder_start_token_id",
    "dtype",
    "eos_token_id",
    "finetuning_task",
    "id2label",
    "initializer_range",
    "is_encoder_decoder",
    "label2id",
    "model_type",
    "pad_token_id",
    "prefix",
    "problem_type",
    "return_dict",
    "sep_token_id",
    "task_specific_params",
    "tokenizer_class",
    "torch_dtype",
    "transformers_version",
    "use_cache",
)
"""The keys of every transformers config that change no training or serving memory (metadata,
token ids, initialisation, the dtype of saved weights: the setup's precision decides)."""

# Keys whose only memory-relevant value is "off": refused when on.
_MUST_BE_OFF = ("output_attentions", "output_hidden_states")


class Keys:
    """A config being read: typed, bounded access to the keys its reader's table lists."""

    def __init__(self, cfg: Mapping[str, object], table: Mapping[str, str]) -> None:
        self.cfg = cfg
        self.table = table

    def has(self, key: str) -> bool:
        """The key is present and not null."""
        if key not in self.table:  # a reader reading a key its table does not list
            raise KeyError(f"{key} is not in the reader's table")
        return self.cfg.get(key) is not None

    def raw(self, key: str, default: object = ...) -> object:
        """The value, ``default`` when absent or null; missing without a default is an error."""
        if self.has(key):
            return self.cfg[key]
        if default is ...:
            raise InputError(key, "is required in the config and missing")
        return default

    def size(self, key: str, default: object = ...) -> int:
        """A positive integer at most :data:`MAX_SIZE` (bools are refused)."""
        return bounded_int(key, self.raw(key, default))

    def flag(self, key: str, default: bool) -> bool:
        """A JSON boolean."""
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise InputError(key, "must be true or false", got=value)
        return value

    def probability(self, key: str, default: float) -> float:
        """A number in [0, 1)."""
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise InputError(key, "must be a number in [0, 1)", got=value)
        return float(value)

    def off(self, key: str, default: object, allowed: str) -> None:
        """The key must keep its default (the only value modelled)."""
        value = self.raw(key, default)
        if value != default or isinstance(value, bool) != isinstance(default, bool):
            raise InputError(key, allowed, got=value)


def _got(value: object) -> object:
    # repr of a huge int is slow and long: name its size instead
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return _Literal(f"a {value.bit_length()}-bit integer")
    return value


class _Literal(str):
    def __repr__(self) -> str:
        return str(self)


def bounded_int(field: str, value: object, low: int = 1) -> int:
    """``value`` if an integer in ``[low, MAX_SIZE]`` (not a bool, not a float), else an error.

    >>> bounded_int("layers", 32)
    32
    >>> bounded_int("layers", True)
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: layers: must be a positive integer (got True)
    """
    what = "a positive integer" if low == 1 else f"an integer >= {low}"
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(field, f"must be {what}", got=_got(value))
    if value > MAX_SIZE:
        raise InputError(field, "must be at most 2**40 (MAX_SIZE)", got=_got(value))
    return value


def divisors_text(n: int, limit: int = 8) -> str:
    """The divisors of ``n`` (found in O(sqrt n)), at most ``limit`` of them listed.

    >>> divisors_text(4)
    '1, 2, 4'
    >>> divisors_text(720720)
    '1, 2, 3, 4, 5, 6, 7, ..., 720720 (240 divisors)'
    """
    small: list[int] = []
    large: list[int] = []
    k = 1
    while k * k <= n:
        if n % k == 0:
            small.append(k)
            if k * k != n:
                large.append(n // k)
        k += 1
    found = small + large[::-1]
    if len(found) <= limit:
        return ", ".join(map(str, found))
    head = ", ".join(map(str, found[: limit - 1]))
    return f"{head}, ..., {n} ({len(found)} divisors)"


def _kv_heads(k: Keys, key: str, heads: int) -> int:
    kv_heads = k.size(key, heads)
    if heads % kv_heads:
        raise InputError(
            key,
            f"must divide num_attention_heads={heads} (allowed: {divisors_text(heads)})",
            got=kv_heads,
        )
    return kv_heads


def _head_dim(k: Keys, hidden: int, heads: int) -> int:
    if k.has("head_dim"):
        return k.size("head_dim")
    if hidden % heads:
        raise InputError(
            "head_dim",
            f"is required when hidden_size={hidden} is not a multiple of "
            f"num_attention_heads={heads}",
        )
    return hidden // heads


@dataclass(frozen=True)
class Reader:
    """How one ``model_type``'s config.json maps to the parts.

    ``keys``: config key -> the part field it sets (or the check it is held to);
    ``harmless``: keys known not to change memory, besides :data:`COMMON_HARMLESS`;
    ``parts``: reads the keys of ``keys`` into the layer count and the four parts;
    ``extra``: reads the optional parts (experts, latent attention, MTP modules), if any.
    """

    model_type: str
    keys: Mapping[str, str]
    harmless: tuple[str, ...]
    parts: Callable[[Keys], Parts]
    extra: Callable[[Keys], Extra] | None = None

    def read(self, cfg: Mapping[str, object], name: str) -> ModelSpec:
        """The ModelSpec of ``cfg``, with a warning for each key this reader does not know."""
        k = Keys(cfg, self.keys)
        layers, embeddings, attention, mlp, norms = self.parts(k)
        experts, latent, mtp = self.extra(k) if self.extra is not None else (None, None, 0)
        known = set(self.keys) | set(self.harmless) | set(COMMON_HARMLESS)
        known |= set(REFUSED_KEYS) | set(_MUST_BE_OFF)
        warnings = tuple(
            f"{key}: unknown to the {self.model_type} reader, ignored (it may change memory)"
            for key in sorted(map(str, cfg))
            if key not in known
        )
        return ModelSpec(
            name=name,
            model_type=self.model_type,
            layers=layers,
            embeddings=embeddings,
            attention=attention,
            mlp=mlp,
            norms=norms,
            warnings=warnings,
            experts=experts,
            latent=latent,
            mtp_layers=mtp,
        )


# ---------------------------------------------------------------------------------------------
# LLaMA-style decoders: llama, mistral, qwen2
# ---------------------------------------------------------------------------------------------

_DECODER_KEYS: dict[str, str] = {
    "hidden_size": "embeddings.hidden",
    "vocab_size": "embeddings.vocab",
    "tie_word_embeddings": "embeddings.tied",
    "max_position_embeddings": "embeddings.max_positions",
    "num_hidden_layers": "layers",
    "num_attention_heads": "attention.heads",
    "num_key_value_heads": "attention.kv_heads",
    "head_dim": "attention.head_dim",
    "attention_dropout": "attention.dropout (0 only: dropout in attention is not modelled)",
    "intermediate_size": "mlp.intermediate",
    "hidden_act": "mlp.activation (silu only)",
}

_DECODER_HARMLESS: tuple[str, ...] = (
    "max_sequence_length",
    "pretraining_tp",
    "rms_norm_eps",
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
)
"""RoPE's base and scaling (Llama 3.x) change the angles, not the tensors kept; ``pretraining_tp``
splits the matmuls of the model's pretraining only when > 1, which transformers 5 ignores."""


def _decoder_parts(
    k: Keys,
    *,
    qkv_bias: bool,
    o_bias: bool,
    mlp_bias: bool,
    window: int | None,
    window_layers: int,
) -> Parts:
    """The parts shared by LLaMA, Mistral and Qwen2: RMSNorm, RoPE, a gated SiLU MLP."""
    hidden = k.size("hidden_size")
    heads = k.size("num_attention_heads")
    layers = k.size("num_hidden_layers")
    activation = k.raw("hidden_act", "silu")
    if activation != "silu":
        raise one_of("hidden_act", activation, ["silu"])
    if k.probability("attention_dropout", 0.0) != 0:
        raise InputError(
            "attention_dropout",
            "must be 0.0 (dropout on attention probabilities is not modelled)",
            got=k.raw("attention_dropout"),
        )
    embeddings = Embeddings(
        vocab=k.size("vocab_size"),
        hidden=hidden,
        tied=k.flag("tie_word_embeddings", False),
        learned_positions=False,
        max_positions=k.size("max_position_embeddings", 2048),
    )
    attention = Attention(
        heads=heads,
        kv_heads=_kv_heads(k, "num_key_value_heads", heads),
        head_dim=_head_dim(k, hidden, heads),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        sliding_window=window,
        window_layers=window_layers if window is not None else 0,
    )
    mlp = MLP(
        intermediate=k.size("intermediate_size"), gated=True, activation="silu", bias=mlp_bias
    )
    return layers, embeddings, attention, mlp, Norms(kind="rmsnorm")


def _llama(k: Keys) -> Parts:
    bias = k.flag("attention_bias", False)
    return _decoder_parts(
        k,
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=k.flag("mlp_bias", False),
        window=None,
        window_layers=0,
    )


def _mistral(k: Keys) -> Parts:
    window = k.size("sliding_window") if k.has("sliding_window") else None
    return _decoder_parts(
        k,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        window=window,
        window_layers=k.size("num_hidden_layers"),
    )


def _qwen2(k: Keys) -> Parts:
    layers = k.size("num_hidden_layers")
    use_window = k.flag("use_sliding_window", False)
    # checked even when off (the presets carry the window they would use); defaults as
    # transformers' Qwen2Config: a 4096-token window from layer 28 on
    explicit_null = "sliding_window" in k.cfg and k.cfg["sliding_window"] is None
    window = None if explicit_null else k.size("sliding_window", 4096)
    full_layers = bounded_int("max_window_layers", k.raw("max_window_layers", 28), low=0)
    window_layers = max(layers - full_layers, 0) if use_window and window is not None else 0
    if k.has("layer_types"):
        kinds = k.raw("layer_types")
        allowed = ("full_attention", "sliding_attention")
        if (
            not isinstance(kinds, list)
            or len(kinds) != layers
            or any(x not in allowed for x in kinds)
        ):
            raise InputError(
                "layer_types",
                f"must list {layers} values (num_hidden_layers), each one of " + ", ".join(allowed),
                got=kinds,
            )
        window_layers = kinds.count("sliding_attention")
        if window_layers and (not use_window or window is None):
            raise InputError(
                "layer_types",
                "lists sliding_attention layers but use_sliding_window is false "
                "or sliding_window is null",
            )
    return _decoder_parts(
        k,
        qkv_bias=True,
        o_bias=False,
        mlp_bias=False,
        window=window if use_window else None,
        window_layers=window_layers,
    )


LLAMA = Reader(
    "llama",
    keys={
        **_DECODER_KEYS,
        "attention_bias": "attention.qkv_bias, attention.o_bias",
        "mlp_bias": "mlp.bias",
    },
    harmless=_DECODER_HARMLESS,
    parts=_llama,
)

MISTRAL = Reader(
    "mistral",
    keys={**_DECODER_KEYS, "sliding_window": "attention.sliding_window (every layer)"},
    harmless=_DECODER_HARMLESS,
    parts=_mistral,
)

QWEN2 = Reader(
    "qwen2",
    keys={
        **_DECODER_KEYS,
        "use_sliding_window": "attention.sliding_window (on or off)",
        "sliding_window": "attention.sliding_window",
        "max_window_layers": "attention.window_layers (layers from this index slide)",
        "layer_types": "attention.window_layers (count of sliding_attention)",
    },
    # use_mrope is Qwen2-VL's multimodal RoPE flag; Qwen2ForCausalLM never reads it
    harmless=(*_DECODER_HARMLESS, "use_mrope"),
    parts=_qwen2,
)


# ---------------------------------------------------------------------------------------------
# GPT-2
# ---------------------------------------------------------------------------------------------

GELU_VARIANTS: tuple[str, ...] = tuple(GELU_KEPT)
"""GPT-2 activation functions the activation formula describes (:data:`GELU_KEPT`)."""


def _dropout_on(k: Keys, key: str) -> float:
    p = k.probability(key, 0.1)
    if p == 0:
        raise InputError(
            key,
            "must be > 0 (GPT-2's activation formula is derived with dropout on; 0 is not modelled)",
            got=k.raw(key),
        )
    return p


def _gpt2(k: Keys) -> Parts:
    hidden = k.size("n_embd")
    heads = k.size("n_head")
    if hidden % heads:
        raise InputError("n_head", f"must divide n_embd={hidden}", got=heads)
    activation = k.raw("activation_function", "gelu_new")
    if activation not in GELU_VARIANTS:
        raise one_of("activation_function", activation, GELU_VARIANTS)
    k.off("reorder_and_upcast_attn", False, "must be false (the upcast attention is not modelled)")
    k.off(
        "scale_attn_by_inverse_layer_idx",
        False,
        "must be false (per-layer attention scaling is not modelled)",
    )
    k.off("scale_attn_weights", True, "must be true (unscaled attention is not modelled)")
    resid = _dropout_on(k, "resid_pdrop")
    embeddings = Embeddings(
        vocab=k.size("vocab_size"),
        hidden=hidden,
        tied=k.flag("tie_word_embeddings", True),
        learned_positions=True,
        max_positions=k.size("n_positions", 1024),
        dropout=_dropout_on(k, "embd_pdrop"),
    )
    attention = Attention(
        heads=heads,
        kv_heads=heads,
        head_dim=hidden // heads,
        qkv_bias=True,
        o_bias=True,
        fused_qkv=True,
        dropout=_dropout_on(k, "attn_pdrop"),
        output_dropout=resid,
    )
    mlp = MLP(
        intermediate=k.size("n_inner", 4 * hidden),
        gated=False,
        activation=str(activation),
        bias=True,
        dropout=resid,
    )
    return k.size("n_layer"), embeddings, attention, mlp, Norms(kind="layernorm")


GPT2 = Reader(
    "gpt2",
    keys={
        "n_embd": "embeddings.hidden",
        "vocab_size": "embeddings.vocab",
        "tie_word_embeddings": "embeddings.tied",
        "n_positions": "embeddings.max_positions",
        "embd_pdrop": "embeddings.dropout (> 0 only)",
        "n_layer": "layers",
        "n_head": "attention.heads (= kv_heads)",
        "attn_pdrop": "attention.dropout (> 0 only)",
        "resid_pdrop": "attention.output_dropout, mlp.dropout (> 0 only)",
        "reorder_and_upcast_attn": "(false only)",
        "scale_attn_by_inverse_layer_idx": "(false only)",
        "scale_attn_weights": "(true only)",
        "n_inner": "mlp.intermediate",
        "activation_function": "mlp.activation",
    },
    harmless=(
        "layer_norm_epsilon",
        "n_ctx",
        "summary_activation",
        "summary_first_dropout",
        "summary_proj_to_labels",
        "summary_type",
        "summary_use_proj",
    ),
    parts=_gpt2,
)
"""``n_ctx`` is a legacy alias of ``n_positions`` that GPT-2's model does not read; the
``summary_*`` keys configure the double-heads model's classifier, not the causal LM."""


# ---------------------------------------------------------------------------------------------
# Mixture-of-experts and latent attention: mixtral, qwen2_moe, qwen3_moe, deepseek_v3
# ---------------------------------------------------------------------------------------------

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


def _mixtral(k: Keys) -> Parts:
    k.off("router_jitter_noise", 0.0, "must be 0.0 (router jitter noise is not modelled)")
    return _mistral(k)


def _mixtral_extra(k: Keys) -> Extra:
    count, top_k = _routing(k, "num_local_experts")
    layers = k.size("num_hidden_layers")
    experts = Experts(
        count, top_k, k.size("intermediate_size"), tuple(range(layers)), norm_topk=True
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
    count, top_k = _routing(k, "num_experts")
    layers = k.size("num_hidden_layers")
    experts = Experts(
        count,
        top_k,
        k.size("moe_intermediate_size"),
        _sparse_layers(k, layers),
        shared_intermediate=k.size("shared_expert_intermediate_size", 5632) if shared else 0,
        shared_gate=shared,
        norm_topk=k.flag("norm_topk_prob", False),
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
    attention = replace(attention, qkv_bias=k.flag("qkv_bias", True))
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
    if k.size("num_key_value_heads", heads) != heads:
        raise InputError(
            "num_key_value_heads",
            f"must equal num_attention_heads={heads} (latent attention expands K/V per head)",
            got=k.raw("num_key_value_heads"),
        )
    rope = k.size("qk_rope_head_dim")
    if rope % 2:
        raise InputError("qk_rope_head_dim", "must be even (RoPE rotates pairs)", got=rope)
    layers, embeddings, attention, mlp, norms = _decoder_parts(
        k, qkv_bias=False, o_bias=False, mlp_bias=False, window=None, window_layers=0
    )
    # the head dimension of q and k; values have v_head_dim (LatentAttention)
    attention = replace(attention, head_dim=k.size("qk_nope_head_dim") + rope)
    return layers, embeddings, attention, mlp, norms


_ROUTER_KINDS = {"scoring_func": "sigmoid", "topk_method": "noaux_tc"}


def _deepseek_v3_extra(k: Keys) -> Extra:
    for key, only in _ROUTER_KINDS.items():
        value = k.raw(key, only)
        if value != only:
            raise one_of(key, value, [only])
    count, top_k = _routing(k, "n_routed_experts")
    groups = k.size("n_group", 1)
    if count % groups:
        raise InputError(
            "n_group", f"must divide n_routed_experts={count} ({divisors_text(count)})", got=groups
        )
    chosen = k.size("topk_group", 1)
    if chosen > groups or top_k > chosen * (count // groups):
        raise InputError(
            "topk_group",
            f"must be at most n_group={groups} and leave num_experts_per_tok={top_k} experts "
            "to choose from",
            got=chosen,
        )
    layers = k.size("num_hidden_layers")
    dense = bounded_int("first_k_dense_replace", k.raw("first_k_dense_replace", 3), low=0)
    if dense > layers:
        raise InputError("first_k_dense_replace", f"must be at most {layers}", got=dense)
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
    **_DECODER_KEYS,
    **_MOE_ROUTING_KEYS,
    "num_experts": "experts.count",
    "moe_intermediate_size": "experts.intermediate",
    "norm_topk_prob": "experts.norm_topk",
    "decoder_sparse_step": "experts.layers (every n-th layer)",
    "mlp_only_layers": "experts.layers (these are dense)",
    "use_sliding_window": "(false only)",
}
_QWEN_MOE_HARMLESS = (*_DECODER_HARMLESS, *_MOE_HARMLESS, "max_window_layers", "sliding_window")
"""With ``use_sliding_window`` false, transformers reads neither the window nor its layers."""

MIXTRAL = Reader(
    "mixtral",
    keys={
        **_DECODER_KEYS,
        **_MOE_ROUTING_KEYS,
        "sliding_window": "attention.sliding_window (every layer)",
        "num_local_experts": "experts.count",
        "router_jitter_noise": "(0 only)",
    },
    harmless=(*_DECODER_HARMLESS, *_MOE_HARMLESS),
    parts=_mixtral,
    extra=_mixtral_extra,
)

QWEN2_MOE = Reader(
    "qwen2_moe",
    keys={
        **_QWEN_MOE_KEYS,
        "qkv_bias": "attention.qkv_bias",
        "shared_expert_intermediate_size": "experts.shared_intermediate (with a sigmoid gate)",
    },
    harmless=_QWEN_MOE_HARMLESS,
    parts=_qwen2_moe,
    extra=lambda k: _qwen_moe_extra(k, shared=True),
)

QWEN3_MOE = Reader(
    "qwen3_moe",
    keys={**_QWEN_MOE_KEYS, "attention_bias": "attention.qkv_bias, attention.o_bias"},
    harmless=_QWEN_MOE_HARMLESS,
    parts=_qwen3_moe,
    extra=lambda k: _qwen_moe_extra(k, shared=False),
)

DEEPSEEK_V3 = Reader(
    "deepseek_v3",
    keys={
        **_DECODER_KEYS,
        **_MOE_ROUTING_KEYS,
        "attention_bias": "(false only)",
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
        *_DECODER_HARMLESS,
        "auto_map",
        "aux_loss_alpha",
        "ep_size",
        "quantization_config",
        "rope_interleave",
        "routed_scaling_factor",
        "seq_aux",
    ),
    parts=_deepseek_v3,
    extra=_deepseek_v3_extra,
)
"""``auto_map`` names the Hub's remote code (transformers has its own); ``ep_size`` is that
code's inference setting; ``quantization_config`` is the fp8 format the weights are published in
(the setup's precision decides the bytes); ``routed_scaling_factor`` scales routing weights in
place; ``seq_aux`` / ``aux_loss_alpha`` configure a training loss transformers does not build."""


# ---------------------------------------------------------------------------------------------
# Gemma-2 (archb: sandwich norms, softcapping, alternating sliding/global layers)
# ---------------------------------------------------------------------------------------------

GEMMA_ACTIVATIONS: tuple[str, ...] = ("gelu_pytorch_tanh", "gelu")
"""The gated MLP's activations the Gemma readers accept (single PyTorch ops keeping their input)."""


def _layer_pattern(k: Keys, layers: int, default: list[bool]) -> list[bool]:
    """Which layers slide: the config's ``layer_types`` or the architecture's default."""
    if not k.has("layer_types"):
        return default
    kinds = k.raw("layer_types")
    allowed = ("full_attention", "sliding_attention")
    if not isinstance(kinds, list) or len(kinds) != layers or any(x not in allowed for x in kinds):
        raise InputError(
            "layer_types",
            f"must list {layers} values (num_hidden_layers), each one of " + ", ".join(allowed),
            got=kinds,
        )
    return [x == "sliding_attention" for x in kinds]


def _softcap(k: Keys, key: str, default: float | None) -> float | None:
    k.has(key)  # the table lists it
    value = k.cfg.get(key, default)  # an explicit null turns the cap off
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InputError(key, "must be a positive number or null", got=value)
    return float(value)


def _gemma(k: Keys) -> Parts:
    """Gemma (v1): Gemma-2's parts without sandwich norms, softcaps or sliding windows."""
    hidden = k.size("hidden_size")
    heads = k.size("num_attention_heads")
    activation = k.raw("hidden_act", "gelu_pytorch_tanh")
    if activation not in GEMMA_ACTIVATIONS:
        raise one_of("hidden_act", activation, GEMMA_ACTIVATIONS)
    # GemmaConfig replaces the legacy "gelu" of the official releases by the tanh approximation
    activation = "gelu_pytorch_tanh"
    if k.probability("attention_dropout", 0.0) != 0:
        raise InputError(
            "attention_dropout",
            "must be 0.0 (dropout on attention probabilities is not modelled)",
            got=k.raw("attention_dropout"),
        )
    bidirectional = k.raw("use_bidirectional_attention", False)
    if bidirectional is not False:
        raise InputError(
            "use_bidirectional_attention",
            "must be false or null (causal decoders only)",
            got=bidirectional,
        )
    bias = k.flag("attention_bias", False)
    embeddings = Embeddings(
        vocab=k.size("vocab_size"),
        hidden=hidden,
        tied=k.flag("tie_word_embeddings", True),
        learned_positions=False,
        max_positions=k.size("max_position_embeddings", 8192),
        scaled=True,
    )
    attention = Attention(
        heads=heads,
        kv_heads=_kv_heads(k, "num_key_value_heads", heads),
        head_dim=k.size("head_dim", 256),
        qkv_bias=bias,
        o_bias=bias,
    )
    mlp = MLP(
        intermediate=k.size("intermediate_size"), gated=True, activation=activation, bias=False
    )
    norms = Norms(kind="rmsnorm", unit_offset=True)
    return k.size("num_hidden_layers"), embeddings, attention, mlp, norms


GEMMA = Reader(
    "gemma",
    keys={
        "hidden_size": "embeddings.hidden",
        "vocab_size": "embeddings.vocab",
        "tie_word_embeddings": "embeddings.tied",
        "max_position_embeddings": "embeddings.max_positions",
        "num_hidden_layers": "layers",
        "num_attention_heads": "attention.heads",
        "num_key_value_heads": "attention.kv_heads",
        "head_dim": "attention.head_dim",
        "attention_bias": "attention.qkv_bias, attention.o_bias",
        "attention_dropout": "attention.dropout (0 only)",
        "use_bidirectional_attention": "(false or null only)",
        "intermediate_size": "mlp.intermediate",
        "hidden_act": "mlp.activation (gelu means gelu_pytorch_tanh)",
    },
    # hidden_activation is in some Gemma files; GemmaConfig 5.x reads hidden_act only
    harmless=(*_DECODER_HARMLESS, "hidden_activation"),
    parts=_gemma,
)


def _gemma3_text(k: Keys) -> Parts:
    """Gemma-3's text decoder: Gemma-2's parts with q/k norms, no softcaps by default, and one
    global layer in ``sliding_window_pattern`` (6)."""
    layers = k.size("num_hidden_layers")
    pattern = k.size("sliding_window_pattern", 6)
    default = [bool((i + 1) % pattern) for i in range(layers)]
    # Gemma3TextConfig's default vocabulary (the 27B file relies on it)
    return _gemma2_like(
        k, default, qk_norm=True, caps=(None, None), max_positions=131072, vocab=262208
    )


def _gemma2(k: Keys) -> Parts:
    layers = k.size("num_hidden_layers")
    default = [bool((i + 1) % 2) for i in range(layers)]
    return _gemma2_like(k, default, qk_norm=False, caps=(30.0, 50.0), max_positions=8192, vocab=...)


def _gemma2_like(
    k: Keys,
    default_slides: list[bool],
    *,
    qk_norm: bool,
    caps: tuple[float | None, float | None],
    max_positions: int,
    vocab: object,
) -> Parts:
    hidden = k.size("hidden_size")
    heads = k.size("num_attention_heads")
    layers = k.size("num_hidden_layers")
    activation = k.raw("hidden_activation", None) or k.raw("hidden_act", "gelu_pytorch_tanh")
    if activation not in GEMMA_ACTIVATIONS:
        raise one_of("hidden_activation", activation, GEMMA_ACTIVATIONS)
    if k.probability("attention_dropout", 0.0) != 0:
        raise InputError(
            "attention_dropout",
            "must be 0.0 (dropout on attention probabilities is not modelled)",
            got=k.raw("attention_dropout"),
        )
    bidirectional = k.raw("use_bidirectional_attention", False)
    if bidirectional is not False:
        raise InputError(
            "use_bidirectional_attention",
            "must be false or null (causal decoders only)",
            got=bidirectional,
        )
    slides = _layer_pattern(k, layers, default_slides)
    window = k.size("sliding_window", 4096) if any(slides) else None
    bias = k.flag("attention_bias", False)
    embeddings = Embeddings(
        vocab=k.size("vocab_size", vocab),
        hidden=hidden,
        tied=k.flag("tie_word_embeddings", True),
        learned_positions=False,
        max_positions=k.size("max_position_embeddings", max_positions),
        scaled=True,
        logit_softcap=_softcap(k, "final_logit_softcapping", caps[0]),
    )
    attention = Attention(
        heads=heads,
        kv_heads=_kv_heads(k, "num_key_value_heads", heads),
        head_dim=k.size("head_dim", 256),
        qkv_bias=bias,
        o_bias=bias,
        sliding_window=window,
        window_layers=sum(slides),
        last_layer_slides=slides[-1],
        softcap=_softcap(k, "attn_logit_softcapping", caps[1]),
        qk_norm="head" if qk_norm else "none",
    )
    mlp = MLP(
        intermediate=k.size("intermediate_size"), gated=True, activation=str(activation), bias=False
    )
    norms = Norms(kind="rmsnorm", placement="sandwich", unit_offset=True)
    return layers, embeddings, attention, mlp, norms


GEMMA2 = Reader(
    "gemma2",
    keys={
        "hidden_size": "embeddings.hidden",
        "vocab_size": "embeddings.vocab",
        "tie_word_embeddings": "embeddings.tied",
        "max_position_embeddings": "embeddings.max_positions",
        "final_logit_softcapping": "embeddings.logit_softcap",
        "num_hidden_layers": "layers",
        "num_attention_heads": "attention.heads",
        "num_key_value_heads": "attention.kv_heads",
        "head_dim": "attention.head_dim",
        "attention_bias": "attention.qkv_bias, attention.o_bias",
        "attention_dropout": "attention.dropout (0 only)",
        "attn_logit_softcapping": "attention.softcap",
        "sliding_window": "attention.sliding_window",
        "layer_types": "attention.window_layers, attention.last_layer_slides",
        "use_bidirectional_attention": "(false or null only)",
        "intermediate_size": "mlp.intermediate",
        "hidden_activation": "mlp.activation",
        "hidden_act": "mlp.activation (when hidden_activation is absent)",
    },
    # query_pre_attn_scalar sets the scores' scale, a number; cache_implementation is serving's;
    # sliding_window_size is a legacy copy of sliding_window that transformers 5 never reads
    harmless=(
        *_DECODER_HARMLESS,
        "cache_implementation",
        "query_pre_attn_scalar",
        "sliding_window_size",
    ),
    parts=_gemma2,
)

GEMMA3_TEXT = Reader(
    "gemma3_text",
    keys={
        **GEMMA2.keys,
        "sliding_window_pattern": "attention.window_layers (one global layer in this many)",
        "layer_types": "attention.window_layers, attention.last_layer_slides (overrides the pattern)",
    },
    # rope_local_base_freq is the sliding layers' RoPE base: a second (s, d) table, counted
    harmless=(*GEMMA2.harmless, "rope_local_base_freq"),
    parts=_gemma3_text,
)


# ---------------------------------------------------------------------------------------------
# GPT-NeoX (archb: parallel residual, partial rotary, fused QKV, LayerNorm with bias)
# ---------------------------------------------------------------------------------------------

NEOX_ACTIVATIONS: tuple[str, ...] = ("gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast")


def _rotary_fraction(k: Keys) -> float:
    """``rotary_pct`` (older configs) or ``rope_parameters.partial_rotary_factor``; 0.25 as
    transformers' GPTNeoXConfig defaults it."""
    value: object = k.raw("rotary_pct", 0.25)
    params = k.raw("rope_parameters", None)
    if isinstance(params, Mapping) and params.get("partial_rotary_factor") is not None:
        value = params["partial_rotary_factor"]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise InputError("rotary_pct", "must be a number in (0, 1]", got=value)
    return float(value)


def _zero(k: Keys, key: str) -> None:
    if k.probability(key, 0.0) != 0:
        raise InputError(key, "must be 0.0 (GPT-NeoX's dropout is not modelled)", got=k.raw(key))


def _gpt_neox(k: Keys) -> Parts:
    hidden = k.size("hidden_size")
    heads = k.size("num_attention_heads")
    if hidden % heads:
        raise InputError("num_attention_heads", f"must divide hidden_size={hidden}", got=heads)
    activation = k.raw("hidden_act", "gelu")
    if activation not in NEOX_ACTIVATIONS:
        raise one_of("hidden_act", activation, NEOX_ACTIVATIONS)
    _zero(k, "attention_dropout")
    _zero(k, "hidden_dropout")
    head_dim = hidden // heads
    rotary = int(head_dim * _rotary_fraction(k))  # transformers truncates the same way
    if rotary == 0:
        raise InputError("rotary_pct", f"rotates no dimension of head_dim={head_dim}")
    bias = k.flag("attention_bias", True)
    embeddings = Embeddings(
        vocab=k.size("vocab_size"),
        hidden=hidden,
        tied=k.flag("tie_word_embeddings", False),
        learned_positions=False,
        max_positions=k.size("max_position_embeddings", 2048),
    )
    attention = Attention(
        heads=heads,
        kv_heads=heads,
        head_dim=head_dim,
        qkv_bias=bias,
        o_bias=bias,
        fused_qkv=True,
        rotary_dim=None if rotary == head_dim else rotary,
    )
    mlp = MLP(
        intermediate=k.size("intermediate_size"), gated=False, activation=str(activation), bias=True
    )
    norms = Norms(kind="layernorm", parallel_residual=k.flag("use_parallel_residual", True))
    return k.size("num_hidden_layers"), embeddings, attention, mlp, norms


GPT_NEOX = Reader(
    "gpt_neox",
    keys={
        "hidden_size": "embeddings.hidden",
        "vocab_size": "embeddings.vocab",
        "tie_word_embeddings": "embeddings.tied",
        "max_position_embeddings": "embeddings.max_positions",
        "num_hidden_layers": "layers",
        "num_attention_heads": "attention.heads (= kv_heads)",
        "attention_bias": "attention.qkv_bias, attention.o_bias",
        "attention_dropout": "attention.dropout (0 only)",
        "hidden_dropout": "(0 only)",
        "rotary_pct": "attention.rotary_dim",
        "rope_parameters": "attention.rotary_dim (partial_rotary_factor)",
        "intermediate_size": "mlp.intermediate",
        "hidden_act": "mlp.activation",
        "use_parallel_residual": "norms.parallel_residual",
    },
    # rotary_emb_base is RoPE's base; classifier_dropout belongs to the classification heads;
    # attention_probs_dropout_prob / hidden_dropout_prob (GPT-NeoX-20B's file) are BERT-style
    # names GPTNeoXConfig never reads (its dropouts are attention_dropout and hidden_dropout)
    harmless=(
        "attention_probs_dropout_prob",
        "classifier_dropout",
        "hidden_dropout_prob",
        "is_decoder",
        "layer_norm_eps",
        "rope_scaling",
        "rope_theta",
        "rotary_emb_base",
        "bias_dropout_fusion",
    ),
    parts=_gpt_neox,
)


# The newer decoders' readers live in their own module; it uses the classes above when called.
from vrammath.readers_decoders import decoder_readers  # noqa: E402

READERS: Mapping[str, Reader] = {
    r.model_type: r
    for r in (
        GPT2,
        LLAMA,
        MISTRAL,
        QWEN2,
        GEMMA,
        GEMMA2,
        GEMMA3_TEXT,
        GPT_NEOX,
        MIXTRAL,
        QWEN2_MOE,
        QWEN3_MOE,
        DEEPSEEK_V3,
        *decoder_readers(),
    )
}
"""The reader of each supported ``model_type``."""

MODEL_TYPES: tuple[str, ...] = tuple(sorted(READERS))


def read_config(cfg: Mapping[str, object], name: str | None = None) -> ModelSpec:
    """Check the keys every reader shares, then read ``cfg`` with its ``model_type``'s reader.

    >>> read_config({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
    ...     "vocab_size": 100, "resid_pdrop": 0.0})
    Traceback (most recent call last):
    ...
    vrammath.errors.InputError: resid_pdrop: must be > 0 (GPT-2's activation formula is derived with dropout on; 0 is not modelled) (got 0.0)
    """
    if not isinstance(cfg, Mapping):
        raise InputError("config", "must be a JSON object", got=type(cfg).__name__)
    model_type = cfg.get("model_type")
    if model_type not in READERS:
        # no formula for it yet: derive measures any type transformers can build
        raise InputError(
            "model_type",
            f"must be one of {', '.join(MODEL_TYPES)} (any other: measure it exactly with "
            "`vrammath derive CONFIG.json`, needs the 'measure' extra)",
            got=model_type,
        )
    for key, what in REFUSED_KEYS.items():
        if key in READERS[str(model_type)].keys:  # the reader models it
            continue
        value = cfg.get(key)
        # "none" is null, false, or a count of 0 or 1 (one expert is a dense MLP); true is on
        if value is not None and value is not False and (value is True or value not in (0, 1)):
            same = {k for k, w in REFUSED_KEYS.items() if w == what}
            having = sorted(t for t, r in READERS.items() if same & set(r.keys)) or ["none"]
            raise InputError(
                key,
                f"{what} is not modelled by the {model_type} reader "
                f"(readers with {what}: {', '.join(having)})",
                got=value,
            )
    for key in _MUST_BE_OFF:
        if cfg.get(key) not in (None, False):
            raise InputError(
                key, "must be false (its returned tensors are not modelled)", got=cfg[key]
            )
    label = name if name is not None else str(cfg.get("_name_or_path") or model_type)
    return READERS[str(model_type)].read(cfg, label)


__all__ = [
    "COMMON_HARMLESS",
    "GELU_VARIANTS",
    "MAX_SIZE",
    "MODEL_TYPES",
    "READERS",
    "REFUSED_KEYS",
    "Keys",
    "Reader",
    "bounded_int",
    "divisors_text",
    "read_config",
]
