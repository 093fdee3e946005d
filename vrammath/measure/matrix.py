"""The validation matrix: vrammath's estimates against memory PyTorch counts on real HF models.

``python -m vrammath.measure.matrix`` measures every row (fake tensors on a CPU), compares each
component with vrammath's estimate, and writes ``validation/matrix.json`` with the torch and
transformers versions and the command. ``--diff`` compares a fresh run with the committed file;
``--quick`` keeps only the rows marked quick (small models), ``--rows`` selects by id substrings;
``--update FILE`` measures the selected rows and puts them into FILE, every other row left as
it is; ``--rescore FILE`` compares a committed matrix's measured numbers with the current
estimates. The rows are in :mod:`vrammath.measure.matrix_rows`.

Targets: parameters, gradients and optimizer states exact (0 bytes); activations and the step peak
within 1%. A row outside the target stays failing, with its explanation in the data.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from vrammath.compose.estimate import estimate
from vrammath.compose.setup import Setup, with_changes
from vrammath.measure import documents
from vrammath.measure.build import RECIPE_OF, as_spec
from vrammath.measure.documents import diff  # importable from here, as it was
from vrammath.measure.matrix_rows import CONFIGS, GPT_TANH, GPU_ROWS, ROWS, SMALL_GQA, SMALL_TIED
from vrammath.measure.step import SETUP_KEYS, measure_training_step
from vrammath.model.params import size_values, tensors

TOLERANCE = {"exact": 0.0, "activations": 0.01, "peak": 0.01}
EXACT = ("parameters", "gradients", "optimizer")
ONE_PERCENT = ("activations", "forward_peak", "backward_peak", "step_peak", "peak", "first_peak")


def _model_arg(name: Any) -> Any:
    """A named config of :data:`CONFIGS`, a preset name, or a config dict as it is."""
    return CONFIGS.get(name, name) if isinstance(name, str) else name


def row_args(row: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments of :func:`~vrammath.measure.step.measure_training_step` (and of
    ``record_training_step``) a row sets: batch, sequence, precision, kernels and optimizer."""
    return {k: row[k] for k in SETUP_KEYS}


def step_counter_bytes(spec: Any, optimizer: str) -> int:
    """Adam's ``step`` counters: one fp32 scalar tensor per parameter tensor.

    For the for-loop and foreach implementations PyTorch keeps them on the host, so on a GPU they
    cost no device memory; the CPU count (and ``fused=True`` on a GPU) sees 4 bytes each.
    """
    if optimizer not in ("adam", "adamw"):
        return 0

    values = size_values(spec)
    return 4 * sum(int(t.count.subs(values)) for t in tensors(spec))


def setup_of(row: dict[str, Any], *, device: str = "cpu") -> Setup:
    """The :class:`~vrammath.compose.setup.Setup` a matrix row measures: its precision's recipe
    (:data:`~vrammath.measure.build.RECIPE_OF`), FSDP2 over ``zero3_ranks`` as ZeRO-3 on that
    many GPUs (states sharded per tensor on dim 0), the batch, sequence, attention, recomputation and optimizer of the row.

    >>> setup_of(ROWS[8]).zero, setup_of(ROWS[8]).gpus, setup_of(ROWS[8]).recipe
    (3, 8, 'bf16-pure')
    """
    ranks = row["zero3_ranks"]
    return Setup(
        as_spec(_model_arg(row["model"])),
        recipe=RECIPE_OF[row["precision"]],
        optimizer=row["optimizer"],
        implementation=row["implementation"],
        zero=3 if ranks else 0,
        gpus=ranks or 1,
        micro_batch=row["batch"],
        seq_len=row["seq"],
        attention=row["attention"],
        recompute=row["recompute"],
        device=device,
        shard="dim0" if ranks else "flat",  # FSDP2 shards each tensor's dim 0
    )


