"""The vocabulary: every named choice vrammath accepts, as a ``Literal`` type and its tuple.

Each tuple is derived from its ``Literal`` with :func:`typing.get_args`, so the type checker and
the runtime check read the same list. Modules import the names from here rather than writing
their own copies.

Examples
========

>>> ATTENTIONS
('sdpa', 'eager')
>>> PRECISION_OF["autocast-bf16"]
'autocast-bf16'
>>> check("recompute", "some", RECOMPUTES)
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: recompute: must be one of none, selective, full (got 'some')
"""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

from vrammath.notation.errors import one_of

#: precision recipes (their bytes per element of each model state are in vrammath.terms.states.RECIPES)
Recipe = Literal[
    "fp32",
    "fp16-mixed",
    "bf16-mixed",
    "bf16-megatron",
    "autocast-bf16",
    "autocast-fp16",
    "bf16-pure",
    "deepseek-v3-fp8",
]
Optimizer = Literal["adamw", "adam", "sgd", "sgd-momentum", "adam8bit", "adafactor"]
#: PyTorch optimizer implementations (their step temporaries differ)
Implementation = Literal["for-loop", "foreach", "fused"]
Attention = Literal["sdpa", "eager"]
Recompute = Literal["none", "selective", "full"]
#: the recomputation policies Hugging Face models offer (gradient checkpointing or none)
HfRecompute = Literal["none", "full"]
#: which activation formula (HF-exact, Korthikanti as published, or chosen from the setup)
ActivationModel = Literal["auto", "hf", "korthikanti"]
Iteration = Literal["steady", "first"]
Schedule = Literal["1f1b", "interleaved", "dualpipe"]
#: where the kernels run (CUDA and CPU kernels keep different dropout masks and norm stats)
Device = Literal["cuda", "cpu"]
#: The training engine whose per-rank rules apply (``hf``: the single-process Hugging Face loop,
#: with ``--zero`` as DeepSpeed's flat partition; ``zero1-torch``: ZeroRedundancyOptimizer;
#: ``ddp``: DistributedDataParallel; ``megatron``: Megatron-Core's DDP grad buffer and
#: mixed-precision optimizer; ``deepspeed``: DeepSpeed's ZeRO-1/2 optimizer).
Engine = Literal["hf", "zero1-torch", "ddp", "megatron", "deepspeed", "fsdp2", "accelerate-fsdp2"]
#: How ZeRO-3 / FSDP divides the states over ranks (see :func:`vrammath.compose.rows.per_rank`).
Shard = Literal["flat", "dim0"]
#: the dtype the forward pass runs in
Precision = Literal["fp32", "bf16", "fp16", "autocast-bf16", "autocast-fp16"]
#: Korthikanti's parallel variants (none, tensor, tensor + sequence)
Parallel = Literal["none", "tp", "tp_sp"]
#: quantized frozen bases under QLoRA-style fine-tuning
Quant = Literal["nf4", "nf4-nodq", "int8"]
LoraTarget = Literal["q", "k", "v", "o", "gate", "up", "down"]
#: weight formats for serving
ServeWeights = Literal[
    "fp16", "bf16", "int8", "int4", "nf4", "fp8", "fp8-tensor", "fp8-block", "mxfp4"
]
#: what a mixture-of-experts or latent-attention layer keeps under Korthikanti's convention
#: (vrammath.terms.korthikanti.layout.POLICIES); auto: deepseek-v3 under its recipe, else bf16-flash
ActivationPolicyName = Literal["auto", "bf16-flash", "deepseek-v3", "deepseek-v3-outputs-kept"]
KvDtype = Literal["fp32", "fp16", "bf16", "fp8-e4m3", "fp8-e5m2", "int8"]
GeluVariant = Literal["gelu", "gelu_pytorch_tanh", "gelu_new", "gelu_fast"]
"""The GeLU implementations of transformers whose kept tensors the activation formulas count."""

