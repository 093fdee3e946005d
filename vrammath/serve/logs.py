"""vrammath's answer beside a serving engine's published startup log.

A row of ``validation/serving-logs.json`` names a published vLLM or SGLang startup log: its
source, the model (a preset, with the fields its published config differs in), the release, the
GPU, the flags and what the engine printed. :func:`compare_log` evaluates the engine's budget
(:func:`~vrammath.serve.vllm.vllm_budget`, :func:`~vrammath.serve.sglang.sglang_budget`) for it
and returns both, with the error; a row vrammath cannot express keeps the reason (vrammath's own
refusal, or why no preset fits). Pure: the caller reads the file.

>>> row = {"id": "x", "engine": "vllm", "source": "s", "model": "m", "preset": "llama-3.1-8b",
...        "version": "0.17.1", "gpu_preset": "A100-80GB", "tp": 1,
...        "flags": {"max_model_len": 32768}, "printed": {"kv_tokens": 457024}}
>>> c = compare_log(row)
>>> c.predicted_tokens, f"{c.error:+.2%}"
(450096, '-1.52%')
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from vrammath.model.presets import load_model
from vrammath.model.spec import ModelSpec
from vrammath.notation.errors import InputError
from vrammath.serve.estimate import Serve
from vrammath.serve.kv_cache import kv_bytes_per_token
from vrammath.serve.sglang import Sglang, SglangBudget, sglang_budget
from vrammath.serve.vllm import GiB, Vllm, VllmBudget, keeps_windows, vllm_budget
from vrammath.serve.vllm_layout import kv_layout

#: config fields a row may set where the published config differs from the preset's
OVERRIDES = ("max_position_embeddings",)


@dataclass(frozen=True)
class LogComparison:
    """One published startup log and vrammath's answer for it."""

    row: dict[str, Any]
    budget: VllmBudget | SglangBudget | None
    reason: str | None

    @property
    def printed_tokens(self) -> int | None:
        """KV tokens the engine printed (blocks x block size for V0)."""
        value = self.row["printed"].get("kv_tokens")
        return None if value is None else int(value)

    @property
    def predicted_tokens(self) -> int | None:
        """vrammath's KV tokens, None where the row is not expressible."""
        return None if self.budget is None else self.budget.kv_tokens

    @property
    def printed_kv_gib(self) -> float | None:
        """The KV memory the engine printed (GiB, two decimals)."""
        p = self.row["printed"]
        value = p.get("available_kv_gib", p.get("kv_cache_gib"))
        return None if value is None else float(value)

    @property
    def error(self) -> float | None:
        """Relative error on KV tokens, else on the KV memory; None if not expressible."""
        if self.budget is None:
            return None
        if self.printed_tokens:
            return self.budget.kv_tokens / self.printed_tokens - 1
        if self.printed_kv_gib:
            return self.budget.available_bytes / GiB / self.printed_kv_gib - 1
        return None

    @property
    def weights_error(self) -> float | None:
        """Relative error on the weights the engine printed."""
        printed = self.row["printed"].get("weights_gib")
        if self.budget is None or printed is None:
            return None
        return self.budget.weights_bytes / GiB / float(printed) - 1


