"""An engine's own configuration file, read into the fields of a
:class:`~vrammath.compose.setup.Setup`.

:func:`deepspeed_fields` reads a DeepSpeed JSON config (``--deepspeed ds_config.json``), parsed,
the way the Hugging Face Trainer hands it to DeepSpeed: its ``"auto"`` values are filled as
``HfTrainerDeepSpeedConfig.trainer_config_process`` and ``trainer_config_finalize`` fill them
(``transformers/integrations/deepspeed.py``): ``reduce_bucket_size`` from the model's hidden
size (``hidden_size * hidden_size``), the micro-batch and the precision from the Trainer's own
arguments, which are the CLI's flags here. A key the file leaves out keeps DeepSpeed's default
(``reduce_bucket_size`` 5e8): the Trainer fills only the ``"auto"`` ones.

Every key is one of four kinds, and the reader says which:

* **modelled** -- it sets a field (``zero_optimization.stage``, ``reduce_bucket_size``, stage
  3's ``stage3_prefetch_bucket_size``, ``stage3_param_persistence_threshold``,
  ``stage3_max_live_parameters``, ``stage3_max_reuse_distance`` and ``sub_group_size``,
  ``bf16``/``fp16``, ``train_micro_batch_size_per_gpu``, ``optimizer``);
* **changes nothing** the estimate counts -- accepted (logging, schedules, the learning rate,
  gradient clipping, the stage-3 keys at stages 1 and 2, ...);
* **changes memory and is not modelled** -- refused, naming the key (``overlap_comm: true``
  below stage 3, where it adds a second bucket; at stage 3 it only moves the collectives to
  side streams and is accepted;
  an offload below stage 3 or to NVMe, ``contiguous_gradients: false``, stage 0, ...);
* **unknown** -- a one-line warning each.

Examples
========

>>> from vrammath.model.presets import load_model
>>> fields, said = deepspeed_fields(
...     {"zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}, "bf16": {"enabled": True},
...      "train_micro_batch_size_per_gpu": 4, "steps_per_print": 10},
...     load_model("llama-7b"),
... )
>>> fields
{'engine': 'deepspeed', 'zero': 2, 'reduce_bucket_size': 16777216, 'recipe': 'bf16-mixed', 'micro_batch': 4}
>>> said
[]
>>> deepspeed_fields({"zero_optimization": {"stage": 2, "overlap_comm": True}}, load_model("gpt2"))
Traceback (most recent call last):
...
vrammath.notation.errors.InputError: zero_optimization.overlap_comm: must be false (below stage 3 its second bucket is not modelled yet) (got True)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.terms.deepspeed3 import Stage3Knobs

Fields = dict[str, object]
"""The :class:`~vrammath.compose.setup.Setup` fields a config sets, by name, with their values."""

#: Top-level DeepSpeed keys that change nothing the estimate counts (logging, profiling,
#: schedules, checkpoint formats, the global batch and accumulation, clipping: the ZeRO step
#: computes the norm whether it clips or not).
_DS_NOTHING = frozenset(
    {
        "train_batch_size", "gradient_accumulation_steps", "gradient_clipping", "steps_per_print",
        "wall_clock_breakdown", "dump_state", "prescale_gradients", "gradient_predivide_factor",
        "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer", "scheduler",
        "flops_profiler", "tensorboard", "wandb", "csv_monitor", "comet", "monitor_config",
        "comms_logger", "checkpoint", "memory_breakdown", "seed", "train_steps",
    }
)  # fmt: skip

#: ``zero_optimization`` keys that change nothing at stages 1 and 2 (stage 3's, save-time
#: gathering, checkpoint layout, all-gathers into the flat buffer itself); at stage 3 its
#: gathering keys are read (:data:`_STAGE3_KEYS`) and its persistence cap refused.
_ZERO_NOTHING = frozenset(
    {
        "allgather_partitions", "allgather_bucket_size", "load_from_fp32_weights",
        "elastic_checkpoint", "ignore_unused_parameters", "legacy_stage1",
        "gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save",
        "stage3_gather_fp16_weights_on_model_save", "sub_group_size", "stage3_prefetch_bucket_size",
        "stage3_param_persistence_threshold", "stage3_max_live_parameters",
        "stage3_max_reuse_distance", "stage3_model_persistence_threshold", "memory_efficient_linear",
        "model_persistence_threshold", "max_live_parameters", "max_reuse_distance",
        "prefetch_bucket_size", "param_persistence_threshold", "log_trace_cache_warnings",
        "use_all_reduce_for_fetch_params", "module_granularity_threshold",
    }
)  # fmt: skip

#: ``zero_optimization`` keys whose default vrammath models, and the value that changes memory.
_ZERO_DEFAULTS: dict[str, tuple[object, str]] = {
    "overlap_comm": (False, "below stage 3 its second bucket is not modelled yet"),
    "contiguous_gradients": (True, "its gradients outside the contiguous buffer are not modelled"),
    "reduce_scatter": (True, "the all-reduce path is not modelled"),
    "round_robin_gradients": (False, "the round-robin gradient order is not modelled"),
    "cpu_offload": (False, "ZeRO-Offload's pinned buffers are not modelled yet"),
    "zero_quantized_weights": (False, "quantized communication is not modelled"),
    "zero_quantized_gradients": (False, "quantized communication is not modelled"),
    "zero_hpz_partition_size": (1, "hierarchical partitions are not modelled"),
    "mics_shard_size": (-1, "MiCS is not modelled"),
}

#: Top-level keys whose null/false value vrammath models, and why another is refused.
_TOP_DEFAULTS: dict[str, tuple[object, str]] = {
    "communication_data_type": (None, "a reduce dtype other than the gradients' is not modelled"),
    "sparse_gradients": (False, "sparse gradients are not modelled"),
    "amp": (None, "apex AMP is not modelled"),
    "data_types": (None, "a gradient accumulation dtype other than the gradients' is not modelled"),
}

_FP16_KEYS = frozenset(
    {
        "enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
        "consecutive_hysteresis", "min_loss_scale", "fp16_master_weights_and_grads",
    }
)  # fmt: skip
_OPT_PARAMS = frozenset(
    {"lr", "betas", "eps", "weight_decay", "bias_correction", "adam_w_mode", "torch_adam", "fused",
     "foreach"}
)  # fmt: skip


def config_mapping(value: object, key: str) -> Mapping[str, Any]:
    """``value`` as a JSON object, refused by ``key`` otherwise."""
    if not isinstance(value, Mapping):
        raise InputError(key, "must be a JSON object", got=type(value).__name__)
    return value


def _count(value: object, key: str) -> int:
    """A positive count, given as an integer or a whole float (``5e8``)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        raise InputError(key, 'must be a positive number or "auto"', got=value)
    if value != int(value):
        raise InputError(key, "must be a whole number", got=value)
    return int(value)


