"""``--deepspeed ds_config.json``: a DeepSpeed config read into ``--engine deepspeed``'s fields.

The configs below are the shapes users have: the Hugging Face Trainer's ``"auto"`` template
(transformers' DeepSpeed integration docs, ZeRO-2 section) and the config the measurement harness
hands DeepSpeed (``vrammath.measure.engine_runs.measure_deepspeed``), whose estimate must be the
one the engine rows compare with.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import vrammath as vm
from vrammath.cli import main
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
        ({"zero_optimization": {"stage": 3}}, "zero_optimization.stage"),
        ({"zero_optimization": {"stage": 0}}, "zero_optimization.stage"),
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