def estimate_row(row: dict[str, Any], *, device: str = "cpu") -> dict[str, int]:
    """vrammath's numbers for one row (bytes per component, steady state unless named first):
    :func:`vrammath.compose.estimate.estimate` of :func:`setup_of` the row, in the measured components.

    ``device="cpu"`` gives what the fake-tensor CPU count sees (CPU dropout and LayerNorm kernels,
    AdamW's step counters on the device); ``"cuda"`` what a GPU's allocator should see.
    """
    setup = setup_of(row, device=device)
    steady = estimate(setup)
    first = estimate(with_changes(setup, iteration="first"))

    def part(*keys: str) -> int:
        return sum(c.bytes or 0 for c in steady.components if c.key in keys)

    counters = device == "cpu" or row["implementation"] == "fused"
    return {
        "parameters": part("weights", "master"),
        "gradients": part("gradients"),
        "optimizer": part("optimizer")
        + (step_counter_bytes(setup.model, row["optimizer"]) if counters else 0),
        "activations": part("activations", "logits_loss"),
        **steady.phases,
        "peak": steady.gpu_bytes,
        "first_peak": first.gpu_bytes,
    }


def measured_row(result: dict[str, Any]) -> dict[str, int]:
    """The measured numbers of one row, in :func:`estimate_row`'s components."""
    st = result["steady"]
    first = result["first"]

    def cat(snap: dict[str, int], *names: str) -> int:
        return sum(snap.get(n, 0) for n in names)

    # FSDPMemTracker names the sharded states its own way
    out = {
        "parameters": cat(st["start"], "Parameter", "Sharded Param"),
        "gradients": cat(st["backward"]["end"], "Gradient", "Sharded Grad"),
        "optimizer": cat(st["start"], "Optstate", "OptState"),
        "activations": st["forward"]["end"]["Activation"],
        "forward_peak": st["forward"]["peak"]["Total"],
        "backward_peak": st["backward"]["peak"]["Total"],
        "step_peak": st["step"]["peak"]["Total"],
    }
    out["peak"] = max(
        st[ph]["peak"]["Total"] for ph in ("forward", "backward", "step", "zero_grad")
    )
    out["first_peak"] = max(
        first[ph]["peak"]["Total"] for ph in ("forward", "backward", "step", "zero_grad")
    )
    return out


def explain(row: dict[str, Any], name: str) -> str:
    """Why a component of a row misses its target (kept in the data, shown in the docs)."""
    eager = row["attention"] == "eager"
    if name in ("forward_peak", "peak", "first_peak") and eager:
        return (
            "forward peak: eager attention's transient score tensors inside the last layer "
            "(masked scores, the fp32 softmax input) are not in the model, which assumes the "
            "peak is at the loss; with a small vocabulary the layer's transient is larger"
        )
    if name in ("backward_peak", "peak", "first_peak") and eager:
        return (
            "backward peak: top layer's softmax backward approximated (probabilities' gradient, "
            "fp32 cast and the scores' gradient, with the MLP, second norm and o_proj input "
            "already freed); the weight gradients created by then are not counted"
        )
    if name in ("forward_peak", "peak", "first_peak") and row["precision"].startswith("autocast"):
        return (
            "forward peak under autocast is inside the last layer (RoPE promotes Q and K to "
            "fp32 before the 16-bit casts) when the logits are small, not at the loss"
        )
    return "not yet explained"


