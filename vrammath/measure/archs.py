"""Every architecture against PyTorch's count: parameters, activations and the phase peaks.

``python -m vrammath.measure.archs`` builds a small config of each ``model_type`` vrammath reads
(odd sizes, GQA/MQA, biases, explicit head_dim, tied embeddings, sliding windows below s),
runs two training iterations of the transformers model in FakeTensorMode under MemTracker, and
compares the steady iteration with :func:`vrammath.compose.estimate.estimate` for bf16 SDPA and fp32
eager (Gemma-2: bf16 eager, since transformers' SDPA refuses its softcapping). The parameter
count is also checked against transformers' own count of the model built from the *raw* config
on the meta device. ``--out`` writes ``validation/archs.json``; ``--diff`` compares a fresh run
with the committed file, as :mod:`vrammath.measure.matrix` does.

Targets as the matrix's: parameters exact, activations and each phase peak within 1%.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from vrammath.measure import documents
from vrammath.measure.build import as_spec
from vrammath.measure.matrix import compare, estimate_row, measured_row, row_args
from vrammath.measure.matrix_rows import SMALL_TIED
from vrammath.measure.step import measure_training_step
from vrammath.model.params import param_count


def _small(model_type: str, head_dim: int | None = None, **extra: Any) -> dict[str, Any]:
    """A 72-wide 3-layer config of ``model_type``: GQA (6 query heads on 2), vocabulary 131,
    ``head_dim`` explicit when given, then the ``extra`` keys (the keys in config.json order)."""
    cfg: dict[str, Any] = {
        "model_type": model_type,
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
    }
    if head_dim is not None:
        cfg["head_dim"] = head_dim
    return {**cfg, "vocab_size": 131, **extra}


_GPT2: dict[str, Any] = {
    "model_type": "gpt2",
    "n_embd": 72,
    "n_layer": 3,
    "n_head": 6,
    "n_inner": 200,
    "vocab_size": 131,
    "n_positions": 256,
}

ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": _small("llama", head_dim=20, attention_bias=True),
    "mistral": _small("mistral", sliding_window=40),
    "qwen2": {**SMALL_TIED},  # the matrix's tied MQA config
    "gpt2": _GPT2,
    "qwen3": _small("qwen3", head_dim=20, attention_bias=True),
    "olmo2": {
        "model_type": "olmo2",
        "hidden_size": 60,
        "intermediate_size": 92,
        "num_hidden_layers": 3,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "vocab_size": 131,
        "tie_word_embeddings": True,
    },
    # Phi3Config's default pad token id (32000) lies outside this vocabulary
    "phi3": _small("phi3", pad_token_id=0),
    "starcoder2": _small("starcoder2"),
    "gemma": {
        "model_type": "gemma",
        "hidden_size": 88,
        "intermediate_size": 150,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 24,
        "vocab_size": 555,
        "tie_word_embeddings": False,
    },
    "gemma2": {
        "model_type": "gemma2",
        "hidden_size": 72,
        "intermediate_size": 130,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 20,
        "vocab_size": 999,
        "sliding_window": 16,
        "query_pre_attn_scalar": 20,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        "hidden_size": 72,
        "intermediate_size": 130,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 20,
        "vocab_size": 999,
        "sliding_window": 16,
        "sliding_window_pattern": 3,
    },
    "gpt_neox": {
        "model_type": "gpt_neox",
        "hidden_size": 72,
        "intermediate_size": 200,
        "num_hidden_layers": 2,
        "num_attention_heads": 6,
        "vocab_size": 999,
        "rotary_pct": 0.25,
        "hidden_act": "gelu_fast",
    },
    # dropout honoured: attention dropout on LLaMA; GPT-2 with every dropout off
    "llama+dropout": _small("llama", head_dim=20, attention_dropout=0.1),
    "gpt2-no-dropout": {
        **_GPT2,
        "attn_pdrop": 0.0,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "activation_function": "gelu_pytorch_tanh",
    },
}
"""One small config per ``model_type``, odd-sized so that no term hides behind a round number."""

EAGER_ONLY = frozenset({"gemma2"})
"""Architectures transformers runs with eager attention only (SDPA refuses softcapping)."""

BATCH, SEQ = 2, 64
"""b and s of every row: s above every window of :data:`ARCH_CONFIGS` (16 and 40)."""


def settings(arch: str) -> list[tuple[str, str]]:
    """(precision, attention) pairs measured for ``arch``: bf16 SDPA (bf16 eager where SDPA is
    refused) and fp32 eager.

    >>> settings("llama"), settings("gemma2")
    ([('bf16', 'sdpa'), ('fp32', 'eager')], [('bf16', 'eager'), ('fp32', 'eager')])
    """
    first = "eager" if arch in EAGER_ONLY else "sdpa"
    return [("bf16", first), ("fp32", "eager")]


def rows() -> list[dict[str, Any]]:
    """The rows, in the matrix's row shape (``model`` holds the config itself)."""
    out = []
    for arch, cfg in ARCH_CONFIGS.items():
        for precision, attention in settings(arch):
            out.append(
                {
                    "id": f"{arch}/b{BATCH}/s{SEQ}/{precision}/{attention}",
                    "arch": arch,
                    "model": cfg,
                    "batch": BATCH,
                    "seq": SEQ,
                    "precision": precision,
                    "attention": attention,
                    "recompute": "none",
                    "optimizer": "adamw",
                    "implementation": "foreach",
                    "zero3_ranks": None,
                    "quick": True,
                }
            )
    return out