def _precision(config: Mapping[str, Any], said: list[str]) -> str | None:
    """``bf16-mixed`` / ``fp16-mixed`` from ``bf16.enabled`` / ``fp16.enabled``; None where
    both are ``"auto"`` (the Trainer's ``--bf16``/``--fp16``: the CLI's ``--recipe``)."""
    enabled: dict[str, object] = {}
    for name in ("bf16", "fp16"):
        section = config_mapping(config.get(name, {}), name)
        for key in section:
            if key != "enabled" and (name == "bf16" or key not in _FP16_KEYS):
                if name == "fp16" and key == "auto_cast" and section[key] is False:
                    continue
                if name == "fp16" and key == "auto_cast":
                    raise InputError("fp16.auto_cast", "must be false (not modelled)", section[key])
                if name == "bf16" and key in ("immediate_grad_update", "check_grad_overflow"):
                    continue
                said.append(f"{name}.{key}: not a key vrammath knows; not read")
        value = section.get("enabled", False)
        if value not in (True, False, "auto"):
            raise InputError(f"{name}.enabled", 'must be true, false or "auto"', got=value)
        enabled[name] = value
    if enabled["bf16"] is True and enabled["fp16"] is True:
        raise InputError("bf16.enabled", "and fp16.enabled cannot both be true", got=True)
    if enabled["bf16"] is True:
        return "bf16-mixed"
    if enabled["fp16"] is True:
        return "fp16-mixed"
    if "auto" in enabled.values():
        return None
    raise InputError(
        "bf16.enabled",
        "must be true, or fp16.enabled (vrammath models DeepSpeed's 16-bit ZeRO optimizer; its "
        "fp32 ZeRO is not modelled)",
        got=False,
    )


