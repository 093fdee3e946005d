"""``--engine fsdp2`` (PyTorch's ``fully_shard`` per decoder layer and on the root, as torchtitan
wraps) and ``--engine accelerate-fsdp2`` (as accelerate 1.15 wraps: layers, the input embedding,
``[final norm, head]`` kept gathered).

Measured: the FSDP2 rows of ``validation/engines.json`` (FSDPMemTracker on 8 fake ranks, three
shapes, ranks 0 and 7) give the states and the gathered bytes each test below checks; every
phase of those rows is compared in ``tests/measure/test_engines.py``.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import vrammath as vm
from vrammath.cli import main
from vrammath.compose.engines import counted_rank
from vrammath.measure.build import as_spec
from vrammath.measure.documents import validation_file
from vrammath.measure.engine_runs import CONFIGS
from vrammath.model.params import param_count
from vrammath.notation.symbols import N_d
from vrammath.terms.parallel import dim0_rank_params, dim0_unit_params
from vrammath.terms.states import state_values

ENGINES_DOC = json.loads(validation_file("engines.json").read_text())
FSDP_ROWS = [
    r
    for r in ENGINES_DOC["rows"]
    if r.get("profile") in ("fsdp2", "accelerate-fsdp2") and "states" in r
]


def _setup(row: dict[str, object], **changes: object) -> vm.Setup:
    spec = (
        as_spec(CONFIGS[str(row["model"])])
        if row["model"] in CONFIGS
        else vm.load_model(str(row["model"]))
    )
    fields: dict[str, object] = {
        "engine": row["profile"],
        "gpus": 8,
        "rank": row["rank"],
        "seq_len": row["seq"],
        "device": "cpu",
        "no_reshard": row.get("reshard") is False,
        "offload_optimizer": bool(row.get("offload")),
        "offload_params": bool(row.get("offload")),
    }
    return vm.Setup(spec, **{**fields, **changes})  # type: ignore[arg-type]


def test_the_rows_cover_three_shapes_two_ranks_both_reshards() -> None:
    seen = {(r["model"], r["rank"], r.get("reshard", True)) for r in FSDP_ROWS}
    assert {m for m, _, _ in seen} >= {"tiny-llama", "tiny-qwen-tied", "tiny-odd-head"}
    assert {k for _, k, _ in seen} == {0, 7}
    assert {x for _, _, x in seen} == {True, False}


@pytest.mark.parametrize("row", FSDP_ROWS, ids=lambda r: str(r["id"]))
def test_states_are_the_measured_bytes(row: dict[str, object]) -> None:
    est = vm.estimate(_setup(row))
    states = row["states"]
    assert isinstance(states, dict)
    if row.get("offload"):  # every shard on the host
        assert est.cpu_bytes == states["parameters"] + states["gradients"] + states["optimizer"]
        return
    assert est.component("optimizer").bytes == states["optimizer"]
    assert est.component("weights").bytes == states["parameters"]
    assert est.component("gradients").bytes == states["gradients"]
    assert "master" not in {c.key for c in est.components}  # the fp32 shard is the master


@pytest.mark.parametrize("row", FSDP_ROWS, ids=lambda r: str(r["id"]))
def test_gathered_bytes_are_the_tracker_s(row: dict[str, object]) -> None:
    """FSDPMemTracker's "Unsharded Param" and "All Gather" at the steady forward peak: the unit
    kept gathered (or everything) and the last all-gather output at the loss on the small
    models; at 7B, where the peak is the top layer's gathering, three layers' bf16 bytes
    beside torchtitan's root."""
    setup = _setup(row)
    est = vm.estimate(setup)
    phases = row["phases"]
    assert isinstance(phases, dict)
    forward = phases["steady"]["forward"]
    gathered = forward["Unsharded Param"] + forward["All Gather"]
    if row["model"] == "llama-7b":  # the top layer's gathering (fsdp2_layer_unshard, unlisted)
        values = {**state_values(setup.model), N_d: 8}
        layer = int(dim0_unit_params(setup.model, "layer").subs(values))
        root = int(dim0_unit_params(setup.model, "root").subs(values))
        assert gathered == 2 * (3 * layer + (root if row["profile"] == "fsdp2" else 0))
        return
    # torchtitan's wrap keeps a layer's output into the backward, accelerate's the tail's
    kept_only = row.get("reshard") is False or row["profile"] == "accelerate-fsdp2"
    key = "all_gather_kept" if kept_only else "all_gather"
    assert est.component("fsdp2_unsharded").bytes == forward["Unsharded Param"]
    assert est.component(key).bytes == forward["All Gather"]
    backward = phases["steady"]["backward"]
    assert backward["All Gather"] == (0 if kept_only else forward["All Gather"])


def test_rank_rows_and_padding_by_hand() -> None:
    # the tied Qwen2: vocabulary 3001 on 8 ranks is 376 rows each, 369 on rank 7
    spec = as_spec(CONFIGS["tiny-qwen-tied"])
    owned = dim0_rank_params(spec, 8)
    assert owned[0] - owned[7] == (376 - 369) * 192
    padded = dim0_unit_params(spec, "root").subs({**state_values(spec), N_d: 8})
    assert padded == 3008 * 192 + 192  # embedding (tied: once) + final norm
    assert counted_rank(vm.Setup(spec, engine="fsdp2", gpus=8)) == (0, owned[0])


