"""Build the real Hugging Face model of a :class:`~vrammath.model.spec.ModelSpec`, without weights.

Nothing here is imported at package import time: torch and transformers are loaded inside the
functions, so ``vrammath`` (and its doctests) work without the ``measure`` extra.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from vrammath.measure.build_decoders import MODEL_TYPES as DECODER_TYPES
from vrammath.measure.build_decoders import (
    base_fields,
    causal_lm_class,
    decoder_config,
    decoder_fields,
)
from vrammath.measure.build_moe import MODEL_TYPES as MOE_TYPES
from vrammath.measure.build_moe import moe_config
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError, one_of

if TYPE_CHECKING:
    import torch

PRECISIONS = ("fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16")
ATTENTIONS = ("eager", "sdpa")

# the states.py recipe each measured precision corresponds to
RECIPE_OF = {
    "fp32": "fp32",
    "bf16": "bf16-pure",
    "fp16": "bf16-pure",  # same byte widths; fp16 pure is not a named recipe
    "autocast-bf16": "autocast-bf16",
    "autocast-fp16": "autocast-fp16",
}


def as_spec(model: ModelSpec | str | Mapping[str, object]) -> ModelSpec:
    """A ModelSpec from a spec, a preset name or a config.json dict."""
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, str):
        return load_model(model)
    return from_hf_config(model)


def param_dtype(precision: str) -> torch.dtype:
    """dtype the model is built in: 16-bit for pure 16-bit runs, fp32 otherwise (autocast too)."""
    import torch

    check_choice("precision", precision, PRECISIONS)
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """dtype of autocast for ``autocast-*`` precisions, else None."""
    import torch

    return {"autocast-bf16": torch.bfloat16, "autocast-fp16": torch.float16}.get(precision)


def gelu_of(model: ModelSpec | str | Mapping[str, object]) -> str:
    """The MLP's activation function (GPT-2's ``activation_function``) of a model."""
    return as_spec(model).mlp.activation


def hf_config(
    spec: ModelSpec,
    *,
    attention: str = "sdpa",
    layers: int | None = None,
    gelu: str | None = None,
) -> Any:
    """The transformers config object for ``spec`` (``layers`` overrides the layer count).

    ``gelu`` overrides GPT-2's ``activation_function`` (default: the spec's ``mlp.activation``).
    """
    import transformers

    check_choice("attention", attention, ATTENTIONS)
    n_layers = spec.layers if layers is None else layers
    if spec.model_type in DECODER_TYPES:
        cfg = decoder_config(spec, n_layers)
    elif spec.model_type in MOE_TYPES:
        cfg = moe_config(spec, n_layers)
        cfg._experts_implementation = "grouped_mm"
    elif spec.model_type == "gpt_neox":
        rotary = spec.attention.rotary_dim
        cfg = transformers.GPTNeoXConfig(
            **base_fields(spec, n_layers),
            hidden_act=spec.mlp.activation,
            attention_bias=spec.qkv_bias,
            use_parallel_residual=spec.norms.parallel_residual,
            rotary_pct=(spec.head_dim if rotary is None else rotary) / spec.head_dim,
        )
    elif spec.model_type == "gpt2":
        cfg = transformers.GPT2Config(
            n_embd=spec.hidden,
            n_layer=n_layers,
            n_head=spec.heads,
            n_inner=spec.intermediate,
            vocab_size=spec.vocab,
            n_positions=spec.max_positions,
            tie_word_embeddings=spec.tied_embeddings,
            activation_function=spec.mlp.activation if gelu is None else gelu,
            embd_pdrop=spec.embeddings.dropout,
            attn_pdrop=spec.attention.dropout,
            resid_pdrop=spec.mlp.dropout,
        )
    else:
        common = {**decoder_fields(spec, n_layers), "attention_dropout": spec.attention.dropout}
        if spec.model_type in ("gemma2", "gemma3_text"):
            gemma = (
                transformers.Gemma2Config
                if spec.model_type == "gemma2"
                else transformers.Gemma3TextConfig
            )
            cfg = gemma(
                **common,
                hidden_activation=spec.mlp.activation,
                attention_bias=spec.qkv_bias,
                sliding_window=spec.sliding_window,
                layer_types=_gemma2_layer_types(spec, n_layers),
                attn_logit_softcapping=spec.attention.softcap,
                final_logit_softcapping=spec.embeddings.logit_softcap,
            )
        elif spec.model_type == "gemma":
            cfg = transformers.GemmaConfig(
                **common, hidden_act=spec.mlp.activation, attention_bias=spec.qkv_bias
            )
        elif spec.model_type == "qwen2":
            # the spec's window layers are the top ones, as max_window_layers places them
            n_window = spec.attention.window_layers if spec.sliding_window is not None else 0
            cfg = transformers.Qwen2Config(
                **common,
                use_sliding_window=n_window > 0,
                sliding_window=spec.sliding_window if n_window else None,
                max_window_layers=spec.layers - n_window,
            )
        elif spec.model_type == "mistral":
            cfg = transformers.MistralConfig(**common, sliding_window=spec.sliding_window)
        else:
            cfg = transformers.LlamaConfig(
                **common, attention_bias=spec.qkv_bias, mlp_bias=spec.mlp_bias
            )
    cfg._attn_implementation = attention
    cfg.use_cache = False
    return cfg


def _gemma2_layer_types(spec: ModelSpec, n_layers: int) -> list[str]:
    """Layer kinds with the spec's count of sliding layers and its top layer's kind.

    The memory depends on the count and on the top layer only, so the sliding layers are put
    at the top when the top one slides, else at the bottom.
    """
    n_window = spec.attention.window_layers if spec.sliding_window is not None else 0
    n_window = min(n_window, n_layers)
    top = spec.attention.last_layer_slides
    slides = [(i >= n_layers - n_window) if top else (i < n_window) for i in range(n_layers)]
    return ["sliding_attention" if x else "full_attention" for x in slides]


def build_model(
    spec: ModelSpec,
    *,
    precision: str,
    attention: str,
    layers: int | None = None,
    gelu: str | None = None,
) -> torch.nn.Module:
    """The HF causal-LM model for ``spec`` in the dtype ``precision`` builds it in (train mode).

    Call it inside ``FakeTensorMode`` to allocate nothing, or under a ``torch.device`` context.
    """
    cfg = hf_config(spec, attention=attention, layers=layers, gelu=gelu)
    model = causal_lm_class(spec)._from_config(cfg, dtype=param_dtype(precision))
    model.train()
    return model


@contextmanager
def real_training_masks() -> Iterator[None]:
    """Run transformers' masking as real training does (``is_causal``, no materialised mask).

    Under fake tensors transformers cannot see that the position ids are one plain sequence, so
    it builds a (b, 1, s, s) mask for packed sequences that SDPA then keeps per layer. This
    patches ``find_packed_sequence_indices`` to answer "not packed" (None) while measuring.
    """
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def check_positive(field: str, value: int) -> int:
    """``value`` if a positive int, else an InputError."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise InputError(field, "must be a positive integer", got=value)
    return value


def check_choice(field: str, value: str, allowed: tuple[str, ...] | list[str]) -> str:
    """``value`` if one of ``allowed``, else an InputError that names them."""
    if value not in allowed:
        raise one_of(field, value, allowed)
    return value