def compare(
    estimated: dict[str, int], measured: dict[str, int], row: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Per component: estimated, measured, relative error ((est - meas) / meas), pass."""
    out: dict[str, Any] = {}
    for name, meas in measured.items():
        est = estimated[name]
        err = (est - meas) / meas if meas else (0.0 if est == 0 else float("inf"))
        tol = TOLERANCE["exact"] if name in EXACT else TOLERANCE["peak"]
        ok = est == meas if name in EXACT else abs(err) <= tol
        out[name] = {
            "estimated": est,
            "measured": meas,
            "difference": est - meas,
            "rel_error": round(err, 6),
            "pass": ok,
        }
        if not ok and row is not None:
            out[name]["explanation"] = explain(row, name)
    return out


def run_rows(
    rows: list[dict[str, Any]], *, steps: int = 2, log: Any = None
) -> list[dict[str, Any]]:
    """Measure and compare each row; returns the matrix rows."""

    out = []
    for row in rows:
        started = time.perf_counter()
        try:
            result = measure_training_step(
                _model_arg(row["model"]),
                **row_args(row),
                zero3_ranks=row["zero3_ranks"],
                steps=steps,
            )
        except Exception as exc:  # a row that cannot run stays visible as failing
            entry = documents.failed(row, exc)
            out.append(entry)
            if log:
                log(f"{row['id']}: ERROR {entry['error']}")
            continue
        comp = compare(estimate_row(row), measured_row(result), row)
        entry = {
            **documents.scored(row, comp),
            "seconds": round(time.perf_counter() - started, 1),
            "phases": documents.phase_peaks(result),
        }
        out.append(entry)
        if log:
            worst = max(
                (abs(c["rel_error"]) for c in comp.values() if c["rel_error"] != float("inf")),
                default=0.0,
            )
            log(
                f"{row['id']}: {'PASS' if entry['pass'] else 'FAIL'} worst {worst:.4%} "
                f"({entry['seconds']} s)"
            )
    return out


def build_matrix(
    rows: list[dict[str, Any]], command: str, *, steps: int = 2, log: Any = None
) -> dict[str, Any]:
    """The whole matrix document (what ``validation/matrix.json`` holds)."""
    found = documents.versions()
    started = time.perf_counter()
    results = run_rows(rows, steps=steps, log=log)
    return {
        "command": command,
        "versions": found,
        "method": (
            "Hugging Face model built from the config in FakeTensorMode on device cpu; "
            f"{steps} training iterations (forward with HF's causal-LM loss, backward, AdamW step, "
            "zero_grad(set_to_none=True)) under torch.distributed._tools MemTracker "
            "(FSDPMemTracker over a fake process group for ZeRO-3); steady state = last iteration. "
            "transformers.masking_utils.find_packed_sequence_indices patched to None."
        ),
        "targets": {
            "exact": list(EXACT),
            "within_1_percent": list(ONE_PERCENT),
        },
        "configs": CONFIGS,
        "seconds": round(time.perf_counter() - started, 1),
        **documents.verdicts(results),
    }


def rescore(committed: dict[str, Any], command: str) -> dict[str, Any]:
    """The committed matrix compared again with the current estimates: measured numbers kept,
    every row's estimated side, errors and verdicts recomputed (what a change to the formulas,
    not to the measurement, needs)."""
    rows = []
    for row in committed["rows"]:
        if "components" not in row:
            rows.append(row)
            continue
        spec_row = {k: row[k] for k in ROW_KEYS}
        measured = {name: c["measured"] for name, c in row["components"].items()}
        rows.append(documents.scored(row, compare(estimate_row(spec_row), measured, spec_row)))
    return {**committed, "rescored": command, **documents.verdicts(rows)}


def update(committed: dict[str, Any], fresh: dict[str, Any], command: str) -> dict[str, Any]:
    """``committed`` with the rows of ``fresh`` put in, in :data:`ROWS`' order
    (:func:`vrammath.measure.documents.updated`)."""
    return documents.updated(committed, fresh, ROWS, CONFIGS, command)


ROW_KEYS = (
    "id",
    "model",
    "batch",
    "seq",
    "precision",
    "attention",
    "recompute",
    "optimizer",
    "implementation",
    "zero3_ranks",
    "quick",
)


def default_path() -> Path:
    """``validation/matrix.json`` of the source checkout."""
    return documents.validation_file("matrix.json")


def run_cuda_rows(rows: list[dict[str, Any]], log: Any = None) -> list[dict[str, Any]]:
    """Measure rows on a CUDA GPU (allocator counters) and compare with the CUDA estimates."""

    out = []
    for row in rows:
        started = time.perf_counter()
        try:
            result = measure_training_step(
                _model_arg(row["model"]), **row_args(row), steps=2, device="cuda"
            )
            comp = compare(estimate_row(row, device="cuda"), measured_row(result), row)
            entry = {
                **documents.scored(row, comp),
                "allocator": result["steady"].get("allocator", {}),
                "phases": documents.phase_peaks(result),
            }
        except Exception as exc:  # keep going: every row's outcome is data
            entry = documents.failed(row, exc)
        entry["seconds"] = round(time.perf_counter() - started, 1)
        out.append(entry)
        if log:
            log(f"{row['id']}: {'PASS' if entry['pass'] else 'FAIL'} {entry.get('error', '')}")
        import torch

        torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = documents.document_parser(
        "vrammath.measure.matrix",
        __doc__,
        out_help="write the matrix here",
        diff_help="compare with this matrix file",
    )
    parser.add_argument("--quick", action="store_true", help="small-model rows only")
    parser.add_argument(
        "--rows", default=None, help="only rows whose id contains this (or one of a,b,...)"
    )
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument(
        "--update",
        type=Path,
        default=None,
        help="measure the selected rows and put them into this matrix file (others unchanged)",
    )
    parser.add_argument("--cuda", action="store_true", help="measure GPU_ROWS on a CUDA GPU")
    parser.add_argument(
        "--rescore",
        type=Path,
        default=None,
        help="compare this matrix's measured numbers with the current estimates (no measuring)",
    )
    args = parser.parse_args(argv)
    if args.rescore:
        rescored = rescore(
            json.loads(args.rescore.read_text(encoding="utf-8")),
            "python -m vrammath.measure.matrix " + " ".join(argv or sys.argv[1:]),
        )
        out = args.out or args.rescore
        out.write_text(json.dumps(rescored, indent=1) + "\n", encoding="utf-8")
        print(f"{rescored['passed']}/{len(rescored['rows'])} rows pass")
        return 0
    if args.cuda:
        import torch
        import transformers

        results = run_cuda_rows(GPU_ROWS, log=lambda m: print(m, flush=True))
        doc = {
            "command": "python -m vrammath.measure.matrix --cuda",
            "versions": {
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "gpu": torch.cuda.get_device_name(0),
            },
            "method": "CUDA caching allocator: memory_allocated at phase ends, "
            "max_memory_allocated per phase after reset_peak_memory_stats",
            "rows": results,
        }
        documents.write_doc(args.out, doc)
        return 0
    rows = [r for r in ROWS if (r["quick"] or not args.quick)]
    if args.rows:
        wanted = args.rows.split(",")
        rows = [r for r in rows if any(w in r["id"] for w in wanted)]
    command = documents.command_line("vrammath.measure.matrix", argv)
    matrix = build_matrix(rows, command, steps=args.steps, log=lambda m: print(m, flush=True))
    documents.write_doc(args.out, matrix)
    if args.update:
        committed = json.loads(args.update.read_text(encoding="utf-8"))
        merged = update(committed, matrix, command)
        args.update.write_text(json.dumps(merged, indent=1) + "\n", encoding="utf-8")
    status = documents.diff_status(args.diff, matrix)
    print(documents.pass_line(matrix))
    return status


__all__ = [
    "CONFIGS",
    "EXACT",
    "GPT_TANH",
    "GPU_ROWS",
    "ONE_PERCENT",
    "ROWS",
    "ROW_KEYS",
    "SMALL_GQA",
    "SMALL_TIED",
    "TOLERANCE",
    "build_matrix",
    "compare",
    "diff",
    "estimate_row",
    "explain",
    "measured_row",
    "rescore",
    "run_cuda_rows",
    "run_rows",
    "setup_of",
    "step_counter_bytes",
    "update",
]


if __name__ == "__main__":
    raise SystemExit(main())
