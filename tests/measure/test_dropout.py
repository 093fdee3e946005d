"""Dropout honoured, not refused: LLaMA-family ``attention_dropout`` and GPT-2's three dropouts.

Each config is built by transformers from the raw config.json dict (no ModelSpec in between) and
counted with MemTracker under FakeTensorMode on a CPU; the activations kept at the end of
forward equal :func:`vrammath.terms.activations.model.hf_activation_bytes` with ``device="cpu"`` to the
byte (the CPU's dropout keeps a noise tensor of the input's dtype, and SDPA with dropout runs
PyTorch's math kernel there). Run by ``nox -s measure``.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from vrammath.measure.derive import measure_config
from vrammath.model.params import size_values
from vrammath.model.readers import from_hf_config
from vrammath.notation.symbols import b, s
from vrammath.terms.activations.gpt import GELU_KEPT
from vrammath.terms.activations.model import hf_activation_bytes
from vrammath.terms.activations.parts import Attention, HfRecompute, Precision

pytestmark = [
    pytest.mark.measure,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

LLAMA_FAMILY: dict[str, dict[str, Any]] = {
    # GQA, explicit head_dim (a d = 120 != h = 72), biases
    "llama-gqa": {
        "model_type": "llama",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 20,
        "vocab_size": 131,
        "attention_bias": True,
        "attention_dropout": 0.1,
    },
    # MQA, tied, q/k/v biases
    "qwen2-mqa": {
        "model_type": "qwen2",
        "hidden_size": 80,
        "intermediate_size": 136,
        "num_hidden_layers": 2,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "vocab_size": 777,
        "tie_word_embeddings": True,
        "attention_dropout": 0.25,
    },
    # q/k norms per head
    "qwen3-gqa": {
        "model_type": "qwen3",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 20,
        "vocab_size": 131,
        "attention_dropout": 0.1,
    },
    # q/k norms over the projection, post-norms, MQA, tied
    "olmo2-mqa": {
        "model_type": "olmo2",
        "hidden_size": 60,
        "intermediate_size": 92,
        "num_hidden_layers": 2,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "vocab_size": 131,
        "tie_word_embeddings": True,
        "attention_dropout": 0.1,
    },
    # fused qkv_proj and gate_up_proj
    "phi3-gqa": {
        "model_type": "phi3",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 131,
        "pad_token_id": 0,
        "attention_dropout": 0.1,
    },
}

_GPT2 = {
    "model_type": "gpt2",
    "n_embd": 72,
    "n_layer": 2,
    "n_head": 6,
    "n_inner": 200,
    "vocab_size": 131,
    "n_positions": 128,
}

GPT2: dict[str, dict[str, Any]] = {
    "on": _GPT2,
    "attn-off": {**_GPT2, "attn_pdrop": 0.0},
    "resid-off": {**_GPT2, "resid_pdrop": 0.0, "activation_function": "gelu"},
    "embd-off": {**_GPT2, "embd_pdrop": 0.0, "activation_function": "gelu_fast"},
    "all-off": {
        **_GPT2,
        "attn_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "activation_function": "gelu_pytorch_tanh",
    },
}


def _check(cfg: dict[str, Any], precision: str, attention: str, recompute: str) -> None:
    batch, seq = 3, 37
    measured = measure_config(
        cfg, batch=batch, seq=seq, precision=precision, attention=attention, recompute=recompute
    )["activations"]
    spec = from_hf_config(cfg)
    expr = hf_activation_bytes(
        spec,
        cast(Attention, attention),
        cast(Precision, precision),
        cast(HfRecompute, recompute),
        device="cpu",
    )
    assert measured == expr.subs({**size_values(spec), b: batch, s: seq})


@pytest.mark.parametrize("name", sorted(LLAMA_FAMILY))
@pytest.mark.parametrize("precision", ["bf16", "fp32", "autocast-bf16"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_attention_dropout_is_exact(
    name: str, precision: str, attention: str, recompute: str
) -> None:
    _check(LLAMA_FAMILY[name], precision, attention, recompute)


@pytest.mark.parametrize("name", sorted(GPT2))
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_gpt2_dropouts_are_exact(name: str, precision: str, attention: str, recompute: str) -> None:
    _check(GPT2[name], precision, attention, recompute)


@pytest.mark.parametrize("gelu", sorted(GELU_KEPT))
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_gpt2_activation_functions_are_exact(gelu: str, attention: str) -> None:
    """Every ``activation_function`` the reader accepts is the one built and counted."""
    _check({**GPT2["all-off"], "activation_function": gelu}, "bf16", attention, "none")


MISTRAL_WINDOW = {
    "model_type": "mistral",
    "hidden_size": 96,
    "intermediate_size": 200,
    "num_hidden_layers": 2,
    "num_attention_heads": 6,
    "num_key_value_heads": 2,
    "head_dim": 24,
    "vocab_size": 1000,
    "sliding_window": 16,
    "attention_dropout": 0.1,
}


@pytest.mark.parametrize("seq", [15, 41])  # below and above the window
@pytest.mark.parametrize("precision", ["bf16", "fp32", "autocast-bf16"])
@pytest.mark.parametrize("attention", ["eager", "sdpa"])
def test_window_with_dropout_is_exact(seq: int, precision: str, attention: str) -> None:
    measured = measure_config(
        MISTRAL_WINDOW, batch=3, seq=seq, precision=precision, attention=attention
    )["activations"]
    spec = from_hf_config(MISTRAL_WINDOW)
    expr = hf_activation_bytes(
        spec, cast(Attention, attention), cast(Precision, precision), "none", device="cpu"
    )
    assert measured == expr.subs({**size_values(spec), b: 3, s: seq})


@pytest.mark.parametrize("name", ["on", "all-off"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize(("batch", "seq"), [(3, 48), (2, 80)])  # the MLP's peak, the scores'
def test_gpt2_checkpointed_peaks(name: str, precision: str, batch: int, seq: int) -> None:
    """GPT-2 with full recomputation, dropout on and off: the forward and backward peaks within
    the matrix's 1 % (at s = 48 the GeLU's backward sets the backward peak, at s = 80 the
    softmax's; without dropout the softmax backward keeps no fused QKV)."""
    from vrammath.measure.matrix import TOLERANCE, estimate_row

    cfg = {**GPT2[name], "n_layer": 3, "activation_function": "gelu_pytorch_tanh"}
    measured = measure_config(
        cfg, batch=batch, seq=seq, precision=precision, attention="eager", recompute="full"
    )
    row = {
        "model": cfg,
        "batch": batch,
        "seq": seq,
        "precision": precision,
        "attention": "eager",
        "recompute": "full",
        "optimizer": "adamw",
        "implementation": "foreach",
        "zero3_ranks": None,
    }
    est = estimate_row(row)
    for phase in ("forward", "backward", "step"):
        err = (est[f"{phase}_peak"] - measured[phase]) / measured[phase]
        assert abs(err) <= TOLERANCE["peak"], (phase, err)


@pytest.mark.parametrize("name", ["llama-gqa", "qwen2-mqa"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize(("batch", "seq"), [(3, 48), (2, 80)])
def test_attention_dropout_checkpointed_peaks(
    name: str, precision: str, batch: int, seq: int
) -> None:
    """LLaMA-style layers with attention dropout and full recomputation: the forward peak at the
    dropout (its input, mask and output beside the fp32 softmax), the backward peak at the MLP's
    backward of a recomputed layer, within the matrix's 1 %."""
    from vrammath.measure.matrix import TOLERANCE, estimate_row

    cfg = LLAMA_FAMILY[name]
    measured = measure_config(
        cfg, batch=batch, seq=seq, precision=precision, attention="eager", recompute="full"
    )
    row = {
        "model": cfg,
        "batch": batch,
        "seq": seq,
        "precision": precision,
        "attention": "eager",
        "recompute": "full",
        "optimizer": "adamw",
        "implementation": "foreach",
        "zero3_ranks": None,
    }
    est = estimate_row(row)
    for phase in ("forward", "backward", "step"):
        err = (est[f"{phase}_peak"] - measured[phase]) / measured[phase]
        assert abs(err) <= TOLERANCE["peak"], (phase, err)
