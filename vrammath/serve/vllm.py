"""vLLM's KV-cache budget at startup: the tokens, blocks and concurrency it prints.

vLLM sizes its KV cache once, at startup, from a profile run. From 0.6.4 to 0.33, in the V0
engine (``vllm/worker/worker.py: Worker.determine_num_available_blocks``) and in V1 from 0.9.2
(``vllm/v1/worker/gpu_worker.py: Worker.determine_available_memory``), the rule is::

    available = util * total - (weights + activation_peak + non_torch [+ cuda_graphs])

* ``total`` is what ``torch.cuda.mem_get_info`` reports as the card's total (less than
  nvidia-smi's figure on data-centre cards; the GPU preset's ``usable_bytes``), ``util`` is
  ``--gpu-memory-utilization`` (0.90 up to 0.19, 0.92 from 0.20: ``vllm/config/cache.py``).
* ``weights`` is what loading the model allocated (``model_memory_usage``): the parameters and
  the rotary ``cos_sin_cache`` (``max_position_embeddings x rotary_dim`` in the model dtype,
  ``vllm/model_executor/layers/rotary_embedding.py``).
* ``activation_peak`` is the rise of PyTorch's peak during the profile run
  (``profile_run``): a forward over ``max_num_batched_tokens`` tokens split into
  ``min(max_num_seqs, tokens)`` requests, then the sampler over one row per request
  (:func:`~vrammath.serve.profile.forward_peak_bytes`,
  :func:`~vrammath.serve.profile.sampler_peak_bytes`; the defaults in
  ``_profile_shape``). The sampler's top-k/top-p path (``--sampler``: the PyTorch sort,
  FlashInfer or Triton) sets its size; a log says which it ran.
* ``non_torch`` is memory outside PyTorch's allocator seen by the profile
  (``vllm/utils: memory_profiling`` from 0.6.5; in 0.6.4 everything the GPU holds outside
  torch): kernels loaded lazily, library handles, NCCL and, under tensor parallelism, the
  custom all-reduce's buffers (``--disable-custom-all-reduce``, or no P2P, drops them). No
  model term derives it: it is a measured constant (``conf/serving.toml``).
* ``cuda_graphs``: from 0.20 on, ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS`` defaults to 1 and
  the graphs' estimated memory is subtracted too (``profile_cudagraph_memory``); a measured
  constant as well.

Then ``num_blocks = available // page_bytes // layers`` with ``page_bytes = 2 x block_size x
kv_heads_per_gpu x head_dim x dtype`` per layer (``vllm/v1/kv_cache_interface.py:
AttentionSpec.page_size_bytes``; one latent "head" of ``kv_lora_rank + qk_rope_head_dim`` and no
factor 2 under MLA; V0's ``CacheEngine.get_cache_block_size`` is the same over all layers). V1
prints ``GPU KV cache size: {num_blocks x block_size:,} tokens`` and ``Maximum concurrency for
{max_model_len:,} tokens per request: {x:.2f}x``, ``x = num_blocks / blocks_per_request`` from
0.11 (``vllm/v1/core/kv_cache_utils.py: get_max_concurrency_for_kv_cache_config``; a sliding
window's request holds ``ceil(min(window - 1 + max_num_batched_tokens, max_model_len) /
block_size) + 1`` blocks) and tokens over ``max_model_len`` before; V0 prints ``# GPU blocks``
(``# cuda blocks`` from 0.7). Both refuse to start when one request of ``max_model_len`` tokens
does not fit (``check_enough_kv_cache_memory``, ``raise_if_cache_size_invalid``).

A model that mixes sliding-window and full layers gets V1's KV-cache groups
(:mod:`vrammath.serve.vllm_layout`). What is not modelled is refused by name: releases before
0.6.4 and V1 before 0.9.2 (other budget rules), 0.34 and later (the cache is sized after
CUDA-graph capture), mixed sliding and full layers under V0, mixture-of-experts layers (the
fused-MoE kernels' buffers in the profile run), bitsandbytes, int8 and MXFP4 weights (vLLM's loaders for
them). GPTQ/AWQ int4 weights are the packed codes and their group scales and zero points; fp8
checkpoints one byte per weight and their scales (:mod:`vrammath.serve.weights`). With fp8
weights the profile run also quantizes each linear's input to fp8 (a byte per element, with
per-token scales, alive beside the 16-bit input): at most the largest linear input's bytes over
the profile's tokens, some 0.03 GiB for an 8B model at 2,048 tokens, which the forward's peak
here leaves out.

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.serve.estimate import Serve
>>> b = vllm_budget(Serve(load_model("llama-3.1-8b"), gpu="H100-80GB"), Vllm(max_model_len=32768))
>>> b.profile_tokens, b.profile_seqs, f"{b.kv_tokens:,}", round(b.max_concurrency, 2)
(8192, 1024, '421,824', 12.87)
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from functools import cache

from vrammath.model.presets import GPU, conf_dir, gpu
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.notation.fields import MAX_TOKENS
from vrammath.serve.estimate import Serve
from vrammath.serve.profile import (
    DEFAULT_SAMPLER,
    forward_peak_bytes,
    loaded_weight_bytes,
    sampler_peak_bytes,
)
from vrammath.serve.vllm_flags import (
    V1_FROM,
    VLLM_DEFAULT,
    VLLM_RANGE,
    VLLM_WEIGHTS,
    Vllm,
)
from vrammath.serve.vllm_flags import version_tuple as _version
from vrammath.serve.vllm_layout import KvLayout, kv_layout

GiB = 2**30


@cache
def runtime_constants() -> dict[str, float]:
    """The measured constants of ``conf/serving.toml`` (GiB), by name: vLLM's as named there,
    SGLang's prefixed ``sglang_``."""
    data = tomllib.loads((conf_dir() / "serving.toml").read_text(encoding="utf-8"))
    out = {k: float(v["gib"]) for k, v in data["vllm"].items()}
    out.update({f"sglang_{k}": float(v["gib"]) for k, v in data["sglang"].items()})
    return out


