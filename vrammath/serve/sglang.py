"""SGLang's KV-cache budget at startup: the tokens it prints, and how its static fraction works.

SGLang runs no profile forward. It measures the memory free on the GPU after the CUDA context
and the distributed init, loads the weights, and keeps ``mem_fraction_static`` of that first
figure for the weights and the KV cache together
(``python/sglang/srt/model_executor/model_runner.py: ModelRunner.profile_max_num_token``, 0.4;
``model_runner_kv_cache_mixin.py`` in 0.5, the same rule)::

    rest   = free_after_load - free_before_load * (1 - mem_fraction_static)
           = mem_fraction_static * free_before_load - weights
    tokens = int(rest // cell_size) // page_size * page_size

``cell_size`` is one token's keys and values over all layers on one GPU, ``2 L a_kv/t d B_kv``
(``max(1, a_kv // t)`` heads), or ``L (r_kv + d_r) B_kv`` under latent attention: the same
bytes per token as :func:`~vrammath.serve.kv_cache.kv_bytes_per_token`. What the fraction leaves
over (CUDA graphs, activations, the allocator) is SGLang's headroom, not subtracted.

``free_before_load`` is the card's total as torch reports it (the GPU preset's
``usable_bytes``) less the CUDA context (the preset's ``context_bytes``) and what the
distributed init takes (``conf/serving.toml``). The default ``mem_fraction_static`` of 0.4 is a
table by GPU size and tensor-parallel degree (``server_args.py: ServerArgs.__post_init__``,
``gpu_mem`` being nvidia-smi's total in MiB); 0.5 derives it from settings (piecewise CUDA
graphs among them) that are not modelled, so there it must be given.

Examples
========

>>> from vrammath.model.presets import load_model
>>> from vrammath.serve.estimate import Serve
>>> b = sglang_budget(Serve(load_model("llama-3.1-8b"), gpu="H100-80GB"))
>>> b.mem_fraction_static, f"{b.tokens:,}"
(0.88, '444,938')
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vrammath.model.presets import GPU, gpu
from vrammath.notation.errors import InputError
from vrammath.notation.fields import MAX_COUNT, MAX_TOKENS, check_bounds, declared
from vrammath.serve.estimate import Serve
from vrammath.serve.kv_cache import kv_bytes_per_token
from vrammath.serve.profile import loaded_weight_bytes
from vrammath.serve.vllm import GiB, runtime_constants

#: The SGLang release a plain ``--engine sglang`` follows.
SGLANG_DEFAULT = "0.4.6"


def default_fraction(card: GPU, tp: int) -> float:
    """SGLang 0.4's default ``mem_fraction_static`` for ``tp`` GPUs of ``card``
    (``ServerArgs.__post_init__``: a table by nvidia-smi's total in MiB and the tensor-parallel
    degree, for cards of up to 80 GiB; above that its rule is not modelled here and the fraction
    must be given).

    >>> from vrammath.model.presets import gpu
    >>> default_fraction(gpu("H100-80GB"), 1), default_fraction(gpu("A100-40GB"), 8)
    (0.88, 0.81)
    """
    if card.bytes > 81920 * 2**20:
        raise InputError(
            "mem_fraction_static",
            f"is needed on {card.name} (SGLang's default above 80 GiB is not modelled; SGLang "
            "prints it in server_args)",
        )
    for size, value in ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87)):
        if tp >= size:
            return value
    return 0.88


@dataclass(frozen=True)
class Sglang:
    """SGLang's own flags that change its KV budget (``None``: the release's default)."""

    sglang_version: str = declared(
        SGLANG_DEFAULT,
        "--sglang-version",
        "the SGLang release followed (0.4 or 0.5; default {default})",
    )
    mem_fraction_static: float | None = declared(
        None,
        "--mem-fraction-static",
        "fraction of the memory free before the weights load kept for weights + KV cache "
        "(default: SGLang 0.4's table by GPU size and tensor-parallel degree; needed for 0.5)",
        kind="fraction",
    )
    context_length: int | None = declared(
        None,
        "--context-length",
        f"tokens per request (1..{MAX_TOKENS}; default the model's max_position_embeddings)",
        low=1,
        high=MAX_TOKENS,
    )
    page_size: int = declared(
        1, "--page-size", f"tokens per page (1..{MAX_COUNT}; default 1)", low=1, high=MAX_COUNT
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        match = re.fullmatch(r"v?0\.([45])(?:[-.+a-z0-9].*)?", str(self.sglang_version).strip())
        if match is None:
            raise InputError(
                "sglang_version", "must be a 0.4 or 0.5 release, e.g. 0.4.6", self.sglang_version
            )
        if self.minor == 5 and self.mem_fraction_static is None:
            raise InputError(
                "mem_fraction_static",
                "is needed with SGLang 0.5 (its default depends on settings not modelled; "
                "SGLang prints it in server_args)",
            )
        u = self.mem_fraction_static
        if u is not None and (
            isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1
        ):
            raise InputError("mem_fraction_static", "must be a number in (0, 1]", u)

    @property
    def minor(self) -> int:
        """The 0.x release line, 4 or 5."""
        return 5 if str(self.sglang_version).strip().lstrip("v").startswith("0.5") else 4


@dataclass(frozen=True)
class SglangBudget:
    """SGLang's startup budget on one GPU, its parts, and what the server prints."""

    version: str
    total_bytes: int
    total_measured: bool
    free_before_bytes: int
    weights_bytes: int
    mem_fraction_static: float
    cell_bytes: int
    page_size: int
    context_len: int

    @property
    def rest_bytes(self) -> float:
        """The KV cache's share, ``mem_fraction_static x free_before - weights``."""
        return self.mem_fraction_static * self.free_before_bytes - self.weights_bytes

    @property
    def tokens(self) -> int:
        """Tokens of KV cache per GPU (``max_total_num_tokens``), whole pages."""
        if self.rest_bytes <= 0:
            return 0
        return int(self.rest_bytes // self.cell_bytes) // self.page_size * self.page_size

    @property
    def kv_tokens(self) -> int:
        """The same as :attr:`tokens` (the name vLLM's budget uses)."""
        return self.tokens

    @property
    def available_bytes(self) -> int:
        """The KV cache's share in bytes, 0 when the weights take it all."""
        return int(max(self.rest_bytes, 0))

    @property
    def starts(self) -> bool:
        """Whether SGLang starts (it refuses when no token fits)."""
        return self.tokens > 0

    @property
    def max_running_requests(self) -> int:
        """SGLang 0.4's default ``max_running_requests`` for that many tokens."""
        return min(max(int(self.tokens / self.context_len * 512), 2048), 4096)

    def lines(self) -> list[str]:
        """The server's own startup lines, as it would print them."""
        after = (self.free_before_bytes - self.weights_bytes) / GiB
        out = [f"Load weight begin. avail mem={self.free_before_bytes / GiB:.2f} GB"]
        if after <= 0:
            need = self.weights_bytes / GiB
            return [*out, f"torch.OutOfMemoryError while loading the weights ({need:.2f} GB)"]
        out.append(
            f"Load weight end. avail mem={after:.2f} GB, mem usage={self.weights_bytes / GiB:.2f} GB."
        )
        if self.tokens <= 0:
            return [
                *out,
                "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.",
            ]
        half = (self.tokens + self.page_size) * self.cell_bytes / 2 / GiB
        return [
            *out,
            f"KV Cache is allocated. #tokens: {self.tokens}, K size: {half:.2f} GB, V size: {half:.2f} GB",
            f"max_total_num_tokens={self.tokens}, max_running_requests={self.max_running_requests}, "
            f"context_len={self.context_len}",
        ]

    def as_dict(self) -> dict[str, object]:
        """Machine-readable form (bytes as integers)."""
        return {
            "engine": "sglang",
            "version": self.version,
            "total_bytes": self.total_bytes,
            "total_measured": self.total_measured,
            "free_before_load_bytes": self.free_before_bytes,
            "weights_bytes": self.weights_bytes,
            "mem_fraction_static": self.mem_fraction_static,
            "kv_bytes": self.available_bytes,
            "cell_bytes": self.cell_bytes,
            "page_size": self.page_size,
            "max_total_num_tokens": self.tokens,
            "context_len": self.context_len,
            "lines": self.lines(),
        }


def sglang_budget(
    setup: Serve, flags: Sglang | None = None, *, total_bytes: int | None = None
) -> SglangBudget:
    """SGLang's startup KV budget for ``setup`` on its GPU (``setup.gpu`` is required)."""
    flags = flags or Sglang()
    spec = setup.model
    if setup.gpu is None:
        raise InputError(
            "gpu", "is needed by --engine sglang (its budget is a fraction of the GPU)"
        )
    if setup.weights not in ("bf16", "fp16", "int4"):
        raise InputError(
            "weights", "must be bf16, fp16 or int4 (GPTQ/AWQ) with --engine sglang", setup.weights
        )
    if spec.sliding_window is not None:
        raise InputError(
            "model",
            "sliding-window layers (SGLang's SWA pools) are not modelled by --engine sglang",
            spec.name,
        )
    card = gpu(setup.gpu)
    total = card.usable if total_bytes is None else total_bytes
    init = runtime_constants()["sglang_init_tp" if setup.tp > 1 else "sglang_init"]
    mfs = flags.mem_fraction_static
    return SglangBudget(
        version=flags.sglang_version,
        total_bytes=total,
        total_measured=total_bytes is not None or card.usable_bytes > 0,
        free_before_bytes=total - card.context_bytes - round(init * GiB),
        weights_bytes=loaded_weight_bytes(spec, setup.weights, tp=setup.tp, group=setup.group),
        mem_fraction_static=default_fraction(card, setup.tp) if mfs is None else float(mfs),
        cell_bytes=kv_bytes_per_token(spec, setup.kv_dtype, tp=setup.tp),
        page_size=flags.page_size,
        context_len=flags.context_length or spec.max_positions,
    )


__all__ = ["SGLANG_DEFAULT", "Sglang", "SglangBudget", "default_fraction", "sglang_budget"]
