"""Measured: LoRA on mixture-of-experts and latent-attention models, through the real peft.

Small configs of each MoE reader (real bf16 tensors on the CPU, seconds each): the trainable
count and every adapter tensor's shape equal :func:`vrammath.terms.lora.targets.adapted_linears`, both for
the explicit peft arguments :func:`vrammath.measure.lora.peft_targets` writes and, for
``all-linear``, for peft's own keyword (whose meaning on MoE models peft rewrites per model
type). Needs the ``measure`` extra with peft.
"""

from __future__ import annotations

import re
import warnings
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from vrammath.measure.lora import peft_targets  # noqa: E402
from vrammath.model.readers import from_hf_config  # noqa: E402
from vrammath.notation.errors import InputError  # noqa: E402
from vrammath.terms.lora.adapters import lora_param_count, lora_values  # noqa: E402
from vrammath.terms.lora.linears import adapted_linears  # noqa: E402

pytestmark = pytest.mark.measure

RANK = 4
TINY: dict[str, dict[str, Any]] = {
    "mixtral": {"num_local_experts": 4},
    "qwen2_moe": {
        "num_experts": 4,
        "moe_intermediate_size": 48,
        "shared_expert_intermediate_size": 80,
    },
    "qwen3_moe": {"head_dim": 16, "num_experts": 4, "moe_intermediate_size": 48},
    "deepseek_v3": {
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "num_key_value_heads": 4,
        "moe_intermediate_size": 48,
        "n_routed_experts": 4,
        "n_shared_experts": 1,
        "n_group": 2,
        "topk_group": 1,
        "q_lora_rank": 32,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
    },
}


def _config(model_type: str) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_experts_per_tok": 2,
        "max_position_embeddings": 128,
        **TINY[model_type],
    }


def _peft_model(cfg: dict[str, Any], **targets: Any) -> Any:
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    hf = transformers.AutoConfig.for_model(cfg["model_type"], **kwargs)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # peft 0.21 asks transformers 5 deprecated questions
        return peft.get_peft_model(model, peft.LoraConfig(r=RANK, **targets))


def _adapters(model: Any) -> dict[tuple[str, tuple[int, ...]], int]:
    """Trainable tensors by (layer-free name, shape), with how many layers hold each."""
    out: dict[tuple[str, tuple[int, ...]], int] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            assert param.dtype == torch.float32  # peft's autocast_adapter_dtype
            key = re.sub(r"^.*layers\.\d+\.", "", name).replace(".default.weight", "")
            out[(key, tuple(param.shape))] = out.get((key, tuple(param.shape)), 0) + 1
    return out


def _expected(cfg: dict[str, Any], targets: str) -> dict[tuple[str, tuple[int, ...]], int]:
    spec = from_hf_config(cfg)
    values = lora_values(spec, RANK)
    out: dict[tuple[str, tuple[int, ...]], int] = {}
    for m in adapted_linears(spec, targets):
        # peft nests a second ParamWrapper on the same module: the inner one is ``base_layer``
        inner = m.module.endswith("gate_up_proj") and _both_expert_params(spec, targets)
        module = m.module.rsplit(".", 1)[0] if m.experts != 1 else m.module
        module += ".base_layer" if inner else ""
        if m.target == "router":
            module = "mlp.gate"
        for part, tensor in (("lora_A", m.lora_a), ("lora_B", m.lora_b)):
            shape = tuple(int(x.subs(values)) for x in tensor.shape)
            key = (f"{module}.{part}", shape)
            out[key] = out.get(key, 0) + int(m.count.subs(values))
    return out


def _both_expert_params(spec: Any, targets: str) -> bool:
    mods = [m.module for m in adapted_linears(spec, targets) if m.experts != 1]
    return len(mods) == 2


CASES = [
    ("mixtral", "q,k,v,o"),
    ("mixtral", "router"),
    ("mixtral", "experts"),
    ("mixtral", "gate,up,down"),
    ("mixtral", "all-linear"),
    ("qwen2_moe", "gate,up,down"),
    ("qwen2_moe", "router,experts,shared_gate"),
    ("qwen2_moe", "all-linear"),
    ("qwen3_moe", "q,v,router"),
    ("qwen3_moe", "gate,up,down"),
    ("qwen3_moe", "all-linear"),
    ("deepseek_v3", "attention"),
    ("deepseek_v3", "kv_b,experts"),
    ("deepseek_v3", "all-linear"),
]


@pytest.mark.parametrize(("model_type", "targets"), CASES)
def test_adapters_equal_peft(model_type: str, targets: str) -> None:
    cfg = _config(model_type)
    spec = from_hf_config(cfg)
    model = _peft_model(cfg, **peft_targets(spec, targets))
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert n == lora_param_count(spec, RANK, targets)
    assert _adapters(model) == _expected(cfg, targets)
    if targets == "all-linear":  # peft's own keyword means the same on this model type
        own = _peft_model(cfg, target_modules="all-linear")
        assert sum(p.numel() for p in own.parameters() if p.requires_grad) == n


@pytest.mark.parametrize("model_type", ["qwen3_moe", "deepseek_v3"])
def test_gate_without_up_is_refused_as_peft_refuses_it(model_type: str) -> None:
    cfg = _config(model_type)
    with pytest.raises(ValueError, match="without also targeting up_proj"):
        _peft_model(cfg, target_modules=["gate_proj"])
    with pytest.raises(InputError, match="gate and up must be named together"):
        adapted_linears(from_hf_config(cfg), "gate")


ACTIVATION_CASES = [
    ("mixtral", "all-linear"),
    ("mixtral", "experts"),
    ("qwen2_moe", "all-linear"),
    ("qwen2_moe", "router,experts"),
    ("qwen3_moe", "gate,up,down"),
    ("deepseek_v3", "all-linear"),
    ("deepseek_v3", "router"),
]


@pytest.mark.parametrize(("model_type", "targets"), ACTIVATION_CASES)
def test_adapter_activations_exact(model_type: str, targets: str) -> None:
    """What the adapters add to the kept memory of a fake bf16 training step, byte for byte:
    on the router and the experts that is the merged weight peft builds for the forward pass,
    its factors in bf16 and the matmul's input (see ``vrammath.terms.lora.adapters._wrapped_bytes``)."""
    from vrammath.measure.lora import measure_lora_step
    from vrammath.model.params import size_values
    from vrammath.notation.symbols import L, b, r, s
    from vrammath.terms.lora.adapters import lora_activation_layer_expr

    cfg = _config(model_type)
    spec = from_hf_config(cfg)
    seq = 32
    base = measure_lora_step(cfg, adapters=False, input_grads=True, seq=seq, steps=1)
    run = measure_lora_step(cfg, rank=RANK, targets=targets, seq=seq, input_grads=True, steps=1)
    added = (
        run["iterations"][0]["forward"]["Activation"]
        - base["iterations"][0]["forward"]["Activation"]
    )
    layer = lora_activation_layer_expr(spec, targets, input_bytes=2, adapter_bytes=4)
    assert added == int((L * layer).subs({**size_values(spec), b: 1, s: seq, r: RANK}))
    assert run["trainable_params"] == lora_param_count(spec, RANK, targets)
