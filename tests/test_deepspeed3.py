"""DeepSpeed ZeRO-3's rules (vrammath.terms.deepspeed3, vrammath.compose.deepspeed3): the
coordinator's replay against what DeepSpeed 0.19.8 kept gathered on the measured rows, the
partition, the config reader's stage-3 keys and the rows an estimate lists."""

from __future__ import annotations

import dataclasses

import pytest

import vrammath as vm
from vrammath.measure.build import as_spec
from vrammath.measure.engine_runs import CONFIGS
from vrammath.terms.deepspeed3 import (
    DEFAULT_STAGE3,
    stage3_gathered,
    stage3_partition,
    stage3_sub_groups,
)

TINY = as_spec(CONFIGS["tiny-llama"])
LLAMA = vm.load_model("llama-7b")


def test_tiny_llama_keeps_every_parameter_gathered_at_the_loss() -> None:
    # measured (validation/engines.json, deepspeed-zero3/tiny-llama): at the steady forward's
    # end 4,259,840 bytes of bf16 parameters beyond the persistent 788,992 -- the whole model
    # is within the default reuse distance, so nothing non-persistent is released
    held = stage3_gathered(TINY, DEFAULT_STAGE3)
    assert (2 * held.persistent, 2 * held.held) == (788_992, 4_259_840)
    assert held.persistent + held.held == vm.param_count(TINY)


def test_a_short_reuse_distance_and_no_prefetch_release_all_but_the_head() -> None:
    knobs = dataclasses.replace(DEFAULT_STAGE3, max_reuse_distance=0, prefetch_bucket_size=0)
    # the head is used again at the very next step of the trace (its backward): the scan
    # stops before it only when the distance is 0 and nothing else is between
    held = stage3_gathered(TINY, knobs)
    assert held.held <= TINY.vocab * TINY.hidden


def test_persistence_threshold_moves_tensors_out_of_the_gathered_set() -> None:
    none = dataclasses.replace(DEFAULT_STAGE3, param_persistence_threshold=0)
    assert stage3_gathered(TINY, none).persistent == 0
    everything = dataclasses.replace(DEFAULT_STAGE3, param_persistence_threshold=10**9)
    assert stage3_gathered(TINY, everything).persistent == vm.param_count(TINY)
    assert stage3_gathered(TINY, everything).held == 0


@pytest.mark.parametrize("world", [1, 3, 8, 64])
def test_partition_pads_each_tensor(world: int) -> None:
    part = stage3_partition(LLAMA, world)
    assert part * world >= vm.param_count(LLAMA)
    assert part * world - vm.param_count(LLAMA) < 291 * world  # under one row per tensor


def test_sub_groups_cover_the_partition() -> None:
    groups = stage3_sub_groups(LLAMA, 1, 10**9)
    assert sum(groups) == vm.param_count(LLAMA)
    assert len(groups) == 7
    assert max(groups) < 10**9 + 131_072_000


def test_estimate_lists_stage3_rows_and_no_stage12_rows() -> None:
    est = vm.estimate(vm.Setup(LLAMA, engine="deepspeed", zero=3, gpus=8, seq_len=512))
    keys = {c.key for c in est.components}
    assert {"stage3_grad_partitions", "stage3_ipg_bucket", "stage3_held", "stage3_step"} <= keys
    assert not keys & {"gradients", "reduce_bucket", "deepspeed_epilogue", "gathered"}
    part = stage3_partition(LLAMA, 8)
    assert est.component("weights").bytes == 2 * part
    assert est.component("optimizer").bytes == 8 * part
    assert est.component("stage3_ipg_bucket").bytes == 2 * 500_000_000
    first = vm.estimate(
        vm.Setup(LLAMA, engine="deepspeed", zero=3, gpus=8, seq_len=512, iteration="first")
    )
    assert "stage3_held" not in {c.key for c in first.components}


