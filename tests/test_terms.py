"""The table of memory terms and its one composition (vrammath.compose.table, vrammath.estimate)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import sympy

from vrammath.compose.estimate import estimate
from vrammath.compose.rows import GROUPS, STATE_GROUPS, Term
from vrammath.compose.setup import Setup, with_changes
from vrammath.compose.table import TERMS, TERMS_BY_KEY
from vrammath.measure.matrix import ROWS, setup_of, step_counter_bytes
from vrammath.model.params import param_count
from vrammath.model.presets import load_model, raw_config
from vrammath.model.readers import from_hf_config
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import N_d, P

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent / "data" / "golden.json").read_text()
)["matrix"]


def test_the_table_is_well_formed() -> None:
    assert len(TERMS_BY_KEY) == len(TERMS)
    for term in TERMS:
        assert term.group in GROUPS, term.key
        assert term.sharded_from in (None, 1, 2, 3), term.key
        if term.device == "cpu":  # a host row exists only under its offload
            assert term.offload is not None, term.key
    # moments, not tensors a rank holds throughout a phase: they enter the phase model only
    assert [t.key for t in TERMS if not t.listed] == [
        "reduce_buffer",
        "layer_unshard",
        "fsdp2_bottom",
        "fsdp2_reduce",
        "stage3_held_backward",
    ]
    assert {t.key for t in TERMS if t.device == "gpu" and t.group in STATE_GROUPS} == {
        "weights",
        "gradients",
        "ddp_buckets",  # resident gradient buffers (the gradients, as bucket views)
        "main_grads",  # Megatron's resident gradient buffer (the gradients)
        "stage3_grad_partitions",  # DeepSpeed ZeRO-3's resident gradient buffer
        "stage3_ipg_bucket",  # and its reduce bucket, made with the optimizer
        "master",
        "optimizer",
        "quant_constants",
        "adapter_weights",
        "adapter_gradients",
        "adapter_master",
        "adapter_optimizer",
    }


def test_zero_stages_shard_each_state_from_its_row() -> None:
    spec = load_model("llama-7b")
    for stage, sharded in ((0, set()), (1, {"master", "optimizer"}), (3, {"weights"})):
        est = estimate(Setup(spec, zero=stage, gpus=4))
        for key in ("weights", "master", "optimizer"):
            expr = est.component(key).expr
            assert expr is not None
            assert (N_d in expr.free_symbols) == (key in sharded or stage == 3), (stage, key)
    est = estimate(Setup(spec, zero=2, gpus=4))
    assert est.component("gradients").expr == 2 * P / N_d
    assert est.component("step_temporaries").expr == 4 * P / N_d


def test_offload_moves_shards_to_the_host() -> None:
    # ZeRO-Infinity: every state shard on the host, CPU-Adam's fp32 gradient copy beside them
    spec = load_model("llama-7b")
    setup = Setup(spec, zero=3, gpus=8, offload_optimizer=True, offload_params=True)
    est = estimate(setup)
    for key in ("weights", "gradients", "master", "optimizer"):
        assert est.component(key).expr == 0
    host = {"weights": 2, "master": 4, "optimizer": 8, "gradients": 4}
    for key, width in host.items():
        assert est.component("cpu_" + key).expr == width * P / N_d
    assert est.cpu_bytes == (4 + 8 + 4 + 2) * param_count(spec) // 8
    assert est.component("step_temporaries").bytes == 0  # the step runs on the CPU
    assert est.component("gathered").bytes == 2 * 2 * 202383360  # gathered to the GPU anyway


def test_lora_rows_shard_from_their_own_stages() -> None:
    spec = load_model("llama-7b")
    est = estimate(Setup(spec, lora_rank=16, zero=2, gpus=4))
    keys = [c.key for c in est.components]
    assert "gradients" not in keys
    assert "master" not in keys
    assert "adapter_master" not in keys  # fp32 adapters need no master copy
    n_lora = 2 * 32 * 16 * 2 * 4096  # q and v, A and B, 32 layers, r = 16
    assert est.component("adapter_weights").bytes == 4 * n_lora
    assert est.component("adapter_gradients").bytes == 4 * n_lora // 4
    assert est.component("adapter_optimizer").bytes == 8 * n_lora // 4
    assert est.model_state_bytes == 2 * param_count(spec) + 4 * n_lora + 12 * n_lora // 4


def test_korthikanti_rows_have_no_separate_logits() -> None:
    est = estimate(Setup(load_model("gpt2"), activation_model="korthikanti"))
    assert [c.key for c in est.components if c.group == "activations"] == ["activations"]
    hf = estimate(Setup(load_model("gpt2")))
    assert [c.key for c in hf.components if c.group == "activations"] == [
        "activations",
        "logits_loss",
    ]


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_estimate_gives_the_validation_matrix_numbers(row: dict[str, Any]) -> None:
    """estimate() of a matrix row's Setup gives the numbers the matrix compares with torch."""
    golden = GOLDEN[row["id"]]
    setup = setup_of(row, device="cpu")
    est = estimate(setup)
    bytes_ = {c.key: c.bytes or 0 for c in est.components}
    assert bytes_["weights"] + bytes_.get("master", 0) == golden["parameters"]
    assert bytes_["gradients"] == golden["gradients"]
    counters = step_counter_bytes(setup.model, row["optimizer"])  # on the CPU's device
    assert bytes_["optimizer"] + counters == golden["optimizer"]
    assert bytes_["activations"] + bytes_["logits_loss"] == golden["activations"]
    for phase, value in est.phases.items():
        assert value == golden[phase], phase
    assert est.gpu_bytes == golden["peak"]
    assert estimate(with_changes(setup, iteration="first")).gpu_bytes == golden["first_peak"]


