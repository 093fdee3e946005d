"""Measured: LoRA through the real peft library (fake tensors + MemTracker) and the KV cache of
transformers' own cache objects, against vrammath's formulas -- byte for byte.

Needs the ``measure`` extra (torch, transformers, peft). The root conftest skips this folder when
torch or transformers is missing; peft is checked here. QLoRA is not measured: bitsandbytes' 4-bit
kernels need CUDA (see ``vrammath.answers.claims.qlora_65b_claims`` for the published figures instead).
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vrammath.measure.lora import (
    KV_CONFIGS,
    config_dict,
    measure_kv_cache,
    measure_lora_step,
)
from vrammath.model.params import param_count, size_values
from vrammath.model.presets import load_model
from vrammath.model.readers import from_hf_config
from vrammath.notation.symbols import b, r, s
from vrammath.serve.kv_cache import kv_cache_bytes
from vrammath.terms.lora.adapters import lora_activation_layer_expr, lora_param_count

pytestmark = pytest.mark.measure

SEQ = 256
LAYERS = 2  # a two-layer cut of the real config keeps each run to seconds; counts scale by L


def _adapter_activation(model: str, rank: int, targets: tuple[str, ...], dropout: bool) -> int:
    spec = load_model(model)
    layer = lora_activation_layer_expr(
        spec, targets, input_bytes=2, adapter_bytes=4, dropout=dropout, dropout_mask_bytes=4
    )
    return int((LAYERS * layer).subs({**size_values(spec), r: rank, b: 1, s: SEQ}))


@pytest.mark.parametrize(
    ("model", "rank", "targets", "dropout"),
    [
        ("llama-7b", 8, ("q", "v"), 0.0),
        ("llama-7b", 16, ("q", "v"), 0.0),
        ("llama-7b", 8, ("q", "v"), 0.05),
        ("qwen2-7b", 8, ("q", "k", "v"), 0.0),
        ("qwen2-7b", 16, ("q", "k", "v", "o", "gate", "up", "down"), 0.0),
    ],
)
def test_lora_step_matches(model: str, rank: int, targets: tuple[str, ...], dropout: float) -> None:
    spec = load_model(model)
    cut = from_hf_config({**config_of(model), "num_hidden_layers": LAYERS}, name=model)
    run = measure_lora_step(
        model, rank=rank, targets=targets, seq=SEQ, dropout=dropout, layers=LAYERS, steps=2
    )
    n = lora_param_count(cut, rank, targets)
    assert run["trainable_params"] == n
    assert run["trainable_bytes"] == 4 * n
    assert run["frozen_bytes"] == 2 * param_count(cut)
    steady = run["iterations"][-1]["step_end"]
    assert steady["Gradient"] == 4 * n
    assert steady["Optstate"] == 8 * n + 4 * 2 * len(targets) * LAYERS  # + fp32 step counters
    base = measure_lora_step(
        model, adapters=False, input_grads=True, seq=SEQ, layers=LAYERS, steps=1
    )
    paired = measure_lora_step(
        model,
        rank=rank,
        targets=targets,
        seq=SEQ,
        dropout=dropout,
        layers=LAYERS,
        input_grads=True,
        steps=1,
    )
    added = (
        paired["iterations"][0]["forward"]["Activation"]
        - base["iterations"][0]["forward"]["Activation"]
    )
    assert added == _adapter_activation(model, rank, targets, dropout > 0)
    assert spec.layers > LAYERS


def config_of(model: str) -> dict[str, object]:
    from vrammath.model.presets import raw_config

    return raw_config(model)


@pytest.mark.parametrize("kind", KV_CONFIGS)
def test_kv_cache_matches(kind: str) -> None:
    row = measure_kv_cache(kind)
    cfg = config_dict(kind)
    spec = from_hf_config(cfg, name=kind)
    layers = int(cfg["num_hidden_layers"])
    if kind == "qwen2-mixed-window":
        window_layers = layers - int(cfg["max_window_layers"])
    else:
        window_layers = layers if cfg.get("sliding_window") is not None else 0
    for key in ("dynamic_prefill", "dynamic_decode"):
        got = row["rows"][key]
        assert got["bytes"] == kv_cache_bytes(
            spec,
            row["batch"],
            got["tokens"],
            row["dtype"],
            window_layers=window_layers,
            keep_window_minus_one=True,
        )
    static = row["rows"]["static"]
    assert static["bytes"] == kv_cache_bytes(
        spec, row["batch"], static["max_cache_len"], row["dtype"], window_layers=window_layers
    )
