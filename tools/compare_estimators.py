"""Run the memory estimators people use on vrammath's setups and write validation/estimators.json.

Usage (from the repository root; ``nox -s compare`` installs what it needs and runs this)::

    python tools/compare_estimators.py [--out validation/estimators.json] [--matrix validation/matrix.json]

Needs torch (CPU build), transformers, accelerate and deepspeed (``DS_BUILD_OPS=0 pip install
--no-build-isolation deepspeed``). Models are built on the meta device from the verbatim
config.json files in ``conf/models``; nothing is downloaded.

The quantity compared is what every tool here claims to estimate: **per-GPU bytes of the model
states** (weights, gradients, master weights, optimizer states, and under ZeRO-3 the gathered
layer(s)) for mixed-precision AdamW. For each setup and tool the file records the tool's number
in bytes, what the tool itself prints, and the relative error ``(tool - reference) / reference``
against vrammath and, where ``validation/matrix.json`` has a measurement of the same setup,
against the measured value.

The tools:

* **DeepSpeed** -- ``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs``
  and ``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``, called as its
  ``*_all_cold`` printers call them (offload options as in the setup, ``zero_init=True``, buffer
  factor 1.5). They return bytes; the tables they print divide by 2**30 and label it "GB". The
  largest layer is taken with DeepSpeed's own rule (``model_to_params``: the module with the most
  direct parameters) on the real ``AutoModelForCausalLM`` built on the meta device; the total
  is ``model.parameters()`` (tied weights once -- DeepSpeed dedupes by ``data_ptr``, which is 0
  for every meta tensor, so its own total cannot run on a meta model).
* **accelerate** -- ``accelerate.utils.calculate_maximum_sizes`` on the model exactly as
  ``accelerate.commands.estimate.create_empty_model`` builds it after its Hub lookup
  (``AutoModel.from_config`` in float32 under ``init_empty_weights``: the *base* model, no LM
  head), then ``estimate_training_usage(total, "bfloat16")``; "Training using Adam" is the
  largest of its entries (not their sum), printed with 1024-based units labelled "GB". It has no
  notion of sharding: it is compared on single-GPU setups only.
* **Megatron-LM** -- ``megatron/training/theoretical_memory_usage.py`` cannot be installed as a
  package; :func:`megatron_weight_and_optimizer_bytes` re-derives its
  ``compute_weight_and_optimizer_memory`` (see its docstring). It covers plain data
  parallelism (18 bytes/parameter) and the distributed optimizer (ZeRO-1: 6 + 12/DP).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import platform
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sympy

import vrammath
from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup
from vrammath.measure.build import RECIPE_OF
from vrammath.model.params import param_count
from vrammath.model.presets import load_model, raw_config
from vrammath.model.spec import ModelSpec
from vrammath.notation.symbols import N_d, P
from vrammath.terms.parallel import convention_bytes

ROOT = Path(__file__).resolve().parent.parent
STATE_KEYS = ("weights", "gradients", "master", "optimizer", "gathered")
MODELS = ("gpt2", "llama-7b", "mistral-7b", "qwen2-7b", "llama-2-70b", "qwen2-72b")
CONFIGS: tuple[dict[str, Any], ...] = (
    {"zero": 0, "gpus": 1},
    {"zero": 1, "gpus": 8},
    {"zero": 2, "gpus": 8},
    {"zero": 2, "gpus": 8, "offload_optimizer": True},
    {"zero": 3, "gpus": 8},
    {"zero": 3, "gpus": 64},
    {"zero": 3, "gpus": 8, "offload_optimizer": True},
    {"zero": 3, "gpus": 8, "offload_optimizer": True, "offload_params": True},
)
GPUS_PER_NODE = 8


@dataclass
class Case:
    """One setup and every tool's answer for it."""

    model: str
    config: dict[str, Any]
    recipe: str = "bf16-mixed"
    tools: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def id(self) -> str:
        parts = [self.model, self.recipe, f"zero{self.config['zero']}", f"{self.config['gpus']}gpu"]
        if self.config.get("offload_optimizer"):
            parts.append("offload-opt")
        if self.config.get("offload_params"):
            parts.append("offload-params")
        return "/".join(parts)


# --- the models, built as each tool builds them ----------------------------------------------


