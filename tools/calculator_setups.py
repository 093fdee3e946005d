"""The setups the calculator's generator enumerates (tools/calculator_build.py).

A *feature* is a discrete fact of a setup the page reads generically: a field's value, whether a
number field is above 1 (``tp>1``), or whether an optional field is set (``lora``).
:func:`make_setup` turns feature values into a valid :class:`vrammath.setup.Setup` (the other
features at their defaults or, where the library refuses those, at a repaired choice), or the
library's message; :func:`invalid_pairs` and :func:`numeric_messages` collect the library's
refusals the page repeats.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

from vrammath.errors import InputError
from vrammath.setup import SHARDS, Setup
from vrammath.vocab import (
    ACTIVATION_MODELS,
    ATTENTIONS,
    DEVICES,
    IMPLEMENTATIONS,
    ITERATIONS,
    OPTIMIZERS,
    QUANTS,
    RECIPE_NAMES,
    RECOMPUTES,
    SCHEDULES,
)

#: LoRA target sets the calculator offers (others: the CLI).
TARGET_CHOICES = ("q,v", "q,k,v,o", "all-linear")
# A feature is a discrete fact of a setup the page reads generically: a field's value, or
# whether a number field is above 1 ("tp>1"), or whether an optional field is set ("lora").
FEATURES: dict[str, tuple[Any, ...]] = {
    "recipe": RECIPE_NAMES,
    "optimizer": OPTIMIZERS,
    "implementation": IMPLEMENTATIONS,
    "zero": (0, 1, 2, 3),
    "offload_optimizer": (False, True),
    "offload_params": (False, True),
    "sp": (False, True),
    "attention": ATTENTIONS,
    "recompute": RECOMPUTES,
    "activation_model": ACTIVATION_MODELS,
    "tp>1": (False, True),
    "pp>1": (False, True),
    "ep>1": (False, True),
    "schedule": SCHEDULES,
    "lora": (False, True),
    "lora_targets": TARGET_CHOICES,
    "quant": (None, *QUANTS),
    "lora_dropout": (False, True),
    "iteration": ITERATIONS,
    "device": DEVICES,
    "shard": SHARDS,
    "keep_outputs": (False, True),
}
DEFAULTS: dict[str, Any] = {
    "recipe": "bf16-mixed",
    "optimizer": "adamw",
    "implementation": "foreach",
    "zero": 0,
    "offload_optimizer": False,
    "offload_params": False,
    "sp": False,
    "attention": "sdpa",
    "recompute": "none",
    "activation_model": "auto",
    "tp>1": False,
    "pp>1": False,
    "ep>1": False,
    "schedule": "1f1b",
    "lora": False,
    "lora_targets": "q,v",
    "quant": None,
    "lora_dropout": False,
    "iteration": "steady",
    "device": "cuda",
    "shard": "flat",
    "keep_outputs": False,
}
# where a feature's relevance shows: the defaults, and these changes to them
PROBES: tuple[dict[str, Any], ...] = (
    {},
    {"lora": True},
    {"lora": True, "quant": "nf4"},
    {"lora": True, "recompute": "full"},
    {"zero": 3},
    {"zero": 2, "offload_optimizer": True},
    {"zero": 3, "offload_optimizer": True, "offload_params": True},
    {"tp>1": True},
    {"ep>1": True},
    {"ep>1": True, "zero": 3, "lora": True},
    {"pp>1": True, "tp>1": True, "sp": True},
    {"recompute": "full"},
    {"attention": "eager"},
    {"device": "cpu"},
    {"recipe": "fp32"},
    {"recipe": "autocast-bf16", "recompute": "full"},
    {"implementation": "for-loop"},
    {"optimizer": "adam8bit"},
    {"optimizer": "adafactor", "implementation": "for-loop"},
    {"lora": True, "optimizer": "adam8bit", "lora_targets": "all-linear"},
    {"lora": True, "recipe": "fp32", "quant": "int8", "lora_dropout": True},
    {"pp>1": True, "implementation": "for-loop", "optimizer": "adafactor"},
    {"zero": 2, "offload_optimizer": True, "optimizer": "adafactor", "implementation": "for-loop"},
    {"zero": 3, "offload_optimizer": True, "optimizer": "adam8bit", "recipe": "fp32"},
    {"zero": 3, "shard": "dim0"},
    {"zero": 1, "shard": "dim0", "offload_optimizer": True},
    {"keep_outputs": True},
    {"keep_outputs": True, "recompute": "full", "lora": True},
    # the models whose activations refuse a precision, an attention kernel or a target set
    {"recipe": "autocast-bf16"},
    {"recipe": "autocast-fp16", "attention": "eager"},
    {"recipe": "fp16-mixed", "attention": "eager", "device": "cpu"},
    {"recipe": "autocast-bf16", "lora": True, "lora_dropout": True},
    {"recipe": "bf16-pure", "lora": True, "lora_dropout": True, "device": "cpu"},
    {"lora": True, "lora_targets": "all-linear"},
    # quantized bases on every linear (the models without q,v refuse the probes above)
    {"lora": True, "lora_targets": "all-linear", "quant": "int8"},
    {"lora": True, "lora_targets": "all-linear", "quant": "nf4", "recompute": "selective"},
    {"lora": True, "lora_targets": "q,k,v,o", "quant": "nf4", "attention": "eager"},
    {"recipe": "fp32", "attention": "eager", "recompute": "full"},
    {"recipe": "fp16-mixed", "recompute": "full", "iteration": "first"},
)


def smallest_tp(spec: Any) -> int | None:
    """The smallest tensor-parallel size above 1 the model accepts (divides both head counts)."""
    return next(
        (t for t in range(2, spec.heads + 1) if spec.heads % t == 0 and spec.kv_heads % t == 0),
        None,
    )


REPAIRS: tuple[dict[str, Any], ...] = (
    {},
    {"lora": True},
    {"zero": 3},
    {"zero": 2},
    {"tp>1": True},
    {"pp>1": True},
    {"lora": False, "quant": None},
    {"recompute": "selective"},
    {"activation_model": "korthikanti"},
    # a model without the default q,v projections (GPT-2, GPT-NeoX, Phi-3) takes LoRA on these
    {"lora_targets": "all-linear"},
)


def _setup_kwargs(spec: Any, f: dict[str, Any]) -> dict[str, Any] | None:
    kw: dict[str, Any] = {
        k: f[k]
        for k in (
            "recipe",
            "optimizer",
            "implementation",
            "zero",
            "offload_optimizer",
            "offload_params",
            "sp",
            "attention",
            "recompute",
            "activation_model",
            "schedule",
            "quant",
            "lora_dropout",
            "iteration",
            "device",
            "shard",
            "keep_outputs",
        )
    }
    kw["gpus"] = 8
    if f["tp>1"]:
        tp = smallest_tp(spec)
        if tp is None:
            return None
        kw["tp"] = tp
    if f["pp>1"]:
        kw["pp"] = 2
    if f["ep>1"]:
        kw["ep"] = 2
    if f["schedule"] == "interleaved":
        kw["chunks"] = 2
    if f["lora"]:
        kw["lora_rank"] = 8
        kw["lora_targets"] = f["lora_targets"]
    elif f["lora_targets"] != DEFAULTS["lora_targets"]:
        kw["lora_targets"] = f["lora_targets"]
    return kw


#: What the page says for a mixture-of-experts or latent-attention model under Korthikanti-style
#: activations: its states are those of the busiest pipeline rank, which vrammath.moe_layout
#: finds by counting each stage's parameters for the run's numbers, not as one expression.
KORTHIKANTI_MOE_REFUSAL = (
    "activation_model: a mixture-of-experts or latent-attention model under Korthikanti-style "
    "activations (--tp or --pp above 1, selective recomputation, or --activations korthikanti) "
    "keeps the states of its busiest pipeline rank, which vrammath.moe_layout counts for the "
    "run's numbers; the calculator does not compile that (use the CLI)"
)
_MADE: dict[tuple[Any, ...], Setup | str] = {}


def model_neutral(message: str, spec: Any) -> str:
    """``message`` with the preset's name as ``{model}``, which the page fills in: presets that
    share a compiled tree share its refusals ("ep: must be 1 for llama-7b, which has no
    experts"). Only the name followed by a space or a comma: a model_type (``gpt2``) stays."""
    return re.sub(rf"(?<= ){re.escape(spec.name)}(?=[ ,])", "{model}", message)


def make_setup(
    spec: Any, feats: dict[str, Any], *, repair: bool = True, pairs: bool = False
) -> Setup | str:
    """A valid Setup with these feature values, the others at their defaults or, where the
    defaults refuse it, at a repaired choice; else the library's message for the first try.
    (Memoized: the generator asks for the same setups for every row.)"""
    key = (id(spec), spec.name, tuple(sorted(feats.items(), key=str)), repair, pairs)
    if key not in _MADE:
        made = _make_setup(spec, feats, repair=repair, pairs=pairs)
        _MADE[key] = model_neutral(made, spec) if isinstance(made, str) else made
    return _MADE[key]


def _make_setup(spec: Any, feats: dict[str, Any], *, repair: bool, pairs: bool) -> Setup | str:
    first = ""
    korthikanti_moe = False
    # single repairs first, then pairs of them (sp needs tp > 1, offload needs a ZeRO stage)
    changes = list(REPAIRS)
    if pairs:
        changes += [{**x, **y} for x, y in itertools.combinations(REPAIRS[1:], 2)]
    # what the node's own features need, whatever the repair: a quantized base, adapter dropout
    # or a target set need adapters; offload needs a ZeRO stage; sp needs tp > 1; a pipeline
    # schedule needs pp > 1 (so that a repair is left for what the library refuses besides)
    implied: dict[str, Any] = {}
    if feats.get("quant") is not None or feats.get("lora_dropout"):
        implied["lora"] = True
    if feats.get("offload_params"):
        implied["zero"] = 3
    elif feats.get("offload_optimizer"):
        implied["zero"] = 2
    if feats.get("sp"):
        implied["tp>1"] = True
    if feats.get("schedule", "1f1b") != "1f1b":
        implied["pp>1"] = True
    implied = {k: v for k, v in implied.items() if k not in feats} if repair else {}
    for change in changes if repair else [{}]:
        f = {**DEFAULTS, **{k: v for k, v in change.items() if k not in feats}, **implied, **feats}
        kw = _setup_kwargs(spec, f)
        if kw is None:
            first = first or "tp: the model has no tensor-parallel size above 1"
            continue
        setup = _construct(spec, kw)
        if isinstance(setup, str):
            first = first or setup
            continue
        if setup.korthikanti_moe:
            korthikanti_moe = True
            continue
        return setup
    # the library takes the setup, the calculator does not: say so rather than the first try's
    # message (deepseek-v3-fp8 "needs --activations korthikanti", which is the refused path)
    return KORTHIKANTI_MOE_REFUSAL if korthikanti_moe else first


_BUILT: dict[tuple[Any, ...], Setup | str] = {}


def _construct(spec: Any, kw: dict[str, Any]) -> Setup | str:
    """``Setup(spec, **kw)`` or its message, once per keywords (a repair that changes only
    features a node already fixes gives the keywords of another try again)."""
    key = (id(spec), tuple(sorted(kw.items())))
    if key not in _BUILT:
        try:
            _BUILT[key] = Setup(spec, **kw)
        except InputError as err:
            _BUILT[key] = str(err)
    return _BUILT[key]


def setup_tp(spec: Any, tp: int) -> Setup:
    return Setup(spec, tp=tp)


#: The features a Setup attribute stands for (numbers enter as symbols; their size as "> 1").
FEATURES_OF_FIELD: dict[str, tuple[str, ...]] = {
    **{name: (name,) for name in FEATURES},
    "tp": ("tp>1",),
    "pp": ("pp>1",),
    "ep": ("ep>1",),
    "lora_rank": ("lora",),
    "activation_formula": ("activation_model", "tp>1", "pp>1", "recompute"),
    "chunks": ("schedule",),
}


def invalid_pairs(spec: Any) -> dict[str, str]:
    """The library's refusals of single feature values and of pairs of them (the others at
    their defaults, or repaired): ``"f=v"`` or ``"f=v&g=w"`` -> the message."""
    out: dict[str, str] = {}
    items = [(f, v) for f, values in FEATURES.items() for v in values]
    for f, v in items:
        got = make_setup(spec, {f: v}, pairs=True)
        if isinstance(got, str):
            out[f"{f}={json.dumps(v)}"] = got
    names = list(FEATURES)
    for (f, v), (g, w) in itertools.combinations(items, 2):
        if f == g or names.index(f) > names.index(g):
            continue
        one, two = f"{f}={json.dumps(v)}", f"{g}={json.dumps(w)}"
        if one in out or two in out:
            continue
        got = make_setup(spec, {f: v, g: w}, pairs=True)
        if isinstance(got, str):
            out[f"{one}&{two}"] = got
    return out


def _refusal(spec: Any, **kw: Any) -> str:
    try:
        Setup(spec, **kw)
    except InputError as err:
        return str(err)
    raise AssertionError(f"accepted {kw}")


def numeric_messages(spec: Any) -> dict[str, Any]:
    """The library's messages for numbers checked against the model, ``{got}`` for the value."""
    big_pp, big_chunks = spec.layers + 1, spec.layers
    experts: dict[str, Any] = {"epNone": _refusal(spec, ep=2).replace("(got 2)", "(got {got})")}
    if spec.experts is not None:
        count = spec.experts.count
        bad = next(x for x in range(2, count + 2) if count % x)
        experts = {
            "experts": count,
            "epExperts": _refusal(spec, ep=bad, gpus=bad).replace(f"(got {bad})", "(got {got})"),
            "epGpus": _refusal(spec, ep=2, gpus=3)
            .replace("(got 2)", "(got {got})")
            .replace("--gpus=3", "--gpus={gpus}"),
        }
    return {
        **experts,
        "ppBig": _refusal(spec, pp=big_pp).replace(f"(got {big_pp})", "(got {got})"),
        "chunksOne": _refusal(spec, pp=2, schedule="interleaved", chunks=1),
        "chunksBig": _refusal(spec, pp=2, schedule="interleaved", chunks=big_chunks).replace(
            f"(got {big_chunks})", "(got {got})"
        ),
        "chunksUnused": _refusal(spec, chunks=2).replace("(got 2)", "(got {got})"),
        "shardOne": _refusal(spec, shard="dim0", zero=3, gpus=1).replace(
            "(got 'dim0')", "(got {got})"
        ),
    }
