"""The ``vrammath`` command: estimate, formula, models, gpus.

Bad input prints one line naming the field and what is allowed, and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

import sympy

from vrammath.budget import DEFAULT_RESERVE_BYTES, budget
from vrammath.errors import InputError, one_of
from vrammath.estimate import estimate
from vrammath.fit import fit
from vrammath.inference import KV_DTYPES, SERVE_WEIGHTS, Serve, serve
from vrammath.lora import lora_param_count, lora_targets
from vrammath.parallel import (
    FSDP_STRATEGIES,
    zero_communication_elements,
    zero_paper_bytes,
    zero_stage,
)
from vrammath.params import param_count, param_exprs, param_total_expr
from vrammath.presets import load_gpus, load_model, model_names, resolve_model
from vrammath.quant import QUANTS
from vrammath.setup import ACTIVATION_MODELS, ATTENTION, ITERATIONS, RECOMPUTE, SCHEDULES, Setup
from vrammath.states import IMPLEMENTATIONS, OPTIMIZERS, RECIPES, model_state_exprs
from vrammath.units import fmt_gb, fmt_gib

FORMULAS = ("params", "states", "zero", "communication")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"vrammath: error: {message}\n")


def _positive(field: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{field}: must be a positive integer (got {text!r})"
            ) from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{field}: must be a positive integer (got {text!r})")
        return value

    return parse


def _zero(text: str) -> int:
    try:
        return zero_stage(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _choices(field: str, allowed: Sequence[str]) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(
                f"{field}: must be one of {', '.join(allowed)} (got {text!r})"
            )
        return text

    return parse


def _add_setup_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("model", help="preset name (see `vrammath models`) or path to a config.json")
    cmd.add_argument(
        "--recipe",
        type=_choices("recipe", list(RECIPES)),
        default="bf16-mixed",
        help="precision recipe: " + ", ".join(RECIPES) + " (default bf16-mixed)",
    )
    cmd.add_argument(
        "--optimizer",
        type=_choices("optimizer", OPTIMIZERS),
        default="adamw",
        help="optimizer: " + ", ".join(OPTIMIZERS) + " (default adamw)",
    )
    cmd.add_argument(
        "--impl",
        type=_choices("impl", IMPLEMENTATIONS),
        default="foreach",
        help="optimizer implementation: " + ", ".join(IMPLEMENTATIONS),
    )
    cmd.add_argument(
        "--zero",
        type=_zero,
        default=0,
        help="ZeRO stage 0-3 or FSDP strategy " + ", ".join(FSDP_STRATEGIES),
    )
    cmd.add_argument(
        "--gpus",
        type=_positive("gpus"),
        default=1,
        help="data-parallel GPUs the states are sharded over (default 1)",
    )
    cmd.add_argument(
        "--offload-optimizer",
        action="store_true",
        help="keep master weights and optimizer states in CPU memory",
    )
    cmd.add_argument(
        "--offload-params",
        action="store_true",
        help="keep the weight shards in CPU memory too (ZeRO-3)",
    )
    cmd.add_argument("--batch", "-b", type=_positive("batch"), default=1, help="micro-batch size")
    cmd.add_argument("--seq", "-s", type=_positive("seq"), default=2048, help="sequence length")
    cmd.add_argument("--tp", type=_positive("tp"), default=1, help="tensor-parallel size")
    cmd.add_argument("--pp", type=_positive("pp"), default=1, help="pipeline-parallel size")
    cmd.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    cmd.add_argument(
        "--attention",
        type=_choices("attention", ATTENTION),
        default="sdpa",
        help="attention implementation: " + ", ".join(ATTENTION),
    )
    cmd.add_argument(
        "--recompute",
        type=_choices("recompute", RECOMPUTE),
        default="none",
        help="activation recomputation: " + ", ".join(RECOMPUTE),
    )
    cmd.add_argument(
        "--activations",
        type=_choices("activations", ACTIVATION_MODELS),
        default="auto",
        help="activation formula: hf (exact, Hugging Face models), korthikanti (Megatron, as "
        "published; needed for --tp/--pp/selective), auto (default: hf unless Megatron options)",
    )
    cmd.add_argument(
        "--iteration",
        type=_choices("iteration", ITERATIONS),
        default="steady",
        help="steady (2nd iteration on, optimizer states exist) or first",
    )
    cmd.add_argument(
        "--schedule",
        type=_choices("schedule", SCHEDULES),
        default="1f1b",
        help="pipeline schedule (Korthikanti's first stage): " + ", ".join(SCHEDULES),
    )
    cmd.add_argument(
        "--chunks", type=_positive("chunks"), default=1, help="model chunks per stage (interleaved)"
    )
    cmd.add_argument("--gpu", default=None, help="GPU preset to check the fit against")


def _targets(text: str) -> tuple[str, ...]:
    try:
        return lora_targets(text)
    except InputError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _fraction(field: str) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 < value <= 1:
            raise argparse.ArgumentTypeError(f"{field}: must be a number in (0, 1] (got {text!r})")
        return value

    return parse


def _add_lora_options(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument(
        "--lora-rank", type=_positive("lora-rank"), default=None, help="LoRA rank (frozen base)"
    )
    cmd.add_argument(
        "--lora-targets",
        type=_targets,
        default=("q", "v"),
        help="adapted projections: q,k,v,o,gate,up,down or all-linear (default q,v)",
    )
    cmd.add_argument(
        "--quant",
        type=_choices("quant", QUANTS),
        default=None,
        help="quantized frozen base (QLoRA): " + ", ".join(QUANTS),
    )
    cmd.add_argument("--lora-dropout", action="store_true", help="adapter dropout on")


def _add_serve_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    cmd = sub.add_parser("serve", help="weights + KV cache per GPU for serving, and what fits")
    cmd.add_argument("model", help="preset name (see `vrammath models`) or path to a config.json")
    cmd.add_argument("--context", type=_positive("context"), default=4096, help="tokens/sequence")
    cmd.add_argument("--batch", "-b", type=_positive("batch"), default=1, help="sequences")
    cmd.add_argument(
        "--weights",
        type=_choices("weights", SERVE_WEIGHTS),
        default="bf16",
        help="weight format: " + ", ".join(SERVE_WEIGHTS),
    )
    cmd.add_argument(
        "--kv-dtype",
        type=_choices("kv-dtype", KV_DTYPES),
        default="bf16",
        help="KV-cache dtype: " + ", ".join(KV_DTYPES),
    )
    cmd.add_argument("--tp", type=_positive("tp"), default=1, help="tensor-parallel GPUs")
    cmd.add_argument(
        "--block", type=_positive("block"), default=16, help="paged KV block size in tokens"
    )
    cmd.add_argument("--no-paging", action="store_true", help="unpaged cache (exact tokens)")
    cmd.add_argument(
        "--gpu-util",
        type=_fraction("gpu-util"),
        default=0.9,
        help="fraction of the GPU for weights + KV (vLLM's gpu_memory_utilization; default 0.9)",
    )
    cmd.add_argument("--gpu", default=None, help="GPU preset to check the fit against")
    cmd.add_argument("--json", action="store_true", help="machine-readable output")


def _headroom(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"headroom: must be a number in [0, 1) (got {text!r})")
    return value


def _reserve(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e6:
        raise argparse.ArgumentTypeError(f"reserve-gib: must be a number >= 0 (got {text!r})")
    return value


def _add_fit_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    cmd = sub.add_parser(
        "fit", help="largest batch, longest sequence, fewest GPUs and cheapest ZeRO stage"
    )
    _add_setup_options(cmd)
    _add_lora_options(cmd)
    cmd.add_argument(
        "--headroom", type=_headroom, default=0.0, help="fraction of the GPU kept free (default 0)"
    )
    cmd.add_argument(
        "--reserve-gib",
        type=_reserve,
        default=DEFAULT_RESERVE_BYTES / 2**30,
        help="GiB reserved for the CUDA context, workspaces and NCCL (default 1)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for the docs and tests)."""
    parser = _Parser(prog="vrammath", description="GPU memory of LLM training, derived.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    est = sub.add_parser("estimate", help="breakdown of per-GPU memory for a training setup")
    _add_setup_options(est)
    _add_lora_options(est)
    est.add_argument("--json", action="store_true", help="machine-readable output")

    form = sub.add_parser("formula", help="print a symbolic expression")
    form.add_argument("term", type=_choices("term", FORMULAS), help=", ".join(FORMULAS))
    form.add_argument(
        "--model", default="llama-7b", help="model whose structure shapes the formula"
    )
    form.add_argument("--stage", type=_zero, default=0, help="ZeRO stage for zero/communication")
    form.add_argument("--recipe", type=_choices("recipe", list(RECIPES)), default="bf16-mixed")
    form.add_argument("--optimizer", type=_choices("optimizer", OPTIMIZERS), default="adamw")
    form.add_argument("--latex", action="store_true", help="LaTeX instead of plain text")

    _add_serve_parser(sub)
    _add_fit_parser(sub)
    sub.add_parser("models", help="list model presets")
    sub.add_parser("gpus", help="list GPU presets")
    return parser


def _training_setup(args: argparse.Namespace) -> Setup:
    return Setup(
        resolve_model(args.model),
        recipe=args.recipe,
        optimizer=args.optimizer,
        implementation=args.impl,
        zero=args.zero,
        gpus=args.gpus,
        offload_optimizer=args.offload_optimizer,
        offload_params=args.offload_params,
        micro_batch=args.batch,
        seq_len=args.seq,
        tp=args.tp,
        pp=args.pp,
        sp=args.sp,
        attention=args.attention,
        recompute=args.recompute,
        gpu=args.gpu,
        lora_rank=args.lora_rank,
        lora_targets=args.lora_targets,
        quant=args.quant,
        lora_dropout=args.lora_dropout,
        activation_model=args.activations,
        iteration=args.iteration,
        schedule=args.schedule,
        chunks=args.chunks,
    )


def _cmd_estimate(args: argparse.Namespace) -> str:
    setup = _training_setup(args)
    est = estimate(setup)
    if args.json:
        return json.dumps(est.as_dict(), indent=2, sort_keys=True)
    head = (
        f"{setup.model.name}: {param_count(setup.model):,} parameters; {setup.recipe}, "
        f"{setup.optimizer} ({setup.implementation}), ZeRO-{setup.zero} over {setup.gpus} GPU(s), "
        f"micro-batch {setup.micro_batch} x {setup.seq_len} tokens"
    )
    if setup.lora_rank is not None:
        n = lora_param_count(setup.model, setup.lora_rank, setup.lora_targets)
        head += (
            f"\nLoRA rank {setup.lora_rank} on {','.join(setup.lora_targets)}: {n:,} trainable "
            f"parameters; frozen base {setup.quant or 'in the recipe dtype'}"
        )
    return head + "\n" + est.table()


def _cmd_fit(args: argparse.Namespace) -> str:
    if args.gpu is None:
        raise one_of("gpu", None, list(load_gpus()))
    setup = _training_setup(args)
    bud = budget(args.gpu, headroom=args.headroom, reserve_bytes=round(args.reserve_gib * 2**30))
    return "\n".join(fit(setup, bud).lines())


def _cmd_serve(args: argparse.Namespace) -> str:
    setup = Serve(
        resolve_model(args.model),
        context=args.context,
        batch=args.batch,
        weights=args.weights,
        kv_dtype=args.kv_dtype,
        tp=args.tp,
        block=None if args.no_paging else args.block,
        gpu=args.gpu,
        gpu_util=args.gpu_util,
    )
    est = serve(setup)
    if args.json:
        return json.dumps(est.as_dict(), indent=2, sort_keys=True)
    head = (
        f"{setup.model.name}: serving {setup.batch} x {setup.context} tokens, weights "
        f"{setup.weights}, KV cache {setup.kv_dtype}, tensor parallel {setup.tp}"
    )
    return head + "\n" + est.table()


def _cmd_formula(args: argparse.Namespace) -> str:
    exprs: dict[str, sympy.Expr]
    if args.term == "params":
        spec = resolve_model(args.model)
        exprs = {**param_exprs(spec), "total": param_total_expr(spec)}
    elif args.term == "states":
        spec = resolve_model(args.model)
        exprs = model_state_exprs(spec, args.recipe, args.optimizer)
    elif args.term == "zero":
        exprs = {f"zero-{args.stage} bytes per GPU": zero_paper_bytes(args.stage)}
    else:
        exprs = {
            f"zero-{args.stage} elements communicated": zero_communication_elements(args.stage)
        }
    render = sympy.latex if args.latex else str
    return "\n".join(f"{name}: {render(expr)}" for name, expr in exprs.items())


def _cmd_models() -> str:
    lines = []
    for name in model_names():
        spec = load_model(name)
        lines.append(
            f"{name:14} {spec.model_type:8} {param_count(spec):>17,} params  h={spec.hidden} "
            f"L={spec.layers} heads={spec.heads}/{spec.kv_heads} vocab={spec.vocab}"
        )
    return "\n".join(lines)


def _cmd_gpus() -> str:
    return "\n".join(
        f"{g.name:16} {fmt_gb(g.bytes):>10} / {fmt_gib(g.bytes):>11}  {g.label}"
        for g in load_gpus().values()
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (0 ok, 2 bad input)."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "estimate":
            out = _cmd_estimate(args)
        elif args.command == "serve":
            out = _cmd_serve(args)
        elif args.command == "fit":
            out = _cmd_fit(args)
        elif args.command == "formula":
            out = _cmd_formula(args)
        elif args.command == "models":
            out = _cmd_models()
        else:
            out = _cmd_gpus()
    except InputError as exc:
        print(f"vrammath: error: {exc}", file=sys.stderr)
        return 2
    try:
        print(out, flush=True)
    except BrokenPipeError:  # the reader left early (``| head``): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


__all__ = ["build_parser", "main"]
