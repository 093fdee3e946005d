"""Bytes per parameter of each recipe and optimizer; shape-dependent optimizers."""

from __future__ import annotations

import math

import pytest

from vrammath.model.params import param_count, size_values, tensors
from vrammath.model.presets import load_model
from vrammath.notation.errors import InputError
from vrammath.terms.states import (
    RECIPES,
    bytes_per_param,
    model_state_bytes,
    optimizer_step_temp_bytes,
)

# Documented totals with Adam/AdamW (bytes per parameter): ZeRO 16, Megatron 18, pure bf16 8.
ADAM_TOTALS = {
    "fp32": 16,
    "fp16-mixed": 16,
    "bf16-mixed": 16,
    "bf16-megatron": 18,
    "autocast-bf16": 16,
    "autocast-fp16": 16,
    "bf16-pure": 8,
    "deepseek-v3-fp8": 14,  # bf16 weights, fp32 gradients and master, bf16 moments
}


@pytest.mark.parametrize(("recipe", "total"), ADAM_TOTALS.items())
def test_adam_bytes_per_param(recipe: str, total: int) -> None:
    assert sum(bytes_per_param(recipe, "adamw").values()) == total


def test_every_recipe_is_documented() -> None:
    assert set(RECIPES) == set(ADAM_TOTALS)


def test_zero_paper_split() -> None:
    bpp = bytes_per_param("fp16-mixed", "adam")
    assert (bpp["weights"], bpp["gradients"], bpp["master"] + bpp["optimizer"]) == (2, 2, 12)


def test_sgd_variants() -> None:
    assert bytes_per_param("fp32", "sgd")["optimizer"] == 0
    assert bytes_per_param("fp32", "sgd-momentum")["optimizer"] == 4
    assert sum(bytes_per_param("fp32", "sgd-momentum").values()) == 12  # Transformer Math 101


def test_adam8bit_exact() -> None:
    spec = load_model("llama-7b")
    values = size_values(spec)
    expected = 0
    for t in tensors(spec):
        n = int(t.numel.subs(values))
        one = n + 4 * math.ceil(n / 256) if n >= 4096 else 4 * n
        expected += int(t.count.subs(values)) * 2 * one
    got = model_state_bytes(spec, "bf16-mixed", "adam8bit")["optimizer"]
    assert got == expected
    # about 2 bytes per parameter plus 1/32 of a byte of block scales
    assert 2.0 < got / param_count(spec) < 2.04


def test_adafactor_is_factored() -> None:
    spec = load_model("llama-7b")
    got = model_state_bytes(spec, "fp32", "adafactor")["optimizer"]
    h, inter, layers, vocab = 4096, 11008, 32, 32000
    per_layer = 4 * (4 * (h + h)) + 4 * 3 * (h + inter) + 4 * 2 * h
    expected = 4 * 2 * (vocab + h) + layers * per_layer + 4 * h
    assert got == expected
    assert got < param_count(spec) * 0.01  # factored: far below Adam's 8 bytes/param
    with_m = model_state_bytes(spec, "fp32", "adafactor", adafactor_momentum=True)["optimizer"]
    assert with_m == expected + 4 * param_count(spec)


def test_shape_dependent_need_a_model() -> None:
    with pytest.raises(InputError, match="optimizer"):
        bytes_per_param("bf16-mixed", "adafactor")


def test_step_temporaries() -> None:
    spec = load_model("llama-7b")
    assert optimizer_step_temp_bytes(spec, "bf16-mixed", "adamw", "fused") == 0
    assert optimizer_step_temp_bytes(spec, "bf16-mixed", "adamw", "foreach") == 4 * param_count(
        spec
    )
    assert optimizer_step_temp_bytes(spec, "fp32", "adamw", "for-loop") == 2 * 32000 * 4096 * 4
    assert optimizer_step_temp_bytes(spec, "fp32", "sgd", "foreach") == 0


@pytest.mark.parametrize(
    ("field", "call"),
    [
        ("recipe", lambda: bytes_per_param("fp64", "adamw")),
        ("optimizer", lambda: bytes_per_param("fp32", "lion")),
        (
            "implementation",
            lambda: optimizer_step_temp_bytes(load_model("gpt2"), "fp32", "adamw", "x"),
        ),
    ],
)
def test_bad_names(field: str, call: object) -> None:
    with pytest.raises(InputError, match=f"^{field}: must be one of"):
        call()  # type: ignore[operator]
