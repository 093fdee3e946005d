"""One reader per Hugging Face ``model_type``: which config keys set which part of a ModelSpec.

Explanation
===========

A :class:`Reader` is a small table: ``keys`` maps every config key it models to the part field
it sets, ``harmless`` lists the keys known not to change memory (RoPE base and scaling, token
ids, initialisation, norm epsilon, ...), and ``parts`` reads the modelled keys into the parts of
:mod:`vrammath.model.spec`. Every key of a config is therefore one of three things:

* modelled -- read, checked and recorded in a part (a value the formulas do not describe, such
  as Gemma's ``attention_dropout`` > 0, is refused with an :class:`~vrammath.notation.errors.InputError`);
* known harmless -- ignored on purpose (:data:`COMMON_HARMLESS` plus the reader's own list);
* unknown -- kept as a one-line warning in ``ModelSpec.warnings``.

Adding an architecture means adding one reader to :data:`READERS`.

Examples
========

>>> spec = from_hf_config({"model_type": "llama", "hidden_size": 64, "intermediate_size": 176,
...     "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "rope_theta": 1e4,
...     "my_new_key": 3})
>>> print(*spec.warnings)
my_new_key: unknown to the llama reader, ignored (it may change memory)
>>> READERS["gpt2"].keys["n_inner"]
'mlp.intermediate'
>>> from_hf_config({"model_type": "llama", "hidden_size": 10**160})
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: hidden_size: must be at most 2**40 (MAX_SIZE) (got a 532-bit integer)
"""

from __future__ import annotations

from collections.abc import Mapping

from vrammath.model.readers.decoders import decoder_readers
from vrammath.model.readers.gemma import GEMMA, GEMMA2, GEMMA3_TEXT
from vrammath.model.readers.gpt import GPT2, GPT_NEOX
from vrammath.model.readers.keys import (
    _MUST_BE_OFF,
    COMMON_HARMLESS,
    MAX_SIZE,
    REFUSED_KEYS,
    Keys,
    Reader,
    bounded_int,
    divisors_text,
)
from vrammath.model.readers.llama import LLAMA, MISTRAL, QWEN2
from vrammath.model.readers.moe import DEEPSEEK_V3, MIXTRAL, QWEN2_MOE, QWEN3_MOE
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError

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


def from_hf_config(cfg: Mapping[str, object], name: str | None = None) -> ModelSpec:
    """Build a :class:`~vrammath.model.spec.ModelSpec` from a parsed Hugging Face ``config.json``.

    Checks the keys every reader shares, then reads ``cfg`` with its ``model_type``'s reader
    (:data:`READERS`). Raises :class:`~vrammath.notation.errors.InputError` naming the key for anything
    missing, mistyped, contradictory or not modelled.

    >>> spec = from_hf_config({"model_type": "qwen2", "hidden_size": 8192,
    ...     "intermediate_size": 29568, "num_hidden_layers": 80, "num_attention_heads": 64,
    ...     "num_key_value_heads": 8, "vocab_size": 152064})
    >>> spec.attention.qkv_bias, spec.attention.o_bias, spec.attention.kind
    (True, False, 'GQA')

    >>> from_hf_config({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4,
    ...     "vocab_size": 100, "resid_pdrop": 1.0})
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: resid_pdrop: must be a number in [0, 1) (got 1.0)
    """
    if not isinstance(cfg, Mapping):
        raise InputError("config", "must be a JSON object", got=type(cfg).__name__)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in READERS:
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
    "MAX_SIZE",
    "MODEL_TYPES",
    "READERS",
    "REFUSED_KEYS",
    "Keys",
    "Reader",
    "bounded_int",
    "divisors_text",
    "from_hf_config",
]
