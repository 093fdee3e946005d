"""Mixture-of-experts and latent attention against transformers 5.24 itself (``measure``).

* parameter counts equal ``sum(p.numel() for p in model.parameters())`` on the meta device, for
  every MoE preset (DeepSeek-V3 included);
* DeepSeek-V3's cache holds the compressed latent and the RoPE key (``kv_lora_rank +
  qk_rope_head_dim`` elements per token and layer), as :func:`vrammath.serve.kv_cache.kv_cache_bytes`;
* the memory a training forward keeps does not depend on how tokens are routed (MemTracker on
  real bf16 tensors, two router initialisations and correction biases, the routing checked to
  differ), for transformers' grouped-matmul experts and for its per-expert loop;
* nor do the grouped experts' forward and backward peaks, with and without recomputation
  (the op-by-op steps of :mod:`vrammath.terms.moe.peaks`), while the per-expert loop's backward peak
  moves with the routing.

bf16 throughout: the grouped matmul (``torch._grouped_mm``) takes bf16 inputs only, so its fp32
memory cannot be counted here.
"""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from vrammath.model.params import param_count  # noqa: E402
from vrammath.model.presets import load_model  # noqa: E402
from vrammath.model.readers import from_hf_config  # noqa: E402
from vrammath.serve.kv_cache import kv_cache_bytes  # noqa: E402

pytestmark = [
    pytest.mark.measure,
    pytest.mark.filterwarnings("ignore::FutureWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

MODELS = Path(__file__).resolve().parents[2] / "conf" / "models"
# keys of the Hub files that are not transformers config fields (remote code, fp8 storage)
_NOT_CONFIG = ("auto_map", "quantization_config", "architectures", "model_type")


def _hf_config(cfg: dict[str, Any]) -> Any:
    kwargs = {k: v for k, v in cfg.items() if k not in _NOT_CONFIG}
    return transformers.AutoConfig.for_model(cfg["model_type"], **kwargs)


@pytest.mark.parametrize(
    "name", ["mixtral-8x7b", "mixtral-8x22b", "qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3"]
)
def test_parameter_count_equals_transformers_on_meta(name: str) -> None:
    cfg = json.loads((MODELS / f"{name}.json").read_text())
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(_hf_config(cfg))
    assert sum(p.numel() for p in model.parameters()) == param_count(load_model(name))


TINY: dict[str, dict[str, Any]] = {
    "mixtral": {"num_local_experts": 8, "num_experts_per_tok": 2},
    "qwen2_moe": {
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
    },
    "qwen3_moe": {
        "head_dim": 16,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "norm_topk_prob": True,
    },
    "deepseek_v3": {
        "num_key_value_heads": 4,
        "moe_intermediate_size": 32,
        "kv_lora_rank": 16,
        "q_lora_rank": 24,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 8,
        "v_head_dim": 8,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "first_k_dense_replace": 1,
    },
}


def _tiny(model_type: str) -> dict[str, Any]:
    return {
        "model_type": model_type,
        "vocab_size": 160,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        **TINY[model_type],
    }


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_tiny_configs_count_exactly(model_type: str) -> None:
    cfg = _tiny(model_type)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(_hf_config(cfg))
    assert sum(p.numel() for p in model.parameters()) == param_count(from_hf_config(cfg))


def test_deepseek_v3_caches_the_compressed_latent() -> None:
    cfg = _tiny("deepseek_v3")
    model = transformers.AutoModelForCausalLM.from_config(_hf_config(cfg)).eval()
    batch, tokens = 2, 5
    with torch.no_grad():
        out = model(torch.randint(0, 128, (batch, tokens)), use_cache=True)
    layers = out.past_key_values.layers
    held = sum(t.numel() * t.element_size() for lay in layers for t in (lay.keys, lay.values))
    # one-head "keys" = the latent (kv_lora_rank), "values" = the RoPE key (qk_rope_head_dim)
    assert [tuple(lay.keys.shape) for lay in layers] == [(batch, 1, tokens, 16)] * 2
    assert [tuple(lay.values.shape) for lay in layers] == [(batch, 1, tokens, 8)] * 2
    spec = from_hf_config(cfg)
    assert held == kv_cache_bytes(spec, batch, tokens, "fp32")


def _forward_memory(model_type: str, seed: int, bias: float, implementation: str) -> Any:
    from torch.distributed._tools.mem_tracker import MemTracker

    torch.manual_seed(seed)
    hf = _hf_config(_tiny(model_type))
    hf._attn_implementation = "sdpa"
    hf._experts_implementation = implementation
    hf.use_cache = False
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).train()
    routes: list[Any] = []
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):  # DeepSeek's routing bias
                n = module.e_score_correction_bias.numel()
                module.e_score_correction_bias.add_(bias * torch.arange(n))
            if type(module).__name__.endswith(("TopKRouter", "TopkRouter")):
                module.weight.normal_(0, 1.0)
                module.register_forward_hook(lambda _m, _i, out: routes.append(out[2]))
    ids = torch.randint(0, 160, (2, 64), generator=torch.Generator().manual_seed(0))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        out = model(input_ids=ids, labels=ids)
        snapshot = tracker.get_tracker_snapshot("current")
        out.loss.backward()
    (per_kind,) = snapshot.values()
    kept = {str(k).rsplit(".", 1)[-1]: v for k, v in per_kind.items()}
    load = torch.bincount(torch.cat([r.reshape(-1) for r in routes]), minlength=8)
    # the caller still holds the logits at the snapshot; a training step drops them
    kept["ACT"] -= out.logits.numel() * out.logits.element_size()
    return kept, load


