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

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

from vrammath.measure.build import as_spec
from vrammath.measure.matrix import compare, diff, estimate_row, measured_row, worst_rel_errors
from vrammath.measure.step import measure_training_step
from vrammath.model.params import param_count

ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 20,
        "vocab_size": 131,
        "attention_bias": True,
    },
    "mistral": {
        "model_type": "mistral",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 131,
        "sliding_window": 40,
    },
    "qwen2": {
        "model_type": "qwen2",
        "hidden_size": 80,
        "intermediate_size": 136,
        "num_hidden_layers": 2,
        "num_attention_heads": 5,
        "num_key_value_heads": 1,
        "vocab_size": 777,
        "tie_word_embeddings": True,
    },
    "gpt2": {
        "model_type": "gpt2",
        "n_embd": 72,
        "n_layer": 3,
        "n_head": 6,
        "n_inner": 200,
        "vocab_size": 131,
        "n_positions": 256,
    },
    "qwen3": {
        "model_type": "qwen3",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 20,
        "vocab_size": 131,
        "attention_bias": True,
    },
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
    "phi3": {
        "model_type": "phi3",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 131,
        "pad_token_id": 0,  # Phi3Config's default (32000) lies outside this vocabulary
    },
    "starcoder2": {
        "model_type": "starcoder2",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "vocab_size": 131,
    },
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
    "llama+dropout": {
        "model_type": "llama",
        "hidden_size": 72,
        "intermediate_size": 100,
        "num_hidden_layers": 3,
        "num_attention_heads": 6,
        "num_key_value_heads": 2,
        "head_dim": 20,
        "vocab_size": 131,
        "attention_dropout": 0.1,
    },
    "gpt2-no-dropout": {
        "model_type": "gpt2",
        "n_embd": 72,
        "n_layer": 3,
        "n_head": 6,
        "n_inner": 200,
        "vocab_size": 131,
        "n_positions": 256,
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
            result = measure_training_step(
                row["model"],
                batch=row["batch"],
                seq=row["seq"],
                precision=row["precision"],
                attention=row["attention"],
                steps=steps,
            )
            comp = compare(estimate_row(row), measured_row(result), row)
            ours = param_count(as_spec(row["model"]))
            theirs = transformers_param_count(row["model"])
        except Exception as exc:  # every row's outcome is data
            entry = {**row, "error": f"{type(exc).__name__}: {exc}", "pass": False}
        else:
            comp["param_count"] = {
                "estimated": ours,
                "measured": theirs,
                "difference": ours - theirs,
                "rel_error": round((ours - theirs) / theirs, 6),
                "pass": ours == theirs,
            }
            entry = {
                **row,
                "components": comp,
                "pass": all(c["pass"] for c in comp.values()),
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
    import torch
    import transformers

    started = time.perf_counter()
    results = run(rows(), steps=steps, log=log)
    worst = worst_rel_errors(results)
    return {
        "command": command,
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
        },
        "method": (
            "transformers model built from each config in FakeTensorMode on device cpu; "
            f"{steps} training iterations (HF causal-LM loss, backward, AdamW foreach step, "
            "zero_grad(set_to_none=True)) under MemTracker; steady state = last iteration. "
            "param_count: transformers' count of the model built from the raw config on the "
            "meta device."
        ),
        "configs": ARCH_CONFIGS,
        "seconds": round(time.perf_counter() - started, 1),
        "worst_rel_error": worst,
        "passed": sum(1 for r in results if r["pass"]),
        "rows": results,
    }


def default_path() -> Path:
    """``validation/archs.json`` of the source checkout."""
    return Path(__file__).resolve().parents[2] / "validation" / "archs.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vrammath.measure.archs", description=__doc__)
    parser.add_argument("--out", type=Path, default=None, help="write the document here")
    parser.add_argument("--diff", type=Path, default=None, help="compare with this file")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args(argv)
    command = "python -m vrammath.measure.archs " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    doc = build(command.strip(), steps=args.steps, log=lambda m: print(m, flush=True))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    status = 0
    if args.diff:
        changes = diff(doc, json.loads(args.diff.read_text(encoding="utf-8")))
        for line in changes:
            print("changed:", line)
        status = 1 if changes else 0
    for line in table(doc):
        print(line)
    print(f"{doc['passed']}/{len(doc['rows'])} rows pass; worst: {doc['worst_rel_error']}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
