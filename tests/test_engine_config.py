"""``--deepspeed ds_config.json`` and ``--accelerate config.yaml``: the engine config files users
have, read into a setup's fields.

The configs below are the shapes users have: the Hugging Face Trainer's ``"auto"`` template
(transformers' DeepSpeed integration docs, ZeRO-2 section) and the config the measurement harness
hands DeepSpeed (``vrammath.measure.deepspeed_runs.measure_deepspeed``), whose estimate must be the
one the engine rows compare with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vrammath as vm
from vrammath.cli import main
from vrammath.compose.accelerate_config import accelerate_fields, simple_yaml
from vrammath.compose.engine_config import deepspeed_fields

LLAMA = vm.load_model("llama-7b")

HF_ZERO2 = {
    "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "hysteresis": 2},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto"}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "none", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": False,
        "reduce_scatter": True,
        "reduce_bucket_size": "auto",
        "contiguous_gradients": True,
    },
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "steps_per_print": 2000,
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "wall_clock_breakdown": False,
}


def test_the_trainer_template_resolves_auto_as_the_trainer_does() -> None:
    fields, said = deepspeed_fields(HF_ZERO2, LLAMA)
    # reduce_bucket_size "auto" is hidden_size * hidden_size; the precision and the
    # micro-batch are the Trainer's arguments (the CLI's flags), so they are not set
    assert fields == {
        "engine": "deepspeed",
        "zero": 2,
        "reduce_bucket_size": 4096 * 4096,
        "optimizer": "adamw",
        "implementation": "fused",
    }
    assert said == [
        "optimizer.type AdamW: DeepSpeed's FusedAdam, taken as a fused step (measured with "
        "torch_adam only)"
    ]


def test_a_bucket_left_out_is_deepspeed_s_default_not_the_trainer_s_auto() -> None:
    fields, _ = deepspeed_fields(
        {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True}}, LLAMA
    )
    assert "reduce_bucket_size" not in fields
    setup = vm.Setup(LLAMA, gpus=8, **fields)  # type: ignore[arg-type]
    assert vm.estimate(setup).component("reduce_bucket").bytes == 2 * 500_000_000


def test_the_measured_config_gives_the_measured_rows_setup() -> None:
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1, "reduce_bucket_size": 10**6},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "foreach": True}},
    }
    fields, said = deepspeed_fields(config, LLAMA)
    assert said == []
    setup = vm.Setup(LLAMA, gpus=8, **fields)  # type: ignore[arg-type]
    same = vm.Setup(
        LLAMA, gpus=8, engine="deepspeed", zero=1, reduce_bucket_size=10**6, micro_batch=1,
        recipe="bf16-mixed", optimizer="adamw", implementation="foreach",
    )  # fmt: skip
    assert setup == same
    assert vm.estimate(setup).phases == vm.estimate(same).phases


@pytest.mark.parametrize(
    ("change", "key"),
    [
        ({"zero_optimization": {"stage": 4}}, "zero_optimization.stage"),
        ({"zero_optimization": {"stage": 0}}, "zero_optimization.stage"),
        (
            {"zero_optimization": {"stage": 3, "stage3_max_live_parameters": "auto"}},
            "zero_optimization.stage3_max_live_parameters",
        ),
        (
            {"zero_optimization": {"stage": 3, "stage3_model_persistence_threshold": 10**6}},
            "zero_optimization.stage3_model_persistence_threshold",
        ),
        (
            {"zero_optimization": {"stage": 2, "overlap_comm": True}},
            "zero_optimization.overlap_comm",
        ),
        (
            {"zero_optimization": {"stage": 2, "contiguous_gradients": False}},
            "zero_optimization.contiguous_gradients",
        ),
        (
            {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}},
            "zero_optimization.offload_optimizer.device",
        ),
        (
            {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            "zero_optimization.offload_param.device",
        ),
        (
            {
                "zero_optimization": {
                    "stage": 3,
                    "offload_optimizer": {"device": "cpu", "ratio": 0.3},
                }
            },
            "zero_optimization.offload_optimizer.ratio",
        ),
        (
            {"zero_optimization": {"stage": 2, "reduce_bucket_size": -1}},
            "zero_optimization.reduce_bucket_size",
        ),
        ({"bf16": {"enabled": False}, "fp16": {"enabled": False}}, "bf16.enabled"),
        ({"bf16": {"enabled": True}, "fp16": {"enabled": True}}, "bf16.enabled"),
        ({"optimizer": {"type": "OneBitAdam"}}, "optimizer.type"),
        ({"optimizer": {"type": "Adam", "params": {"amsgrad": True}}}, "optimizer.params.amsgrad"),
        ({"communication_data_type": "fp32"}, "communication_data_type"),
        ({"train_micro_batch_size_per_gpu": 0}, "train_micro_batch_size_per_gpu"),
    ],
)
def test_a_key_that_changes_memory_and_is_not_modelled_is_refused_by_name(
    change: dict[str, object], key: str
) -> None:
    config = {**HF_ZERO2, "bf16": {"enabled": True}, **change}
    with pytest.raises(vm.InputError) as err:
        deepspeed_fields(config, LLAMA)
    assert str(err.value).startswith(key + ":")
    assert "\n" not in str(err.value)


def test_unknown_keys_are_warned_once_each_and_harmless_ones_pass() -> None:
    config = {
        **HF_ZERO2,
        "bf16": {"enabled": True},
        "tensorboard": {"enabled": True},
        "no_such_key": 1,
        "zero_optimization": {**HF_ZERO2["zero_optimization"], "stage3_max_live_parameters": 1e9},  # type: ignore[dict-item]
    }
    _, said = deepspeed_fields(config, LLAMA)
    assert [s for s in said if "not read" in s] == [
        "no_such_key: not a key vrammath knows; not read"
    ]


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({**HF_ZERO2, "mystery": True}))
    argv = ["estimate", "llama-7b", "--deepspeed", str(path), "--gpus", "8", "--json"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["setup"]["engine"] == "deepspeed"
    assert out["setup"]["reduce_bucket_size"] == 4096 * 4096
    assert "ds_config.json: mystery: not a key vrammath knows; not read" in out["warnings"]
    assert "vrammath: warning: ds_config.json: mystery" in captured.err
    # a flag that says otherwise than the file is refused, one line, exit 2
    assert main([*argv[:-1], "--zero", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        "vrammath: error: zero: is 2 in ds_config.json; the flag says otherwise (got 1)"
    )
    path.write_text("{")
    assert main(argv) == 2
    assert "deepspeed: ds_config.json is not JSON" in capsys.readouterr().err


# --- accelerate's config file ----------------------------------------------------------------

ACCELERATE_FSDP = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: FSDP
downcast_bf16: 'no'
enable_cpu_affinity: false
fsdp_config:
  fsdp_activation_checkpointing: false
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_cpu_ram_efficient_loading: true
  fsdp_offload_params: false
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: SHARDED_STATE_DICT
  fsdp_transformer_layer_cls_to_wrap:
  - LlamaDecoderLayer
  fsdp_version: 2
machine_rank: 0
main_training_function: main
mixed_precision: bf16
num_machines: 1
num_processes: 8
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: false
"""
"""What ``accelerate config`` writes for FSDP2 on one machine of 8 GPUs (accelerate 1.15)."""


