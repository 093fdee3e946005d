"""The engines' own rules: ``--engine zero1-torch`` (PyTorch's ZeroRedundancyOptimizer, per
rank) and ``--engine ddp`` (DistributedDataParallel's gradient buckets).

Measured: the partitions below are what ``ZeroRedundancyOptimizer._partition_parameters``
returned on 8 fake ranks (``validation/engines.json``, field ``zro_partition_numel``); the DDP
rows of the same file are compared phase by phase in ``tests/measure/test_engines.py``.
"""

from __future__ import annotations

import json

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

import vrammath as vm
from vrammath.answers.budget import budget
from vrammath.answers.fit import fewest_gpus
from vrammath.answers.plan import candidates
from vrammath.answers.sweep import sensitivities, sweep
from vrammath.cli import main
from vrammath.compose.engines import counted_rank
from vrammath.compose.setup import setup_warnings
from vrammath.measure.build import as_spec
from vrammath.measure.documents import validation_file
from vrammath.measure.engine_runs import CONFIGS
from vrammath.notation.symbols import P_r
from vrammath.terms.parallel import (
    flat_kept_gradients,
    flat_rank_slices,
    module_order_numels,
    tensor_numels,
    zro_partition,
)

ENGINES_DOC = json.loads(validation_file("engines.json").read_text())


def _spec(name: str) -> vm.ModelSpec:
    return as_spec(CONFIGS[name]) if name in CONFIGS else vm.load_model(name)


@pytest.mark.parametrize(
    "row",
    [r for r in ENGINES_DOC["rows"] if r.get("zro_partition_numel")],
    ids=lambda r: r["id"],
)
def test_partition_is_the_measured_one(row: dict[str, object]) -> None:
    spec = _spec(str(row["model"]))
    assert (
        list(zro_partition(tensor_numels(spec), int(str(row["ranks"]))))
        == row["zro_partition_numel"]
    )


@given(
    st.lists(st.integers(min_value=1, max_value=10**6), min_size=1, max_size=60),
    st.integers(min_value=1, max_value=16),
)
def test_partition_properties(numels: list[int], world: int) -> None:
    sizes = zro_partition(numels, world)
    assert len(sizes) == world
    assert sum(sizes) == sum(numels)
    # greedy, largest first: no rank exceeds the least loaded one by more than one tensor
    assert max(sizes) - min(sizes) <= max(numels)
    assert max(sizes) >= -(-sum(numels) // world)


def test_rows_it_splits_and_rows_it_keeps() -> None:
    spec = vm.load_model("llama-7b")
    est = vm.estimate(vm.Setup(spec, engine="zero1-torch", gpus=8, seq_len=512))
    rank, owned = counted_rank(est.setup)
    assert (rank, owned) == (0, 850395136)
    parts = {c.key: c for c in est.components}
    assert parts["optimizer"].expr == 8 * P_r
    assert parts["optimizer"].bytes == 8 * owned
    assert parts["step_temporaries"].expr == 4 * P_r
    psi = vm.param_count(spec)
    # every rank keeps all weights, gradients and fp32 masters (the parameters it updates)
    assert parts["weights"].bytes == 2 * psi
    assert parts["gradients"].bytes == 2 * psi
    assert parts["master"].bytes == 4 * psi


def test_the_last_rank_and_the_shorthand() -> None:
    spec = vm.load_model("llama-7b")
    last = vm.Setup(spec, engine="zero1-torch", gpus=8, rank=7)
    assert last.zero == 1
    assert counted_rank(last) == (7, 843055104)
    flat = vm.estimate(vm.Setup(spec, zero=1, gpus=8)).component("optimizer").bytes
    assert flat == 8 * -(-vm.param_count(spec) // 8)  # --zero 1 alone: the flat partition


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"zero": 2}, "zero"),
        ({"optimizer": "adafactor"}, "optimizer"),
        ({"implementation": "for-loop"}, "implementation"),
        ({"lora_rank": 8}, "lora_rank"),
        ({"tp": 2}, "tp/pp"),
        ({"rank": 8}, "rank"),
    ],
)
def test_refused_by_name(changes: dict[str, object], field: str) -> None:
    with pytest.raises(vm.InputError, match=f"^{field}: "):
        vm.estimate(vm.Setup(vm.load_model("llama-7b"), engine="zero1-torch", gpus=8, **changes))


def test_rank_is_read_only_where_ranks_differ() -> None:
    with pytest.raises(vm.InputError, match="^rank: is read only"):
        vm.Setup(vm.load_model("llama-7b"), zero=1, gpus=8, rank=1)