@dataclass(frozen=True)
class VllmBudget:
    """vLLM's startup budget on one GPU, its parts, and what the engine prints."""

    version: str
    engine_v0: bool
    total_bytes: int
    total_measured: bool
    utilization: float
    weights_bytes: int
    forward_peak_bytes: int
    sampler_peak_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    layout: KvLayout
    layers: int
    max_model_len: int
    profile_tokens: int
    profile_seqs: int
    #: the profile run's sampler (``v0`` or the V1 top-k/top-p path)
    sampler: str = "pytorch"
    #: the ``conf/serving.toml`` constant taken for the memory outside torch
    non_torch_key: str = "non_torch"

    @property
    def activation_peak_bytes(self) -> int:
        """The profile run's peak above the weights, the larger of forward and sampler."""
        return max(self.forward_peak_bytes, self.sampler_peak_bytes)

    @property
    def requested_bytes(self) -> float:
        """What vLLM may use, ``util x total``."""
        return self.total_bytes * self.utilization

    @property
    def available_bytes(self) -> int:
        """What is left for the KV cache (``available_kv_cache_memory``)."""
        rest = self.weights_bytes + self.activation_peak_bytes
        return int(self.requested_bytes - (rest + self.non_torch_bytes + self.cuda_graph_bytes))

    @property
    def page_bytes(self) -> int:
        """One block of one layer."""
        return self.layout.page_bytes

    @property
    def block_size(self) -> int:
        """Tokens per block."""
        return self.layout.block_size

    @property
    def num_blocks(self) -> int:
        """Blocks in every KV-cache group's share (every layer's, for one group)."""
        return self.layout.num_blocks(self.available_bytes)

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache on each GPU (V1's ``GPU KV cache size``)."""
        return self.layout.tokens(self.available_bytes)

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request of ``max_model_len`` tokens takes, over the groups."""
        return self.layout.blocks_per_request(self.max_model_len, self.profile_tokens)

    @property
    def rule(self) -> str:
        """The releases whose rule this answer follows, as one phrase."""
        v = _version(self.version)
        if self.engine_v0:
            return "V0 of 0.6.4" if v < (0, 6, 5) else "V0 of 0.6.5 to 0.10"
        if v < (0, 11, 0):
            return "V1 of 0.9.2 to 0.10"
        return "V1 of 0.11 to 0.19" if v < (0, 20, 0) else "V1 of 0.20 to 0.33"

    @property
    def whole_blocks(self) -> bool:
        """Concurrency in whole blocks per request (V1 from 0.11), else in tokens."""
        return not self.engine_v0 and _version(self.version) >= (0, 11, 0)

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` tokens the cache holds at once."""
        if self.whole_blocks:
            return self.num_blocks / self.blocks_per_request
        return self.kv_tokens / self.max_model_len

    @property
    def starts(self) -> bool:
        """Whether vLLM starts (it refuses when one request of ``max_model_len`` does not fit)."""
        if self.engine_v0:
            return self.num_blocks > 0 and self.kv_tokens >= self.max_model_len
        needed = self.layout.needed_bytes(self.max_model_len, self.profile_tokens)
        return self.available_bytes > 0 and needed <= self.available_bytes

    @property
    def largest_max_model_len(self) -> int:
        """The longest ``--max-model-len`` whose one request still fits (whole blocks; a
        bisection over the layers' needs where sliding and full layers mix)."""
        if self.layout.groups == 1:
            return self.kv_tokens
        return self.layout.largest_len(self.available_bytes, self.profile_tokens, MAX_TOKENS)

    def lines(self) -> list[str]:
        """The engine's own startup lines, as it would print them."""
        if self.weights_bytes >= self.total_bytes:
            w, t = self.weights_bytes / GiB, self.total_bytes / GiB
            return [
                f"torch.OutOfMemoryError while loading the weights ({w:.2f} GiB, {t:.2f} GiB GPU)"
            ]
        if self.available_bytes <= 0 or self.num_blocks == 0:
            return [
                "No available memory for the cache blocks. Try increasing "
                "`gpu_memory_utilization` when initializing the engine."
            ]
        if self.engine_v0:
            return self._v0_lines()
        out = [
            f"Available KV cache memory: {self.available_bytes / GiB:.2f} GiB",
            *self.layout.padding_lines(),
            f"GPU KV cache size: {self.kv_tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: "
            f"{self.max_concurrency:.2f}x",
        ]
        if not self.starts:
            needed = self.layout.needed_bytes(self.max_model_len, self.profile_tokens)
            out.append(
                f"ValueError: To serve at least one request with the models's max seq len "
                f"({self.max_model_len}), ({needed / GiB:.2f} GiB KV cache is needed, which is "
                f"larger than the available KV cache memory ({self.available_bytes / GiB:.2f} "
                f"GiB). Based on the available memory, the estimated maximum model length is "
                f"{self.largest_max_model_len}."
            )
        return out

    def _v0_lines(self) -> list[str]:
        device = "GPU" if _version(self.version) < (0, 7, 0) else "cuda"
        cpu_blocks = 4 * GiB // (self.page_bytes * self.layers)  # swap_space 4 GiB
        out = [
            f"the current vLLM instance can use total_gpu_memory ({self.total_bytes / GiB:.2f}GiB)"
            f" x gpu_memory_utilization ({self.utilization:.2f}) = "
            f"{self.requested_bytes / GiB:.2f}GiB",
            f"model weights take {self.weights_bytes / GiB:.2f}GiB; non_torch_memory takes "
            f"{self.non_torch_bytes / GiB:.2f}GiB; PyTorch activation peak memory takes "
            f"{self.activation_peak_bytes / GiB:.2f}GiB; the rest of the memory reserved for KV "
            f"Cache is {self.available_bytes / GiB:.2f}GiB.",
            f"# {device} blocks: {self.num_blocks}, # CPU blocks: {cpu_blocks}",
            f"Maximum concurrency for {self.max_model_len} tokens per request: "
            f"{self.max_concurrency:.2f}x",
        ]
        if not self.starts:
            out.append(
                f"ValueError: The model's max seq len ({self.max_model_len}) is larger than the "
                f"maximum number of tokens that can be stored in KV cache ({self.kv_tokens}). "
                "Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
                "initializing the engine."
            )
        return out

    def as_dict(self) -> dict[str, object]:
        """Machine-readable form (bytes as integers)."""
        return {
            "engine": "vllm",
            "version": self.version,
            "rule": self.rule,
            "v0": self.engine_v0,
            "total_bytes": self.total_bytes,
            "total_measured": self.total_measured,
            "gpu_memory_utilization": self.utilization,
            "requested_bytes": math.floor(self.requested_bytes),
            "weights_bytes": self.weights_bytes,
            "activation_peak_bytes": self.activation_peak_bytes,
            "forward_peak_bytes": self.forward_peak_bytes,
            "sampler_peak_bytes": self.sampler_peak_bytes,
            "non_torch_bytes": self.non_torch_bytes,
            "non_torch_constant": self.non_torch_key,
            "cuda_graph_bytes": self.cuda_graph_bytes,
            "available_kv_bytes": self.available_bytes,
            "page_bytes_per_layer": self.page_bytes,
            "kv_cache_groups": self.layout.groups,
            "layers_per_group": self.layout.group_size,
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "kv_tokens": self.kv_tokens,
            "max_model_len": self.max_model_len,
            "blocks_per_request": self.blocks_per_request,
            "max_concurrency": self.max_concurrency,
            "starts": self.starts,
            "largest_max_model_len": self.largest_max_model_len,
            "profile_tokens": self.profile_tokens,
            "profile_seqs": self.profile_seqs,
            "sampler": self.sampler,
            "lines": self.lines(),
        }


def _refuse_unmodelled(spec: ModelSpec, flags: Vllm) -> None:
    if spec.experts is not None:
        raise InputError(
            "model",
            "vLLM's profile run of a mixture-of-experts layer (fused-MoE buffers) is not "
            "modelled by --engine vllm",
            spec.name,
        )
    if _mixed(spec) and flags.engine_v0:
        raise InputError(
            "model",
            "sliding-window and full layers in vLLM's V0 engine (which caps or drops the "
            "window by model) are not modelled: V1 groups them (0.9.2 on)",
            spec.name,
        )


def keeps_windows(spec: ModelSpec, flags: Vllm) -> bool:
    """Whether vLLM keeps only the window of ``spec``'s sliding layers: V1 does (V0 holds every
    token), except for a model that mixes kinds under ``--disable-hybrid-kv-cache-manager``."""
    return not flags.engine_v0 and not (_mixed(spec) and flags.disable_hybrid_kv_cache_manager)


def _mixed(spec: ModelSpec) -> bool:
    """Whether ``spec`` mixes sliding-window and full layers."""
    return spec.sliding_window is not None and spec.attention.window_layers != spec.layers


def big_card(card: GPU, total: int) -> bool:
    """vLLM's larger defaults: 70 GiB or more and not an A100 (``EngineArgs``'s batch defaults)."""
    return total >= 70 * GiB and "a100" not in card.label.lower()


def _profile_shape(flags: Vllm, big: bool, max_len: int) -> tuple[int, int]:
    """``(max_num_batched_tokens, requests)`` of the profile run, the release's defaults filled."""
    if flags.engine_v0:
        seqs = flags.max_num_seqs or 256
        chunked = max_len > 32768  # V0 turns chunked prefill on by itself past 32K
        chunk = 512 if flags.release < (0, 7, 0) else 2048
        tokens = flags.max_num_batched_tokens or (chunk if chunked else max(max_len, 2048))
    else:
        seqs = flags.max_num_seqs or (1024 if big else 256)
        default = (16384 if flags.offline else 8192) if big else (8192 if flags.offline else 2048)
        tokens = flags.max_num_batched_tokens or default
    return tokens, min(seqs, tokens)


def _non_torch_key(flags: Vllm, tp: int) -> str:
    if flags.release < (0, 6, 5):
        return "non_torch_whole_gpu"
    if tp == 1:
        return "non_torch"
    return "non_torch_tp_plain" if flags.disable_custom_all_reduce else "non_torch_tp"


def vllm_budget(
    setup: Serve, flags: Vllm | None = None, *, total_bytes: int | None = None
) -> VllmBudget:
    """vLLM's startup KV budget for ``setup`` on its GPU (``setup.gpu`` is required).

    ``total_bytes``: the card's total as torch reports it on the machine at hand (default: the
    preset's measured usable size, else its nominal size, which the budget then flags).
    """
    flags = flags or Vllm()
    spec = setup.model
    if setup.gpu is None:
        raise InputError("gpu", "is needed by --engine vllm (its budget is a fraction of the GPU)")
    if setup.weights not in VLLM_WEIGHTS:
        raise InputError(
            "weights",
            f"with --engine vllm must be one of {', '.join(VLLM_WEIGHTS)} (its bitsandbytes, "
            "int8 and MXFP4 loaders are not modelled)",
            setup.weights,
        )
    if setup.block is None:
        raise InputError("block", "vLLM's cache is paged: --no-paging is not read by --engine vllm")
    _refuse_unmodelled(spec, flags)
    card = gpu(setup.gpu)
    total = card.usable if total_bytes is None else total_bytes
    util = flags.gpu_memory_utilization
    if util is None:
        util = 0.92 if flags.release >= (0, 20, 0) else 0.90
    max_len = flags.max_model_len or spec.max_positions
    tokens, seqs = _profile_shape(flags, big_card(card, total), max_len)
    const = runtime_constants()
    non_torch = _non_torch_key(flags, setup.tp)
    graphs = 0
    if not flags.engine_v0 and flags.release >= (0, 20, 0) and not flags.enforce_eager:
        graphs = round(const["cuda_graphs"] * GiB)
    layout = kv_layout(
        spec, setup.kv_dtype, tp=setup.tp, block=setup.block, windowed=keeps_windows(spec, flags)
    )
    return VllmBudget(
        version=flags.version,
        engine_v0=flags.engine_v0,
        total_bytes=total,
        total_measured=total_bytes is not None or card.usable_bytes > 0,
        utilization=util,
        weights_bytes=loaded_weight_bytes(spec, setup.weights, tp=setup.tp, group=setup.group),
        forward_peak_bytes=forward_peak_bytes(spec, tokens, setup.tp),
        sampler_peak_bytes=sampler_peak_bytes(
            spec, seqs, v0=flags.engine_v0, sampler=flags.sampler or DEFAULT_SAMPLER
        ),
        sampler=flags.sampler_path,
        non_torch_bytes=round(const[non_torch] * GiB),
        non_torch_key=non_torch,
        cuda_graph_bytes=graphs,
        layout=layout,
        layers=spec.layers,
        max_model_len=max_len,
        profile_tokens=tokens,
        profile_seqs=seqs,
    )


__all__ = [
    "V1_FROM",
    "VLLM_DEFAULT",
    "VLLM_RANGE",
    "Vllm",
    "VllmBudget",
    "big_card",
    "keeps_windows",
    "runtime_constants",
    "vllm_budget",
]
