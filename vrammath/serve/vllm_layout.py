"""How vLLM's V1 engine cuts its KV cache into blocks, and what it prints from the memory left.

Every attention layer stores ``page_bytes`` per block of ``block_size`` tokens (``2 x
block_size x kv_heads_per_gpu x head_dim x dtype``; one latent "head" under MLA). A model whose
layers all attend alike has one *KV-cache group*: ``num_blocks = available // page_bytes //
layers`` and ``GPU KV cache size = num_blocks x block_size``.

A model that mixes sliding-window and full layers (Gemma-2, Gemma-3, gpt-oss) has several
groups of equally many layers (``vllm/v1/core/kv_cache_utils.py:
_get_kv_cache_groups_uniform_page_size``, V1's hybrid KV-cache manager from 0.9.2). The group
size is the count of the rarer kind, or of the commoner one when it is less than 1.5 times the
rarer; each kind is split into ``ceil(count / group_size)`` groups, the last one padded ("Add N
padding layers, may waste at most X% KV cache memory"). One layer of every group shares a
memory pool, so ``num_blocks = available // page_bytes // group_size``
(``get_kv_cache_config_from_groups``), and the tokens printed are ``num_blocks // groups x
block_size`` (``_report_kv_cache_config``). A request holds ``ceil(max_model_len /
block_size)`` blocks in each full group and, in each sliding group, ``ceil(min(window - 1 +
max_num_batched_tokens, max_model_len) / block_size) + 1`` (``SlidingWindowSpec.
max_memory_usage_bytes``); the concurrency is ``num_blocks`` over their sum
(``get_max_concurrency_for_kv_cache_config``). vLLM starts when the layers' own needs, layer by
layer, fit the memory (``check_enough_kv_cache_memory``), and otherwise names the longest
``max_model_len`` that does (``estimate_max_model_len``, a bisection).
``--disable-hybrid-kv-cache-manager`` makes every sliding layer a full one
(``unify_hybrid_kv_cache_specs``).

Gemma-3-27B's text layers (52 sliding, window 1024, and 10 full) at ``max_model_len`` 4096 with
the 109.86 GiB a published vLLM 0.11 log printed as available:

>>> from vrammath.model.presets import load_model
>>> lay = kv_layout(load_model("gemma-3-27b-text"), "bf16", tp=1, block=16, windowed=True)
>>> lay.group_size, lay.full_groups, lay.window_groups, lay.padding_lines()
(10, 1, 6, ['Add 8 padding layers, may waste at most 15.38% KV cache memory'])
>>> avail = int(109.86 * 2**30)
>>> f"{lay.tokens(avail):,}", f"{lay.concurrency(avail, 4096, 8192):.2f}"
('205,696', '50.05')

(The log: "GPU KV cache size: 205,696 tokens", "Maximum concurrency for 4,096 tokens per
request: 50.05x".)
"""

from __future__ import annotations

from dataclasses import dataclass

from vrammath.model.spec import ModelSpec
from vrammath.serve.kv_cache import kv_bytes_per_token


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def group_size(counts: tuple[int, ...]) -> int:
    """Layers per KV-cache group for layer kinds of these counts: the rarer kind's count, or
    the commoner's when it is under 1.5 times the rarer (``_get_kv_cache_groups_uniform_page_size``).

    >>> group_size((21, 21)), group_size((10, 52)), group_size((12, 13))
    (21, 10, 13)
    """
    lo, hi = min(counts), max(counts)
    return hi if hi < lo * 1.5 else lo


@dataclass(frozen=True)
class KvLayout:
    """The blocks of vLLM's KV cache on one GPU: the page of one layer, the layers of each kind
    and how they group."""

    page_bytes: int
    block_size: int
    full_layers: int
    window_layers: int
    #: the sliding window in tokens, None without sliding layers
    window: int | None
    group_size: int
    full_groups: int
    window_groups: int

    @property
    def groups(self) -> int:
        """KV-cache groups (1 unless the model mixes layer kinds)."""
        return self.full_groups + self.window_groups

    def window_blocks(self, max_model_len: int, step_tokens: int) -> int:
        """Blocks one request holds in a sliding group: its window plus one step's tokens, and
        one block more (``SlidingWindowSpec.max_memory_usage_bytes``)."""
        if self.window is None:
            return 0
        return _cdiv(min(self.window - 1 + step_tokens, max_model_len), self.block_size) + 1

    def num_blocks(self, available: int) -> int:
        """Blocks in every group's share of the memory."""
        return max(available // self.page_bytes // self.group_size, 0)

    def tokens(self, available: int) -> int:
        """What vLLM prints as ``GPU KV cache size``."""
        return self.num_blocks(available) // self.groups * self.block_size

    def blocks_per_request(self, max_model_len: int, step_tokens: int) -> int:
        """Blocks one request of ``max_model_len`` tokens takes across the groups."""
        full = _cdiv(max_model_len, self.block_size)
        return self.full_groups * full + self.window_groups * self.window_blocks(
            max_model_len, step_tokens
        )

    def concurrency(self, available: int, max_model_len: int, step_tokens: int) -> float:
        """Requests of ``max_model_len`` tokens the cache holds at once, in whole blocks."""
        return self.num_blocks(available) / self.blocks_per_request(max_model_len, step_tokens)

    def needed_bytes(self, max_model_len: int, step_tokens: int) -> int:
        """What one request of ``max_model_len`` tokens needs, layer by layer."""
        full = self.full_layers * _cdiv(max_model_len, self.block_size)
        window = self.window_layers * self.window_blocks(max_model_len, step_tokens)
        return self.page_bytes * (full + window)

    def largest_len(self, available: int, step_tokens: int, limit: int) -> int:
        """The longest ``max_model_len`` (at most ``limit``) whose one request fits, 0 if
        none does."""
        lo, hi = 0, limit
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.needed_bytes(mid, step_tokens) <= available:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def padding_lines(self) -> list[str]:
        """vLLM's warning for each kind of layer its groups pad."""
        out = []
        for count in (self.full_layers, self.window_layers):
            pad = self.group_size - count % self.group_size
            if self.groups > 1 and count and pad != self.group_size:
                out.append(
                    f"Add {pad} padding layers, may waste at most {pad / count * 100:.2f}% KV "
                    "cache memory"
                )
        return out


def kv_layout(spec: ModelSpec, kv_dtype: str, *, tp: int, block: int, windowed: bool) -> KvLayout:
    """``spec``'s KV-cache layout in vLLM (``windowed``: its sliding layers keep only their
    window, V1's rule; without it every layer counts as full, as in V0 and, for a model that
    mixes kinds, under ``--disable-hybrid-kv-cache-manager``)."""
    page = kv_bytes_per_token(spec, kv_dtype, tp=tp) // spec.layers * block
    window = spec.sliding_window if windowed else None
    sliding = spec.attention.window_layers if window is not None else 0
    full = spec.layers - sliding
    counts = tuple(n for n in (full, sliding) if n)
    size = group_size(counts)
    return KvLayout(
        page_bytes=page,
        block_size=block,
        full_layers=full,
        window_layers=sliding,
        window=window,
        group_size=size,
        full_groups=_cdiv(full, size),
        window_groups=_cdiv(sliding, size),
    )


__all__ = ["KvLayout", "group_size", "kv_layout"]