def test_fewest_gpus_searches_the_partition() -> None:
    setup = vm.Setup(vm.load_model("llama-7b"), recipe="fp32", engine="zero1-torch", gpus=8)
    sol = fewest_gpus(vm.estimate(setup), budget("A100-80GB"))
    assert sol.value is not None
    assert sol.method == "search"

    def at(n: int) -> int:
        return vm.estimate(
            vm.Setup(setup.model, recipe="fp32", engine="zero1-torch", gpus=n)
        ).gpu_bytes

    assert at(sol.value) == sol.bytes <= sol.limit < at(sol.value - 1) == sol.neighbour_bytes


def test_sweeps_refuse_the_gpu_count() -> None:
    est = vm.estimate(vm.Setup(vm.load_model("llama-7b"), engine="zero1-torch", gpus=8))
    assert sympy.Symbol("N_d", positive=True, integer=True) not in {
        x.knob for x in sensitivities(est)
    }
    with pytest.raises(vm.InputError, match="^knobs: N_d cannot vary"):
        sensitivities(est, ["N_d"])
    with pytest.raises(vm.InputError, match="^axes: N_d cannot vary"):
        sweep(est, {"N_d": [2, 4]})


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-7b", "--engine", "zero1-torch", "--gpus", "8"]
    assert main([*args, "--rank", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rank"] == {"index": 3, "of": 8, "busiest": False, "optimizer_params": 837877760}
    assert main(args) == 0
    assert "rank 0 of 8 (the busiest)" in capsys.readouterr().out
    assert main([*args, "--offload-optimizer"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("vrammath: error: offload_optimizer:")
    assert main(["estimate", "llama-7b", "--engine", "fsdp9"]) == 2
    assert "must be one of hf, zero1-torch, ddp, megatron, deepspeed" in capsys.readouterr().err


def test_ddp_buckets_are_resident_gradients() -> None:
    spec = vm.load_model("llama-7b")
    plain = vm.estimate(vm.Setup(spec, seq_len=1024))
    ddp = vm.estimate(vm.Setup(spec, engine="ddp", gpus=8, seq_len=1024))
    view = vm.estimate(vm.Setup(spec, engine="ddp", gpus=8, seq_len=1024, bucket_view=True))
    grads = 2 * vm.param_count(spec)  # bf16 gradients
    assert ddp.component("ddp_buckets").bytes == grads
    # the buckets are there in every phase, also before the first backward
    assert {k: v - plain.phases[k] for k, v in ddp.phases.items()} == dict.fromkeys(
        plain.phases, grads
    )
    # as bucket views the gradients are the buckets: no gradients row; in the step the fp32
    # master gradients stand beside the buckets, where the plain loop frees its bf16 ones
    assert "gradients" not in {c.key for c in view.components}
    assert view.phases["step_peak"] - plain.phases["step_peak"] == grads
    assert view.phases["forward_peak"] == ddp.phases["forward_peak"]


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"zero": 3}, "zero"),
        ({"recipe": "bf16-megatron"}, "recipe"),
        ({"lora_rank": 8}, "lora_rank"),
    ],
)
def test_ddp_refusals(changes: dict[str, object], field: str) -> None:
    with pytest.raises(vm.InputError, match=f"^{field}: "):
        vm.estimate(vm.Setup(vm.load_model("llama-7b"), engine="ddp", gpus=8, **changes))


def test_bucket_view_needs_ddp() -> None:
    with pytest.raises(vm.InputError, match="^bucket_view: is read only by --engine ddp"):
        vm.Setup(vm.load_model("llama-7b"), bucket_view=True)


def test_plans_keep_the_engine_stage_once() -> None:
    tried = candidates(vm.Setup(vm.load_model("llama-7b"), engine="zero1-torch", gpus=8))
    assert {c.zero for c in tried} == {1}
    assert len(tried) == len({(c.recompute, c.offload_optimizer) for c in tried})


