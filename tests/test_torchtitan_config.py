"""``--torchtitan job.toml``: torchtitan's job file (its last TOML release's keys and defaults)
read into an FSDP2 setup; what changes memory and is not modelled is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

import vrammath as vm
from vrammath.cli import main

LLAMA = vm.load_model("llama-7b")

# torchtitan's train_configs/llama3_8b.toml, as shipped before its configs became Python
# functions, with full checkpointing (its own file asks for selective, which is refused)
LLAMA3_8B = """
[job]
dump_folder = "./outputs"
description = "Llama 3 8B training"

[model]
name = "llama3"
flavor = "8B"
hf_assets_path = "./assets/hf/Llama-3.1-8B"

[optimizer]
name = "AdamW"
lr = 3e-4
eps = 1e-8

[lr_scheduler]
warmup_steps = 200

[training]
local_batch_size = 1
seq_len = 8192
max_norm = 1.0
steps = 1000
dataset = "c4"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = -1
tensor_parallel_degree = 1
pipeline_parallel_degree = 1
context_parallel_degree = 1

[checkpoint]
enable = false
folder = "checkpoint"
interval = 500
async_mode = "disabled"

[compile]
enable = false
components = ["model", "loss"]

[activation_checkpoint]
mode = "full"

[float8]
enable_fsdp_float8_all_gather = false
filter_fqns = ["output"]
"""


def _fields(text: str) -> tuple[dict[str, object], list[str]]:
    import tomllib

    return vm.torchtitan_fields(tomllib.loads(text), LLAMA)


def test_the_8b_job_file_is_fsdp2_with_its_batch_and_fused_adamw() -> None:
    fields, said = _fields(LLAMA3_8B)
    assert said == []
    assert fields == {
        "engine": "fsdp2",
        "recipe": "bf16-mixed",
        "micro_batch": 1,
        "seq_len": 8192,
        "recompute": "full",
        "optimizer": "adamw",
        "implementation": "fused",
    }


def test_left_out_keys_take_torchtitans_defaults() -> None:
    fields, _ = _fields('[activation_checkpoint]\nmode = "none"\n')
    assert (fields["micro_batch"], fields["seq_len"]) == (8, 2048)
    assert fields["implementation"] == "fused"
    # its default checkpointing is selective: refused until op-level checkpointing is modelled
    with pytest.raises(vm.InputError, match=r"^activation_checkpoint\.mode: "):
        _fields("[training]\nseq_len = 4096\n")


@pytest.mark.parametrize(
    ("extra", "fields"),
    [
        ('[parallelism]\nfsdp_reshard_after_forward = "never"\n', {"no_reshard": True}),
        ("[training]\nenable_cpu_offload = true\n", {"offload_params": True}),
        ('[training]\ndtype = "bfloat16"\n', {"recipe": "bf16-pure"}),
        ('[training]\nmixed_precision_param = "float32"\n', {"recipe": "fp32"}),
        ("[parallelism]\ndata_parallel_shard_degree = 16\n", {"gpus": 16}),
        ('[optimizer]\nimplementation = "foreach"\n', {"implementation": "foreach"}),
    ],
)
def test_modelled_keys_set_their_fields(extra: str, fields: dict[str, object]) -> None:
    got, _ = _fields('[activation_checkpoint]\nmode = "none"\n' + extra)
    assert fields.items() <= got.items()


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ("[parallelism]\ntensor_parallel_degree = 2\n", "parallelism.tensor_parallel_degree"),
        ("[parallelism]\ncontext_parallel_degree = 2\n", "parallelism.context_parallel_degree"),
        ("[compile]\nenable = true\n", "compile.enable"),
        ('[model]\nconverters = ["float8"]\n', "model.converters"),
        ('[checkpoint]\nasync_mode = "async_with_pinned_mem"\n', "checkpoint.async_mode"),
        ('[training]\nmixed_precision_reduce = "bfloat16"\n', "training.mixed_precision_reduce"),
        ('[optimizer]\nname = "Muon"\n', "optimizer.name"),
        ("[training]\nlocal_batch_size = 0\n", "training.local_batch_size"),
    ],
)
def test_memory_keys_not_modelled_are_refused_by_name(extra: str, key: str) -> None:
    with pytest.raises(vm.InputError, match=f"^{key}: "):
        _fields('[activation_checkpoint]\nmode = "none"\n' + extra)


def test_unknown_keys_warn_one_line_each() -> None:
    _, said = _fields('[activation_checkpoint]\nmode = "none"\n[training]\nfancy = 1\n')
    assert said == ["training.fancy: not a key vrammath knows; not read"]


def test_cli_reads_the_file_and_refuses_bad_toml(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "llama3_8b.toml"
    job.write_text(LLAMA3_8B, encoding="utf-8")
    assert main(["estimate", "llama-7b", "--torchtitan", str(job), "--gpus", "8"]) == 0
    out = capsys.readouterr().out
    assert "FSDP2 (fully_shard per decoder layer and the root" in out
    assert "micro-batch 1 x 8192 tokens" in out
    bad = tmp_path / "bad.toml"
    bad.write_text("[training\n", encoding="utf-8")
    assert main(["estimate", "llama-7b", "--torchtitan", str(bad)]) == 2
    assert capsys.readouterr().err.startswith("vrammath: error: torchtitan: bad.toml is not TOML")