def test_gpt2_activation_changes_only_the_mlp() -> None:
    setup = Setup(load_model("gpt2"), micro_batch=1, seq_len=1024)
    tanh_spec = from_hf_config({**raw_config("gpt2"), "activation_function": "gelu_pytorch_tanh"})
    new = estimate(setup).component("activations")
    tanh = estimate(with_changes(setup, model=tanh_spec)).component("activations")
    assert new.bytes is not None
    assert tanh.bytes is not None
    # gelu_new keeps 4 intermediate tensors, PyTorch's fused tanh GeLU 1: 3 x 2 B x s b I, L layers
    assert new.bytes - tanh.bytes == 12 * 3 * 2 * 1024 * 3072
    assert sympy.simplify(new.expr - tanh.expr) != 0


ENGINES: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parent.parent / "validation" / "engines.json").read_text()
)


@pytest.mark.parametrize("loop", ENGINES["loops"], ids=lambda r: r["id"])
def test_keep_outputs_adds_what_the_measured_loops_differ_by(loop: dict[str, Any]) -> None:
    """Keeping the model output moves each phase peak by exactly what the two measured loop
    shapes (loss only / ``out = model(...)``) differ by: bf16 weights, AdamW, sdpa, first and
    steady iterations."""
    from vrammath.measure.build import as_spec

    model = ENGINES["configs"].get(loop["model"], loop["model"])
    spec = as_spec(model)
    assert loop["logits_bytes"] == 2 * loop["batch"] * loop["seq"] * spec.vocab
    for iteration in ("first", "steady"):
        base = Setup(
            spec,
            recipe="bf16-pure",
            micro_batch=loop["batch"],
            seq_len=loop["seq"],
            attention="sdpa",
            device="cpu",
            iteration=iteration,
        )
        loss_only = estimate(base).phases
        kept = estimate(with_changes(base, keep_outputs=True)).phases
        measured = loop["iterations"][iteration]
        for phase in ("forward", "backward", "step"):
            assert (
                kept[f"{phase}_peak"] - loss_only[f"{phase}_peak"]
                == measured[phase]["peak_difference"]
            ), (iteration, phase)


def test_keep_outputs_is_one_listed_term_off_by_default() -> None:
    spec = load_model("qwen2-72b")
    assert "outputs" not in {c.key for c in estimate(Setup(spec)).components}
    est = estimate(Setup(spec, keep_outputs=True, recipe="fp32", seq_len=1024))
    assert est.component("outputs").bytes == 4 * 1024 * 152064 + 4


def test_dim0_shards_hold_what_fsdp2_rank0_holds() -> None:
    """FSDP2 (shard="dim0"): rank 0 holds ceil(dim0 / N) rows of every tensor -- the committed
    ZeRO-3 MQA row measured 79,672 B of fp32 parameters on rank 0 of 8, where P/N gives 79,392."""
    row = next(r for r in ROWS if r["id"] == "small-tied-mqa/b4/s512/fp32/sdpa/rc-none/zero3x8")
    setup = setup_of(row)
    assert setup.shard == "dim0"
    assert estimate(setup).component("weights").bytes == 79672
    assert estimate(with_changes(setup, shard="flat")).component("weights").bytes == 79392
    # a divisible model shards the same either way
    llama = Setup(load_model("llama-7b"), zero=3, gpus=8)
    dim0 = estimate(with_changes(llama, shard="dim0")).model_state_bytes
    assert dim0 == estimate(llama).model_state_bytes


def test_an_opt_in_row_moves_only_the_setups_that_name_it() -> None:
    # a row of 3 bytes a parameter, sharded from ZeRO-3 like the weights
    extra = Term(
        key="extra",
        label="extra",
        device="gpu",
        builder=lambda ctx: 3 * P,
        group="weights",
        live="resident",
        sharded_from=3,
        opt_in=True,
    )
    table = (*TERMS, extra)
    spec = load_model("llama-7b")
    plain = Setup(spec, zero=3, gpus=8)
    assert estimate(plain, terms=table) == estimate(plain)
    named = with_changes(plain, extra_terms=("extra",))
    est = estimate(named, terms=table)
    assert est.component("extra").bytes == -(-3 * param_count(spec) // 8)
    assert est.gpu_bytes - estimate(plain).gpu_bytes == est.component("extra").bytes
    with pytest.raises(InputError, match=r"extra_terms: must name opt-in rows of the table \("):
        estimate(named)
    with pytest.raises(InputError, match="terms: must hold one row per key .got 'extra'"):
        estimate(named, terms=(*table, extra))
    with pytest.raises(InputError, match="extra_terms: must name each row once"):
        with_changes(plain, extra_terms=("extra", "extra"))
