"""accelerate's configuration file (``accelerate config``'s YAML, or JSON), read into the fields
of a :class:`~vrammath.compose.setup.Setup`, as :mod:`vrammath.compose.engine_config` reads a
DeepSpeed config.

:func:`simple_yaml` reads the YAML ``accelerate config`` writes (block mappings, plain scalars,
lists of scalars; nothing else) without a YAML library; :func:`accelerate_fields` maps it to an
engine: ``distributed_type`` ``NO`` (one GPU), ``MULTI_GPU`` (``ddp``), ``FSDP`` with
``fsdp_version: 2`` (``accelerate-fsdp2``), ``DEEPSPEED`` (``deepspeed``, through
:func:`~vrammath.compose.engine_config.deepspeed_fields`). Source: accelerate 1.15,
``accelerate/commands/config/config_args.py`` (the file's keys), ``accelerate/utils/dataclasses.py``
(``DeepSpeedPlugin``, ``FullyShardedDataParallelPlugin``) and ``accelerate/accelerator.py``
(native AMP: autocast on an fp32 model).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from vrammath.compose.engine_config import Fields, config_mapping, deepspeed_fields
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError


def _scalar(text: str, where: str) -> object:
    """A YAML scalar as ``accelerate config`` writes them (``yaml.safe_dump``)."""
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    if text in ("null", "~", ""):
        return None
    if text == "[]":
        return []
    if text == "{}":
        return {}
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    if text[0] in "[{&*!|>%@`":
        raise InputError("accelerate", f"{where}: only plain key: value lines are read", text)
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def simple_yaml(text: str) -> dict[str, Any]:
    """The block mappings, plain scalars and block lists of scalars an accelerate config file
    holds (what ``accelerate config`` writes); anything else is refused with its line.

    >>> simple_yaml("distributed_type: FSDP\\nfsdp_config:\\n  fsdp_version: 2\\ntpu_env: []\\n")
    {'distributed_type': 'FSDP', 'fsdp_config': {'fsdp_version': 2}, 'tpu_env': []}
    """
    root: dict[str, Any] = {}
    stack: list[tuple[int, Any]] = [(-1, root)]
    pending: tuple[int, dict[str, Any], str] | None = None  # a "key:" awaiting its block
    columns: dict[int, int] = {}  # each mapping's keys stand in one column
    for number, raw in enumerate(text.splitlines(), 1):
        where = f"line {number}"
        line = raw.split(" #", 1)[0].rstrip()
        if not line.strip() or line.lstrip().startswith("#") or line.strip() == "---":
            continue
        if "\t" in line[: len(line) - len(line.lstrip())]:
            raise InputError("accelerate", f"{where}: indented with a tab", line.strip())
        indent = len(line) - len(line.lstrip())
        body = line.strip()
        if pending is not None:
            p_indent, p_parent, p_key = pending
            pending = None
            if indent > p_indent or (body.startswith("- ") and indent == p_indent):
                block: Any = [] if body.startswith("- ") else {}
                p_parent[p_key] = block
                # a list's items may stand at its key's indentation (as safe_dump writes them)
                stack.append((p_indent - 1 if isinstance(block, list) else p_indent, block))
        while len(stack) > 1 and (
            indent <= stack[-1][0] or (isinstance(stack[-1][1], list) and body[0] != "-")
        ):
            stack.pop()
        container = stack[-1][1]
        if isinstance(container, dict) and columns.setdefault(id(container), indent) != indent:
            raise InputError("accelerate", f"{where}: indentation matches no mapping", body)
        if body.startswith("- ") or body == "-":
            if not isinstance(container, list):
                raise InputError("accelerate", f"{where}: a list item outside a list", body)
            container.append(_scalar(body[1:].strip(), where))
            continue
        key, sep, value = body.partition(": ") if ": " in body else body.partition(":")
        if not sep or not isinstance(container, dict) or not key or key[0] in "'\"[{?":
            raise InputError("accelerate", f"{where}: only plain key: value lines are read", body)
        if value.strip():
            container[key] = _scalar(value.strip(), where)
        else:
            container[key] = None
            pending = (indent, container, key)
    return root


#: accelerate config keys that change nothing the estimate counts (the launch, the machine's
#: address, logging), top level and in ``fsdp_config`` (FSDP1's keys, loading, state dicts).
_ACCEL_NOTHING = frozenset(
    {
        "compute_environment", "debug", "machine_rank", "main_process_ip", "main_process_port",
        "main_training_function", "rdzv_backend", "same_network", "enable_cpu_affinity",
        "downcast_bf16", "gpu_ids", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "tpu_name",
        "tpu_zone", "commands", "command_file", "num_cpu_threads_per_process", "use_cpu",
        "deepspeed_config", "fsdp_config", "dynamo_config", "megatron_lm_config", "ipex_config",
        "mpirun_config", "fp8_config", "parallelism_config", "distributed_type", "mixed_precision",
        "num_processes", "num_machines",
    }
)  # fmt: skip
_FSDP_NOTHING = frozenset(
    {
        "fsdp_version", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_state_dict_type", "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
        "fsdp_use_orig_params", "fsdp_backward_prefetch", "fsdp_forward_prefetch",
        "fsdp_min_num_params", "fsdp_reshard_after_forward", "fsdp_offload_params",
        "fsdp_activation_checkpointing",
    }
)  # fmt: skip
_DS_PLUGIN = {
    "gradient_accumulation_steps": "gradient_accumulation_steps",
    "gradient_clipping": "gradient_clipping",
    "zero_stage": "zero_optimization.stage",
    "offload_optimizer_device": "zero_optimization.offload_optimizer.device",
    "offload_param_device": "zero_optimization.offload_param.device",
}
_DS_PLUGIN_NOTHING = frozenset(
    {
        "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_multinode_launcher",
        "deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
        "offload_optimizer_nvme_path", "offload_param_nvme_path", "deepspeed_config_file",
    }
)  # fmt: skip


def accelerate_deepspeed_file(config: Mapping[str, Any]) -> str | None:
    """The DeepSpeed config file an accelerate config names (``deepspeed_config_file``)."""
    section = config.get("deepspeed_config")
    path = section.get("deepspeed_config_file") if isinstance(section, Mapping) else None
    return path if isinstance(path, str) and path else None


def _accel_precision(value: object, kind: str) -> str:
    """The recipe of ``mixed_precision``: autocast on an fp32 model (``NO``, ``MULTI_GPU``:
    accelerate's native AMP), ``MixedPrecisionPolicy`` under FSDP2; ``no`` is fp32."""
    autocast = {"bf16": "autocast-bf16", "fp16": "autocast-fp16", "no": "fp32"}
    allowed = {"FSDP": {"bf16": "bf16-mixed", "no": "fp32"}, "DEEPSPEED": {"bf16": "", "fp16": ""}}
    table = allowed.get(kind, autocast)
    if value not in table:
        raise InputError(
            "mixed_precision",
            f"must be {' or '.join(table)} under {kind} (others not modelled)",
            value,
        )
    return table[str(value)]


def _accel_deepspeed(
    section: Mapping[str, Any], ds_file: Mapping[str, Any] | None, precision: object
) -> dict[str, Any]:
    """The DeepSpeed config accelerate hands DeepSpeed: the named file (its ``"auto"``
    precision filled from ``mixed_precision``), or one made from the plugin's keys
    (``DeepSpeedPlugin.__post_init__``: no ``reduce_bucket_size``, so DeepSpeed's default),
    with ``mixed_precision`` as ``bf16``/``fp16``."""
    ds: dict[str, Any]
    if ds_file is not None:  # accelerate fills the file's "auto" precision from its own
        ds = dict(ds_file)
        for name in ("bf16", "fp16"):
            section_ = ds.get(name)
            if isinstance(section_, Mapping) and section_.get("enabled") == "auto":
                ds[name] = {**section_, "enabled": precision == name}
        return ds
    ds = {"zero_optimization": {"stage": 0}}
    for key, value in section.items():
        if key in _DS_PLUGIN:
            *parents, leaf = _DS_PLUGIN[key].split(".")
            node = ds
            for part in parents:
                node = node.setdefault(part, {})
            node[leaf] = value
        elif key not in _DS_PLUGIN_NOTHING:
            raise InputError(f"deepspeed_config.{key}", "is not a key vrammath reads", value)
    ds["bf16"] = {"enabled": precision == "bf16"}
    ds["fp16"] = {"enabled": precision == "fp16"}
    return ds


def accelerate_fields(
    config: Mapping[str, Any], spec: ModelSpec, ds_file: Mapping[str, Any] | None = None
) -> tuple[Fields, list[str]]:
    """The :class:`~vrammath.compose.setup.Setup` fields an accelerate config file sets (as
    ``accelerate config`` writes it, parsed: :func:`simple_yaml` or JSON), and its warnings.

    ``distributed_type`` picks the engine: ``NO`` the plain loop on one GPU, ``MULTI_GPU``
    ``ddp``, ``FSDP`` with ``fsdp_version: 2`` ``accelerate-fsdp2`` (accelerate 1.15's wrap),
    ``DEEPSPEED`` ``deepspeed`` through :func:`deepspeed_fields` (``ds_file``: the parsed
    ``deepspeed_config_file``, else the plugin's own keys); the GPUs are ``num_processes``
    (accelerate's count over all machines). Other types, FSDP1, a compile backend and
    tensor/context parallelism are refused by name.

    >>> from vrammath.model.presets import load_model
    >>> fields, said = accelerate_fields(simple_yaml(
    ...     "distributed_type: FSDP\\nmixed_precision: bf16\\nnum_processes: 8\\nfsdp_config:\\n"
    ...     "  fsdp_version: 2\\n  fsdp_reshard_after_forward: false\\n"), load_model("llama-7b"))
    >>> fields
    {'engine': 'accelerate-fsdp2', 'gpus': 8, 'recipe': 'bf16-mixed', 'no_reshard': True}
    """
    config = config_mapping(config, "accelerate")
    said: list[str] = []
    if config.get("use_cpu") is True:
        raise InputError("use_cpu", "must be false (vrammath counts a GPU's memory)", got=True)
    kind = config.get("distributed_type", "NO")
    gpus = config.get("num_processes", 1)
    if not isinstance(gpus, int) or isinstance(gpus, bool) or gpus < 1:
        raise InputError("num_processes", "must be a positive integer", got=gpus)
    backend = config_mapping(config.get("dynamo_config") or {}, "dynamo_config").get(
        "dynamo_backend"
    )
    if backend not in (None, "NO", "no"):
        raise InputError(
            "dynamo_config.dynamo_backend", "must be NO (torch.compile is not modelled)", backend
        )
    parallel = config_mapping(config.get("parallelism_config") or {}, "parallelism_config")
    for key, value in parallel.items():
        if key.endswith(("tp_size", "cp_size")) and value not in (1, None):
            raise InputError(f"parallelism_config.{key}", "must be 1 (not modelled)", value)
    fields: Fields
    if kind == "NO":
        fields = {"gpus": 1}
    elif kind == "MULTI_GPU":
        fields = {"engine": "ddp", "gpus": gpus}
    elif kind == "FSDP":
        section = config_mapping(config.get("fsdp_config") or {}, "fsdp_config")
        if section.get("fsdp_version", 1) != 2:
            raise InputError(
                "fsdp_config.fsdp_version",
                "must be 2 (FSDP1 is not modelled yet)",
                section.get("fsdp_version", 1),
            )
        wrap = section.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
        if wrap != "TRANSFORMER_BASED_WRAP":
            raise InputError(
                "fsdp_config.fsdp_auto_wrap_policy",
                "must be TRANSFORMER_BASED_WRAP (one unit per decoder layer)",
                wrap,
            )
        fields = {"engine": "accelerate-fsdp2", "gpus": gpus}
        fields["recipe"] = _accel_precision(config.get("mixed_precision", "no"), kind)
        if section.get("fsdp_reshard_after_forward", True) is False:
            fields["no_reshard"] = True
        if section.get("fsdp_offload_params") is True:
            fields |= {"offload_optimizer": True, "offload_params": True}
        if section.get("fsdp_activation_checkpointing") is True:
            fields["recompute"] = "full"
        said += [
            f"fsdp_config.{k}: not a key vrammath knows; not read"
            for k in section
            if k not in _FSDP_NOTHING
        ]
    elif kind == "DEEPSPEED":
        precision = config.get("mixed_precision", "no")
        _accel_precision(precision, kind)
        section = config_mapping(config.get("deepspeed_config") or {}, "deepspeed_config")
        fields, more = deepspeed_fields(_accel_deepspeed(section, ds_file, precision), spec)
        fields |= {"gpus": gpus}
        said += more
    else:
        raise InputError(
            "distributed_type",
            "must be NO, MULTI_GPU, FSDP or DEEPSPEED (the others are not modelled)",
            kind,
        )
    if kind in ("NO", "MULTI_GPU"):
        fields["recipe"] = _accel_precision(config.get("mixed_precision", "no"), kind)
    said += [f"{k}: not a key vrammath knows; not read" for k in config if k not in _ACCEL_NOTHING]
    return fields, said


__all__ = ["accelerate_deepspeed_file", "accelerate_fields", "simple_yaml"]
