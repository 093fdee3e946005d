"""Sliding windows, Gemma and GPT-NeoX against memory PyTorch counts (fake tensors on a CPU).

Small configs with odd sizes, built by transformers from the ModelSpec the reader made; the
activations kept at the end of forward equal :func:`vrammath.terms.activations.model.hf_activation_bytes`
to the byte. Run by ``nox -s measure``.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vrammath.measure import measure_training_step  # noqa: E402
from vrammath.measure.archs import ARCH_CONFIGS  # noqa: E402
from vrammath.measure.build import as_spec  # noqa: E402
from vrammath.model.params import size_values  # noqa: E402
from vrammath.notation.symbols import b, s  # noqa: E402
from vrammath.terms.activations.model import hf_activation_bytes  # noqa: E402

pytestmark = [
    pytest.mark.measure,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

WINDOWED: dict[str, dict[str, Any]] = {
    # GQA, explicit head_dim, every layer windowed
    "mistral-gqa": {
        "model_type": "mistral",
        "hidden_size": 96,
        "intermediate_size": 200,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 24,
        "vocab_size": 1000,
        "sliding_window": 16,
    },
    # MQA, tied, biases, the top two of three layers windowed
    "qwen2-mqa-mixed": {
        "model_type": "qwen2",
        "hidden_size": 80,
        "intermediate_size": 136,
        "num_hidden_layers": 3,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "vocab_size": 777,
        "tie_word_embeddings": True,
        "use_sliding_window": True,
        "sliding_window": 16,
        "max_window_layers": 1,
    },
}


def _check(
    cfg: dict[str, Any], batch: int, seq: int, precision: Any, attention: Any, recompute: Any
) -> None:
    spec = as_spec(cfg)
    result = measure_training_step(
        cfg,
        batch=batch,
        seq=seq,
        precision=precision,
        attention=attention,
        recompute=recompute,
        steps=1,
    )
    measured = int(result["steady"]["forward"]["end"]["Activation"])
    expr = hf_activation_bytes(spec, attention, precision, recompute, device="cpu")
    assert measured == expr.subs({**size_values(spec), b: batch, s: seq})


@pytest.mark.parametrize("config", sorted(WINDOWED))
@pytest.mark.parametrize("seq", [15, 16, 41])  # below, at and above the window of 16
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("precision", ["bf16", "fp32", "autocast-bf16"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_sliding_window_activations_are_exact(
    config: str, seq: int, attention: str, precision: str, recompute: str
) -> None:
    _check(WINDOWED[config], 3, seq, precision, attention, recompute)


ARCHS: dict[str, dict[str, Any]] = {
    # GQA, head_dim 20 != 72 / 4, tied, window 16 on layers 0 and 2 (the top one slides)
    "gemma2-odd": ARCH_CONFIGS["gemma2"],  # the validation table's config
    # Gemma-3: q/k norms, one global layer in 3 (layers 0, 1, 3 slide), head_dim 20, sdpa allowed
    "gemma3-odd": ARCH_CONFIGS["gemma3_text"],  # the validation table's config
    # Gemma (v1): MQA, head_dim 24 != 88 / 4, legacy "gelu", untied
    "gemma-mqa": {
        "model_type": "gemma",
        "hidden_size": 88,
        "intermediate_size": 150,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 24,
        "vocab_size": 555,
        "hidden_act": "gelu",
        "tie_word_embeddings": False,
    },
    # parallel residual, rotary 3 of 12 dimensions, gelu_fast (GPT-NeoX-20B's), odd sizes
    "neox-parallel": ARCH_CONFIGS["gpt_neox"],  # the validation table's config
    # sequential residual, untied, plain GeLU, rotary 8 of 16
    "neox-sequential": {
        "model_type": "gpt_neox",
        "hidden_size": 80,
        "intermediate_size": 136,
        "num_hidden_layers": 3,
        "num_attention_heads": 5,
        "vocab_size": 777,
        "rotary_pct": 0.5,
        "use_parallel_residual": False,
    },
}

EAGER_ONLY = {"gemma2-odd"}  # transformers' SDPA refuses attention softcapping


@pytest.mark.parametrize("config", sorted(ARCHS))
def test_param_count_equals_transformers(config: str) -> None:
    """The exact count equals transformers' own, built on the meta device."""
    from vrammath.measure.build import build_model
    from vrammath.model.params import param_count

    spec = as_spec(ARCHS[config])
    with torch.device("meta"):
        model = build_model(spec, precision="bf16", attention="eager")
    assert param_count(spec) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("config", sorted(ARCHS))
@pytest.mark.parametrize("seq", [15, 41])  # below and above the window of 16, where there is one
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_arch_activations_are_exact(
    config: str, seq: int, attention: str, precision: str, recompute: str
) -> None:
    if attention == "sdpa" and config in EAGER_ONLY:
        pytest.skip("transformers runs this architecture with eager attention only")
    _check(ARCHS[config], 3, seq, precision, attention, recompute)


@pytest.mark.parametrize(
    ("preset", "count"),
    [
        ("gemma-2-9b", 9_241_705_984),
        ("gemma-2-27b", 27_227_128_320),
        ("gpt-neox-20b", 20_554_567_680),
        ("gemma-3-27b-text", 27_009_346_304),
    ],
)
def test_preset_param_count_equals_transformers(preset: str, count: int) -> None:
    from vrammath.measure.build import build_model
    from vrammath.model.params import param_count

    spec = as_spec(preset)
    with torch.device("meta"):
        model = build_model(spec, precision="bf16", attention="eager")
    assert param_count(spec) == sum(p.numel() for p in model.parameters()) == count
