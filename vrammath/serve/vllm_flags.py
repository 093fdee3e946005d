"""vLLM's own flags that change its startup KV budget, and the releases they follow.

:class:`Vllm` is what ``vrammath serve --engine vllm`` reads besides the model and the GPU:
the release (whose defaults and budget rule differ), the flags in vLLM's own names, and two
facts a startup log states: the sampler's top-k/top-p path and whether the custom all-reduce
ran. :mod:`vrammath.serve.vllm` applies them.

>>> Vllm(version="0.10.1.1", sampler="flashinfer").sampler_path
'flashinfer'
>>> Vllm(version="0.17.1").warnings()[0][:40]
'sampler: vLLM 0.17.1 may sample with a T'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from vrammath.notation.errors import InputError
from vrammath.notation.fields import MAX_COUNT, MAX_TOKENS, check_bounds, declared
from vrammath.serve.profile import DEFAULT_SAMPLER, SAMPLERS

#: The vLLM releases whose budget rules this module follows (first, last), inclusive.
VLLM_RANGE = ((0, 6, 4), (0, 33, 99))
#: The first release whose V1 engine budgets by ``memory_profiling`` (0.8.0 to 0.9.1's V1 took
#: the peak of all allocations plus everything outside torch, the CUDA context included).
V1_FROM = (0, 9, 2)
#: The weight formats whose loaded bytes are modelled under ``--engine vllm``.
VLLM_WEIGHTS = ("bf16", "fp16", "int4", "fp8", "fp8-tensor", "fp8-block")
#: The release a plain ``--engine vllm`` follows.
VLLM_DEFAULT = "0.11.0"
#: The first release whose default sampler is not known here (the Triton top-k/top-p kernels
#: were merged in February 2026, vllm-project/vllm PR #33538, after 0.15).
SAMPLER_KNOWN_UNTIL = (0, 16, 0)
#: The first release a published log shows running the V2 model runner (vLLM 0.22.0 on two
#: T4s, validation/serving-logs.json row qwen3-8b-2xt4-eager); since when it is the default is
#: not known here.
MODEL_RUNNER_V2_SEEN = (0, 22, 0)


def version_tuple(text: str) -> tuple[int, int, int]:
    """``major.minor.patch`` of a release string; a suffix (``.post1``, ``rc1``, ``+local``)
    is dropped.

    >>> version_tuple("0.13.0+faa43dbf.nv26.01"), version_tuple("v0.8.5.post1"), version_tuple("0.11")
    ((0, 13, 0), (0, 8, 5), (0, 11, 0))
    """
    match = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:[-.+a-z].*)?", text.strip())
    if match is None:
        raise InputError("vllm_version", "must be a release number like 0.11.0", text)
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


@dataclass(frozen=True)
class Vllm:
    """vLLM's own flags that change its KV budget (``None``: the release's default)."""

    version: str = declared(
        VLLM_DEFAULT,
        "--vllm-version",
        "the vLLM release followed (0.6.4 to 0.33; default {default})",
    )
    v0: bool = declared(
        False,
        "--v0",
        "the V0 engine (VLLM_USE_V1=0) in 0.8 to 0.10; releases before 0.8 run V0 anyway",
        kind="switch",
    )
    gpu_memory_utilization: float | None = declared(
        None,
        "--gpu-memory-utilization",
        "fraction of the GPU's total vLLM may use (default 0.90 to 0.19, 0.92 from 0.20)",
        kind="fraction",
    )
    max_model_len: int | None = declared(
        None,
        "--max-model-len",
        f"tokens per request (1..{MAX_TOKENS}; default the model's max_position_embeddings)",
        low=1,
        high=MAX_TOKENS,
    )
    max_num_seqs: int | None = declared(
        None,
        "--max-num-seqs",
        f"requests per step (1..{MAX_COUNT}; default 1024 on GPUs of 70 GiB or more but A100, "
        "else 256)",
        low=1,
        high=MAX_COUNT,
    )
    max_num_batched_tokens: int | None = declared(
        None,
        "--max-num-batched-tokens",
        f"tokens per step (1..{MAX_TOKENS}; default 8192 (server) or 16384 (offline LLM) on GPUs "
        "of 70 GiB or more but A100, else 2048 or 8192)",
        low=1,
        high=MAX_TOKENS,
    )
    enforce_eager: bool = declared(
        False,
        "--enforce-eager",
        "no CUDA graphs (vLLM 0.20 on then subtracts no graph memory; the profile's forward "
        "peak is derived from the eager ops either way)",
        kind="switch",
    )
    offline: bool = declared(
        False,
        "--offline",
        "vLLM run as LLM(...) in Python (its defaults), not `vllm serve`",
        kind="switch",
    )
    sampler: str | None = declared(
        None,
        "--sampler",
        "the V1 sampler's top-k/top-p path in the profile run: pytorch (sorts the vocabulary), "
        "flashinfer (the log prints 'Using FlashInfer for top-p & top-k sampling.') or triton "
        "(default pytorch, what pip installs ran before 0.16)",
        choices=SAMPLERS,
    )
    disable_hybrid_kv_cache_manager: bool = declared(
        False,
        "--disable-hybrid-kv-cache-manager",
        "one KV-cache group for a model that mixes sliding-window and full layers: every layer "
        "keeps every token",
        kind="switch",
    )
    disable_custom_all_reduce: bool = declared(
        False,
        "--disable-custom-all-reduce",
        "tensor parallel without vLLM's custom all-reduce (also when the log says 'Custom "
        "allreduce is disabled': no GPU P2P, or ranks on several nodes)",
        kind="switch",
    )

    def __post_init__(self) -> None:
        check_bounds(self)
        v = version_tuple(self.version) if isinstance(self.version, str) else None
        if v is None or not VLLM_RANGE[0] <= v <= VLLM_RANGE[1]:
            raise InputError(
                "vllm_version",
                "must be a release from 0.6.4 to 0.33 (older ones budget by other rules; 0.34 "
                "sizes the cache after CUDA-graph capture)",
                self.version,
            )
        if self.v0 and v >= (0, 11, 0):
            raise InputError("v0", "the V0 engine was removed in vLLM 0.11", self.version)
        if not self.engine_v0 and v < V1_FROM:
            raise InputError(
                "vllm_version",
                "V1 before 0.9.2 budgets by another rule (its peak of all allocations and the "
                "CUDA context): pass --v0 for the V0 engine, or 0.9.2 or later",
                self.version,
            )
        if self.sampler is not None and self.sampler not in SAMPLERS:
            raise InputError("sampler", f"must be one of {', '.join(SAMPLERS)}", self.sampler)
        if self.sampler is not None and self.engine_v0:
            raise InputError(
                "sampler", "is read by the V1 engine only (V0 samples with its own sort)"
            )
        u = self.gpu_memory_utilization
        if u is not None and (
            isinstance(u, bool) or not isinstance(u, int | float) or not 0 < u <= 1
        ):
            raise InputError("gpu_memory_utilization", "must be a number in (0, 1]", u)

    @property
    def release(self) -> tuple[int, int, int]:
        """The release as a tuple."""
        return version_tuple(self.version)

    @property
    def engine_v0(self) -> bool:
        """Whether the V0 engine runs (every release before 0.8, or ``--v0``)."""
        return self.v0 or version_tuple(self.version) < (0, 8, 0)

    @property
    def sampler_path(self) -> str:
        """The sampler the profile run uses, ``v0`` or the V1 path.

        The V1 path is ``--sampler``, else the PyTorch sort: FlashInfer is not installed with
        vLLM's wheel before 0.11.1 (an extra, vllm-project/vllm PR #21959; a dependency from PR
        #26443) and is opt-in from 0.11.1 (PR #26859).
        """
        if self.engine_v0:
            return "v0"
        return self.sampler or DEFAULT_SAMPLER

    def warnings(self) -> list[str]:
        """One line for each default of this release that is not known here."""
        out: list[str] = []
        if self.engine_v0:
            return out
        if self.sampler is None and self.release >= SAMPLER_KNOWN_UNTIL:
            out.append(
                f"sampler: vLLM {self.version} may sample with a Triton kernel or FlashInfer "
                "(vllm-project/vllm PRs #33538, #40376); the PyTorch sort is assumed, the largest "
                "of the three: pass --sampler"
            )
        if self.release >= MODEL_RUNNER_V2_SEEN:
            out.append(
                f"vllm_version: {self.version} may run vLLM's V2 model runner (a published 0.22 "
                "log prints 'Using V2 Model Runner'), whose profile run is not modelled; the "
                "budget here follows V1's model runner"
            )
        return out


__all__ = [
    "MODEL_RUNNER_V2_SEEN",
    "SAMPLER_KNOWN_UNTIL",
    "V1_FROM",
    "VLLM_DEFAULT",
    "VLLM_RANGE",
    "VLLM_WEIGHTS",
    "Vllm",
    "version_tuple",
]