def transformers_param_count(cfg: dict[str, Any]) -> int:
    """transformers' own parameter count of the causal LM built from the raw config on the meta
    device (no ModelSpec in between)."""
    import torch
    import transformers

    fields = {k: v for k, v in cfg.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **fields)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def run(rows_: list[dict[str, Any]], *, steps: int = 2, log: Any = None) -> list[dict[str, Any]]:
    """Measure and compare each row (a row that cannot run stays in the data as an error)."""

    out = []
    for row in rows_:
        started = time.perf_counter()
        try:
            # the rows' recompute, optimizer and implementation are the step's defaults
            result = measure_training_step(row["model"], **row_args(row), steps=steps)
            comp = compare(estimate_row(row), measured_row(result), row)
            ours = param_count(as_spec(row["model"]))
            theirs = transformers_param_count(row["model"])
        except Exception as exc:  # every row's outcome is data
            entry = documents.failed(row, exc)
        else:
            comp["param_count"] = {
                "estimated": ours,
                "measured": theirs,
                "difference": ours - theirs,
                "rel_error": round((ours - theirs) / theirs, 6),
                "pass": ours == theirs,
            }
            entry = {
                **documents.scored(row, comp),
                "seconds": round(time.perf_counter() - started, 1),
            }
        out.append(entry)
        if log:
            log(f"{row['id']}: {'PASS' if entry['pass'] else 'FAIL'} {entry.get('error', '')}")
    return out


COLUMNS = ("param_count", "activations", "forward_peak", "backward_peak", "step_peak")


def table(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per row: architecture, precision, attention, params exact, and the relative
    error of activations and of each phase peak (what the handbook renders)."""
    lines = []
    for r in doc["rows"]:
        comp = r.get("components", {})
        line = {k: r[k] for k in ("arch", "precision", "attention")}
        line["params_exact"] = comp.get("param_count", {}).get("pass", False)
        for name in COLUMNS[1:]:
            line[name] = comp[name]["rel_error"] if name in comp else None
        line["pass"] = r["pass"]
        lines.append(line)
    return lines


def build(command: str, *, steps: int = 2, log: Any = None) -> dict[str, Any]:
    """The whole document ``validation/archs.json`` holds."""
    found = documents.versions()
    started = time.perf_counter()
    results = run(rows(), steps=steps, log=log)
    return {
        "command": command,
        "versions": found,
        "method": (
            "transformers model built from each config in FakeTensorMode on device cpu; "
            f"{steps} training iterations (HF causal-LM loss, backward, AdamW foreach step, "
            "zero_grad(set_to_none=True)) under MemTracker; steady state = last iteration. "
            "param_count: transformers' count of the model built from the raw config on the "
            "meta device."
        ),
        "configs": ARCH_CONFIGS,
        "seconds": round(time.perf_counter() - started, 1),
        **documents.verdicts(results),
    }


def default_path() -> Path:
    """``validation/archs.json`` of the source checkout."""
    return documents.validation_file("archs.json")


def main(argv: list[str] | None = None) -> int:
    parser = documents.document_parser("vrammath.measure.archs", __doc__)
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    command = documents.command_line("vrammath.measure.archs", argv)
    doc = build(command, steps=args.steps, log=lambda m: print(m, flush=True))
    documents.write_doc(args.out, doc)
    status = documents.diff_status(args.diff, doc)
    for line in table(doc):
        print(line)
    print(documents.pass_line(doc))
    return status


if __name__ == "__main__":
    raise SystemExit(main())
