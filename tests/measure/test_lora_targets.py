"""Each architecture's LoRA targets against peft's own count of trainable parameters.

peft adapts the modules transformers builds (fused ``c_attn``, ``query_key_value``,
``qkv_proj``, ``gate_up_proj``; GPT-2's two ``c_proj``); vrammath's
:func:`~vrammath.terms.lora.adapters.lora_param_count` with the same targets must equal peft's count, on the
small configs of :data:`vrammath.measure.archs.ARCH_CONFIGS`. Run by ``nox -s measure``.
"""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from vrammath.measure.archs import ARCH_CONFIGS, EAGER_ONLY
from vrammath.measure.build import as_spec
from vrammath.measure.lora import measure_lora_step
from vrammath.terms.lora.adapters import lora_param_count

pytestmark = [
    pytest.mark.measure,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

CASES = [
    ("llama", "q,v"),
    ("qwen3", "attention"),
    ("olmo2", "k,o,down"),
    ("phi3", "qkv"),
    ("phi3", "gate_up_proj,o"),
    ("starcoder2", "c_proj"),  # StarCoder2's c_proj is the MLP's only
    ("starcoder2", "q,up"),
    ("gemma", "v,gate"),
    ("gemma2", "o,up"),
    ("gemma3_text", "q,k"),
    ("gpt2", "c_attn"),
    ("gpt2", "c_proj"),  # GPT-2's attention and MLP output projections both
    ("gpt2", "o"),
    ("gpt_neox", "query_key_value,dense_4h_to_h"),
    ("gpt_neox", "o,up"),
]


@pytest.mark.parametrize("arch", sorted(ARCH_CONFIGS))
def test_all_linear_matches_peft(arch: str) -> None:
    cfg = ARCH_CONFIGS[arch]
    attention = "eager" if arch in EAGER_ONLY else "sdpa"
    result = measure_lora_step(
        cfg, rank=3, targets="all-linear", batch=1, seq=8, steps=1, attention=attention
    )
    assert result["trainable_params"] == lora_param_count(as_spec(cfg), 3, "all-linear")


@pytest.mark.parametrize(("arch", "targets"), CASES)
def test_named_targets_match_peft(arch: str, targets: str) -> None:
    cfg = ARCH_CONFIGS[arch]
    attention = "eager" if arch in EAGER_ONLY else "sdpa"
    result = measure_lora_step(
        cfg, rank=5, targets=targets, batch=1, seq=8, steps=1, attention=attention
    )
    assert result["trainable_params"] == lora_param_count(as_spec(cfg), 5, targets)