RECIPE_NAMES: tuple[Recipe, ...] = get_args(Recipe)
OPTIMIZERS: tuple[Optimizer, ...] = get_args(Optimizer)
IMPLEMENTATIONS: tuple[Implementation, ...] = get_args(Implementation)
ATTENTIONS: tuple[Attention, ...] = get_args(Attention)
RECOMPUTES: tuple[Recompute, ...] = get_args(Recompute)
HF_RECOMPUTES: tuple[HfRecompute, ...] = get_args(HfRecompute)
ACTIVATION_MODELS: tuple[ActivationModel, ...] = get_args(ActivationModel)
ITERATIONS: tuple[Iteration, ...] = get_args(Iteration)
SCHEDULES: tuple[Schedule, ...] = get_args(Schedule)
DEVICES: tuple[Device, ...] = get_args(Device)
ENGINES: tuple[Engine, ...] = get_args(Engine)
SHARDS: tuple[Shard, ...] = get_args(Shard)
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
PARALLELS: tuple[Parallel, ...] = get_args(Parallel)
QUANTS: tuple[Quant, ...] = get_args(Quant)
LORA_TARGETS: tuple[LoraTarget, ...] = get_args(LoraTarget)
SERVE_WEIGHTS: tuple[ServeWeights, ...] = get_args(ServeWeights)
KV_DTYPES: tuple[KvDtype, ...] = get_args(KvDtype)
#: the spellings serving engines' flags use for a KV-cache dtype (vLLM's ``--kv-cache-dtype``:
#: ``fp8`` is ``fp8_e4m3`` on CUDA), by the name vrammath gives it
KV_DTYPE_ALIASES: dict[str, KvDtype] = {
    "fp8": "fp8-e4m3",
    "fp8_e4m3": "fp8-e4m3",
    "fp8_e5m2": "fp8-e5m2",
    "bfloat16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "float32": "fp32",
}
ACTIVATION_POLICY_NAMES: tuple[ActivationPolicyName, ...] = get_args(ActivationPolicyName)
GELU_VARIANTS: tuple[GeluVariant, ...] = get_args(GeluVariant)

#: the dtype the forward runs in under each recipe (what the activations are kept in)
PRECISION_OF: dict[Recipe, Precision] = {
    "fp32": "fp32",
    "fp16-mixed": "fp16",
    "bf16-mixed": "bf16",
    "bf16-megatron": "bf16",
    "autocast-bf16": "autocast-bf16",
    "autocast-fp16": "autocast-fp16",
    "bf16-pure": "bf16",
    "deepseek-v3-fp8": "bf16",  # FP8 GEMMs on bf16 weights; the activations are bf16
}

_S = TypeVar("_S", bound=str)


def check(field: str, value: object, allowed: tuple[_S, ...]) -> _S:
    """``value`` as one of ``allowed`` (typed as their Literal), else an :class:`InputError`.

    >>> check("schedule", "1f1b", SCHEDULES)
    '1f1b'
    """
    for name in allowed:
        if value == name and isinstance(value, str):
            return name
    raise one_of(field, value, allowed)


__all__ = [
    "ACTIVATION_MODELS",
    "ACTIVATION_POLICY_NAMES",
    "ATTENTIONS",
    "DEVICES",
    "ENGINES",
    "HF_RECOMPUTES",
    "IMPLEMENTATIONS",
    "ITERATIONS",
    "KV_DTYPES",
    "KV_DTYPE_ALIASES",
    "LORA_TARGETS",
    "OPTIMIZERS",
    "PARALLELS",
    "PRECISIONS",
    "PRECISION_OF",
    "QUANTS",
    "RECIPE_NAMES",
    "RECOMPUTES",
    "SCHEDULES",
    "SERVE_WEIGHTS",
    "SHARDS",
    "ActivationModel",
    "ActivationPolicyName",
    "Attention",
    "Device",
    "Engine",
    "HfRecompute",
    "Implementation",
    "Iteration",
    "KvDtype",
    "LoraTarget",
    "Optimizer",
    "Parallel",
    "Precision",
    "Quant",
    "Recipe",
    "Recompute",
    "Schedule",
    "ServeWeights",
    "Shard",
    "check",
]