def test_config_auto_fills_stage3_keys_from_the_hidden_size() -> None:
    fields, said = vm.deepspeed_fields(
        {
            "zero_optimization": {
                "stage": 3,
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
                "stage3_max_live_parameters": 1e8,
            },
            "bf16": {"enabled": True},
        },
        LLAMA,
    )
    assert said == []
    knobs = fields["stage3"]
    assert knobs == dataclasses.replace(
        DEFAULT_STAGE3,
        prefetch_bucket_size=int(0.9 * 4096 * 4096),
        param_persistence_threshold=40_960,
        max_live_parameters=10**8,
    )
    est = vm.estimate(vm.Setup(LLAMA, gpus=8, **fields))  # type: ignore[arg-type]
    default = vm.estimate(vm.Setup(LLAMA, gpus=8, engine="deepspeed", zero=3, recipe="bf16-mixed"))
    # fewer live parameters: the prefetcher stops earlier (its bucket is per fetch, so at the
    # defaults the gathered set grows to max_live_parameters)
    assert est.component("stage3_held").bytes < default.component("stage3_held").bytes


def test_offloaded_optimizer_moves_eighteen_bytes_per_partition_element_to_the_host() -> None:
    fields, said = vm.deepspeed_fields(
        {
            "zero_optimization": {
                "stage": 3,
                "offload_optimizer": {"device": "cpu", "pin_memory": True},
            },
            "bf16": {"enabled": True},
        },
        LLAMA,
    )
    assert said == []
    assert fields["offload_optimizer"] is True
    est = vm.estimate(vm.Setup(LLAMA, gpus=8, seq_len=512, **fields))  # type: ignore[arg-type]
    part = stage3_partition(LLAMA, 8)
    # fp32 master 4, AdamW 8, CPU Adam's fp32 gradient 4, the 16-bit gradient partitions 2
    assert est.cpu_bytes == 18 * part
    keys = {c.key for c in est.components if c.bytes}
    assert "stage3_step" not in keys  # the step runs on the host
    assert "stage3_grad_partitions" not in keys
    on = vm.estimate(vm.Setup(LLAMA, gpus=8, seq_len=512, engine="deepspeed", zero=3))
    assert on.phases["forward_peak"] - est.phases["forward_peak"] == 14 * part


def test_the_trainers_zero3_template_reads_whole() -> None:
    # transformers' DeepSpeed docs, the ZeRO-3 example: both offloads, overlap_comm (side
    # streams at stage 3, no second bucket), every gathering key "auto" or set
    template = {
        "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto"}},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True,
            "contiguous_gradients": True,
            "sub_group_size": 1e9,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "gradient_clipping": "auto",
        "train_micro_batch_size_per_gpu": "auto",
    }
    fields, said = vm.deepspeed_fields(template, LLAMA)
    assert len(said) == 1  # DeepSpeed's AdamW is its FusedAdam (on the host here: CPU Adam)
    assert said[0].startswith("optimizer.type AdamW: DeepSpeed's FusedAdam")
    assert fields["offload_optimizer"] is fields["offload_params"] is True
    assert fields["reduce_bucket_size"] == 4096 * 4096
    est = vm.estimate(vm.Setup(LLAMA, gpus=8, recipe="bf16-mixed", **fields))  # type: ignore[arg-type]
    part = stage3_partition(LLAMA, 8)
    assert est.cpu_bytes == 20 * part  # the 16-bit partitions on the host too
    with pytest.raises(vm.InputError, match=r"^zero_optimization\.overlap_comm: "):
        vm.deepspeed_fields({"zero_optimization": {"stage": 2, "overlap_comm": True}}, LLAMA)


def test_rank_is_refused_where_every_rank_holds_the_same() -> None:
    with pytest.raises(vm.InputError, match="^rank: is not read at DeepSpeed's stage 3"):
        vm.Setup(LLAMA, engine="deepspeed", zero=3, gpus=8, rank=7)


def test_korthikantis_activations_keep_the_gathered_parameters() -> None:
    # under the published activation formula every resident row and the parameters gathered
    # at the loss stand at the forward's end (a row the phase model dropped would be a silent
    # underestimate)
    est = vm.estimate(
        vm.Setup(
            LLAMA, engine="deepspeed", zero=3, gpus=8, seq_len=512, activation_model="korthikanti"
        )
    )
    at_loss = sum(
        c.bytes
        for c in est.components
        if c.device == "gpu" and c.group in ("weights", "optimizer", "activations", "in-flight")
    )
    assert est.component("stage3_held").bytes > 0
    assert est.phases["forward_peak"] == at_loss
