"""The ``vrammath serve`` command: its options and its answer, with or without an engine's rule.

``--engine flat`` (the default) answers weights + KV cache against a flat share of the GPU
(:func:`vrammath.serve.estimate.serve`); ``--engine hf`` answers transformers' ``generate()``
(:func:`vrammath.serve.hf.hf_serve`: weights, DynamicCache and the prefill's and decode's
peaks, exact); ``--engine vllm`` follows vLLM's own startup budget
(:func:`vrammath.serve.vllm.vllm_budget`) and prints the lines vLLM would print; ``--engine
sglang`` follows SGLang's (:func:`vrammath.serve.sglang.sglang_budget`). Each option is declared
once, on :class:`~vrammath.serve.estimate.Serve`, :class:`~vrammath.serve.hf.Hf`,
:class:`~vrammath.serve.vllm.Vllm` or :class:`~vrammath.serve.sglang.Sglang`.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from vrammath.answers.report import hf_table, serve_dict, serve_table, sglang_table, vllm_table
from vrammath.answers.vllm_fit import fewest_tp, smallest_gpu
from vrammath.flags import Parser, add_options, choice, number
from vrammath.model.presets import resolve_model
from vrammath.notation.errors import InputError
from vrammath.notation.fields import field_values, options
from vrammath.notation.vocab import KV_DTYPES
from vrammath.serve.estimate import Serve, ServeEstimate, serve, serve_warnings
from vrammath.serve.hf import HF_ASSUMPTIONS, Hf, hf_serve
from vrammath.serve.sglang import Sglang, SglangBudget, sglang_budget
from vrammath.serve.vllm import Vllm, VllmBudget, vllm_budget

Result = tuple[str, dict[str, Any]]

#: the serving engines whose rule ``--engine`` selects
SERVE_ENGINES = ("flat", "hf", "vllm", "sglang")

_NOT_GIVEN: Any = object()  # a flag's default that tells "not typed" from any typed value
_SERVE_BLOCK = next(f.default for f in dataclasses.fields(Serve) if f.name == "block")
_SERVE_UTIL = next(f.default for f in dataclasses.fields(Serve) if f.name == "gpu_util")
_SERVE_KV = next(f.default for f in dataclasses.fields(Serve) if f.name == "kv_dtype")


def add_serve_parser(sub: argparse._SubParsersAction[Parser], model_help: str) -> None:
    """The ``serve`` subcommand and its options."""
    srv = sub.add_parser(
        "serve", help="weights + KV cache per GPU for serving, and what fits (or vLLM's budget)"
    )
    srv.add_argument("model", help=model_help)
    srv.add_argument(
        "--engine",
        type=choice("engine", SERVE_ENGINES),
        default="flat",
        help="flat: weights + KV cache against --gpu-util of the GPU; hf: transformers' "
        "generate() (weights, DynamicCache, the prefill's and decode's peaks); vllm: vLLM's own "
        "startup budget, the KV tokens and concurrency it prints; sglang: SGLang's static "
        "fraction and the tokens it prints (both need --gpu) (default flat)",
    )
    add_options(srv, Serve)
    add_options(srv, Hf)
    add_options(srv, Vllm)
    add_options(srv, Sglang)
    srv.add_argument(
        "--concurrency",
        type=number("concurrency", 0, 2**24, open_low=True, open_high=False),
        default=None,
        help="with --engine vllm: also answer the fewest tensor-parallel GPUs and the smallest "
        "GPU preset that hold this many requests of max_model_len tokens at once",
    )
    srv.add_argument("--no-paging", action="store_true", help="unpaged cache (exact tokens)")
    # typed or not: see cmd_serve
    srv.set_defaults(block=_NOT_GIVEN, gpu_util=_NOT_GIVEN, kv_dtype=_NOT_GIVEN)
    srv.add_argument("--json", action="store_true", help="machine-readable output (same content)")


def _serve_data(est: ServeEstimate) -> dict[str, Any]:
    data: dict[str, Any] = serve_dict(est)
    data["total_with_reserve_bytes"] = est.total_with_reserve_bytes
    data["warnings"] = list(serve_warnings(est.setup))
    return data


def _typed(cls: Any, args: argparse.Namespace) -> list[str]:
    """The flags of ``cls``'s declared fields typed at other than their default."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    return [o.flag for o in options(cls) if o.flag and getattr(args, o.name) != defaults[o.name]]


def _refuse_typed(flags: list[str], engine: str) -> None:
    if flags:
        raise InputError(flags[0].removeprefix("--"), f"is read by --engine {engine} only")


def _flags(cls: Any, args: argparse.Namespace) -> dict[str, Any]:
    return {o.name: getattr(args, o.name) for o in options(cls) if o.flag is not None}