def _optimizer(section: Mapping[str, Any], said: list[str]) -> Fields:
    """``adamw``/``adam``: ``torch_adam`` builds torch's AdamW (``foreach`` by default, or
    ``fused``); otherwise DeepSpeed's FusedAdam, taken as a fused step."""
    kind = section.get("type")
    if not isinstance(kind, str) or kind.lower() not in ("adam", "adamw"):
        raise InputError(
            "optimizer.type",
            "must be Adam or AdamW (DeepSpeed's other optimizers are not modelled)",
            got=kind,
        )
    params = config_mapping(section.get("params", {}), "optimizer.params")
    for key in params:
        if key == "amsgrad" and params[key]:
            raise InputError("optimizer.params.amsgrad", "must be false (not modelled)", True)
        if key not in _OPT_PARAMS and key != "amsgrad":
            said.append(f"optimizer.params.{key}: not a key vrammath knows; not read")
    adamw = kind.lower() == "adamw" or params.get("adam_w_mode", True) is True
    if params.get("torch_adam"):
        implementation = "fused" if params.get("fused") else "foreach"
    else:
        implementation = "fused"
        said.append(
            f"optimizer.type {kind}: DeepSpeed's FusedAdam, taken as a fused step (measured "
            "with torch_adam only)"
        )
    return {"optimizer": "adamw" if adamw else "adam", "implementation": implementation}


#: Stage 3's gathering keys (either spelling DeepSpeed accepts), the field of
#: :class:`~vrammath.terms.deepspeed3.Stage3Knobs` each sets, and the Trainer's ``"auto"`` as a
#: function of the hidden size (``trainer_config_finalize``; None: no ``"auto"``).
_STAGE3_KEYS: dict[str, tuple[str, Callable[[int], int] | None]] = {
    "stage3_prefetch_bucket_size": ("prefetch_bucket_size", lambda h: int(0.9 * h * h)),
    "stage3_param_persistence_threshold": ("param_persistence_threshold", lambda h: 10 * h),
    "stage3_max_live_parameters": ("max_live_parameters", None),
    "stage3_max_reuse_distance": ("max_reuse_distance", None),
    "sub_group_size": ("sub_group_size", None),
}


def _stage3(section: Mapping[str, Any], spec: ModelSpec) -> Stage3Knobs:
    """Stage 3's gathering keys, ``"auto"`` filled as the Trainer fills it."""
    knobs: dict[str, int] = {}
    for key, (field, auto) in _STAGE3_KEYS.items():
        short = key.removeprefix("stage3_")
        for name in {key, short}:
            if name not in section:
                continue
            value, full = section[name], f"zero_optimization.{name}"
            if value == "auto" and auto is not None:
                knobs[field] = auto(spec.hidden)
            elif isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                allowed = 'a number >= 0 or "auto"' if auto else "a number >= 0"
                raise InputError(full, f"must be {allowed}", got=value)
            else:
                knobs[field] = int(value)
    for name in ("stage3_model_persistence_threshold", "model_persistence_threshold"):
        value = section.get(name, sys.maxsize)
        if value != sys.maxsize:
            raise InputError(
                f"zero_optimization.{name}",
                "must be left out (a cap on the persistent parameters is not modelled)",
                got=value,
            )
    return Stage3Knobs(**knobs)


#: Offload keys that change nothing counted: pinning keeps the bytes (page-locked), the
#: rest size NVMe's swap buffers, refused with the device.
_OFFLOAD_NOTHING = frozenset({"pin_memory", "buffer_count", "buffer_size", "max_in_cpu",
                              "fast_init", "nvme_path", "pipeline_read", "pipeline_write"})  # fmt: skip


def _offload(section: Mapping[str, Any], name: str, stage: int) -> Fields:
    """``offload_optimizer`` / ``offload_param``: the CPU at stage 3 (the host's share of each
    rank, :mod:`vrammath.compose.deepspeed3`); none otherwise."""
    device = section.get("device", "none")
    if device in ("none", None):
        return {}
    if device != "cpu" or stage != 3:
        why = "stage 3's CPU offload is modelled; NVMe and stages 1-2 are not"
        allowed = "none or cpu" if stage == 3 else "none"
        raise InputError(f"{name}.device", f"must be {allowed} ({why})", got=device)
    for key, value in section.items():
        if key == "ratio" and value != 1:
            raise InputError(f"{name}.ratio", "must be 1 (partial offload is not modelled)", value)
        if key not in (*_OFFLOAD_NOTHING, "device", "ratio"):
            raise InputError(f"{name}.{key}", "is not a key vrammath knows", got=value)
    field = "offload_optimizer" if name.endswith("offload_optimizer") else "offload_params"
    return {field: True}