def _hf_config(name: str) -> Any:
    from transformers import AutoConfig

    cfg = dict(raw_config(name))
    return AutoConfig.for_model(str(cfg.pop("model_type")), **cfg)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def _causal_lm(name: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    with _quiet(), torch.device("meta"):
        return AutoModelForCausalLM.from_config(_hf_config(name), dtype=torch.float32)


def _accelerate_model(name: str) -> Any:
    """The model as accelerate's create_empty_model builds it once it has the config."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoModel

    with _quiet(), init_empty_weights():
        return AutoModel.from_config(_hf_config(name), dtype=torch.float32)


# --- each tool -------------------------------------------------------------------------------


def vrammath_states(case: Case, spec: ModelSpec) -> dict[str, Any]:
    est = estimate(Setup(spec, recipe=case.recipe, **case.config))
    states = sum(c.bytes or 0 for c in est.components if c.device == "gpu" and c.key in STATE_KEYS)
    return {
        "gpu_bytes": states,
        "components": {
            c.key: c.bytes
            for c in est.components
            if c.device == "gpu" and c.key in STATE_KEYS and c.bytes
        },
        "gpu_peak": est.gpu_bytes,  # the step's peak at b = 1, s = 2048, activations included
        "cpu_bytes": est.cpu_bytes,
        "expr": str(sum((c.expr for c in est.components if c.key in STATE_KEYS and c.expr), 0)),
    }


def deepspeed_estimate(case: Case, total: int, largest_layer: int) -> dict[str, Any]:
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    zero, gpus = case.config["zero"], case.config["gpus"]
    if zero not in (2, 3):
        return {"gpu_bytes": None, "note": "DeepSpeed's estimators cover ZeRO-2 and ZeRO-3 only"}
    per_node = min(gpus, GPUS_PER_NODE)
    nodes = max(1, gpus // GPUS_PER_NODE)
    offload_opt = bool(case.config.get("offload_optimizer"))
    if zero == 2:
        cpu, gpu = estimate_zero2_model_states_mem_needs(
            total, num_gpus_per_node=per_node, num_nodes=nodes, cpu_offload=offload_opt
        )
        call = "estimate_zero2_model_states_mem_needs"
    else:
        cpu, gpu, _ = estimate_zero3_model_states_mem_needs(
            total,
            largest_layer,
            num_gpus_per_node=per_node,
            num_nodes=nodes,
            cpu_offload=offload_opt,
            cpu_offload_params=bool(case.config.get("offload_params")),
            zero_init=True,
        )
        call = "estimate_zero3_model_states_mem_needs"
    convention = None
    if not offload_opt:
        expr = convention_bytes("deepspeed", zero, sympy.Integer(largest_layer))
        convention = int(sympy.floor(expr.subs({P: total, N_d: gpus})))
    return {
        "gpu_bytes": int(gpu),
        "cpu_bytes": int(cpu),
        "vrammath_convention_bytes": convention,
        "printed": f"{gpu / 2**30:.2f}GB",
        "call": f"{call}(total_params={total}, largest_layer_params={largest_layer}, "
        f"num_gpus_per_node={per_node}, num_nodes={nodes}, cpu_offload={offload_opt})",
    }


def accelerate_estimate(case: Case, name: str) -> dict[str, Any]:
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes, convert_bytes

    if case.config["gpus"] != 1 or case.config["zero"] != 0:
        return {"gpu_bytes": None, "note": "accelerate's estimate-memory has no sharding"}
    total_size, largest = calculate_maximum_sizes(_accelerate_model(name))
    dtype = {"bf16-mixed": "bfloat16", "fp16-mixed": "float16", "fp32": "float32"}[case.recipe]
    usage = estimate_training_usage(total_size, dtype)
    peak = max(usage.values())
    return {
        "gpu_bytes": int(peak),
        "printed": convert_bytes(peak),
        "model_fp32_bytes": int(total_size),
        "largest_layer_fp32_bytes": int(largest[0]),
        "entries": {k: int(v) for k, v in usage.items()},
    }


def megatron_weight_and_optimizer_bytes(
    spec: ModelSpec,
    *,
    data_parallel: int = 1,
    distributed_optimizer: bool = False,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    vocab_divisible_by: int = 128,
) -> float:
    """Megatron-LM's theoretical weight-and-optimizer bytes on its most loaded GPU.

    Re-derived (not copied) from ``compute_weight_and_optimizer_memory`` in NVIDIA/Megatron-LM,
    ``megatron/training/theoretical_memory_usage.py`` (dense form at commit 38644dd7; later
    revisions add the SwiGLU multiplier 3/2 and the query-projection/hidden ratio used here):

    * per layer ``2h * (I * g + 2) + 2h * (a*d + a_kv*d)``, ``g = 3/2`` for a gated (SwiGLU) MLP
      -- two weight matrices of ``h x I`` scaled by ``g``, two norms counted as 2h each (weight
      and bias, even for RMSNorm), Q/O and K/V projections; no attention or MLP biases;
    * a final norm ``2h`` and the embedding ``h * V'`` (twice when untied), where ``V'`` is the
      vocabulary padded to a multiple of ``vocab_divisible_by * t``;
    * the most loaded shard: ``(block / p + embedding) / t``, plus the output layer when untied
      and ``p = 1``;
    * bytes per parameter: 18 (bf16 weight 2 + fp32 main_grad 4 + fp32 master 4 + Adam 8), or
      with the distributed optimizer ``6 + 12 / DP``.
    """
    h, inter, layers = spec.hidden, spec.intermediate, spec.layers
    gated = 1.5 if spec.mlp.gated else 1.0
    attention = 2 * h * (spec.heads * spec.head_dim + spec.kv_heads * spec.head_dim)
    layer = 2 * h * (inter * gated + 2) + attention
    block = layer * layers + 2 * h
    multiple = vocab_divisible_by * tensor_parallel
    padded_vocab = math.ceil(spec.vocab / multiple) * multiple
    embedding = h * padded_vocab
    shard = (block / pipeline_parallel + embedding) / tensor_parallel
    if not spec.tied_embeddings and pipeline_parallel == 1:
        shard += embedding / tensor_parallel
    per_param = 6 + 12 / data_parallel if distributed_optimizer else 18
    return shard * per_param


def megatron_estimate(case: Case, spec: ModelSpec) -> dict[str, Any]:
    zero, gpus = case.config["zero"], case.config["gpus"]
    if zero not in (0, 1) or case.config.get("offload_optimizer"):
        return {
            "gpu_bytes": None,
            "note": "Megatron's formula covers plain DP and the distributed optimizer (ZeRO-1)",
        }
    value = megatron_weight_and_optimizer_bytes(
        spec, data_parallel=gpus, distributed_optimizer=zero == 1
    )
    return {
        "gpu_bytes": round(value),
        "printed": f"weight and optimizer={value / 2**20:.2f} MB",
        "distributed_optimizer": zero == 1,
    }


# --- measured values (validation/matrix.json, written by the measurement session) -------------


def _measured_rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    data = json.loads(path.read_text(encoding="utf-8"))
    rows = data.get("rows", data.get("cases", [])) if isinstance(data, dict) else data
    return [row for row in rows if isinstance(row, dict)]


def _measured_states(row: dict[str, Any]) -> int | None:
    """Model-state bytes of a measured row: an explicit total, or Parameter+Gradient+Optstate."""
    measured = row.get("measured", row)
    if not isinstance(measured, dict):
        return None
    for key in ("model_state_bytes", "model_states_bytes", "model_states"):
        if isinstance(measured.get(key), int):
            return int(measured[key])
    cats = measured.get("categories", measured.get("steady", {}))
    if isinstance(cats, dict) and all(k in cats for k in ("Parameter", "Gradient", "Optstate")):
        return int(cats["Parameter"] + cats["Gradient"] + cats["Optstate"])
    return None


def find_measured(case: Case, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The measured row of the same model, recipe, optimizer, stage and GPU count, if any."""
    for row in rows:
        setup = row.get("setup", row)
        if not isinstance(setup, dict) or row.get("model", setup.get("model")) != case.model:
            continue
        # matrix rows name a precision (measure.build.RECIPE_OF maps it) and zero3_ranks (None: unsharded)
        recipe = setup.get("recipe") or RECIPE_OF.get(str(setup.get("precision")), "")
        ranks = setup.get("gpus") or setup.get("zero3_ranks") or 1
        stage = setup.get("zero", 3 if setup.get("zero3_ranks") else 0)
        same = (
            recipe == case.recipe
            and setup.get("optimizer", "adamw") == "adamw"
            and int(stage) == case.config["zero"]
            and int(ranks) == case.config["gpus"]
            and not setup.get("offload_optimizer")
            and not case.config.get("offload_optimizer")
        )
        value = _measured_states(row)
        if same and value is not None:
            return {"gpu_bytes": value, "source": row.get("id", row.get("source", "matrix.json"))}
    return None


# --- the table -------------------------------------------------------------------------------


def _rel(value: int | None, ref: int | None) -> float | None:
    if value is None or ref is None or ref == 0:
        return None
    return round((value - ref) / ref, 6)


REASONS = {
    "deepspeed": (
        "counts 18 bytes/parameter of sharded state -- fp16 gradient 2 + fp32 gradient 4 + "
        "master 4 + Adam 8 -- where vrammath's bf16-mixed shards 2 + 4 + 8 (PyTorch-style "
        "mixed precision keeps no separate fp32 gradient copy): +4P/N_d at ZeRO-2 and ZeRO-3; "
        "ZeRO-3 adds 4 bytes x the largest *module* (the embedding or LM head, not a decoder "
        "layer) where vrammath counts two gathered 16-bit decoder layers, so wide-vocabulary "
        "models (Qwen2) and small models (GPT-2) come out far higher; with optimizer offload "
        "the two agree at ZeRO-2 (2P each) and differ by the gathered term at ZeRO-3; with "
        "parameter offload too, the GPU keeps only the layers being computed: vrammath's two "
        "gathered 16-bit decoder layers against DeepSpeed's 4 bytes x the largest module"
    ),
    "accelerate": (
        "reports the largest single entry (optimizer states 8P in fp32 for bf16 training) rather "
        "than the sum of weights, gradients and states, on the base model without its LM head "
        "(AutoModel), so it under-counts mixed-precision Adam by about half"
    ),
    "megatron": (
        "18 bytes/parameter (fp32 main_grad accumulation, no 2-byte gradient), 6 + 12/DP with "
        "the distributed optimizer; its parameter count approximates the layer (LayerNorm "
        "weight+bias for RMSNorm, no QKV bias, vocabulary padded to 128)"
    ),
}


def run(matrix: Path) -> dict[str, Any]:
    import accelerate
    import deepspeed
    import torch
    import transformers

    measured_rows = _measured_rows(matrix)
    cases = [Case(model, dict(cfg)) for model in MODELS for cfg in CONFIGS]
    sizes: dict[str, tuple[int, int]] = {}
    for name in MODELS:
        from deepspeed.runtime.zero.stage3 import model_to_params

        model = _causal_lm(name)
        total = sum(p.numel() for p in model.parameters())
        _, largest_layer = model_to_params(model)
        sizes[name] = (int(total), int(largest_layer))
        del model
    out_cases = []
    for case in cases:
        spec = load_model(case.model)
        total, largest_layer = sizes[case.model]
        tools = {
            "vrammath": vrammath_states(case, spec),
            "deepspeed": deepspeed_estimate(case, total, largest_layer),
            "accelerate": accelerate_estimate(case, case.model),
            "megatron": megatron_estimate(case, spec),
        }
        measured = find_measured(case, measured_rows)
        ref = tools["vrammath"]["gpu_bytes"]
        out_cases.append(
            {
                "id": case.id,
                "model": case.model,
                "params": param_count(spec),
                "hf_params": total,
                "largest_layer_params_deepspeed_rule": largest_layer,
                "setup": {"recipe": case.recipe, "optimizer": "adamw", **case.config},
                "tools": tools,
                "measured": measured,
                "rel_error_vs_vrammath": {
                    name: _rel(tool["gpu_bytes"], ref)
                    for name, tool in tools.items()
                    if name != "vrammath"
                },
                "rel_error_vs_measured": None
                if measured is None
                else {
                    name: _rel(tool["gpu_bytes"], measured["gpu_bytes"])
                    for name, tool in tools.items()
                },
            }
        )
    summary: dict[str, Any] = {}
    for name in ("deepspeed", "accelerate", "megatron"):
        errs = [
            c["rel_error_vs_vrammath"][name]
            for c in out_cases
            if c["rel_error_vs_vrammath"][name] is not None
        ]
        summary[name] = {
            "setups": len(errs),
            "min": min(errs) if errs else None,
            "max": max(errs) if errs else None,
            "mean_abs": round(sum(abs(e) for e in errs) / len(errs), 6) if errs else None,
            "why": REASONS[name],
        }
    return {
        "generated_by": "tools/compare_estimators.py",
        "command": "nox -s compare  (python tools/compare_estimators.py "
        "--out validation/estimators.json)",
        "versions": {
            "python": platform.python_version(),
            "vrammath": vrammath.__version__,
            "sympy": sympy.__version__,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "accelerate": accelerate.__version__,
            "deepspeed": deepspeed.__version__,
        },
        "quantity": "per-GPU bytes of model states (weights, gradients, master weights, "
        "optimizer states, ZeRO-3 gathered parameters) for bf16 mixed-precision AdamW; "
        "activations and optimizer-step temporaries excluded",
        "units": "bytes. DeepSpeed's tables print bytes / 2**30 labelled 'GB'; accelerate "
        "prints 1024-based units labelled 'GB'; Megatron prints bytes / 2**20 labelled 'MB'",
        "relative_error": "(tool - reference) / reference",
        "measured_source": str(matrix.relative_to(ROOT)) if matrix.is_file() else None,
        "summary": summary,
        "cases": out_cases,
    }


def main(argv: list[str] | None = None) -> int:
    # the grid goes past some models' positions on purpose: bytes only, no quality claim
    warnings.simplefilter("ignore", vrammath.ContextWarning)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "validation" / "estimators.json")
    parser.add_argument("--matrix", type=Path, default=ROOT / "validation" / "matrix.json")
    args = parser.parse_args(argv)
    data = run(args.matrix.resolve())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    for name, row in data["summary"].items():
        print(
            f"{name:10} setups={row['setups']:3} rel. error vs vrammath "
            f"min={row['min']} max={row['max']} mean|.|={row['mean_abs']}",
            file=sys.stderr,
        )
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