@given(st.sampled_from(["tiny-llama", "tiny-qwen-tied", "tiny-odd-head", "gpt2", "llama-7b"]),
       st.integers(min_value=1, max_value=64))  # fmt: skip
def test_rank_rows_properties(name: str, world: int) -> None:
    spec = as_spec(CONFIGS[name]) if name in CONFIGS else vm.load_model(name)
    owned = dim0_rank_params(spec, world)
    assert sum(owned) == param_count(spec)
    assert list(owned) == sorted(owned, reverse=True)  # the padding is on the last ranks
    padded = int(dim0_unit_params(spec, "all").subs({**state_values(spec), N_d: world}))
    assert padded == world * owned[0] >= param_count(spec)


def test_no_reshard_keeps_every_parameter_gathered() -> None:
    spec = vm.load_model("llama-7b")
    on = vm.estimate(vm.Setup(spec, engine="fsdp2", gpus=8, seq_len=2048))
    off = vm.estimate(vm.Setup(spec, engine="fsdp2", gpus=8, seq_len=2048, no_reshard=True))
    assert off.component("fsdp2_unsharded").bytes == 2 * param_count(spec)  # no padding at 8
    assert on.component("fsdp2_unsharded").bytes == 2 * (2 * 32000 * 4096 + 4096)
    assert off.phases["backward_peak"] > on.phases["backward_peak"]
    assert off.phases["step_peak"] == on.phases["step_peak"]  # resharded after backward


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"recipe": "bf16-megatron"}, "recipe"),
        ({"optimizer": "adam8bit"}, "optimizer"),
        ({"implementation": "for-loop"}, "implementation"),
        ({"offload_optimizer": True}, "offload_optimizer"),
        ({"zero": 2}, "zero"),
    ],
)
def test_refused_by_name(changes: dict[str, object], field: str) -> None:
    spec = vm.load_model("llama-7b")
    with pytest.raises(vm.InputError) as err:
        vm.estimate(vm.Setup(spec, engine="fsdp2", gpus=8, **changes))  # type: ignore[arg-type]
    assert str(err.value).startswith(field + ":")


def test_no_reshard_needs_fsdp2() -> None:
    with pytest.raises(vm.InputError, match="^no_reshard: is read only by --engine fsdp2"):
        vm.Setup(vm.load_model("llama-7b"), gpus=8, zero=3, no_reshard=True)


@pytest.mark.parametrize("name", ["gemma-2-9b", "gpt2"])  # tied; GPT-2 has learned positions too
def test_accelerate_wrap_refuses_what_it_does_not_replicate(name: str) -> None:
    with pytest.raises(vm.InputError, match="^model: with --engine accelerate-fsdp2 must be"):
        vm.estimate(vm.Setup(vm.load_model(name), engine="accelerate-fsdp2", gpus=8))


def test_accelerate_keeps_the_tail_not_the_root() -> None:
    spec = vm.load_model("llama-7b")
    titan = vm.estimate(vm.Setup(spec, engine="fsdp2", gpus=8))
    accel = vm.estimate(vm.Setup(spec, engine="accelerate-fsdp2", gpus=8))
    assert accel.component("fsdp2_unsharded").bytes == 2 * (32000 * 4096 + 4096)  # head + norm
    assert titan.component("fsdp2_unsharded").bytes == 2 * (2 * 32000 * 4096 + 4096)
    assert accel.model_state_bytes == titan.model_state_bytes


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-7b", "--engine", "fsdp2", "--gpus", "8", "--rank", "7"]
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rank"]["index"] == 7
    assert out["rank"]["owned_rows_params"] > 0
    assert "FSDP2" in out["engine"]
    assert "reshard_after_forward=True" in out["engine"]
    assert main(["estimate", "llama-7b", "--engine", "fsdp2", "--gpus", "8", "--zero", "2"]) == 2
    assert capsys.readouterr().err.strip().endswith("zero: --engine fsdp2 is ZeRO stage 3 (got 2)")


def test_accelerate_backward_peaks_at_the_second_lowest_layer() -> None:
    """At 7B, accelerate's FSDP2 peaks in the backward of the second-lowest layer: four layers'
    bf16 bytes (its unsharded parameters, the lowest layer's prefetched all-gather, its
    unsharded gradients and their reduce-scatter input) beside every gradient shard but the
    embedding's and the two lowest layers'. The measured snapshot of validation/engines.json
    holds exactly those buffers, and the estimate is within 1 % of its total."""
    row = next(r for r in ENGINES_DOC["rows"] if r["id"] == "accel-fsdp/llama-7b/b1/s512/x8")
    snap = row["phases"]["steady"]["backward"]
    spec = vm.load_model("llama-7b")
    layer_bf16 = snap["Unsharded Param"]
    assert snap["All Gather"] == snap["Reduce Scatter"] == layer_bf16  # one layer each, bf16
    shards_missing = (4 * vm.param_count(spec) // 8) - snap["Sharded Grad"]
    pending = spec.vocab * spec.hidden + 2 * layer_bf16 // 2
    assert abs(shards_missing - 4 * pending // 8) < 1e-3 * shards_missing
    comp = row["components"]["backward_peak"]
    assert comp["pass"]
    assert abs(comp["rel_error"]) < 0.01
