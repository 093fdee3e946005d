"""LoRA / QLoRA: exact trainable counts, the papers' numbers, estimate wiring, measured rows."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, cast

import pytest
import sympy
from hypothesis import given
from hypothesis import strategies as st

from vrammath.answers.claims import lora_gpt3_claims, qlora_65b_claims
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.model.params import param_count, size_values
from vrammath.model.presets import load_model, raw_config
from vrammath.model.readers import from_hf_config
from vrammath.notation.errors import InputError
from vrammath.notation.symbols import b, r, s
from vrammath.terms.lora.adapters import (
    lora_activation_layer_expr,
    lora_param_count,
    lora_state_exprs,
)
from vrammath.terms.lora.linears import adapted_linears, allowed_targets
from vrammath.terms.lora.quant import (
    frozen_base_exprs,
    nf4_published_bits_per_param,
    quantized_tensors,
)
from vrammath.terms.lora.targets import LORA_TARGETS, lora_targets
from vrammath.terms.states import state_values

VALIDATION = Path(__file__).resolve().parents[1] / "validation" / "lora_kv.json"


def by_hand(
    h: int,
    inter: int,
    layers: int,
    heads: int,
    kv: int,
    d: int,
    rank: int,
    targets: tuple[str, ...],
) -> int:
    sizes = {
        "q": h + heads * d,
        "k": h + kv * d,
        "v": h + kv * d,
        "o": heads * d + h,
        "gate": h + inter,
        "up": h + inter,
        "down": inter + h,
    }
    return layers * rank * sum(sizes[t] for t in targets)


# LLaMA-7B: the numbers peft prints ("trainable params: 4,194,304" for r=8 on q,v).
@pytest.mark.parametrize(
    ("rank", "targets", "expected"),
    [
        (8, "q,v", 4_194_304),
        (16, "q,v", 8_388_608),
        (8, "all-linear", 19_988_480),
        (16, "all-linear", 39_976_960),
        (64, "all-linear", 159_907_840),
    ],
)
def test_llama7b_trainable(rank: int, targets: str, expected: int) -> None:
    spec = load_model("llama-7b")
    assert lora_param_count(spec, rank, targets) == expected
    names = LORA_TARGETS if targets == "all-linear" else lora_targets(targets)
    assert expected == by_hand(4096, 11008, 32, 32, 32, 128, rank, names)


@pytest.mark.parametrize(
    ("model", "rank", "targets", "expected"),
    [
        ("llama-2-70b", 8, "q,k,v", 22_282_240),  # GQA: k, v are 8 x 128 = 1024 wide
        ("qwen2-7b", 8, "q,k,v", 3_440_640),
        ("qwen2-72b", 16, "all-linear", 210_534_400),
        ("mistral-7b", 16, "q,v", 6_815_744),
    ],
)
def test_gqa_trainable(model: str, rank: int, targets: str, expected: int) -> None:
    spec = load_model(model)
    assert lora_param_count(spec, rank, targets) == expected
    assert expected == by_hand(
        spec.hidden,
        spec.intermediate,
        spec.layers,
        spec.heads,
        spec.kv_heads,
        spec.head_dim,
        rank,
        LORA_TARGETS if targets == "all-linear" else lora_targets(targets),
    )


@given(
    st.sampled_from(["llama-7b", "qwen2-7b", "llama-2-70b"]),
    st.integers(1, 512),
    st.sets(st.sampled_from(LORA_TARGETS), min_size=1),
)
def test_count_is_linear_and_additive(model: str, rank: int, targets: set[str]) -> None:
    spec = load_model(model)
    total = lora_param_count(spec, rank, tuple(targets))
    assert total == rank * lora_param_count(spec, 1, tuple(targets))
    assert total == sum(lora_param_count(spec, rank, (t,)) for t in targets)


def test_targets_parse_and_refuse() -> None:
    assert lora_targets(["v_proj", "q"]) == ("q", "v")
    assert lora_targets("mlp,attention") == ("attention", "mlp")
    llama = load_model("llama-7b")
    assert [m.target for m in adapted_linears(llama, "attention,mlp")] == list(LORA_TARGETS)
    with pytest.raises(InputError, match="^lora_targets: must be one of"):
        lora_targets("q,zz")
    gpt2_allowed = "qkv, o, up, down, c_attn, c_proj, c_fc, all-linear, attention, mlp for gpt2"
    for missing in ("gate", "q"):  # GPT-2 fuses q, k, v in c_attn and has no gate
        with pytest.raises(InputError) as info:
            lora_param_count(load_model("gpt2"), 4, missing)
        assert str(info.value) == f"lora_targets: must be one of {gpt2_allowed} (got '{missing}')"
    with pytest.raises(InputError, match="^lora_rank: must be a positive integer"):
        lora_param_count(load_model("gpt2"), 0, "qkv")


@pytest.mark.parametrize(
    ("model", "targets", "modules"),
    [
        ("gpt2", "all-linear", ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]),
        ("gpt2", "c_proj", ["attn.c_proj", "mlp.c_proj"]),  # peft matches both
        ("gpt2", "qkv,down", ["attn.c_attn", "mlp.c_proj"]),
        (
            "gpt-neox-20b",
            "mlp,query_key_value",
            ["attention.query_key_value", "mlp.dense_h_to_4h", "mlp.dense_4h_to_h"],
        ),
        ("gpt-neox-20b", "o", ["attention.dense"]),
        (
            "phi-3-mini",
            "all-linear",
            [
                "self_attn.qkv_proj",
                "self_attn.o_proj",
                "mlp.gate_up_proj",
                "mlp.down_proj",
            ],
        ),
        ("phi-3-mini", "gate_up_proj", ["mlp.gate_up_proj"]),
        ("starcoder2-15b", "c_proj,q", ["self_attn.q_proj", "mlp.c_proj"]),
        ("starcoder2-15b", "mlp", ["mlp.c_fc", "mlp.c_proj"]),
    ],
)
def test_targets_per_architecture(model: str, targets: str, modules: list[str]) -> None:
    assert [m.module for m in adapted_linears(load_model(model), targets)] == modules


@pytest.mark.parametrize(
    ("model", "missing"),
    [
        ("phi-3-mini", "q"),
        ("phi-3-mini", "up"),
        ("gpt-neox-20b", "k"),
        ("starcoder2-15b", "gate"),
        ("llama-7b", "qkv"),
        ("llama-7b", "c_attn"),
        ("starcoder2-15b", "gate_up"),
    ],
)
def test_targets_an_architecture_lacks_are_refused(model: str, missing: str) -> None:
    spec = load_model(model)
    with pytest.raises(InputError) as info:
        adapted_linears(spec, missing)
    allowed = ", ".join(allowed_targets(spec))
    assert str(info.value) == (
        f"lora_targets: must be one of {allowed} for {spec.model_type} (got '{missing}')"
    )
    assert missing not in allowed_targets(spec)


def test_adapter_states_fp32_and_8bit() -> None:
    spec = load_model("llama-7b")
    n = lora_param_count(spec, 16, "q,v")
    values = {**size_values(spec), r: 16}
    fp32 = {k: int(v.subs(values)) for k, v in lora_state_exprs(spec, 16, "q,v").items()}
    assert fp32 == {"weights": 4 * n, "gradients": 4 * n, "master": 0, "optimizer": 8 * n}
    eight = lora_state_exprs(spec, 16, "q,v", optimizer="adam8bit")["optimizer"]
    # A (16 x 4096) and B (4096 x 16) have 65536 elements: 8-bit, one fp32 absmax per 256.
    assert int(eight.subs(values)) == 2 * n + 2 * 4 * n // 256
    small = lora_state_exprs(load_model("gpt2"), 2, "o", optimizer="adam8bit")["optimizer"]
    assert int(small.subs({**size_values(load_model("gpt2")), r: 2})) == 12 * 8 * 2 * 2 * 768


# --- QLoRA ------------------------------------------------------------------------------------


def test_nf4_published_constants() -> None:
    bits = nf4_published_bits_per_param() - 4
    assert bits == sympy.Rational(8, 64) + sympy.Rational(32, 64 * 256)
    assert round(float(bits), 3) == 0.127  # QLoRA section 3
    assert nf4_published_bits_per_param(double_quant=False) - 4 == sympy.Rational(1, 2)


def test_nf4_exact_storage_matches_published_rate() -> None:
    spec = load_model("llama-7b")
    values = state_values(spec)
    quantized = sum(int((t.count * t.numel).subs(values)) for t in quantized_tensors(spec))
    assert quantized == 6_476_005_376  # every decoder linear; embeddings and head stay 16-bit
    dq = frozen_base_exprs(spec, "nf4")
    nodq = frozen_base_exprs(spec, "nf4-nodq")
    consts = int(dq["quant_constants"].subs(values))
    assert math.isclose(8 * consts / quantized, 0.127, abs_tol=2e-4)
    assert int(nodq["quant_constants"].subs(values)) * 8 == quantized // 2  # 0.5 bits
    rest = param_count(spec) - quantized
    assert int(dq["weights"].subs(values)) == 2 * rest + quantized // 2


def test_qlora_65b_claims() -> None:
    full, qlora = qlora_65b_claims()
    assert param_count(load_model("llama-65b")) == 65_285_660_672
    assert full.bytes == 12 * 65_285_660_672
    assert full.bytes > 780e9  # "more than 780 GB"
    assert qlora.bytes < 48e9  # fits the 48 GB GPU ...
    assert qlora.bytes > 40e9  # ... without much to spare
    base = qlora.parts["NF4 codes + bf16 embeddings, head, norms"]
    assert 33.4e9 < base < 33.5e9
    assert qlora.parts["paged AdamW 32-bit states"] == 8 * lora_param_count(
        load_model("llama-65b"), 64, "all-linear"
    )
    assert any("CUDA" in a for a in qlora.assumptions)


def test_lora_gpt3_claims() -> None:
    full6, full8, lora = lora_gpt3_claims()
    # the paper's W_q and W_v, h x h each: 2 x 2 x L x r x h (37.7 MB in fp16)
    assert lora.parts["adapters: weights, gradients, adam m, v (fp16)"] == 8 * 18_874_368
    # transformers' GPT-2 fuses them in c_attn: peft adapts all of it, h -> 3h
    assert lora_param_count(load_model("gpt-175b"), 4, "c_attn") == 96 * 4 * (12288 + 3 * 12288)
    assert abs(lora.relative_error) < 0.005  # 350 GB
    assert full6.bytes < 1.2e12 < full8.bytes  # 1.2 TB lies between the two readings
    assert math.isclose(lora.bytes / full6.bytes, 1 / 3, rel_tol=1e-3)  # "up to 2/3" saved


# --- the estimate ------------------------------------------------------------------------------


def test_estimate_lora_components() -> None:
    spec = load_model("llama-7b")
    est = estimate(Setup(spec, lora_rank=16, lora_targets=("q", "v"), micro_batch=2, seq_len=1024))
    keys = [c.key for c in est.components]
    assert not {"gradients", "master", "optimizer"} & set(keys)
    n = 8_388_608
    assert est.component("weights").bytes == 2 * param_count(spec)
    assert est.component("adapter_gradients").bytes == 4 * n
    assert est.component("adapter_optimizer").bytes == 8 * n
    assert est.component("step_temporaries").bytes == 4 * n  # foreach over the adapters
    # per layer: q's and v's fp32 copy of their input (b s h) and lora_A's output (b s r)
    assert est.component("adapter_activations").bytes == 32 * 2 * 4 * 2 * 1024 * (4096 + 16)
    assert est.model_state_bytes == 2 * param_count(spec) + 16 * n


def test_estimate_qlora_and_sharding() -> None:
    spec = load_model("llama-7b")
    est = estimate(Setup(spec, lora_rank=8, quant="nf4", recompute="full"))
    assert est.component("quant_constants").bytes == 102_769_536
    assert est.component("dequant_buffer").bytes == 2 * 11008 * 4096
    assert "recomputed" in est.component("adapter_activations").label
    zero2 = estimate(Setup(spec, lora_rank=8, zero=2, gpus=4))
    assert zero2.component("adapter_optimizer").bytes == 8 * 4_194_304 // 4
    assert zero2.component("weights").bytes == 2 * param_count(spec)  # frozen base not sharded


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"quant": "nf4"}, "quant"),
        ({"lora_rank": 8, "quant": "fp4"}, "quant"),
        ({"lora_rank": 0}, "lora_rank"),
        ({"lora_rank": 8, "lora_targets": ("q", "w")}, "lora_targets"),
        ({"lora_rank": 8, "zero": 2, "gpus": 2, "offload_optimizer": True}, "offload"),
    ],
)
def test_setup_refuses(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InputError, match=f"^{field}: "):
        Setup(load_model("llama-7b"), **kwargs)  # type: ignore[arg-type]


# --- measured (validation/lora_kv.json, written by `python -m vrammath.measure.lora`) ---------


def _measured() -> dict[str, object]:
    return json.loads(VALIDATION.read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def test_measured_lora_rows_match() -> None:
    data = _measured()
    baselines = data["lora_baselines"]  # type: ignore[index]
    for row in data["lora"]:  # type: ignore[attr-defined]
        run, paired = row["run"], row["with_input_grads"]
        setup = run["setup"]
        cfg = {**raw_config(run["model"]), "num_hidden_layers": setup["layers"]}
        spec = from_hf_config(cfg, name=run["model"])
        rank, targets = setup["rank"], tuple(setup["targets"])
        n = lora_param_count(spec, rank, targets)
        assert run["trainable_params"] == n
        assert run["trainable_bytes"] == 4 * n  # peft upcasts adapters to fp32
        assert run["frozen_bytes"] == 2 * param_count(spec)
        steady = run["iterations"][-1]["step_end"]
        assert steady["Gradient"] == 4 * n
        n_tensors = 2 * len(targets) * spec.layers
        assert steady["Optstate"] == 8 * n + 4 * n_tensors  # + Adam's fp32 step counters
        base = baselines[run["model"]]["iterations"][0]["forward"]["Activation"]
        added = paired["iterations"][0]["forward"]["Activation"] - base
        layer = lora_activation_layer_expr(
            spec,
            targets,
            input_bytes=2,
            adapter_bytes=4,
            dropout=setup["dropout"] > 0,
            dropout_mask_bytes=4,  # CPU dropout keeps an fp32 mask (CUDA: 1-byte bool)
        )
        values = {**size_values(spec), r: rank, b: setup["batch"], s: setup["seq"]}
        assert added == int((spec.layers * layer).subs(values))


def test_measured_kv_rows_match() -> None:
    from vrammath.serve.kv_cache import kv_cache_bytes

    for row in _measured()["kv"]:  # type: ignore[attr-defined]
        cfg = dict(row["config_dict"])
        windowed = cfg.get("sliding_window") is not None
        if row["config"] == "qwen2-mixed-window":
            window_layers = cfg["num_hidden_layers"] - cfg["max_window_layers"]
        else:
            window_layers = cfg["num_hidden_layers"] if windowed else 0
        spec = from_hf_config(cfg, name=row["config"])
        batch, dtype = row["batch"], row["dtype"]
        for key in ("dynamic_prefill", "dynamic_decode"):
            got = row["rows"][key]
            assert got["bytes"] == kv_cache_bytes(
                spec,
                batch,
                got["tokens"],
                dtype,
                window_layers=window_layers,
                keep_window_minus_one=True,
            )
        static = row["rows"]["static"]
        assert static["bytes"] == kv_cache_bytes(
            spec, batch, static["max_cache_len"], dtype, window_layers=window_layers
        )


def test_cli_estimate_lora(capsys: pytest.CaptureFixture[str]) -> None:
    from vrammath.cli import main

    code = main(
        ["estimate", "llama-7b", "--lora-rank", "16", "--lora-targets", "q,v", "--quant", "nf4"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "LoRA rank 16 on q,v: 8,388,608 trainable parameters" in out
    assert "quantization constants (nf4)" in out
    assert "adapter optimizer states (adamw)" in out


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--lora-rank", "0"], "lora-rank"),
        (["--lora-rank", "8", "--lora-targets", "q,w"], "lora_targets"),
        (["--lora-rank", "8", "--quant", "fp4"], "quant"),
        (["--quant", "nf4"], "quant"),
    ],
)
def test_cli_lora_bad_input(
    capsys: pytest.CaptureFixture[str], args: list[str], field: str
) -> None:
    from vrammath.cli import main

    try:
        code = main(["estimate", "llama-7b", *args])
    except SystemExit as exc:  # argparse rejects the value
        code = int(str(exc.code))
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1
    assert f"{field}: " in err


@pytest.mark.parametrize("value", [None, 7, ["q", 7], {"q"}])
def test_lora_targets_refuse_non_text(value: object) -> None:
    with pytest.raises(
        InputError, match=r"lora_targets: must be text or a list of names from q, k"
    ):
        lora_targets(cast(Any, value))