def test_megatron_grad_buffer_is_resident() -> None:
    spec = vm.load_model("llama-7b")
    p = vm.param_count(spec)
    plain = vm.estimate(vm.Setup(spec, recipe="bf16-megatron", seq_len=1024))
    fp32 = vm.estimate(vm.Setup(spec, recipe="bf16-megatron", engine="megatron", seq_len=1024))
    # the same 18 bytes/param; the 4 of the gradients are the buffer, kept from construction
    assert fp32.model_state_bytes == plain.model_state_bytes == 18 * p
    assert fp32.component("main_grads").bytes == 4 * p
    assert "gradients" not in {c.key for c in fp32.components}
    assert fp32.phases["step_peak"] == plain.phases["step_peak"]  # .float() is an alias
    assert fp32.phases["forward_peak"] - plain.phases["forward_peak"] == 4 * p
    # --grad-reduce-in-bf16: a 2-byte buffer, and the step's fp32 copies of it beside it
    bf16 = vm.estimate(vm.Setup(spec, recipe="bf16-mixed", engine="megatron", seq_len=1024))
    mixed = vm.estimate(vm.Setup(spec, recipe="bf16-mixed", seq_len=1024))
    assert bf16.component("main_grads").bytes == 2 * p
    # both copy to fp32 in the step; the plain loop frees its 2 bytes, the buffer stays
    assert bf16.phases["step_peak"] - mixed.phases["step_peak"] == 2 * p
    assert bf16.phases["forward_peak"] - mixed.phases["forward_peak"] == 2 * p


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"zero": 1}, "zero"),
        ({"recipe": "bf16-pure"}, "recipe"),
        ({"optimizer": "adam8bit"}, "optimizer"),
        ({"offload_optimizer": True}, "offload_optimizer"),
        ({"tp": 2}, "tp/pp"),
    ],
)
def test_megatron_refusals(changes: dict[str, object], field: str) -> None:
    with pytest.raises(vm.InputError, match=f"^{field}: "):
        vm.estimate(vm.Setup(vm.load_model("llama-7b"), engine="megatron", gpus=8, **changes))


def test_deepspeed_keeps_whole_gradients_of_its_range() -> None:
    # tiny-llama: P = 2,524,416 on 8 ranks, 315,552 each; the embedding (2048 x 256 = 524,288)
    # spans ranks 0 and 1, lm_head the last two: those ranks keep a whole 524,288-element tensor
    spec = _spec("tiny-llama")
    kept = flat_kept_gradients(module_order_numels(spec), 8)
    assert kept[0] == kept[7] == 524_288
    for row in ENGINES_DOC["rows"]:  # the measured rows: 2 bytes a kept element
        if row["engine"].startswith("deepspeed-zero") and row["zero"] in (1, 2):
            spec = _spec(row["model"])
            setup = vm.Setup(spec, engine="deepspeed", zero=row["zero"], gpus=8, rank=row["rank"])
            assert 2 * counted_rank(setup)[1] == row["states"]["gradients"], row["id"]


@given(
    st.lists(st.integers(min_value=1, max_value=10**5), min_size=1, max_size=40),
    st.integers(min_value=1, max_value=16),
)
def test_flat_slices_properties(numels: list[int], world: int) -> None:
    slices = flat_rank_slices(numels, world)
    # every element is inside exactly one range; the ranges are equal, the padding at the end
    total, size = sum(numels), -(-sum(numels) // (2 * world)) * 2
    assert sum(inside for mine in slices for _, inside in mine) == total
    for r, mine in enumerate(slices):
        assert sum(i for _, i in mine) == max(0, min(size, total - r * size))
    kept = flat_kept_gradients(numels, world)
    assert all(k >= sum(i for _, i in mine) for k, mine in zip(kept, slices, strict=True))


def test_deepspeed_step_and_bucket() -> None:
    spec = vm.load_model("llama-7b")
    base = {"zero": 2, "gpus": 4, "seq_len": 512}
    est = vm.estimate(vm.Setup(spec, engine="deepspeed", **base))
    # the 7B page's ZeRO-2 on 4 GPUs, under DeepSpeed: 5e8 bf16 elements of reduce bucket
    assert est.component("reduce_bucket").bytes == 10**9
    # 6,738,415,616 parameters > 5e8: the bucket fills and is flushed from a flat copy mid-
    # backward; the epilogue's last flush copies the remainder, 238,415,616, beside the kept
    kept_bytes = 2 * counted_rank(est.setup)[1]
    assert est.component("bucket_flush").bytes == 10**9
    assert est.component("deepspeed_epilogue").bytes == kept_bytes + 2 * 238_415_616
    smaller = vm.estimate(vm.Setup(spec, engine="deepspeed", reduce_bucket_size=10**6, **base))
    assert smaller.component("reduce_bucket").bytes == smaller.component("bucket_flush").bytes
    assert smaller.component("bucket_flush").bytes == 2 * 10**6
    assert smaller.phases["backward_peak"] < est.phases["backward_peak"]
    # ZeRO-1 keeps every 16-bit .grad until the epilogue; after its first flush the kept
    # gradients are made beside the 2 (P - B) still waiting
    z1 = vm.estimate(vm.Setup(spec, engine="deepspeed", **(base | {"zero": 1})))
    kept1 = 2 * counted_rank(z1.setup)[1]
    waiting = 2 * (6_738_415_616 - 5 * 10**8)
    assert z1.component("deepspeed_epilogue").bytes == max(2 * 6_738_415_616, waiting + kept1)
    assert "bucket_flush" not in {c.key for c in z1.components}
    # the step: fp32 gradient partition (4 ps) + foreach AdamW's (4 ps), the kept grads freed
    ps = 6_738_415_616 // 4
    kept = counted_rank(est.setup)[1]
    step = est.component("deepspeed_step").bytes
    assert step == max(8 * ps - 2 * kept, 6 * ps)
    assert est.phases["step_peak"] == 2 * 6_738_415_616 + 12 * ps + 2 * kept + step


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"zero": 0}, "zero"),
        ({"zero": 3, "model": "gpt2"}, "model"),  # learned positions: its trace is not modelled
        ({"recipe": "fp32"}, "recipe"),
        ({"optimizer": "adafactor"}, "optimizer"),
        ({"offload_optimizer": True}, "offload_optimizer"),
        ({"shard": "dim0"}, "shard"),
        ({"tp": 2}, "tp/pp"),
    ],
)
def test_deepspeed_refusals(changes: dict[str, object], field: str) -> None:
    setup = {"engine": "deepspeed", "gpus": 8, "zero": 2} | changes
    model = vm.load_model(str(setup.pop("model", "llama-7b")))
    with pytest.raises(vm.InputError, match=f"^{field}: "):
        vm.estimate(vm.Setup(model, **setup))


