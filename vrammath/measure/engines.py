"""Real training engines on 8 fake ranks against vrammath's estimate of the same recipe.

``python -m vrammath.measure.engines --out validation/engines.json`` measures every row (with
:func:`vrammath.measure.engine_runs.measure_engine`), compares each component with
``vrammath.estimate`` and writes the document; ``--diff validation/engines.json`` compares a fresh
run with the committed file; ``--quick`` keeps the small-model rows; ``--rows`` selects by id.

Targets: model states exact (parameters with masters, gradients, optimizer states, their sum, the
host's share under offload); every phase peak within 1%. A row outside the target stays failing,
with its explanation, term by term, in the data.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any

import vrammath as vm
from vrammath.measure import documents
from vrammath.measure.build import as_spec
from vrammath.measure.ddp_runs import DDP_RUNS, measure_ddp
from vrammath.measure.deepspeed_runs import measure_deepspeed_row
from vrammath.measure.engine_runs import (
    CONFIGS,
    ENGINES,
    LOOPS,
    PHASE_NAMES,
    STATES,
    TINY_LLAMA,
    Float16MasterOptimizer,
    measure_engine,
)


def _stage3_fields(cfg: dict[str, Any], spec: Any) -> dict[str, Any]:
    """Stage 3's gathering keys of a row, read as ``--deepspeed`` reads a config."""
    if not cfg.get("stage3"):
        return {}
    config = {"zero_optimization": {"stage": 3, **cfg["stage3"]}, "bf16": {"enabled": True}}
    return {"stage3": vm.deepspeed_fields(config, spec)[0]["stage3"]}


def estimate_engine(
    engine: str, model: Any, *, batch: int, seq: int, attention: str, ranks: int, rank: int = 0
) -> dict[str, Any]:
    """vrammath's numbers for the recipe an engine implements, from the public API only."""

    cfg = ENGINES[engine]
    spec = as_spec(model)
    offload = bool(cfg.get("offload"))
    profile = cfg.get("profile", "hf")

    def setup(iteration: str) -> Any:
        return vm.Setup(
            spec,
            recipe=cfg["recipe"],
            optimizer="adamw",
            implementation="foreach",
            zero=cfg["zero"],
            gpus=ranks if cfg["zero"] or profile != "hf" else 1,
            micro_batch=batch,
            seq_len=seq,
            attention=attention,
            device="cpu",
            offload_optimizer=offload,
            # DeepSpeed's rows offload what their config names
            offload_params=offload
            and (profile != "deepspeed" or "offload_param" in cfg.get("stage3", {})),
            iteration=iteration,
            engine=profile,
            # no --rank where every rank holds the same (DeepSpeed's stage 3 among them)
            rank=None
            if profile in ("hf", "ddp", "megatron") or (profile == "deepspeed" and cfg["zero"] == 3)
            else rank,
            no_reshard=cfg.get("reshard") is False,
            bucket_view=bool(cfg.get("bucket_view")),
            reduce_bucket_size=cfg.get("bucket"),
            recompute=cfg.get("recompute", "none"),
            **_stage3_fields(cfg, spec),
        )

    est = vm.estimate(setup("steady"))
    first = vm.estimate(setup("first"))

    def comp(*keys: str) -> int:
        return sum(c.bytes or 0 for c in est.components if c.key in keys)

    out = {
        "parameters": comp("weights", "master"),
        # with gradient_as_bucket_view the gradients are DDP's buckets
        # Megatron's main_grad buffer is its gradients, DeepSpeed ZeRO-3's its partitions' buffer
        "gradients": comp(
            "gradients",
            "main_grads",
            "stage3_grad_partitions",
            *(["ddp_buckets"] if cfg.get("bucket_view") else []),
        ),
        "optimizer": comp("optimizer"),
        "forward_peak": est.phases["forward_peak"],
        "backward_peak": est.phases["backward_peak"],
        "step_peak": est.phases["step_peak"],
        "first_peak": max(first.phases.values()),
    }
    if offload:
        out["host"] = est.cpu_bytes
    out["states"] = out["parameters"] + out["gradients"] + out["optimizer"]
    return out


