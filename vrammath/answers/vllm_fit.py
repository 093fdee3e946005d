"""What to give vLLM so that it serves a concurrency: the fewest tensor-parallel GPUs, the
smallest GPU preset, the longest ``--max-model-len``.

Each answer re-evaluates :func:`~vrammath.serve.vllm.vllm_budget` (vLLM's own startup rule)
over the candidates in order and returns the first that starts and holds ``concurrency``
requests of ``max_model_len`` tokens at once, or None.

>>> from vrammath.model.presets import load_model
>>> from vrammath.serve.estimate import Serve
>>> from vrammath.serve.vllm import Vllm
>>> setup = Serve(load_model("llama-3.1-70b"), gpu="H100-80GB")
>>> fewest_tp(setup, Vllm(max_model_len=32768), 8)
4
>>> smallest_gpu(Serve(load_model("llama-3.1-8b")), Vllm(max_model_len=8192), 4)
'RTX-A5000-24GB'
"""

from __future__ import annotations

import dataclasses

from vrammath.model.presets import load_gpus
from vrammath.notation.errors import InputError
from vrammath.serve.estimate import Serve
from vrammath.serve.vllm import Vllm, vllm_budget


def _holds(setup: Serve, flags: Vllm, concurrency: float) -> bool:
    b = vllm_budget(setup, flags)
    return b.starts and b.max_concurrency >= concurrency


def _check(concurrency: float) -> None:
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int | float)
        or concurrency <= 0
    ):
        raise InputError("concurrency", "must be a positive number of requests", concurrency)


def fewest_tp(setup: Serve, flags: Vllm, concurrency: float) -> int | None:
    """The smallest ``--tensor-parallel-size`` (a divisor of the attention heads that vLLM
    accepts) at which ``setup``'s GPU holds ``concurrency`` requests; None if none does."""
    _check(concurrency)
    spec = setup.model
    for tp in range(1, spec.heads + 1):
        if spec.heads % tp or (spec.kv_heads % tp and tp % spec.kv_heads):
            continue
        if _holds(dataclasses.replace(setup, tp=tp), flags, concurrency):
            return tp
    return None


def smallest_gpu(setup: Serve, flags: Vllm, concurrency: float) -> str | None:
    """The GPU preset with the least memory on which ``setup`` (at its tensor-parallel size)
    holds ``concurrency`` requests; only presets with a measured usable total are tried."""
    _check(concurrency)
    measured = sorted(
        (g for g in load_gpus().values() if g.usable_bytes), key=lambda g: g.usable_bytes
    )
    for card in measured:
        if _holds(dataclasses.replace(setup, gpu=card.name), flags, concurrency):
            return card.name
    return None


__all__ = ["fewest_tp", "smallest_gpu"]
