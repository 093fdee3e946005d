"""Which projections LoRA adapts: target names, and what each name adapts in a given model.

Targets are named by what they adapt: ``q``, ``k``, ``v``, ``o`` (attention projections, k and v
GQA-shaped ``a_kv d``), ``gate``, ``up``, ``down`` (MLP), and ``qkv``, ``gate_up`` where an
architecture fuses them into one module (Phi-3, GPT-2's ``c_attn``, GPT-NeoX's
``query_key_value``): each architecture has its own (:func:`target_modules`), as peft adapts the
modules the model has. Mixture-of-experts and latent-attention models add ``router``,
``experts`` and ``shared_gate`` (Qwen2-MoE's ``Linear(h, 1)``), and ``q_a``, ``q_b``, ``kv_a``,
``kv_b`` (DeepSeek's MLA projections ``q_a_proj``, ``q_b_proj``, ``kv_a_proj_with_mqa``,
``kv_b_proj``).

Examples
========

>>> lora_targets("q_proj, v")  # Hugging Face module names are read as the targets they adapt
('q', 'v')
>>> TARGET_GROUPS["attention"]
('q', 'k', 'v', 'qkv', 'o')
"""

from __future__ import annotations

from collections.abc import Sequence

from vrammath.notation.errors import InputError

LORA_TARGETS = ("q", "k", "v", "o", "gate", "up", "down")
"""The LLaMA-style targets (separate projections); the full vocabulary is :data:`ALL_TARGETS`."""
ALL_TARGETS = ("q", "k", "v", "qkv", "o", "gate", "up", "gate_up", "down")
"""Every logical target of a dense model; ``qkv`` and ``gate_up`` are the fused projections
(Phi-3's ``qkv_proj`` and ``gate_up_proj``, GPT-2's ``c_attn``, GPT-NeoX's
``query_key_value``)."""
MOE_TARGETS = ("q_a", "q_b", "kv_a", "kv_b", "router", "experts", "shared_gate")
"""Targets only mixture-of-experts or latent-attention models have."""
TARGET_GROUPS: dict[str, tuple[str, ...]] = {
    "all-linear": ALL_TARGETS,
    "attention": ("q", "k", "v", "qkv", "o"),
    "mlp": ("gate", "up", "gate_up", "down"),
}
"""Groups, resolved per architecture to the targets it has (peft's ``all-linear``: every linear
of the decoder layers, not the LM head)."""
MODULE_NAMES: tuple[str, ...] = (
    "c_attn",
    "c_proj",
    "c_fc",
    "query_key_value",
    "dense",
    "dense_h_to_4h",
    "dense_4h_to_h",
)
"""transformers' module names of the GPT blocks, accepted as targets (``*_proj`` names are read
as their target: ``q_proj`` is ``q``). ``c_proj`` names GPT-2's attention output *and* its MLP's
down projection (peft matches both), StarCoder2's MLP down projection only."""
HF_MODULES = {
    "q": "self_attn.q_proj",
    "k": "self_attn.k_proj",
    "v": "self_attn.v_proj",
    "o": "self_attn.o_proj",
    "gate": "mlp.gate_proj",
    "up": "mlp.up_proj",
    "down": "mlp.down_proj",
}
FUSED_MODULES = {"qkv": "self_attn.qkv_proj", "gate_up": "mlp.gate_up_proj"}
# Hugging Face names accepted for the MoE/MLA targets (``_proj`` is stripped from the others)
_ALIASES = {"kv_a_proj_with_mqa": "kv_a", "shared_expert_gate": "shared_gate"}


def lora_targets(value: str | Sequence[str]) -> tuple[str, ...]:
    """Validated adapter targets in canonical order, from ``"q,v"``, ``"all-linear"`` or a list.

    Names from :data:`ALL_TARGETS` and :data:`MOE_TARGETS`, the groups of :data:`TARGET_GROUPS`
    (kept as groups: each architecture resolves them to what it has) and transformers' module
    names (``q_proj`` is read as ``q``, ``kv_a_proj_with_mqa`` as ``kv_a``; the GPT blocks'
    :data:`MODULE_NAMES` are kept as given). Whether a model has a target is checked by
    :func:`adapted_linears`.

    >>> lora_targets("v,q_proj")
    ('q', 'v')
    >>> lora_targets("mlp,all-linear,qkv_proj")
    ('all-linear', 'mlp', 'qkv')
    >>> lora_targets("experts,router,o")
    ('o', 'router', 'experts')
    >>> lora_targets("q,x")
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: lora_targets: must be one of q, k, v, qkv, o, gate, up, gate_up, down, q_a, q_b, kv_a, kv_b, router, experts, shared_gate, all-linear, attention, mlp, c_attn, c_proj, c_fc, query_key_value, dense, dense_h_to_4h, dense_4h_to_h (got 'x')
    >>> lora_targets(None)
    Traceback (most recent call last):
    ...
    vrammath.notation.errors.InputError: lora_targets: must be text or a list of names from q, k, v, qkv, o, gate, up, gate_up, down, q_a, q_b, kv_a, kv_b, router, experts, shared_gate, all-linear, attention, mlp, c_attn, c_proj, c_fc, query_key_value, dense, dense_h_to_4h, dense_4h_to_h (got None)
    """
    allowed = (*ALL_TARGETS, *MOE_TARGETS, *TARGET_GROUPS, *MODULE_NAMES)
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not all(isinstance(x, str) for x in items):
        raise InputError(
            "lora_targets", "must be text or a list of names from " + ", ".join(allowed), got=value
        )
    names: list[str] = []
    for item in items:
        for raw in str(item).split(","):
            name = raw.strip()
            if name in _ALIASES:
                name = _ALIASES[name]
            elif name not in MODULE_NAMES:
                name = name.removesuffix("_proj")
            if name not in allowed:
                raise InputError(
                    "lora_targets", "must be one of " + ", ".join(allowed), got=raw.strip()
                )
            names.append(name)
    if not names:
        raise InputError("lora_targets", "must name at least one of " + ", ".join(allowed), got="")
    order = (*TARGET_GROUPS, *ALL_TARGETS, *MOE_TARGETS, *MODULE_NAMES)
    return tuple(t for t in order if t in names)


__all__ = [
    "ALL_TARGETS",
    "FUSED_MODULES",
    "HF_MODULES",
    "LORA_TARGETS",
    "MODULE_NAMES",
    "MOE_TARGETS",
    "TARGET_GROUPS",
    "lora_targets",
]