def sglang_rule_tokens(row: dict[str, Any]) -> int | None:
    """SGLang's rule applied to the log's own printed figures (the memory free before and after
    the weights load, ``mem_fraction_static``) and vrammath's bytes per token: the tokens SGLang
    should print, whatever the GPU; None where the log lacks a figure or the model a preset."""
    printed, flags = row.get("printed", {}), row.get("flags", {})
    need = (printed.get("avail_before_gib"), printed.get("avail_after_gib"))
    mfs = flags.get("mem_fraction_static")
    if row.get("preset") is None or None in need or mfs is None:
        return None
    before, after = (float(x) for x in need)
    cell = kv_bytes_per_token(log_model(row), row.get("kv_dtype", "bf16"), tp=int(row.get("tp", 1)))
    return int((after - before * (1 - float(mfs))) * GiB // cell)


@dataclass(frozen=True)
class LayoutCheck:
    """vLLM's cache layout applied to the KV memory a V1 log printed: the tokens and the
    concurrency vrammath derives from the printed GiB at both ends of their rounding."""

    row: dict[str, Any]
    tokens: tuple[int, int]
    concurrency: tuple[float, float]

    @property
    def tokens_hold(self) -> bool:
        """Whether the printed tokens lie within the derived range."""
        return self.tokens[0] <= int(self.row["printed"]["kv_tokens"]) <= self.tokens[1]

    @property
    def printed_concurrency(self) -> float | None:
        """The concurrency the log printed ("Maximum concurrency for N tokens per request:
        X.XXx") after the token count of the row; None if it printed none. Under tensor
        parallelism vLLM before 0.11 prints one pair of lines per rank."""
        tokens = int(self.row["printed"]["kv_tokens"])
        last = None
        for line in self.row["lines"]:
            size = _KV_TOKENS.search(line)
            if size:
                last = int(size.group(1).replace(",", ""))
            match = _CONCURRENCY.search(line)
            if match and last in (None, tokens):
                return float(match.group(1))
        return None

    @property
    def concurrency_holds(self) -> bool | None:
        """Whether the printed concurrency (two decimals) lies within the derived range; None
        where the log printed none."""
        printed = self.printed_concurrency
        if printed is None:
            return None
        lo, hi = self.concurrency
        return round(lo, 2) <= printed <= round(hi, 2)


_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_CONCURRENCY = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x")


def layout_check(row: dict[str, Any]) -> LayoutCheck | None:
    """:class:`LayoutCheck` for a V1 vLLM row that printed its KV memory and tokens and whose
    model is a preset; None otherwise. The GiB are printed with two decimals, so the memory lies
    within 0.005 GiB of the figure."""
    printed, flags = row.get("printed", {}), dict(row.get("flags", {}))
    need = (printed.get("available_kv_gib"), printed.get("kv_tokens"), row.get("version"))
    if row.get("engine") != "vllm" or row.get("preset") is None or None in need:
        return None
    vflags = Vllm(version=row["version"], **flags)
    if vflags.engine_v0:
        return None
    spec = log_model(row)
    tp = int(row.get("tp", 1))
    max_len = vflags.max_model_len or spec.max_positions
    windowed = keeps_windows(spec, vflags)
    lay = kv_layout(spec, row.get("kv_dtype", "bf16"), tp=tp, block=16, windowed=windowed)
    step = vflags.max_num_batched_tokens
    if step is None and lay.window is not None:
        return None  # a sliding group's blocks need the step's tokens, which the row must state
    step = step or 1  # full layers only: the step does not enter
    gib = float(printed["available_kv_gib"])
    ends = [int((gib + d) * GiB) for d in (-0.005, 0.005)]
    tokens = (lay.tokens(ends[0]), lay.tokens(ends[1]))
    if vflags.release >= (0, 11, 0):
        lo, hi = (lay.concurrency(e, max_len, step) for e in ends)
    else:  # before 0.11: the tokens over max_model_len
        lo, hi = (t / max_len for t in tokens)
    return LayoutCheck(row, tokens, (lo, hi))


def _sglang(row: dict[str, Any]) -> LogComparison:
    try:
        setup = Serve(log_model(row), weights=row.get("weights", "bf16"),
                      kv_dtype=row.get("kv_dtype", "bf16"), tp=int(row.get("tp", 1)),
                      gpu=row.get("gpu_preset") or "A100-80GB")  # fmt: skip
        total = row.get("total_gib")
        flags = {k: v for k, v in row.get("flags", {}).items() if k in SGLANG_FLAGS}
        budget = sglang_budget(
            setup,
            Sglang(sglang_version=row.get("version") or "0.4", **flags),
            total_bytes=None if total is None else round(float(total) * GiB),
        )
    except InputError as err:
        return LogComparison(row, None, str(err))
    return LogComparison(row, budget, None)


#: the SGLang flags a row may set
SGLANG_FLAGS = ("mem_fraction_static", "context_length", "page_size")


def log_model(row: dict[str, Any]) -> ModelSpec:
    """The row's model: its preset with the fields of :data:`OVERRIDES` the row sets."""
    spec = load_model(row["preset"])
    over = row.get("overrides") or {}
    for key in over:
        if key not in OVERRIDES:
            raise InputError("overrides", f"must be among {', '.join(OVERRIDES)}", key)
    if "max_position_embeddings" in over:
        emb = dataclasses.replace(
            spec.embeddings, max_positions=int(over["max_position_embeddings"])
        )
        spec = dataclasses.replace(spec, embeddings=emb)
    return spec


def compare_log(row: dict[str, Any]) -> LogComparison:
    """vrammath's budget for one published log row, or the reason it cannot be expressed."""
    engine = row.get("engine")
    if engine not in ("vllm", "sglang"):
        raise InputError("engine", "must be vllm or sglang", engine)
    if row.get("preset") is None:
        return LogComparison(row, None, row.get("why") or "the model's config is not a preset")
    if row.get("gpu_preset") is None and row.get("total_gib") is None:
        return LogComparison(row, None, row.get("why") or "the GPU (its total) is not stated")
    if engine == "sglang":
        return _sglang(row)
    if row.get("version") is None:
        return LogComparison(row, None, row.get("why") or "the vLLM release is not stated")
    try:
        setup = Serve(
            log_model(row),
            weights=row.get("weights", "bf16"),
            kv_dtype=row.get("kv_dtype", "bf16"),
            tp=int(row.get("tp", 1)),
            gpu=row.get("gpu_preset") or "A100-80GB",
        )
        total = row.get("total_gib")
        budget = vllm_budget(
            setup,
            Vllm(version=row["version"], **row.get("flags", {})),
            total_bytes=None if total is None else round(float(total) * GiB),
        )
    except InputError as err:
        return LogComparison(row, None, str(err))
    return LogComparison(row, budget, None)


__all__ = [
    "OVERRIDES",
    "SGLANG_FLAGS",
    "LayoutCheck",
    "LogComparison",
    "compare_log",
    "layout_check",
    "log_model",
    "sglang_rule_tokens",
]
