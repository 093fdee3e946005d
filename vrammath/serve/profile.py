"""The terms of vLLM's startup profile run: the forward's peak, the sampler's, the rotary cache.

vLLM measures what one profile forward over ``max_num_batched_tokens`` tokens and one sampling
step over ``min(max_num_seqs, tokens)`` requests take (``profile_run``); these derive it from
the model, op by op as vLLM's code allocates (each function names the file).
:mod:`vrammath.serve.vllm` composes them into the startup budget.

>>> from vrammath.model.presets import load_model
>>> spec = load_model("llama-3.1-8b")
>>> forward_peak_bytes(spec, 8192, 1), sampler_peak_bytes(spec, 1024, v0=False)
(905969664, 4990697472)
"""

from __future__ import annotations

from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import one_of
from vrammath.serve.weights import serving_weight_bytes

#: The top-k/top-p implementations of vLLM's V1 sampler whose profile-run peak is modelled
#: (``vllm/v1/sample/ops/topk_topp_sampler.py: TopKTopPSampler``): ``pytorch`` sorts the
#: vocabulary (``forward_native``), ``flashinfer`` is FlashInfer's fused kernel
#: (``forward_cuda``), ``triton`` masks the float32 logits in place (``apply_top_k_top_p_triton``).
SAMPLERS = ("pytorch", "flashinfer", "triton")
#: The V1 path a release samples with unless told (:attr:`vrammath.serve.vllm_flags.Vllm.sampler_path`).
DEFAULT_SAMPLER = "pytorch"
#: Bytes per (request, vocabulary entry) at the V1 FlashInfer sampler's peak, beyond the logits
#: in the model dtype (``compute_logits``): their float32 copy (``Sampler.forward``:
#: ``logits.to(torch.float32)``) and FlashInfer's float32 probabilities.
V1_SAMPLER_BYTES = 4 + 4
#: The same for the Triton top-k/top-p kernel, which masks the float32 logits in place; beside
#: them the float32 probabilities and ``random_sample``'s float32 exponential noise ``q``. The
#: kernel's own gather buffers (some 80 MiB, vllm-project/vllm PR #33538) are not counted.
V1_TRITON_BYTES = 4 + 4 + 4
#: The same for the V0 sampler, at the ``gather`` that ends ``_apply_top_k_top_p``
#: (``vllm/model_executor/layers/sampler.py``; the profile run asks for top-p 0.99 and top-k
#: vocab - 1): the float32 logits, ``logits_sort``, ``probs_sort``, ``probs_sum`` and the
#: gathered result (5 x 4), ``logits_idx`` and ``logits_idx_inv`` (2 x 8, int64), the top-k
#: and top-p masks (2 x 1).
V0_SAMPLER_BYTES = 5 * 4 + 2 * 8 + 2 * 1


def sort_bytes(rows: int) -> int:
    """Bytes per element a CUDA ``torch.sort`` of ``rows`` float32 rows (each shorter than 10^6)
    holds at its peak beyond its input: its outputs (values 4, int64 indices 8) and what
    ``aten/src/ATen/native/cuda/SortStable.cu: launch_stable_sort_kernel`` allocates.

    From 128 rows on (``segmented_sort_pairs``) and for one row
    (``segmented_sort_large_segments``): the int64 indices it sorts from (8) and cub's temporary
    storage, which holds an alternate copy of keys and values (4 + 8); 32 in all. From 2 to 127
    rows (``segmented_sort_pairs_by_full_sort``): two ``int2`` index-and-segment buffers
    (8 + 8), the sorted keys (4) and cub's alternates of keys and ``int2`` values (4 + 8); 44.

    >>> sort_bytes(1024), sort_bytes(48)
    (32, 44)
    """
    if rows == 1 or rows >= 128:
        return 4 + 8 + 8 + (4 + 8)
    return 4 + 8 + (8 + 8) + 4 + (4 + 8)


