"""torchtitan's job file (``--torchtitan job.toml``), parsed, read into the fields of a
:class:`~vrammath.compose.setup.Setup`, as :mod:`vrammath.compose.engine_config` reads a
DeepSpeed config.

torchtitan trains with FSDP2 (``fully_shard`` on every decoder layer, then the model): the
engine is ``fsdp2``. Its ``[training]`` section gives the micro-batch (``local_batch_size``),
the sequence, ``MixedPrecisionPolicy``'s dtypes (``mixed_precision_param``,
``mixed_precision_reduce``) and CPU offload; ``[parallelism]`` the shard degree and
``fsdp_reshard_after_forward``; ``[activation_checkpoint]`` the recomputation; ``[optimizer]``
the optimizer and its implementation. A key the file leaves out keeps torchtitan's default
(``local_batch_size`` 8, ``seq_len`` 2048, a fused AdamW, selective checkpointing). Source:
torchtitan's ``torchtitan/config/job_config.py`` as of the last TOML release (commit
``e347b1e5e``, before ``9810191bb`` moved its configs to Python functions, which vrammath does
not run) and ``torchtitan/models/llama3/infra/parallelize.py`` (``apply_fsdp``, ``apply_ac``).

Every key is one of four kinds, as in a DeepSpeed config: modelled (it sets a field), known to
change nothing the step holds (logging, schedules, checkpoint folders, the learning rate),
changing memory and not modelled (refused by name: tensor, pipeline, context and expert
parallelism, replicas, ``torch.compile``, float8 and MX converters, selective checkpointing),
or unknown (a one-line warning each). The model is the command's ``MODEL`` argument:
``[model]`` names torchtitan's own definition, which a Hugging Face config stands in for.

>>> from vrammath.model.presets import load_model
>>> fields, said = torchtitan_fields(
...     {"training": {"local_batch_size": 2, "seq_len": 8192},
...      "parallelism": {"data_parallel_shard_degree": 8},
...      "activation_checkpoint": {"mode": "full"},
...      "optimizer": {"name": "AdamW", "lr": 3e-4}},
...     load_model("llama-7b"),
... )
>>> fields
{'engine': 'fsdp2', 'recipe': 'bf16-mixed', 'micro_batch': 2, 'seq_len': 8192, 'gpus': 8, 'recompute': 'full', 'optimizer': 'adamw', 'implementation': 'fused'}
>>> torchtitan_fields({"activation_checkpoint": {"mode": "none"}, "compile": {"enable": True}},
...                   load_model("llama-7b"))
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: compile.enable: must be false (torch.compile's memory is not modelled yet) (got True)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vrammath.compose.engine_config import Fields, config_mapping
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError

#: Sections whose keys change nothing the training step holds (a validation pass holds less:
#: no gradients, no activations kept; the float8, MX and quantize sections act only through
#: ``model.converters``, refused).
_NOTHING_SECTIONS = frozenset(
    {"job", "profiling", "metrics", "lr_scheduler", "comm", "checkpoint", "memory_estimation",
     "validation", "float8", "mx", "quantize", "debug"}
)  # fmt: skip

#: Keys of the read sections that are known: read above, refused above, or changing nothing
#: counted (any other key of these sections gets a warning).
_KNOWN_KEYS = {
    "training": {"global_batch_size", "max_norm", "steps", "dataset", "dataset_path", "seed",
                 "deterministic", "gc_freq", "gc_debug", "warmup_steps", "enable_cpu_offload",
                 "dtype", "dataloader"},
    "optimizer": {"lr", "beta1", "beta2", "eps", "weight_decay", "min_lr_factor"},
    "parallelism": {"disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_degree", "context_parallel_degree",
                    "tensor_parallel_degree", "expert_parallel_degree",
                    "data_parallel_replicate_degree", "fsdp_reshard_after_forward",
                    "data_parallel_shard_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers",
                    "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule_csv",
                    "pipeline_parallel_expert_parallel_overlap", "context_parallel_load_balancer",
                    "context_parallel_rotate_method", "expert_tensor_parallel_degree",
                    "expert_parallel_comm_backend"},
    "compile": {"components", "backend"},
    "activation_checkpoint": {"mode", "selective_ac_option", "preserve_rng_state",
                              "determinism_check", "debug", "early_stop"},
    "model": {"name", "flavor", "hf_assets_path", "tokenizer_path", "converters",
              "print_after_conversion"},
}  # fmt: skip

#: Keys whose default vrammath models, and why another value is refused.
_DEFAULTS: dict[str, tuple[object, str]] = {
    "parallelism.tensor_parallel_degree": (1, "tensor parallelism with FSDP2 is not modelled yet"),
    "parallelism.pipeline_parallel_degree": (1, "pipeline parallelism with FSDP2 is not modelled"),
    "parallelism.context_parallel_degree": (1, "context parallelism is not modelled yet"),
    "parallelism.expert_parallel_degree": (1, "expert parallelism with FSDP2 is not modelled"),
    "parallelism.expert_tensor_parallel_degree": (1, "expert tensor parallelism is not modelled"),
    "parallelism.data_parallel_replicate_degree": (1, "HSDP's replicas are not modelled"),
    "compile.enable": (False, "torch.compile's memory is not modelled yet"),
    "float8.enable_fsdp_float8_all_gather": (False, "float8 training is not modelled yet"),
    "optimizer.early_step_in_backward": (False, "a step inside the backward is not modelled"),
    "fault_tolerance.enable": (False, "torchft's replica groups are not modelled"),
}

_PRECISION = {"bfloat16": "bf16", "float32": "fp32"}
_OPTIMIZERS = {"AdamW": "adamw", "Adam": "adam"}
_IMPLEMENTATIONS = {"fused": "fused", "foreach": "foreach", "for-loop": "for-loop"}


def _recipe(training: Mapping[str, Any]) -> str:
    """``MixedPrecisionPolicy``'s dtypes as a recipe (torchtitan's defaults bf16 and fp32); a
    bf16 model (``training.dtype``) trains in bf16 throughout."""
    dtype = training.get("dtype", "float32")
    if dtype not in _PRECISION:
        raise InputError("training.dtype", "must be bfloat16 or float32", got=dtype)
    if dtype == "bfloat16":
        return "bf16-pure"
    param = training.get("mixed_precision_param", "bfloat16")
    reduce = training.get("mixed_precision_reduce", "float32")
    for key, value in (("param", param), ("reduce", reduce)):
        if value not in _PRECISION:
            raise InputError(
                f"training.mixed_precision_{key}", "must be bfloat16 or float32", value
            )
    if param == "float32":
        return "fp32"  # no policy: fp32 compute, fp32 gradients
    if reduce == "bfloat16":
        raise InputError(
            "training.mixed_precision_reduce",
            "must be float32 with bfloat16 parameters (a bf16 reduce over fp32 shards is not "
            "modelled)",
            got=reduce,
        )
    return "bf16-mixed"


def _count(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(key, "must be a positive integer", got=value)
    return value


def _refusals(config: Mapping[str, Any]) -> None:
    """Refuse what changes memory and is not modelled, naming the key."""
    for dotted, (default, why) in _DEFAULTS.items():
        section, key = dotted.split(".")
        value = config_mapping(config.get(section, {}), section).get(key, default)
        if value != default:
            raise InputError(dotted, f"must be {str(default).lower()} ({why})", got=value)
    mode = config_mapping(config.get("checkpoint", {}), "checkpoint").get("async_mode", "disabled")
    if mode not in ("disabled", "async"):
        raise InputError(
            "checkpoint.async_mode",
            "must be disabled or async (a pinned host copy of the state is not modelled)",
            got=mode,
        )
    converters = config_mapping(config.get("model", {}), "model").get("converters", [])
    if converters:
        raise InputError(
            "model.converters", "must be empty (float8 and MX training are not modelled yet)",
            converters,
        )  # fmt: skip
    checkpointing = config_mapping(config.get("activation_checkpoint", {}), "activation_checkpoint")
    mode = checkpointing.get("mode", "selective")  # torchtitan's default
    if mode not in ("none", "full"):
        raise InputError(
            "activation_checkpoint.mode",
            "must be none or full (torchtitan's selective and memory-budget checkpointing are "
            "not modelled yet; its default is selective)",
            got=mode,
        )


def torchtitan_fields(config: Mapping[str, Any], spec: ModelSpec) -> tuple[Fields, list[str]]:
    """The :class:`~vrammath.compose.setup.Setup` fields a torchtitan job file sets, and a line
    for each key it does not know (``spec``, the model, is the command's: ``[model]`` is not
    read)."""
    _refusals(config)
    said: list[str] = []
    training = config_mapping(config.get("training", {}), "training")
    parallel = config_mapping(config.get("parallelism", {}), "parallelism")
    optimizer = config_mapping(config.get("optimizer", {}), "optimizer")
    fields: Fields = {"engine": "fsdp2", "recipe": _recipe(training)}
    batch = training.get("local_batch_size", training.get("batch_size", 8))
    fields["micro_batch"] = _count(batch, "training.local_batch_size")
    fields["seq_len"] = _count(training.get("seq_len", 2048), "training.seq_len")
    shard = parallel.get("data_parallel_shard_degree", -1)
    if shard != -1:  # -1: every rank (the CLI's --gpus)
        fields["gpus"] = _count(shard, "parallelism.data_parallel_shard_degree")
    reshard = parallel.get("fsdp_reshard_after_forward", "default")
    if reshard not in ("default", "always", "never"):
        raise InputError(
            "parallelism.fsdp_reshard_after_forward", "must be default, always or never", reshard
        )
    if reshard == "never":
        fields["no_reshard"] = True
    if training.get("enable_cpu_offload", False):
        fields |= {"offload_params": True, "offload_optimizer": True}
    checkpointing = config_mapping(config.get("activation_checkpoint", {}), "activation_checkpoint")
    fields["recompute"] = "full" if checkpointing.get("mode", "selective") == "full" else "none"
    name = optimizer.get("name", "AdamW")
    if name not in _OPTIMIZERS:
        raise InputError("optimizer.name", "must be AdamW or Adam", got=name)
    fields["optimizer"] = _OPTIMIZERS[name]
    kind = optimizer.get("implementation", "fused")
    if kind not in _IMPLEMENTATIONS:
        raise InputError("optimizer.implementation", "must be fused, foreach or for-loop", kind)
    fields["implementation"] = _IMPLEMENTATIONS[kind]
    for section, body in config.items():
        if section in _NOTHING_SECTIONS or not isinstance(body, Mapping):
            continue
        known = _KNOWN_KEYS.get(section, set()) | {"mixed_precision_param",
                                                     "mixed_precision_reduce", "local_batch_size",
                                                     "batch_size", "seq_len", "name",
                                                     "implementation", "enable"}  # fmt: skip
        for key in body:
            if key not in known and f"{section}.{key}" not in _DEFAULTS:
                said.append(f"{section}.{key}: not a key vrammath knows; not read")
    return fields, said


__all__ = ["torchtitan_fields"]