def measured_engine(result: dict[str, Any], engine: str) -> dict[str, int]:
    """Rank 0's numbers in :func:`estimate_engine`'s components (steady iteration)."""
    st = result["steady"]
    states = st["states"]
    out = {k: states[k] for k in STATES}
    out["states"] = sum(out.values())
    peaks = {ph: st[ph]["peak"]["Total"] for ph in PHASE_NAMES}
    if "host" in st:  # DeepSpeed's offload: its host tensors by name, the rest the device
        resident = st["host"] + st["host_counters"]
        return {
            "host": st["host"],
            "forward_peak": peaks["forward"] - resident,
            "backward_peak": peaks["backward"] - resident,
        }
    if ENGINES[engine].get("offload"):
        # one CPU holds both sides: the host part is the offloaded shards, the rest is the device
        host_idle = st["states_after_step"]
        resident = host_idle["parameters"] + host_idle["optimizer"] + host_idle["step_counters"]
        return {"host": out["states"], "forward_peak": peaks["forward"] - resident}
    out["forward_peak"] = peaks["forward"]
    out["backward_peak"] = peaks["backward"]
    out["step_peak"] = peaks["step"]
    out["first_peak"] = max(result["first"][ph]["peak"]["Total"] for ph in PHASE_NAMES)
    return out


EXACT = ("parameters", "gradients", "optimizer", "states", "host")
TOLERANCE = 0.01

#: Why a component of an engine row misses its target, by (engine, component): every row of the
#: committed table passes now; a miss found later is explained here, kept in the data and the docs.
EXPLAIN: dict[tuple[str, str], str] = {}


def explain(engine: str, name: str) -> str:
    """Why a component of an engine row misses its target (kept in the data and the docs)."""
    if (engine, name) in EXPLAIN:
        return EXPLAIN[(engine, name)]
    if name in ("step_peak", "forward_peak", "backward_peak", "first_peak"):
        for key in ("step_peak", "forward_peak", "backward_peak", "parameters", "optimizer"):
            if (engine, key) in EXPLAIN:
                return "follows from " + key + ": " + EXPLAIN[(engine, key)]
    if name == "states":
        for key in ("parameters", "gradients", "optimizer"):
            if (engine, key) in EXPLAIN:
                return "follows from " + key + ": " + EXPLAIN[(engine, key)]
    return "not yet explained"


def compare(engine: str, estimated: dict[str, int], measured: dict[str, int]) -> dict[str, Any]:
    """Per component: estimated, measured, relative error ((est - meas) / meas), pass."""
    out: dict[str, Any] = {}
    for name, meas in measured.items():
        est = estimated[name]
        # nothing measured and something estimated: no relative error (None), a failure
        err = (est - meas) / meas if meas else (0.0 if est == 0 else None)
        ok = est == meas if name in EXACT else err is not None and abs(err) <= TOLERANCE
        out[name] = {
            "estimated": est,
            "measured": meas,
            "difference": est - meas,
            "rel_error": None if err is None else round(err, 6),
            "pass": ok,
        }
        if not ok:
            out[name]["explanation"] = explain(engine, name)
    return out


def _row(
    engine: str, model: str, batch: int, seq: int, *, quick: bool, rank: int = 0
) -> dict[str, Any]:
    return {
        "id": f"{engine}/{model}/b{batch}/s{seq}/x8" + (f"/r{rank}" if rank else ""),
        "engine": engine,
        "model": model,
        "batch": batch,
        "seq": seq,
        "attention": "sdpa",
        "ranks": 8,
        "rank": rank,
        **ENGINES[engine],
        "quick": quick,
        "needs": "deepspeed" if engine.startswith("deepspeed") else None,
    }


