"""Qwen3, OLMo-2, Phi-3 and StarCoder2 against transformers and PyTorch's own counts.

Parameters: transformers' count of the model built on the meta device. Activations: MemTracker
under FakeTensorMode on a CPU, byte for byte, on small configs with odd sizes (GQA, MQA, MHA,
tied, explicit head_dim, biases). Run by ``nox -s measure``.
"""

from __future__ import annotations

from typing import Any, cast

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from vrammath.measure import measure_training_step  # noqa: E402
from vrammath.measure.archs import ARCH_CONFIGS  # noqa: E402
from vrammath.measure.build import build_model  # noqa: E402
from vrammath.model.params import param_count, size_values  # noqa: E402
from vrammath.model.presets import load_model  # noqa: E402
from vrammath.model.readers import from_hf_config  # noqa: E402
from vrammath.notation.symbols import b, s  # noqa: E402
from vrammath.terms.activations.model import hf_activation_bytes  # noqa: E402
from vrammath.terms.activations.parts import Attention, HfRecompute, Precision  # noqa: E402
from vrammath.terms.lora.adapters import lora_param_count  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

SMALL: dict[str, dict[str, Any]] = {
    "qwen3-gqa-bias": ARCH_CONFIGS["qwen3"],  # the validation table's config
    "qwen3-mqa-tied": {
        "model_type": "qwen3",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 1,
        "vocab_size": 131,
        "tie_word_embeddings": True,
    },
    "olmo2-gqa": {
        "model_type": "olmo2",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 131,
    },
    "olmo2-mqa-tied-hd": ARCH_CONFIGS["olmo2"],  # the validation table's config
    "phi3-gqa": {
        "model_type": "phi3",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 131,
    },
    "phi3-mha-tied": {
        "model_type": "phi3",
        "hidden_size": 60,
        "intermediate_size": 92,
        "num_hidden_layers": 3,
        "num_attention_heads": 5,
        "vocab_size": 131,
        "tie_word_embeddings": True,
    },
    "starcoder2-dropout": {
        "model_type": "starcoder2",
        "hidden_size": 60,
        "intermediate_size": 92,
        "num_hidden_layers": 3,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "vocab_size": 131,
        "tie_word_embeddings": False,
        "attention_dropout": 0.1,
        "residual_dropout": 0.1,
        "embedding_dropout": 0.1,
    },
    "starcoder2-gqa": ARCH_CONFIGS["starcoder2"],  # the validation table's config
}

PRESETS = (
    "qwen3-8b",
    "qwen3-32b",
    "phi-3-mini",
    "phi-3-medium",
    "phi-4",
    "olmo-2-7b",
    "starcoder2-15b",
)


def _hf_count(spec: Any) -> int:
    with torch.device("meta"):
        model = build_model(spec, precision="bf16", attention="sdpa")
    return sum(p.numel() for p in model.parameters())


@pytest.mark.measure
@pytest.mark.parametrize("name", PRESETS)
def test_preset_params_equal_transformers(name: str) -> None:
    spec = load_model(name)
    assert param_count(spec) == _hf_count(spec)


@pytest.mark.measure
@pytest.mark.parametrize("name", SMALL)
def test_small_params_equal_transformers(name: str) -> None:
    spec = from_hf_config(SMALL[name])
    assert param_count(spec) == _hf_count(spec)


@pytest.mark.measure
@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("precision", ["bf16", "fp32", "autocast-bf16"])
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_small_activations_are_exact(
    name: str, precision: str, attention: str, recompute: str
) -> None:
    """Everything kept at the end of forward (layers, RoPE, final norm, logits and loss)."""
    cfg = SMALL[name]
    spec = from_hf_config(cfg)
    result = measure_training_step(
        cfg,
        batch=3,
        seq=37,
        precision=precision,
        attention=attention,
        recompute=recompute,
        steps=1,
    )
    measured = int(result["steady"]["forward"]["end"]["Activation"])
    est = hf_activation_bytes(
        spec,
        cast(Attention, attention),
        cast(Precision, precision),
        cast(HfRecompute, recompute),
        device="cpu",
    )
    assert measured == est.subs({**size_values(spec), b: 3, s: 37})


@pytest.mark.measure
@pytest.mark.parametrize(
    ("name", "targets"),
    [
        ("phi3-gqa", "qkv,down"),
        ("phi3-gqa", "all-linear"),
        ("qwen3-gqa-bias", "q,k,v,o"),
        ("starcoder2-gqa", "up,down"),
    ],
)
def test_lora_targets_match_peft(name: str, targets: str) -> None:
    """peft's trainable count on the fused modules equals vrammath's rule (one adapter each)."""
    from vrammath.measure.lora import measure_lora_step

    cfg = SMALL[name]
    result = measure_lora_step(cfg, rank=4, targets=targets, batch=1, seq=8, steps=1)
    assert result["trainable_params"] == lora_param_count(from_hf_config(cfg), 4, targets)


@pytest.mark.measure
@pytest.mark.parametrize("name", ["phi3-gqa", "qwen3-mqa-tied", "olmo2-gqa", "starcoder2-gqa"])
def test_kv_cache_matches_dynamic_cache(name: str) -> None:
    """transformers' DynamicCache after a 37-token prefill: 2 L a_kv d tokens bytes."""
    from vrammath.measure.build import hf_config
    from vrammath.measure.build_decoders import causal_lm_class
    from vrammath.serve.kv_cache import kv_bytes_per_token

    spec = from_hf_config(SMALL[name])
    cfg = hf_config(spec, attention="sdpa")
    cfg.use_cache = True
    torch.manual_seed(0)
    model = causal_lm_class(spec)._from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, spec.vocab, (2, 37))
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    held = sum(
        t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
    )
    assert held == 2 * 37 * kv_bytes_per_token(spec, "bf16")