def _accel(text: str = ACCELERATE_FSDP, **changes: object) -> dict[str, object]:
    config = simple_yaml(text)
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = config
        for part in parents:
            node = node[part]
        node[leaf] = value
    return config


def test_simple_yaml_reads_what_accelerate_writes() -> None:
    config = simple_yaml(ACCELERATE_FSDP)
    assert config["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
    assert config["fsdp_config"]["fsdp_version"] == 2
    assert config["downcast_bf16"] == "no"
    assert config["tpu_env"] == []
    assert config["use_cpu"] is False


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a:\n\tb: 1\n", "line 2: indented with a tab"),
        ("a: |\n  text\n", "line 1: only plain key: value lines are read"),
        ("a: &x 1\n", "line 1: only plain key: value lines are read"),
        ("a: 1\n  b: 2\n", "line 2: indentation matches no mapping"),
        ("- a\n", "line 1: a list item outside a list"),
    ],
)
def test_simple_yaml_refuses_the_rest_with_its_line(text: str, line: str) -> None:
    with pytest.raises(vm.InputError, match="^accelerate: " + line):
        simple_yaml(text)


def test_accelerate_fsdp2_is_accelerate_s_wrap() -> None:
    fields, said = accelerate_fields(_accel(), LLAMA)
    assert fields == {"engine": "accelerate-fsdp2", "gpus": 8, "recipe": "bf16-mixed"}
    assert said == []
    changed = {
        "fsdp_config__fsdp_reshard_after_forward": False,
        "fsdp_config__fsdp_offload_params": True,
        "fsdp_config__fsdp_activation_checkpointing": True,
    }
    fields, _ = accelerate_fields(_accel(**changed), LLAMA)
    assert fields["no_reshard"] is True
    assert fields["offload_optimizer"] is fields["offload_params"] is True
    assert fields["recompute"] == "full"
    vm.estimate(vm.Setup(LLAMA, **fields))  # type: ignore[arg-type]


