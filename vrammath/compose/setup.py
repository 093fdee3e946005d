"""One training setup: the model, how it is stored and optimized, how it is split.

Each field is declared once, with its CLI flag, help, allowed values and bounds
(:mod:`vrammath.notation.fields`); the CLI's options, ``as_dict`` and the checks read them.

Examples
========

>>> from vrammath.model.presets import load_model
>>> setup = Setup(load_model("llama-7b"), zero=3, gpus=8)
>>> with_changes(setup, gpus=16).gpus
16
>>> Setup(load_model("llama-2-70b"), tp=16)
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: tp: must divide the KV heads (8) as Megatron splits KV groups (got 16)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from vrammath.model.presets import gpu
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.fields import MAX_COUNT, MAX_TOKENS, check_bounds, declared
from vrammath.notation.vocab import (
    ACTIVATION_MODELS,
    ACTIVATION_POLICY_NAMES,
    ATTENTIONS,
    DEVICES,
    ENGINES,
    IMPLEMENTATIONS,
    ITERATIONS,
    OPTIMIZERS,
    PRECISION_OF,
    QUANTS,
    RECIPE_NAMES,
    RECOMPUTES,
    SCHEDULES,
    SHARDS,
    ActivationModel,
    ActivationPolicyName,
    Attention,
    Device,
    Engine,
    Implementation,
    Iteration,
    Optimizer,
    Quant,
    Recipe,
    Recompute,
    Schedule,
    Shard,
    check,
)
from vrammath.terms.deepspeed3 import DEFAULT_STAGE3, Stage3Knobs
from vrammath.terms.korthikanti.moe import check_capacity
from vrammath.terms.lora.linears import adapted_linears, default_targets_refusal
from vrammath.terms.lora.targets import lora_targets
from vrammath.terms.moe.params import check_ep, check_ep_optimizer
from vrammath.terms.parallel import FSDP_STRATEGIES, engine_shard, engine_stage, zero_stage

DEFAULT_TARGETS = ("q", "v")
#: The boolean fields (checked to be booleans: a JSON "false" string is refused)
SWITCHES: tuple[str, ...] = ("offload_optimizer", "offload_params", "sp", "lora_dropout")
SWITCHES += ("keep_outputs", "bucket_view", "no_reshard")


@dataclass(frozen=True)
class Setup:
    """One training setup: the model, how it is stored and optimized, and how it is split."""

    model: ModelSpec
    recipe: Recipe = declared("bf16-mixed", "--recipe", "precision recipe", choices=RECIPE_NAMES)
    optimizer: Optimizer = declared("adamw", "--optimizer", "optimizer", choices=OPTIMIZERS)
    implementation: Implementation = declared(
        "foreach", "--impl", "optimizer implementation", choices=IMPLEMENTATIONS
    )
    zero: int = declared(
        0,
        "--zero",
        "ZeRO stage 0-3 or FSDP strategy " + ", ".join(FSDP_STRATEGIES),
        low=0,
        high=3,
        kind="zero",
    )
    gpus: int = declared(
        1,
        "--gpus",
        f"data-parallel GPUs the states are sharded over (1..{MAX_COUNT}, default {{default}})",
        low=1,
        high=MAX_COUNT,
    )
    offload_optimizer: bool = declared(
        False,
        "--offload-optimizer",
        "keep master weights and optimizer states in CPU memory",
        kind="switch",
    )
    offload_params: bool = declared(
        False,
        "--offload-params",
        "keep the weight shards in CPU memory too (ZeRO-3)",
        kind="switch",
    )
    micro_batch: int = declared(
        1, "--batch", f"micro-batch size (1..{MAX_TOKENS})", low=1, high=MAX_TOKENS, short="-b"
    )
    seq_len: int = declared(
        2048, "--seq", f"sequence length (1..{MAX_TOKENS})", low=1, high=MAX_TOKENS, short="-s"
    )
    tp: int = declared(1, "--tp", "tensor-parallel size (divides the heads)", low=1, high=MAX_COUNT)
    pp: int = declared(
        1, "--pp", "pipeline-parallel size (at most the layers)", low=1, high=MAX_COUNT
    )
    ep: int = declared(
        1,
        "--ep",
        "expert-parallel size: ranks the routed experts are split over, within the "
        "data-parallel --gpus (divides the experts and --gpus)",
        low=1,
        high=MAX_COUNT,
    )
    sp: bool = declared(False, "--sp", "sequence parallelism (needs --tp > 1)", kind="switch")
    attention: Attention = declared(
        "sdpa", "--attention", "attention implementation", choices=ATTENTIONS
    )
    recompute: Recompute = declared(
        "none", "--recompute", "activation recomputation", choices=RECOMPUTES
    )
    gpu: str | None = declared(None, "--gpu", "GPU preset to check the fit against", kind="gpu")
    lora_rank: int | None = declared(
        None, "--lora-rank", "LoRA rank (frozen base)", low=1, high=MAX_COUNT
    )
    lora_targets: tuple[str, ...] = declared(
        DEFAULT_TARGETS,
        "--lora-targets",
        "adapted projections: q,k,v,o,gate,up,down (qkv, gate_up where fused; "
        "shared_gate, q_a, q_b, kv_a, kv_b on MoE/MLA models), module names or "
        "all-linear/attention/mlp (default q,v; needs --lora-rank); router and experts: "
        "vrammath formula lora only, the training estimate refuses them",
        kind="targets",
    )
    quant: Quant | None = declared(
        None,
        "--quant",
        "quantized frozen base (QLoRA; needs --lora-rank)",
        choices=QUANTS,
    )
    lora_dropout: bool = declared(
        False, "--lora-dropout", "adapter dropout on (needs --lora-rank)", kind="switch"
    )
    activation_model: ActivationModel = declared(
        "auto",
        "--activations",
        "activation formula: hf (exact, Hugging Face models), korthikanti (Megatron, as "
        "published; needed for --tp/--pp/selective), auto (default: hf unless Megatron options)",
        choices=ACTIVATION_MODELS,
    )
    iteration: Iteration = declared(
        "steady",
        "--iteration",
        "the iteration counted (steady: the 2nd on, optimizer states exist)",
        choices=ITERATIONS,
    )
    schedule: Schedule = declared(
        "1f1b",
        "--schedule",
        "pipeline schedule (Korthikanti's first stage)",
        choices=SCHEDULES,
    )
    chunks: int = declared(
        1,
        "--chunks",
        "model chunks per stage (interleaved schedule only; > 1 there)",
        low=1,
        high=MAX_COUNT,
    )
    device: Device = declared("cuda", "--device", "where the kernels run", choices=DEVICES)
    shard: Shard = declared(
        "flat",
        "--shard",
        "how sharded states divide (flat: DeepSpeed's flat buffer, ceil(P/N) each; dim0: FSDP2, "
        "each tensor's dim 0 in ceil(dim0/N) rows, rank 0 the fullest)",
        choices=SHARDS,
    )
    engine: Engine = declared(
        "hf",
        "--engine",
        "whose per-rank rules apply: hf (the Hugging Face loop; --zero as a flat partition), "
        "zero1-torch (ZeroRedundancyOptimizer), ddp (DistributedDataParallel's buckets), megatron "
        "(Megatron-Core's main_grad buffer), deepspeed (DeepSpeed ZeRO's own buffers), fsdp2 "
        "(fully_shard per decoder layer and the root, torchtitan's: ZeRO-3 on dim 0), "
        "accelerate-fsdp2 (accelerate's units: layers, the input embedding, norm and head)",
        choices=ENGINES,
    )
    stage3: Stage3Knobs = DEFAULT_STAGE3  # DeepSpeed ZeRO-3's gathering keys (its config's)
    reduce_bucket_size: int | None = declared(
        None, "--reduce-bucket-size", "ZeRO's bucket (elements, default 5e8)", low=1, high=2**40
    )
    bucket_view: bool = declared(
        False,
        "--gradient-as-bucket-view",
        "DDP's gradient_as_bucket_view: the gradients are views of its buckets (--engine ddp)",
        kind="switch",
    )
    no_reshard: bool = declared(
        False,
        "--no-reshard-after-forward",
        "FSDP2's reshard_after_forward=False: every parameter stays gathered from its forward to "
        "the end of the backward (--engine fsdp2)",
        kind="switch",
    )
    rank: int | None = declared(
        None,
        "--rank",
        "the data-parallel rank counted where ranks differ (default: the busiest)",
        low=0,
        high=MAX_COUNT,
    )
    keep_outputs: bool = declared(
        False,
        "--keep-outputs",
        "the loop keeps the model output through backward (out = model(...); "
        "out.loss.backward()); default: only the loss, as Trainer",
        kind="switch",
    )
    capacity_factor: float | None = declared(
        None,
        "--capacity-factor",
        "expert capacity factor c_f > 0, buffers padded to c_f*b*s*k/E rows (token "
        "dropping; mixture-of-experts under --activations korthikanti; default: dropless)",
        kind="ratio",
    )
    imbalance: float = declared(
        1.0,
        "--imbalance",
        "busiest expert-parallel rank's routed rows over the mean, >= 1 (dropless "
        "mixture-of-experts under --activations korthikanti; default 1, balanced)",
        kind="ratio",
    )
    extra_terms: tuple[str, ...] = declared(
        (),
        "--with",
        "opt-in rows of the term table to add, comma-separated",
        kind="terms",
    )
    activation_policy: ActivationPolicyName = declared(
        "auto",
        "--activation-policy",
        "what mixture-of-experts/latent-attention layers keep under --activations "
        "korthikanti: " + ", ".join(ACTIVATION_POLICY_NAMES) + " (default auto: "
        "deepseek-v3's FP8 caches and recomputation under --recipe deepseek-v3-fp8, "
        "else bf16-flash)",
        choices=ACTIVATION_POLICY_NAMES,
    )

    @property
    def korthikanti_moe(self) -> bool:
        """Whether the setup is a mixture-of-experts or latent-attention model under
        Korthikanti-style activations (:mod:`vrammath.terms.korthikanti.layout`'s layers, states per
        pipeline rank from :mod:`vrammath.terms.moe.layout`)."""
        spec = self.model
        moe = spec.experts is not None or spec.latent is not None
        return moe and self.activation_formula == "korthikanti"

    @property
    def policy(self) -> str:
        """``activation_policy`` with ``auto`` resolved: ``deepseek-v3`` under the
        ``deepseek-v3-fp8`` recipe (its FP8 caches go with its FP8 GEMMs), else ``bf16-flash``."""
        if self.activation_policy != "auto":
            return self.activation_policy
        return "deepseek-v3" if self.recipe == "deepseek-v3-fp8" else "bf16-flash"

    @property
    def activation_formula(self) -> str:
        """``hf`` or ``korthikanti``: ``activation_model`` with ``auto`` resolved (Korthikanti's
        formulas for tensor/pipeline parallelism and selective recomputation, else HF-exact)."""
        if self.activation_model != "auto":
            return self.activation_model
        return "korthikanti" if self._megatron else "hf"

    @property
    def _megatron(self) -> bool:
        return self.tp > 1 or self.pp > 1 or self.recompute == "selective"

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelSpec):
            raise InputError(
                "model", "must be a ModelSpec (see vrammath.load_model)", type(self.model).__name__
            )
        check("recipe", self.recipe, RECIPE_NAMES)
        check("optimizer", self.optimizer, OPTIMIZERS)
        check("implementation", self.implementation, IMPLEMENTATIONS)
        object.__setattr__(self, "zero", zero_stage(self.zero))
        for name in SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise InputError(name, "must be true or false", getattr(self, name))
        check_bounds(self)
        check("engine", self.engine, ENGINES)
        object.__setattr__(self, "zero", engine_stage(self))
        check("attention", self.attention, ATTENTIONS)
        check("recompute", self.recompute, RECOMPUTES)
        check("activation_model", self.activation_model, ACTIVATION_MODELS)
        check("iteration", self.iteration, ITERATIONS)
        check("shard", self.shard, SHARDS)
        check("schedule", self.schedule, SCHEDULES)
        check("device", self.device, DEVICES)
        if self.gpu is not None:
            if not isinstance(self.gpu, str):
                raise InputError("gpu", "must be a GPU preset name", self.gpu)
            gpu(self.gpu)  # raises on an unknown name
        extra = self.extra_terms
        if not isinstance(extra, tuple) or not all(isinstance(k, str) for k in extra):
            raise InputError("extra_terms", "must be a tuple of row keys", got=extra)
        if len(set(extra)) != len(extra):
            raise InputError("extra_terms", "must name each row once", got=",".join(extra))
        self._check_offload()
        self._check_read()
        self._check_parallel()
        self._check_activations()
        self._check_moe()
        self._check_lora()

    def _check_read(self) -> None:
        """Refuse a field set where nothing reads it (it would change nothing, silently)."""
        object.__setattr__(self, "shard", engine_shard(self))
        if self.device != "cuda" and self.activation_formula == "korthikanti":
            raise InputError(
                "device",
                "is read only by the HF-exact activations (the CPU's kernels); Korthikanti's "
                "formulas assume a GPU's flash kernel",
                self.device,
            )

    def _check_offload(self) -> None:
        if self.offload_params and self.zero != 3:
            raise InputError("offload_params", "needs --zero 3", got=self.zero)
        if self.offload_optimizer and self.zero == 0:
            raise InputError("offload_optimizer", "needs --zero 1, 2 or 3", got=self.zero)

    def _check_parallel(self) -> None:
        spec = self.model
        if self.tp > spec.heads or spec.heads % self.tp:
            raise InputError("tp", f"must divide the attention heads ({spec.heads})", self.tp)
        if spec.kv_heads % self.tp:
            raise InputError(
                "tp",
                f"must divide the KV heads ({spec.kv_heads}) as Megatron splits KV groups",
                self.tp,
            )
        if self.pp > spec.layers:
            raise InputError("pp", f"must be at most the layers ({spec.layers})", self.pp)
        check_ep(spec, self.ep, self.gpus)
        check_ep_optimizer(self.optimizer, self.ep)
        if self.sp and self.tp == 1:
            raise InputError("sp", "sequence parallelism needs tp > 1", got=self.tp)
        if self.schedule == "interleaved":
            if self.pp == 1:
                raise InputError("schedule", "interleaved needs --pp > 1", got=self.schedule)
            if self.chunks == 1:
                raise InputError("chunks", "interleaved needs --chunks > 1", got=self.chunks)
            if self.pp * self.chunks > spec.layers:
                raise InputError(
                    "chunks", f"pp x chunks must be at most the layers ({spec.layers})", self.chunks
                )
        elif self.chunks != 1:
            raise InputError("chunks", "is used only by --schedule interleaved", got=self.chunks)
        if (self.tp > 1 or self.pp > 1) and (self.lora_rank is not None or self.zero == 3):
            raise InputError(
                "tp/pp",
                "tensor/pipeline parallelism is estimated with ZeRO 0-2 and without LoRA",
                got=(self.tp, self.pp),
            )

    def _check_activations(self) -> None:
        if self.activation_model == "hf" and self._megatron:
            raise InputError(
                "activation_model",
                "hf covers Hugging Face runs (tp=1, pp=1, recompute none or full); tensor, "
                "pipeline and selective recomputation are Megatron's: use korthikanti or auto",
                got=self.activation_model,
            )
        precision = PRECISION_OF[self.recipe]
        if (
            self.activation_formula == "hf"
            and self.model.conv1d
            and precision.startswith("autocast")
        ):
            raise InputError(
                "recipe",
                "autocast is not derived for GPT-2's activations; use fp32, fp16-mixed, "
                "bf16-mixed or bf16-pure",
                got=self.recipe,
            )

    def _check_moe(self) -> None:
        check("activation_policy", self.activation_policy, ACTIVATION_POLICY_NAMES)
        check_capacity(self.capacity_factor, self.imbalance)
        routed = self.korthikanti_moe and self.model.experts is not None
        why = "needs a mixture-of-experts model under --activations korthikanti"
        if self.capacity_factor is not None and not routed:
            raise InputError("capacity_factor", why, got=self.capacity_factor)
        if self.imbalance != 1 and not routed:
            # transformers' grouped GEMM keeps b*s*k rows whatever the routing (measured)
            raise InputError("imbalance", why, got=self.imbalance)
        if self.imbalance != 1 and self.capacity_factor is not None:
            # with a capacity every expert's buffer is c_f*b*s*k/E rows whatever the routing
            raise InputError(
                "imbalance",
                "is not read with --capacity-factor (capacity buffers do not depend on the "
                "routing); it describes dropless routing",
                got=self.imbalance,
            )
        if self.korthikanti_moe:
            return
        if self.activation_policy != "auto":
            raise InputError(
                "activation_policy",
                "needs a mixture-of-experts or latent-attention model under --activations "
                "korthikanti",
                got=self.activation_policy,
            )
        if self.schedule == "dualpipe":
            raise InputError(
                "schedule",
                "dualpipe is modelled for mixture-of-experts and latent-attention models under "
                "--activations korthikanti; use 1f1b or interleaved",
                got=self.schedule,
            )
        if self.recipe == "deepseek-v3-fp8" and self.activation_formula == "hf":
            raise InputError(
                "recipe",
                "deepseek-v3-fp8 needs --activations korthikanti (FP8 GEMMs are not how "
                "transformers runs a model)",
                got=self.recipe,
            )

    def _check_lora(self) -> None:
        if not isinstance(self.lora_targets, str | tuple | list):
            raise InputError(
                "lora_targets",
                "must be a list of targets (q,k,v,o,gate,up,down, qkv, gate_up) or all-linear",
                self.lora_targets,
            )
        object.__setattr__(self, "lora_targets", lora_targets(self.lora_targets))
        if self.lora_rank is None:
            if self.lora_targets != DEFAULT_TARGETS:
                raise InputError(
                    "lora_targets", "needs --lora-rank", got=",".join(self.lora_targets)
                )
            if self.lora_dropout:
                raise InputError("lora_dropout", "needs --lora-rank", got=True)
            if self.quant is not None:
                check("quant", self.quant, QUANTS)
                raise InputError(
                    "quant", "needs --lora-rank (a quantized base is frozen)", got=self.quant
                )
            return
        try:
            adapted_linears(self.model, self.lora_targets)  # e.g. no gate in a GPT MLP
        except InputError as err:
            if self.lora_targets != DEFAULT_TARGETS:
                raise
            # the user named no targets: say the default is what the model lacks
            raise default_targets_refusal(self.model, training=True) from err
        if self.offload_optimizer or self.offload_params:
            raise InputError(
                "offload", "is not estimated with LoRA (use --zero without offload)", got="offload"
            )
        if self.quant is not None:
            check("quant", self.quant, QUANTS)
            if self.zero == 3:
                raise InputError(
                    "quant", "is not estimated with ZeRO-3 (use --zero 0, 1 or 2)", got=self.zero
                )


def setup_warnings(setup: Setup) -> tuple[str, ...]:
    """What a setup is allowed to do but should be told: the model's own warnings, and a
    sequence longer than the model was trained for.

    >>> from vrammath.model.presets import load_model
    >>> setup_warnings(Setup(load_model("gpt2"), seq_len=4096))
    ("seq_len 4096 exceeds the model's max_position_embeddings (1024)",)
    """
    out = list(setup.model.context_warnings("seq_len", setup.seq_len))
    if setup.engine == "deepspeed" and setup.recipe == "fp16-mixed":  # a CPU refuses fp16
        out.append("--engine deepspeed: fp16-mixed follows its bf16 rules, not measured in fp16")
    if setup.quant is not None and setup.model.experts is not None:
        # transformers 5's bitsandbytes replaces nn.Linear only (vrammath.terms.lora.quant.quantized_tensors)
        out.append(
            f"quant {setup.quant}: the routed experts (3-D parameters in transformers 5) and the "
            "router stay in 16 bits; only nn.Linear layers are quantized"
        )
    return tuple(out)


def with_changes(setup: Setup, **changes: object) -> Setup:
    """A copy of ``setup`` with some fields changed (validated again)."""
    return replace(setup, **changes)  # type: ignore[arg-type]


__all__ = [
    "ACTIVATION_MODELS",
    "DEVICES",
    "ITERATIONS",
    "PRECISION_OF",
    "SCHEDULES",
    "SHARDS",
    "Setup",
    "Shard",
    "setup_warnings",
    "with_changes",
]