ROWS: list[dict[str, Any]] = [
    *(
        _row(e, "tiny-llama", 1, 256, quick=True)
        for e in ENGINES
        if "bucket1m" not in e and not e.startswith("accel")
    ),
    # ZeroRedundancyOptimizer's ranks differ: the busiest (0) and the last, three shapes
    *(
        _row("zero1-zro", m, 1, 256, quick=True, rank=7)
        for m in ("tiny-llama", "tiny-qwen-tied", "tiny-odd-head")
    ),
    *(_row("zero1-zro", m, 1, 256, quick=True) for m in ("tiny-qwen-tied", "tiny-odd-head")),
    _row("zero1-zro-master", "tiny-llama", 1, 256, quick=True, rank=7),
    # DistributedDataParallel on the other two shapes (every rank holds the same bytes)
    _row("ddp", "tiny-qwen-tied", 1, 256, quick=True),
    _row("ddp-view", "tiny-odd-head", 1, 256, quick=True),
    _row("ddp-view-master", "tiny-qwen-tied", 1, 256, quick=True),
    # Megatron-Core's grad buffer on the other two shapes, one per buffer dtype
    _row("megatron-main-grad", "tiny-qwen-tied", 1, 256, quick=True),
    _row("megatron-bf16-grad", "tiny-odd-head", 1, 256, quick=True),
    # FSDP2: the last ranks own fewer rows (their optimizer states follow), three shapes;
    # accelerate's wrap on the two untied ones (it refuses tied embeddings)
    *(
        _row(e, m, 1, 256, quick=True, rank=int(r))
        for e, shapes in (
            (
                "zero3-fsdp",
                ("tiny-llama/7", "tiny-qwen-tied/0", "tiny-qwen-tied/7", "tiny-odd-head/7"),
            ),
            ("zero2-fsdp", ("tiny-qwen-tied/7", "tiny-odd-head/0")),
            ("offload-fsdp", ("tiny-odd-head/7",)),
            ("accel-fsdp", ("tiny-llama/0", "tiny-llama/7", "tiny-odd-head/0", "tiny-odd-head/7")),
            ("accel-fsdp-keep", ("tiny-llama/0",)),
        )
        for m, r in (shape.split("/") for shape in shapes)
    ),
    # DeepSpeed ZeRO-1/2: its ranks keep different whole gradients; the last rank and two shapes
    _row("deepspeed-zero2", "tiny-llama", 1, 256, quick=True, rank=7),
    _row("deepspeed-zero1", "tiny-qwen-tied", 1, 256, quick=True, rank=7),
    _row("deepspeed-zero2", "tiny-odd-head", 1, 256, quick=True),
    _row("deepspeed-zero2", "tiny-odd-head", 1, 256, quick=True, rank=7),
    # ZeRO-3: every tensor cut on its own, padded (every rank holds the same bytes; DeepSpeed
    # checks its trace across ranks, which a fake group cannot answer past rank 0)
    *(_row("deepspeed-zero3", m, 1, 256, quick=True) for m in ("tiny-qwen-tied", "tiny-odd-head")),
    _row("deepspeed-zero3-live", "tiny-odd-head", 1, 256, quick=True),
    _row("deepspeed-zero3-offload", "tiny-qwen-tied", 1, 256, quick=True),
    _row("deepspeed-zero3-recompute", "tiny-odd-head", 1, 256, quick=True),
    # 16 tokens: the backward's end (its gradients on their way to the kept ones) outweighs the
    # activations; with a bucket smaller than the model, ZeRO-2 flushes it mid-backward
    *(
        _row(e, "tiny-llama", 1, 16, quick=True)
        for e in ("deepspeed-zero1", "deepspeed-zero1-bucket1m", "deepspeed-zero2-bucket1m")
    ),
    _row("megatron-copy", "llama-7b", 1, 512, quick=False),
    _row("megatron-main-grad", "llama-7b", 1, 512, quick=False),
    _row("zero1-zro", "llama-7b", 1, 512, quick=False),
    _row("zero3-fsdp", "llama-7b", 1, 512, quick=False),
    _row("accel-fsdp", "llama-7b", 1, 512, quick=False),
]

LOOP_ROWS: list[dict[str, Any]] = [
    {"id": "loop/tiny-llama/b1/s256", "model": "tiny-llama", "batch": 1, "seq": 256, "quick": True},
    {"id": "loop/llama-7b/b1/s512", "model": "llama-7b", "batch": 1, "seq": 512, "quick": False},
]
"""Loop shapes, bf16 weights, AdamW foreach, sdpa: the loss-only loop against the one that keeps
the model output (what ``--keep-outputs`` models)."""


def _model_arg(name: str) -> Any:
    return CONFIGS.get(name, name)