def _zero(section: Mapping[str, Any], spec: ModelSpec, said: list[str]) -> Fields:
    stage = section.get("stage", 0)
    if stage not in (1, 2, 3) or isinstance(stage, bool):
        why = {
            0: "DeepSpeed without ZeRO is not modelled (--engine ddp is plain data parallelism)",
        }.get(stage, "DeepSpeed's stages are 0 to 3")
        raise InputError("zero_optimization.stage", f"must be 1, 2 or 3 ({why})", got=stage)
    out: Fields = {"engine": "deepspeed", "zero": stage}
    if stage == 3:
        out["stage3"] = _stage3(section, spec)
    # absent, DeepSpeed's own default stands (5e8): the Trainer fills only an "auto"
    bucket = section.get("reduce_bucket_size")
    if bucket is not None:
        key = "zero_optimization.reduce_bucket_size"
        out["reduce_bucket_size"] = (
            spec.hidden * spec.hidden if bucket == "auto" else _count(bucket, key)
        )
    for key, value in section.items():
        name = f"zero_optimization.{key}"
        if key in ("stage", "reduce_bucket_size") or key in _ZERO_NOTHING:
            continue  # stage 3's gathering keys: read by _stage3 above
        if key in ("offload_optimizer", "offload_param"):
            out |= _offload(config_mapping(value, name), name, stage)
        elif key == "overlap_comm" and stage == 3 and isinstance(value, bool):
            continue  # stage 3: side streams, no second bucket (DeepSpeedZeroOptimizer_Stage3)
        elif key in _ZERO_DEFAULTS:
            default, why = _ZERO_DEFAULTS[key]
            if value != default:
                raise InputError(name, f"must be {_json(default)} ({why})", got=value)
        else:
            said.append(f"{name}: not a key vrammath knows; not read")
    return out


def _json(value: object) -> str:
    """A default as JSON writes it."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return str(value)


def deepspeed_fields(config: Mapping[str, Any], spec: ModelSpec) -> tuple[Fields, list[str]]:
    """The :class:`~vrammath.compose.setup.Setup` fields a DeepSpeed config sets, and its
    one-line warnings (unknown keys, assumptions); a key that changes memory and is not
    modelled raises :class:`~vrammath.notation.errors.InputError` naming it."""
    config = config_mapping(config, "deepspeed")
    said: list[str] = []
    fields = _zero(
        config_mapping(config.get("zero_optimization", {}), "zero_optimization"), spec, said
    )
    recipe = _precision(config, said)
    if recipe is not None:
        fields["recipe"] = recipe
    micro = config.get("train_micro_batch_size_per_gpu", "auto")
    if micro != "auto":
        fields["micro_batch"] = _count(micro, "train_micro_batch_size_per_gpu")
    if "optimizer" in config:
        fields |= _optimizer(config_mapping(config["optimizer"], "optimizer"), said)
    for key, value in config.items():
        if key in _TOP_DEFAULTS:
            default, why = _TOP_DEFAULTS[key]
            enabled = value.get("enabled", True) if isinstance(value, Mapping) else value
            if value != default and enabled not in (False, None) and value != {}:
                raise InputError(key, f"must be {_json(default)} ({why})", got=_shown(value))
        elif key == "activation_checkpointing":
            said.append(
                "activation_checkpointing: read only by models that call "
                "deepspeed.checkpointing; a Hugging Face model's is --recompute"
            )
        elif key not in _DS_NOTHING and key not in (
            "zero_optimization", "bf16", "fp16", "optimizer", "train_micro_batch_size_per_gpu",
        ):  # fmt: skip
            said.append(f"{key}: not a key vrammath knows; not read")
    return fields, said


def _shown(value: object) -> object:
    return "an object" if isinstance(value, Mapping) else value


__all__ = ["Fields", "config_mapping", "deepspeed_fields"]