@pytest.mark.parametrize("implementation", ["grouped_mm", "eager"])
@pytest.mark.parametrize("model_type", sorted(TINY))
def test_kept_memory_does_not_depend_on_routing(model_type: str, implementation: str) -> None:
    one, load_one = _forward_memory(model_type, 0, 0.0, implementation)
    two, load_two = _forward_memory(model_type, 1, 0.5, implementation)
    assert not torch.equal(load_one, load_two)  # the tokens went to other experts
    assert one == two
    assert one["ACT"] > 0


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_whole_model_activations_exact(model_type: str) -> None:
    from vrammath.model.params import size_values
    from vrammath.notation.symbols import b, k_e, s
    from vrammath.terms.activations.model import hf_activation_bytes

    kept, _ = _forward_memory(model_type, 0, 0.0, "grouped_mm")
    spec = from_hf_config(_tiny(model_type))
    assert spec.experts is not None
    values = {**size_values(spec), k_e: spec.experts.top_k, b: 2, s: 64}
    assert kept["ACT"] == hf_activation_bytes(spec, "sdpa", "bf16", device="cpu").subs(values)


def _block_kept(model_type: str, tokens: int, top_k: int) -> tuple[int, int]:
    """What autograd still holds after one MoE block's forward (each storage once, parameters
    and the block's input excluded) plus its output, and vrammath's figure."""
    from vrammath.terms.moe.params import moe_mlp_kept_bytes

    cfg = {**_tiny(model_type), "num_experts_per_tok": top_k}
    hf = _hf_config(cfg)
    hf._experts_implementation = "grouped_mm"
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).train()
    block = model.model.layers[1].mlp  # layer 1 is a MoE layer in every tiny config
    x = torch.randn(1, tokens, 64, dtype=torch.bfloat16, requires_grad=True)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()}
    skip.add(x.untyped_storage().data_ptr())
    refs: list[Any] = []

    def pack(tensor: Any) -> Any:
        refs.append(weakref.ref(tensor))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = block(x)
    gc.collect()  # graph nodes no gradient reaches (DeepSeek's group choice) free what they saved
    alive = {}
    for ref in refs:
        tensor = ref()
        if tensor is not None and tensor.untyped_storage().data_ptr() not in skip:
            alive[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
    kept = sum(alive.values()) + out.numel() * out.element_size()
    return kept, sum(moe_mlp_kept_bytes(from_hf_config(cfg), 1, tokens).values())


@pytest.mark.parametrize(("tokens", "top_k"), [(128, 1), (256, 2), (96, 3)])
@pytest.mark.parametrize("model_type", sorted(TINY))
def test_moe_block_kept_bytes_exact(model_type: str, tokens: int, top_k: int) -> None:
    measured, predicted = _block_kept(model_type, tokens, top_k)
    assert measured == predicted


def _step_peaks(model_type: str, seed: int, implementation: str, recompute: bool) -> Any:
    """Forward and backward peaks (MemTracker, real bf16 tensors) of one training step, with
    the routers re-drawn by ``seed``; and the tokens each expert received."""
    from torch.distributed._tools.mem_tracker import MemTracker

    from vrammath.measure.step import _Phases

    torch.manual_seed(seed)
    hf = _hf_config(_tiny(model_type))
    hf._attn_implementation = "sdpa"
    hf._experts_implementation = implementation
    hf.use_cache = False
    model = transformers.AutoModelForCausalLM.from_config(hf, dtype=torch.bfloat16).train()
    if recompute:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    routes: list[Any] = []
    with torch.no_grad():
        for module in model.modules():
            if type(module).__name__.endswith(("TopKRouter", "TopkRouter")):
                module.weight.normal_(0, 1.0)
                module.register_forward_hook(lambda _m, _i, out: routes.append(out[2]))
    ids = torch.randint(0, 160, (2, 64), generator=torch.Generator().manual_seed(0))
    tracker = MemTracker()
    tracker.track_external(model)
    phases = _Phases(tracker, cuda=False)
    record: dict[str, Any] = {}
    with tracker:
        with phases.phase(record, "forward", "Activation"):
            loss = model(input_ids=ids, labels=ids).loss
        with phases.phase(record, "backward", "Temp"):
            loss.backward()
            del loss
    load = torch.bincount(torch.cat([r.reshape(-1) for r in routes]), minlength=8)
    return (record["forward"]["peak"]["Total"], record["backward"]["peak"]["Total"]), load


@pytest.mark.parametrize("recompute", [False, True])
@pytest.mark.parametrize("model_type", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_phase_peaks_do_not_depend_on_routing(model_type: str, recompute: bool) -> None:
    """The grouped matmul's peaks, forward and backward (the recomputation's too), are the same
    whichever experts the tokens go to: every buffer has S = b s k rows."""
    one, load_one = _step_peaks(model_type, 0, "grouped_mm", recompute)
    two, load_two = _step_peaks(model_type, 1, "grouped_mm", recompute)
    assert not torch.equal(load_one, load_two)
    assert one == two


def test_per_expert_loop_peak_depends_on_routing() -> None:
    """The contrast: transformers' per-expert loop (``eager``) sizes each expert's buffers by
    its load, so its backward peak moves with the routing (the grouped peaks above do not)."""
    (fwd_one, bwd_one), _ = _step_peaks("mixtral", 0, "eager", False)
    (fwd_two, bwd_two), _ = _step_peaks("mixtral", 1, "eager", False)
    assert fwd_one == fwd_two  # the forward peaks at the loss here, after the experts
    assert bwd_one != bwd_two