def run_row(row: dict[str, Any]) -> dict[str, Any]:
    """Measure one engine row and compare it with vrammath."""
    started = time.perf_counter()
    model = _model_arg(row["model"])
    shape = {"batch": row["batch"], "seq": row["seq"], "attention": row["attention"]}
    try:
        if row["engine"] in DDP_RUNS:  # real CPU tensors: DDP cannot be built on fake ones
            result = measure_ddp(row["engine"], as_spec(model), ranks=row["ranks"], **shape)
        elif row["engine"].startswith("deepspeed"):  # real CPU tensors too
            result = measure_deepspeed_row(
                row["engine"], as_spec(model), ranks=row["ranks"], rank=row["rank"], **shape
            )
        else:
            result = measure_engine(row["engine"], model, rank=row["rank"], **shape)
    except Exception as exc:  # a row that cannot run stays visible as failing
        return documents.failed(row, exc)
    est = estimate_engine(row["engine"], model, ranks=row["ranks"], rank=row["rank"], **shape)
    comp = compare(row["engine"], est, measured_engine(result, row["engine"]))
    return {
        **documents.scored(row, comp),
        "states": result["steady"]["states"],
        "zro_partition_numel": result["zro_partition_numel"],
        "phases": documents.phase_peaks(result, PHASE_NAMES),
        "seconds": round(time.perf_counter() - started, 1),
    }


def run_loop_row(row: dict[str, Any]) -> dict[str, Any]:
    """Both loop shapes of one setup, their difference per phase, and b*s*V*2 for comparison."""
    started = time.perf_counter()
    model = _model_arg(row["model"])
    spec = as_spec(model)
    runs = {
        loop: measure_engine(
            "plain-bf16", model, batch=row["batch"], seq=row["seq"], ranks=1, loop=loop
        )
        for loop in LOOPS
    }
    logits = row["batch"] * row["seq"] * spec.vocab * 2  # bf16 logits
    out: dict[str, Any] = {**row, "logits_bytes": logits, "vocab": spec.vocab, "iterations": {}}
    for it in ("first", "steady"):
        per: dict[str, Any] = {}
        for ph in PHASE_NAMES:
            a = runs["loss"][it][ph]
            b = runs["outputs"][it][ph]
            per[ph] = {
                "loss_peak": a["peak"]["Total"],
                "outputs_peak": b["peak"]["Total"],
                "peak_difference": b["peak"]["Total"] - a["peak"]["Total"],
                "end_difference": b["end"]["Total"] - a["end"]["Total"],
            }
        out["iterations"][it] = per
    out["seconds"] = round(time.perf_counter() - started, 1)
    return out