def test_accelerate_ddp_and_one_gpu_are_autocast() -> None:
    fields, _ = accelerate_fields(_accel(distributed_type="MULTI_GPU"), LLAMA)
    assert fields == {"engine": "ddp", "gpus": 8, "recipe": "autocast-bf16"}
    fields, _ = accelerate_fields(_accel(distributed_type="NO", mixed_precision="no"), LLAMA)
    assert fields == {"gpus": 1, "recipe": "fp32"}


def test_accelerate_deepspeed_plugin_and_file() -> None:
    plugin = "distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 4\n"
    plugin += "deepspeed_config:\n  zero_stage: 2\n  offload_optimizer_device: none\n"
    fields, _ = accelerate_fields(simple_yaml(plugin), LLAMA)
    # the plugin's own config has no reduce_bucket_size: DeepSpeed's default stands
    assert fields == {"engine": "deepspeed", "zero": 2, "recipe": "bf16-mixed", "gpus": 4}
    fields, _ = accelerate_fields(simple_yaml(plugin), LLAMA, ds_file=HF_ZERO2)
    assert fields["recipe"] == "bf16-mixed"  # the file's "auto", filled from mixed_precision
    assert fields["reduce_bucket_size"] == 4096 * 4096


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"fsdp_config__fsdp_version": 1}, "fsdp_config.fsdp_version"),
        (
            {"fsdp_config__fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"},
            "fsdp_config.fsdp_auto_wrap_policy",
        ),
        ({"mixed_precision": "fp8"}, "mixed_precision"),
        ({"distributed_type": "MEGATRON_LM"}, "distributed_type"),
        ({"dynamo_config": {"dynamo_backend": "INDUCTOR"}}, "dynamo_config.dynamo_backend"),
        (
            {"parallelism_config": {"parallelism_config_tp_size": 2}},
            "parallelism_config.parallelism_config_tp_size",
        ),
        ({"num_processes": 0}, "num_processes"),
    ],
)
def test_accelerate_refuses_by_name(changes: dict[str, object], key: str) -> None:
    with pytest.raises(vm.InputError) as err:
        accelerate_fields(_accel(**changes), LLAMA)
    assert str(err.value).startswith(key + ":")


def test_cli_accelerate_with_a_deepspeed_file_beside_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ds.json").write_text(json.dumps(HF_ZERO2))
    (tmp_path / "acc.yaml").write_text(
        "distributed_type: DEEPSPEED\nmixed_precision: bf16\nnum_processes: 4\n"
        "deepspeed_config:\n  deepspeed_config_file: ds.json\n  zero3_init_flag: false\n"
    )
    argv = ["estimate", "llama-7b", "--accelerate", str(tmp_path / "acc.yaml"), "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["engine"] == "deepspeed"
    assert out["setup"]["gpus"] == 4
    assert out["setup"]["reduce_bucket_size"] == 4096 * 4096
    assert main([*argv, "--deepspeed", str(tmp_path / "ds.json")]) == 2
    assert "--accelerate and --torchtitan each name an engine's file" in capsys.readouterr().err