def forward_peak_bytes(spec: ModelSpec, tokens: int, tp: int, dtype_bytes: int = 2) -> int:
    """The profile forward's peak inside one decoder layer, per GPU.

    In the MLP (``vllm/model_executor/models/llama.py: LlamaMLP.forward``), while ``down_proj``
    writes its output, the layer holds the residual, the MLP's input, ``gate_up`` (``2 f / t``:
    still bound to its local name), the activation (``f / t``) and the output (``h``):
    ``3 h + 3 f / t`` per token (``2 f / t`` for an ungated MLP). Attention holds the residual,
    its input, ``qkv``, its output and ``o_proj``'s: ``3 h + (2 q + 2 kv) / t``. The larger is
    the peak.

    >>> from vrammath.model.presets import load_model
    >>> forward_peak_bytes(load_model("llama-3.1-8b"), 20000, 1) == 20000 * (3 * 4096 + 3 * 14336) * 2
    True
    """
    h, f = spec.hidden, spec.intermediate
    q = spec.heads * spec.head_dim
    kv = max(1, spec.kv_heads // tp) * spec.head_dim
    mlp = 3 * h + (3 if spec.gated_mlp else 2) * f // tp
    attn = 3 * h + (2 * q) // tp + 2 * kv
    return tokens * max(mlp, attn) * dtype_bytes


def sampler_peak_bytes(
    spec: ModelSpec, seqs: int, *, v0: bool, sampler: str = DEFAULT_SAMPLER, dtype_bytes: int = 2
) -> int:
    """The sampler's peak in the profile run: one row per request over the whole vocabulary
    (the logits are gathered), the model-dtype logits and the sampler's own tensors.

    V0: :data:`V0_SAMPLER_BYTES`, or its sort (below) where that is larger. V1 by ``sampler``:
    ``flashinfer`` :data:`V1_SAMPLER_BYTES`, ``triton`` :data:`V1_TRITON_BYTES`; ``pytorch``
    peaks inside ``logits.sort`` (``apply_top_k_top_p``: the profile asks for top-k and top-p),
    where the float32 logits (4) and :func:`sort_bytes` are alive. The scatter that follows
    holds less (4 + 4 + 8 + two masks + 4). These sizes are consistent with the memory the vLLM
    PRs that replaced the PyTorch path report for it (vllm-project/vllm #32558 and #33538, whose
    benchmarks count their inputs in their own ways); the published startup logs that print
    "FlashInfer is not available" check them in the budget.

    >>> from vrammath.model.presets import load_model
    >>> spec = load_model("llama-3.1-8b")
    >>> [sampler_peak_bytes(spec, 1024, v0=False, sampler=s) // (1024 * spec.vocab)
    ...  for s in SAMPLERS]
    [38, 10, 14]
    """
    if sampler not in SAMPLERS:
        raise one_of("sampler", sampler, SAMPLERS)
    in_sort = 4 + sort_bytes(seqs)
    if v0:
        per = max(V0_SAMPLER_BYTES, in_sort)
    elif sampler == "flashinfer":
        per = V1_SAMPLER_BYTES
    elif sampler == "triton":
        per = V1_TRITON_BYTES
    else:
        per = in_sort
    return seqs * spec.vocab * (dtype_bytes + per)


def rotary_cache_bytes(spec: ModelSpec, dtype_bytes: int = 2) -> int:
    """vLLM's rotary ``cos_sin_cache``: ``max_position_embeddings x rotary_dim`` in the model
    dtype, one per model (``get_rope`` shares it between layers); 0 for learned positions."""
    if spec.learned_positions:
        return 0
    rot = spec.attention.rotary_dim or spec.head_dim
    return spec.max_positions * rot * dtype_bytes


def loaded_weight_bytes(spec: ModelSpec, weights: str, *, tp: int, group: int) -> int:
    """What loading the model allocates on one GPU in vLLM and SGLang (``model_memory_usage``,
    SGLang's "mem usage"): the weights in their serving format, codes and quantization
    constants (:func:`~vrammath.serve.weights.serving_weight_bytes`), and the rotary cache.

    >>> from vrammath.model.presets import load_model
    >>> f'{loaded_weight_bytes(load_model("llama-3.1-8b"), "bf16", tp=1, group=128) / 2**30:.4f}'
    '14.9888'

    (vLLM prints "Model loading took 14.9888 GiB" for Llama-3.1-8B.)
    """
    served = serving_weight_bytes(spec, weights, tp=tp, group=group)
    return sum(served.values()) + rotary_cache_bytes(spec)


__all__ = [
    "DEFAULT_SAMPLER",
    "SAMPLERS",
    "V0_SAMPLER_BYTES",
    "V1_SAMPLER_BYTES",
    "V1_TRITON_BYTES",
    "forward_peak_bytes",
    "loaded_weight_bytes",
    "rotary_cache_bytes",
    "sampler_peak_bytes",
    "sort_bytes",
]