def _version_of(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


def build_document(
    rows: list[dict[str, Any]], loop_rows: list[dict[str, Any]], command: str, log: Any = None
) -> dict[str, Any]:
    """The whole ``validation/engines.json`` document."""
    found = documents.versions()
    started = time.perf_counter()
    results = []
    for row in rows:
        if row["needs"] and importlib.util.find_spec(row["needs"]) is None:
            if log:
                log(f"{row['id']}: skipped ({row['needs']} is not installed)")
            continue
        entry = run_row(row)
        results.append(entry)
        if log:
            log(f"{row['id']}: {'PASS' if entry['pass'] else 'FAIL'} {entry.get('error', '')}")
    loops = []
    for row in loop_rows:
        loops.append(run_loop_row(row))
        if log:
            log(f"{row['id']}: measured")
    return {
        "command": command,
        "versions": {**found, "deepspeed": _version_of("deepspeed")},
        "method": (
            "Hugging Face model built from the config in FakeTensorMode on device cpu, wrapped by "
            "the engine, over a fake process group of 8 ranks (init_process_group('fake')); two "
            "iterations (forward with HF's causal-LM loss, backward, step, "
            "zero_grad(set_to_none=True)) under MemTracker (FSDPMemTracker for FSDP2, after one "
            "untracked warm-up iteration); rank 0's bytes (ZeroRedundancyOptimizer's rows also rank "
            "7's: ranks differ there); steady state = last iteration; model "
            "states summed from the tensors' storages. DeepSpeed rows run on real CPU tensors "
            "(its engine cannot be built under FakeTensorMode) with its CPU accelerator, "
            "LOCAL_RANK=0, in a venv that adds deepspeed to the measure extra; so do the DDP rows "
            "(DDP's constructor reads the parameters' data), with PyTorch's noop_hook standing for "
            "the in-place all-reduce the fake group cannot return. Estimates: "
            "vrammath.estimate(Setup(..., device='cpu')) of the recipe, ZeRO stage and engine "
            "profile (Setup.engine, Setup.rank) named in each row."
        ),
        "targets": {"exact": list(EXACT), "within_1_percent": "every phase peak"},
        "configs": CONFIGS,
        "seconds": round(time.perf_counter() - started, 1),
        **documents.verdicts(results),
        "loops": loops,
    }


def diff(fresh: dict[str, Any], committed: dict[str, Any]) -> list[str]:
    """Lines describing values that changed between two documents (empty: identical): the
    rows as the matrix compares them, then the loop shapes."""
    lines = documents.diff(fresh, committed)
    old_loops = {r["id"]: r for r in committed.get("loops", [])}
    for loop in fresh.get("loops", []):
        if old_loops.get(loop["id"], {}).get("iterations") != loop["iterations"]:
            lines.append(f"{loop['id']}: changed")
    return lines


def rescore(committed: dict[str, Any], command: str) -> dict[str, Any]:
    """The committed engine table compared again with the current estimates: the measured
    numbers kept, every row's estimated side, errors, explanations and verdicts recomputed
    (what a change to the formulas, not to the measurement, needs)."""
    rows = []
    for row in committed["rows"]:
        if "components" not in row:  # a row that could not run stays as it is
            rows.append(row)
            continue
        shape = {"batch": row["batch"], "seq": row["seq"], "attention": row["attention"]}
        est = estimate_engine(
            row["engine"], _model_arg(row["model"]), ranks=row["ranks"], rank=row["rank"], **shape
        )
        measured = {name: c["measured"] for name, c in row["components"].items()}
        rows.append(documents.scored(row, compare(row["engine"], est, measured)))
    return {**committed, "rescored": command, **documents.verdicts(rows)}


def update(committed: dict[str, Any], fresh: dict[str, Any], command: str) -> dict[str, Any]:
    """``committed`` with the rows of ``fresh`` put in, in :data:`ROWS`' order
    (:func:`vrammath.measure.documents.updated`)."""
    return documents.updated(committed, fresh, ROWS, CONFIGS, command)


def default_path() -> Path:
    """``validation/engines.json`` of the source checkout."""
    return documents.validation_file("engines.json")


def main(argv: list[str] | None = None) -> int:
    parser = documents.document_parser("vrammath.measure.engines", __doc__)
    parser.add_argument("--quick", action="store_true", help="small-model rows only")
    parser.add_argument("--rows", default=None, help="only rows whose id contains this")
    parser.add_argument(
        "--rescore",
        type=Path,
        default=None,
        help="compare this table's measured numbers with the current estimates (no measuring)",
    )
    parser.add_argument(
        "--update",
        type=Path,
        default=None,
        help="measure the selected rows and put them into this table (others unchanged)",
    )
    args = parser.parse_args(argv)
    if args.rescore:
        committed = json.loads(args.rescore.read_text(encoding="utf-8"))
        doc = rescore(committed, documents.command_line("vrammath.measure.engines", argv))
        documents.write_doc(args.out or args.rescore, doc)
        print(documents.pass_line(doc))
        return 0

    def keep(r: dict[str, Any]) -> bool:
        return (r["quick"] or not args.quick) and (args.rows is None or args.rows in r["id"])

    doc = build_document(
        [r for r in ROWS if keep(r)],
        [r for r in LOOP_ROWS if keep(r)],
        documents.command_line("vrammath.measure.engines", argv),
        log=lambda m: print(m, flush=True),
    )
    if args.update:
        committed = json.loads(args.update.read_text(encoding="utf-8"))
        doc = update(committed, doc, doc["command"])
        documents.write_doc(args.out or args.update, doc)
        print(documents.pass_line(doc))
        return 0
    documents.write_doc(args.out, doc)
    status = documents.diff_status(args.diff, doc, diff)
    print(documents.pass_line(doc))
    return status


__all__ = [
    "CONFIGS",
    "ENGINES",
    "LOOP_ROWS",
    "ROWS",
    "TINY_LLAMA",
    "Float16MasterOptimizer",
    "build_document",
    "compare",
    "diff",
    "estimate_engine",
    "explain",
    "measure_engine",
    "measured_engine",
    "rescore",
    "run_loop_row",
    "run_row",
    "update",
]


if __name__ == "__main__":
    raise SystemExit(main())
