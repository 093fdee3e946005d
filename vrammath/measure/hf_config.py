"""The transformers config of a ``config.json`` as :mod:`vrammath.measure.derive` runs it: built
for any ``model_type`` transformers knows, with its attention kernel, grouped experts where the
model can switch them, and whether every decoder layer is the same.

torch and transformers are imported inside the functions, so this module imports without them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vrammath.notation.errors import InputError

# keys that make decoder layers differ (then all L layers are run)
PER_LAYER_KEYS = (
    "first_k_dense_replace",
    "mlp_only_layers",
    "decoder_sparse_step",
    "moe_layer_freq",
    "sliding_window_pattern",
    "no_rope_layers",
    "max_window_layers",
    "layer_types",
)


def hf_config_of(cfg: Mapping[str, object], *, attention: str, layers: int | None = None) -> Any:
    """The transformers config object of a config.json dict (``layers`` overrides its count)."""
    import transformers

    if not isinstance(cfg, Mapping):
        raise InputError("config", "must be a JSON object", got=type(cfg).__name__)
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str):
        raise InputError("model_type", "is required in the config and missing", got=model_type)
    rest = {k: v for k, v in cfg.items() if k != "model_type"}
    try:
        config = transformers.AutoConfig.for_model(model_type, **rest)
        if layers is not None:
            key = type(config).attribute_map.get("num_hidden_layers", "num_hidden_layers")
            for name in ("num_hidden_layers", key):
                rest.pop(name, None)
            kinds = rest.get("layer_types")
            if isinstance(kinds, list):  # uniform here (else all layers run): keep its length
                rest["layer_types"] = kinds[:layers]
            config = transformers.AutoConfig.for_model(model_type, **rest, **{key: layers})
    except (ValueError, TypeError, KeyError) as exc:
        raise InputError(
            "model_type",
            f"transformers {transformers.__version__} cannot build this config ({first_line(exc)})",
            got=model_type,
        ) from None
    config._attn_implementation = attention
    config.use_cache = False
    if grouped_experts(config):
        # asked for by name: transformers would fall back to its per-expert loop silently
        config._experts_implementation = "grouped_mm"
    return config


def grouped_experts(config: Any) -> bool:
    """Whether transformers runs this config's causal LM with switchable experts (Mixtral,
    Qwen-MoE, DeepSeek-V3, ...): derive then runs them as one grouped matmul (``grouped_mm``),
    whose kept memory does not depend on the routing, and which takes bf16 inputs only."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    cls = MODEL_FOR_CAUSAL_LM_MAPPING.get(type(config), None)
    return cls is not None and bool(cls._can_set_experts_implementation())


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:160]


def layer_count(config: Any) -> int:
    n = getattr(config, "num_hidden_layers", None)
    if not isinstance(n, int) or n <= 0:
        raise InputError("num_hidden_layers", "must be a positive integer in the config", got=n)
    return n


def uniform_layers(cfg: Mapping[str, object], config: Any) -> bool:
    """Whether every decoder layer is built the same (then the count can be fitted in L)."""
    kinds = getattr(config, "layer_types", None)
    if isinstance(kinds, (list, tuple)) and len(set(kinds)) > 1:
        return False
    given = [k for k in PER_LAYER_KEYS if k != "layer_types" and cfg.get(k) not in (None, 0)]
    if "max_window_layers" in given and not cfg.get("use_sliding_window"):
        given.remove("max_window_layers")  # only read when the sliding window is on
    return not given


__all__ = [
    "PER_LAYER_KEYS",
    "first_line",
    "grouped_experts",
    "hf_config_of",
    "layer_count",
    "uniform_layers",
]