def cmd_serve(args: argparse.Namespace) -> Result:
    """The answer of ``vrammath serve``: text and its JSON."""
    given = _flags(Serve, args)
    if args.no_paging and given["block"] is not _NOT_GIVEN:
        raise InputError("block", "is not read with --no-paging (an unpaged cache)", given["block"])
    if given["block"] is _NOT_GIVEN:
        given["block"] = None if args.no_paging else _SERVE_BLOCK
    vllm_only = _typed(Vllm, args) + (["--concurrency"] if args.concurrency is not None else [])
    if args.engine != "hf":
        _refuse_typed(_typed(Hf, args), "hf")
        if given["kv_dtype"] is _NOT_GIVEN:
            given["kv_dtype"] = _SERVE_KV
    if args.engine != "sglang":
        _refuse_typed(_typed(Sglang, args), "sglang")
    if args.engine != "vllm":
        _refuse_typed(vllm_only, "vllm")
    if args.engine == "sglang":
        setup = _engine_setup(args, given)
        sg = sglang_budget(setup, Sglang(**_flags(Sglang, args)))
        return sglang_table(setup, sg), _engine_data(setup, "sglang", sg)
    if args.engine == "vllm":
        return _vllm_answer(args, given)
    if args.engine == "hf":
        return _hf_answer(args, given)
    if given["gpu_util"] is _NOT_GIVEN:
        given["gpu_util"] = _SERVE_UTIL
    setup = Serve(resolve_model(args.model), **given)
    est = serve(setup)
    head = (
        f"{setup.model.name}: serving {setup.batch} x {setup.context} tokens, weights "
        f"{setup.weights}, KV cache {setup.kv_dtype}, tensor parallel {setup.tp}"
    )
    return head + "\n" + serve_table(est), _serve_data(est)


def _engine_setup(args: argparse.Namespace, given: dict[str, Any]) -> Serve:
    """The serving setup of an engine's rule: the flags the engine reads in its own words."""
    own = {"vllm": ("--gpu-memory-utilization", "--max-model-len"),
           "sglang": ("--mem-fraction-static", "--context-length")}[args.engine]  # fmt: skip
    if given["gpu_util"] is not _NOT_GIVEN:
        raise InputError("gpu-util", f"is not read by --engine {args.engine}: use {own[0]}")
    for name in ("context", "batch"):
        default = next(f.default for f in dataclasses.fields(Serve) if f.name == name)
        if given[name] != default:
            raise InputError(name, f"is not read by --engine {args.engine}: use {own[1]}")
    given["gpu_util"] = _SERVE_UTIL
    return Serve(resolve_model(args.model), **given)


def _engine_data(setup: Serve, engine: str, budget: VllmBudget | SglangBudget) -> dict[str, Any]:
    """The JSON of an engine's answer: the setup as the engine reads it, the budget, warnings."""
    data: dict[str, Any] = {
        "model": setup.model.name,
        "setup": field_values(setup),
        engine: budget.as_dict(),
        "warnings": list(setup.model.warnings),
    }
    del data["setup"]["context"], data["setup"]["batch"], data["setup"]["gpu_util"]
    if not budget.total_measured:
        data["warnings"].append(
            f"{setup.gpu}: no measured usable total (torch.cuda.mem_get_info) in the GPU "
            "preset; nvidia-smi's figure is used, larger than what the engine sees"
        )
    return data


def _hf_answer(args: argparse.Namespace, given: dict[str, Any]) -> Result:
    """transformers' generate(): the cache is in the weights' dtype and is not paged."""
    if given["gpu_util"] is not _NOT_GIVEN:
        raise InputError("gpu-util", "is not read by --engine hf (generate() has no such share)")
    if args.block is not _NOT_GIVEN:
        raise InputError("block", "is not read by --engine hf (DynamicCache is not paged)")
    if given["kv_dtype"] is _NOT_GIVEN:  # the weights' dtype, which hf_serve checks first
        given["kv_dtype"] = given["weights"] if given["weights"] in KV_DTYPES else _SERVE_KV
    given["gpu_util"] = _SERVE_UTIL
    setup = Serve(resolve_model(args.model), **given)
    est = hf_serve(setup, Hf(**_flags(Hf, args)))
    data: dict[str, Any] = {"model": setup.model.name, "setup": field_values(setup)}
    del data["setup"]["gpu_util"], data["setup"]["block"]
    data["hf"] = est.as_dict()
    data["assumptions"] = list(HF_ASSUMPTIONS)
    data["warnings"] = list(serve_warnings(setup))
    return hf_table(est), data


def _vllm_answer(args: argparse.Namespace, given: dict[str, Any]) -> Result:
    setup = _engine_setup(args, given)
    flags = Vllm(**_flags(Vllm, args))
    budget = vllm_budget(setup, flags)
    data = _engine_data(setup, "vllm", budget)
    data["warnings"].extend(flags.warnings())
    if budget.max_model_len > setup.model.max_positions:
        data["warnings"].insert(
            len(setup.model.warnings),
            f"max_model_len {budget.max_model_len} exceeds the model's max_position_embeddings "
            f"({setup.model.max_positions}): vLLM refuses it unless "
            "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1",
        )
    text = vllm_table(setup, budget)
    if args.concurrency is not None:
        want = args.concurrency
        tp, card = fewest_tp(setup, flags, want), smallest_gpu(setup, flags, want)
        data["concurrency"] = {"requests": want, "fewest_tp": tp, "smallest_gpu": card}
        text += (
            f"\nfor {want:g} requests of {budget.max_model_len:,} tokens at once: tensor "
            f"parallel {tp if tp is not None else 'none (no size holds them)'} on {setup.gpu}; "
            f"smallest GPU preset at tensor parallel {setup.tp}: {card or 'none'}"
        )
    return text, data


__all__ = ["SERVE_ENGINES", "add_serve_parser", "cmd_serve"]