def test_reduce_bucket_size_needs_deepspeed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(vm.InputError, match="^reduce_bucket_size: is read only by --engine"):
        vm.Setup(vm.load_model("llama-7b"), zero=2, gpus=8, reduce_bucket_size=10**6)
    args = ["estimate", "llama-7b", "--engine", "deepspeed", "--zero", "2", "--gpus", "4"]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rank"]["index"] == 1
    assert data["rank"]["busiest"]
    assert (
        data["rank"]["gradient_params"]
        == counted_rank(vm.Setup(vm.load_model("llama-7b"), engine="deepspeed", zero=2, gpus=4))[1]
    )
    setup = vm.Setup(vm.load_model("llama-7b"), engine="deepspeed", zero=2, gpus=8)
    sol = fewest_gpus(vm.estimate(setup), budget("A100-80GB"))
    assert sol.method == "search"
    assert sol.value is not None


def test_deepspeed_fp16_follows_bf16_with_a_warning() -> None:
    spec = vm.load_model("llama-7b")
    setups = [
        vm.Setup(spec, recipe=r, engine="deepspeed", zero=2, gpus=4)
        for r in ("bf16-mixed", "fp16-mixed")
    ]
    bf16, fp16 = (vm.estimate(x) for x in setups)
    assert bf16.phases == fp16.phases
    assert setup_warnings(setups[1]) == (
        "--engine deepspeed: fp16-mixed follows its bf16 rules, not measured in fp16",
    )
    assert setup_warnings(setups[0]) == ()


def test_deepspeed_fewest_gpus_goes_past_one_rank_per_tensor() -> None:
    # LLaMA-7B has 291 tensors; under DeepSpeed the flat partition still shrinks past 291 ranks
    setup = vm.Setup(vm.load_model("llama-7b"), engine="deepspeed", zero=2, gpus=8, seq_len=512)

    def at(n: int) -> int:
        return vm.estimate(
            vm.Setup(setup.model, engine="deepspeed", zero=2, gpus=n, seq_len=512)
        ).gpu_bytes

    limit = (at(512) + at(1024)) // 2
    assert at(512) > limit >= at(1024)
    sol = fewest_gpus(vm.estimate(setup), vm.Budget(limit, reserve_bytes=0))
    assert sol.value is not None
    assert 512 < sol.value <= 1024
    assert at(sol.value) <= limit < at(sol.value - 1)


@pytest.mark.parametrize(
    ("changes", "name"),
    [
        ({}, "the plain loop on one GPU"),
        ({"gpus": 8}, "the plain loop on each GPU"),
        ({"gpus": 8, "zero": 3}, "ZeRO-3 as a flat partition (the plain loop)"),
        (
            {"gpus": 8, "zero": 3, "shard": "dim0"},
            "ZeRO-3 as FSDP2's dim-0 shards (the plain loop)",
        ),
        ({"gpus": 8, "tp": 2, "pp": 4}, "Megatron's TP 2 x PP 4"),
        ({"gpus": 8, "engine": "deepspeed", "zero": 1}, "DeepSpeed ZeRO-1"),
        ({"gpus": 8, "engine": "ddp"}, "DistributedDataParallel"),
    ],
)
def test_engine_name_says_which_rules_a_verdict_assumes(
    changes: dict[str, object], name: str
) -> None:
    assert vm.engine_name(vm.Setup(vm.load_model("llama-7b"), **changes)) == name
