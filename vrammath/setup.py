"""One training setup: the model, how it is stored and optimized, how it is split, and the
allowed values of each of its choices.

Examples
========

>>> from vrammath.presets import load_model
>>> setup = Setup(load_model("llama-7b"), zero=3, gpus=8)
>>> with_changes(setup, gpus=16).gpus
16
>>> Setup(load_model("llama-7b"), attention="flash")
Traceback (most recent call last):
...
vrammath.errors.InputError: attention: must be one of sdpa, eager (got 'flash')
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vrammath.errors import InputError, one_of, positive_int
from vrammath.model import ModelSpec
from vrammath.parallel import zero_stage
from vrammath.peft import QUANTS, adapted_linears, lora_targets
from vrammath.presets import gpu
from vrammath.states import IMPLEMENTATIONS, OPTIMIZERS, RECIPES

ATTENTION = ("sdpa", "eager")
RECOMPUTE = ("none", "selective", "full")
ACTIVATION_MODELS = ("auto", "hf", "korthikanti")
ITERATIONS = ("steady", "first")
SCHEDULES = ("1f1b", "interleaved")
#: where the kernels run (CUDA and CPU kernels keep different tensors, e.g. dropout masks)
DEVICES = ("cuda", "cpu")

# The dtype the forward runs in under each recipe (what the activations are kept in).
PRECISION_OF = {
    "fp32": "fp32",
    "fp16-mixed": "fp16",
    "bf16-mixed": "bf16",
    "bf16-megatron": "bf16",
    "autocast-bf16": "autocast-bf16",
    "autocast-fp16": "autocast-fp16",
    "bf16-pure": "bf16",
}


@dataclass(frozen=True)
class Setup:
    """One training setup: the model, how it is stored and optimized, and how it is split."""

    model: ModelSpec
    recipe: str = "bf16-mixed"
    optimizer: str = "adamw"
    implementation: str = "foreach"
    zero: int = 0
    gpus: int = 1
    offload_optimizer: bool = False
    offload_params: bool = False
    micro_batch: int = 1
    seq_len: int = 2048
    tp: int = 1
    pp: int = 1
    sp: bool = False
    attention: str = "sdpa"
    recompute: str = "none"
    gpu: str | None = None
    lora_rank: int | None = None
    lora_targets: tuple[str, ...] = ("q", "v")
    quant: str | None = None
    lora_dropout: bool = False
    activation_model: str = "auto"
    iteration: str = "steady"
    schedule: str = "1f1b"
    chunks: int = 1
    device: str = "cuda"

    @property
    def activation_formula(self) -> str:
        """``hf`` or ``korthikanti``: ``activation_model`` with ``auto`` resolved (Korthikanti's
        formulas for tensor/pipeline parallelism and selective recomputation, else HF-exact)."""
        if self.activation_model != "auto":
            return self.activation_model
        megatron = self.tp > 1 or self.pp > 1 or self.recompute == "selective"
        return "korthikanti" if megatron else "hf"

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise one_of("recipe", self.recipe, list(RECIPES))
        if self.optimizer not in OPTIMIZERS:
            raise one_of("optimizer", self.optimizer, OPTIMIZERS)
        if self.implementation not in IMPLEMENTATIONS:
            raise one_of("implementation", self.implementation, IMPLEMENTATIONS)
        object.__setattr__(self, "zero", zero_stage(self.zero))
        for name in ("gpus", "micro_batch", "seq_len", "tp", "pp", "chunks"):
            positive_int(name, getattr(self, name))
        if self.attention not in ATTENTION:
            raise one_of("attention", self.attention, ATTENTION)
        if self.recompute not in RECOMPUTE:
            raise one_of("recompute", self.recompute, RECOMPUTE)
        if self.gpu is not None:
            gpu(self.gpu)  # raises on an unknown name
        if self.offload_params and self.zero != 3:
            raise InputError("offload_params", "needs --zero 3", got=self.zero)
        if self.offload_optimizer and self.zero == 0:
            raise InputError("offload_optimizer", "needs --zero 1, 2 or 3", got=self.zero)
        if self.sp and self.tp == 1:
            raise InputError("sp", "sequence parallelism needs tp > 1", got=self.tp)
        if self.activation_model not in ACTIVATION_MODELS:
            raise one_of("activation_model", self.activation_model, ACTIVATION_MODELS)
        if self.iteration not in ITERATIONS:
            raise one_of("iteration", self.iteration, ITERATIONS)
        if self.schedule not in SCHEDULES:
            raise one_of("schedule", self.schedule, SCHEDULES)
        positive_int("chunks", self.chunks)
        if self.device not in DEVICES:
            raise one_of("device", self.device, DEVICES)
        megatron = self.tp > 1 or self.pp > 1 or self.recompute == "selective"
        if self.activation_model == "hf" and megatron:
            raise InputError(
                "activation_model",
                "hf covers Hugging Face runs (tp=1, pp=1, recompute none or full); tensor, "
                "pipeline and selective recomputation are Megatron's: use korthikanti or auto",
                got=self.activation_model,
            )
        if (self.tp > 1 or self.pp > 1) and (self.lora_rank is not None or self.zero == 3):
            raise InputError(
                "tp/pp",
                "tensor/pipeline parallelism is estimated with ZeRO 0-2 and without LoRA",
                got=(self.tp, self.pp),
            )
        object.__setattr__(self, "lora_targets", lora_targets(self.lora_targets))
        if self.lora_rank is not None:
            positive_int("lora_rank", self.lora_rank)
            adapted_linears(self.model, self.lora_targets)  # e.g. no gate in a GPT MLP
            if self.offload_optimizer or self.offload_params:
                raise InputError(
                    "offload",
                    "is not estimated with LoRA (use --zero without offload)",
                    got="offload",
                )
        if self.quant is not None:
            if self.quant not in QUANTS:
                raise one_of("quant", self.quant, QUANTS)
            if self.lora_rank is None:
                raise InputError(
                    "quant", "needs --lora-rank (a quantized base is frozen)", got=self.quant
                )
            if self.zero == 3:
                raise InputError(
                    "quant", "is not estimated with ZeRO-3 (use --zero 0, 1 or 2)", got=self.zero
                )


def with_changes(setup: Setup, **changes: object) -> Setup:
    """A copy of ``setup`` with some fields changed (validated again)."""
    return replace(setup, **changes)  # type: ignore[arg-type]


__all__ = [
    "ACTIVATION_MODELS",
    "ATTENTION",
    "DEVICES",
    "ITERATIONS",
    "PRECISION_OF",
    "RECOMPUTE",
    "SCHEDULES",
    "Setup",
    "with_changes",
]
