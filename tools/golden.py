"""Write tests/data/golden.json: the numbers vrammath printed before a refactor, to pin them.

``python tools/golden.py`` evaluates a fixed grid of training and serving setups over every
preset (and the validation matrix's rows) and records only bytes: components, phases and totals.
``tests/test_golden.py`` recomputes the same grid and asserts that nothing moved. Regenerate only
when a change is meant to move a number, and say which and why in the commit: the script prints
every key that moved (old -> new bytes and the relative change) before it writes, so the
regenerated file is a reviewed diff. ``python tools/golden.py --check`` prints the same list and
writes nothing (exit 1 when anything moved).
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from typing import Any

import vrammath as vm
from vrammath.measure.matrix import ROWS, estimate_row

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "golden.json"

#: training setups applied to every preset (Setup keyword arguments)
TRAINING: tuple[dict[str, Any], ...] = (
    {},
    {"zero": 2, "gpus": 4, "gpu": "A100-80GB"},
    {"zero": 3, "gpus": 8, "seq_len": 4096, "recompute": "full", "gpu": "A100-80GB"},
    {"zero": 3, "gpus": 8, "offload_optimizer": True, "offload_params": True},
    {"zero": 1, "gpus": 8, "recipe": "fp32", "attention": "eager", "micro_batch": 2},
    {"recipe": "autocast-bf16", "implementation": "for-loop", "seq_len": 512},
    {"recipe": "fp16-mixed", "optimizer": "sgd-momentum", "iteration": "first"},
    {"recipe": "bf16-megatron", "optimizer": "adam8bit", "zero": 2, "gpus": 2},
    {"recipe": "bf16-pure", "optimizer": "adafactor", "implementation": "fused"},
    {"lora_rank": 16, "lora_targets": ("q", "v"), "micro_batch": 2, "seq_len": 1024},
    {"lora_rank": 8, "lora_targets": "all-linear", "quant": "nf4", "recompute": "full"},
    {"lora_rank": 64, "quant": "int8", "zero": 2, "gpus": 4, "lora_dropout": True},
    {"tp": 8, "pp": 4, "sp": True, "recompute": "selective", "zero": 1, "gpus": 8},
    {"tp": 2, "pp": 2, "schedule": "interleaved", "chunks": 2},
    {"activation_model": "korthikanti", "recompute": "full"},
)

SERVING: tuple[dict[str, Any], ...] = (
    {},
    {"context": 32768, "batch": 8, "gpu": "H100-80GB"},
    {"weights": "nf4", "kv_dtype": "fp8-e4m3", "tp": 2, "block": None},
    {"weights": "int8", "kv_dtype": "fp16", "tp": 4, "gpu": "A100-40GB", "gpu_util": 0.8},
)


def _training(model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        est = vm.estimate(vm.Setup(vm.load_model(model), **kwargs))
    except vm.InputError:
        return {"refused": True}
    d = vm.estimate_dict(est)
    return {
        "components": {c["key"]: c["bytes"] for c in d["components"]},  # type: ignore[union-attr]
        "phases": d["phases"],
        "totals": d["totals"],
    }


def _serving(model: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    try:
        d = vm.serve_dict(vm.serve(vm.Serve(vm.load_model(model), **kwargs)))
    except vm.InputError:
        return {"refused": True}
    d.pop("setup")
    d.pop("kv_cache_expr")
    return d


def golden() -> dict[str, Any]:
    """Every number of the grid, keyed by model and setup."""
    out: dict[str, Any] = {"params": {}, "training": {}, "serving": {}, "matrix": {}}
    for model in vm.model_names():
        out["params"][model] = vm.param_count(vm.load_model(model))
        for i, kw in enumerate(TRAINING):
            out["training"][f"{model}/{i}"] = _training(model, kw)
        for i, kw in enumerate(SERVING):
            out["serving"][f"{model}/{i}"] = _serving(model, kw)
    for row in ROWS:
        out["matrix"][row["id"]] = estimate_row(row)
    return out


def moved(old: Any, new: Any, key: str = "") -> list[str]:
    """One line per leaf that differs between two golden trees: the key, old -> new, and the
    relative change where both are numbers.

    >>> moved({"a": {"x": 100, "y": 1}}, {"a": {"x": 110, "y": 1, "z": 2}})
    ['a/x: 100 -> 110 (+10.00 %)', 'a/z: (absent) -> 2']
    """
    if isinstance(old, dict) and isinstance(new, dict):
        lines: list[str] = []
        for k in sorted(old.keys() | new.keys(), key=str):
            sub = f"{key}/{k}" if key else str(k)
            if k not in new:
                lines.append(f"{sub}: {old[k]!r} -> (absent)")
            elif k not in old:
                lines.append(f"{sub}: (absent) -> {new[k]!r}")
            else:
                lines += moved(old[k], new[k], sub)
        return lines
    if old == new:
        return []
    numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (old, new))
    if numbers and old:
        return [f"{key}: {old!r} -> {new!r} ({100 * (new - old) / old:+.2f} %)"]
    return [f"{key}: {old!r} -> {new!r}"]


def main(argv: list[str]) -> int:
    # the grid goes past some models' positions on purpose: bytes only, no quality claim
    warnings.simplefilter("ignore", vm.ContextWarning)
    new = golden()
    old = json.loads(OUT.read_text()) if OUT.is_file() else {}
    lines = moved(old, new)
    for line in lines:
        print(line)
    print(f"{len(lines)} key(s) moved", file=sys.stderr)
    if "--check" in argv:
        return 1 if lines else 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(new, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
