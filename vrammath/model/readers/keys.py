"""What every reader shares: the config view (:class:`Keys`), :class:`Reader`, the key tables.

Examples
========

>>> bounded_int("hidden_size", 64)
64
>>> divisors_text(12)
'1, 2, 3, 4, 6, 12'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from vrammath.model.spec import (
    MLP,
    Attention,
    Embeddings,
    Experts,
    LatentAttention,
    ModelSpec,
    Norms,
)
from vrammath.notation.errors import InputError, one_of

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

_SIZE_KEYS: Mapping[str, str] = {
    "hidden_size": "embeddings.hidden",
    "vocab_size": "embeddings.vocab",
    "tie_word_embeddings": "embeddings.tied",
    "max_position_embeddings": "embeddings.max_positions",
    "num_hidden_layers": "layers",
    "intermediate_size": "mlp.intermediate",
}
"""The sizes under transformers' usual names (every reader's but GPT-2's): a reader's table starts
from them and adds its own keys."""

_GQA_KEYS: Mapping[str, str] = {
    **_SIZE_KEYS,
    "num_attention_heads": "attention.heads",
    "num_key_value_heads": "attention.kv_heads",
    "head_dim": "attention.head_dim",
}
"""The sizes with grouped-query heads of a stated (or derived) width: every reader's but GPT-2's
and GPT-NeoX's, whose heads are multi-head and ``h / a`` wide."""

_ATTENTION_BIAS: Mapping[str, str] = {"attention_bias": "attention.qkv_bias, attention.o_bias"}


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

    def choice(self, key: str, default: str, allowed: tuple[str, ...]) -> str:
        """One of the strings ``allowed``."""
        value = self.raw(key, default)
        if value not in allowed:
            raise one_of(key, value, allowed)
        return str(value)

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
    vrammath.notation.errors.InputError: layers: must be a positive integer (got True)
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


def _embeddings(
    k: Keys,
    hidden: int,
    *,
    tied: bool,
    max_positions: int,
    vocab: object = ...,
    scaled: bool = False,
) -> Embeddings:
    """Token embeddings read from transformers' usual keys; positions are rotary (no table).
    ``tied``, ``max_positions`` and ``vocab`` are the config class's defaults (``...``: none)."""
    return Embeddings(
        vocab=k.size("vocab_size", vocab),
        hidden=hidden,
        tied=k.flag("tie_word_embeddings", tied),
        learned_positions=False,
        max_positions=k.size("max_position_embeddings", max_positions),
        scaled=scaled,
    )


def _attention(
    k: Keys,
    hidden: int,
    heads: int,
    *,
    qkv_bias: bool,
    o_bias: bool,
    window: int | None,
    window_layers: int,
) -> Attention:
    """Grouped-query attention (:data:`_GQA_KEYS`), ``window_layers`` of its layers sliding over
    ``window`` tokens (none without a window)."""
    return Attention(
        heads=heads,
        kv_heads=_kv_heads(k, "num_key_value_heads", heads),
        head_dim=_head_dim(k, hidden, heads),
        qkv_bias=qkv_bias,
        o_bias=o_bias,
        sliding_window=window,
        window_layers=window_layers if window is not None else 0,
        dropout=k.probability("attention_dropout", 0.0),
    )


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
