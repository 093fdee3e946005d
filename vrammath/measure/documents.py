"""What every validation document shares (the matrix, the architectures, the engines): how a
row is scored and the document tallied, its versions, and its command line (``--out`` writes the
document, ``--diff`` compares it with the committed one).

torch and transformers are imported inside the functions, so this module imports without them.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def failed(row: dict[str, Any], exc: Exception) -> dict[str, Any]:
    """A row that could not run, kept in the data as failing with its error."""
    return {**row, "error": f"{type(exc).__name__}: {exc}", "pass": False}


def scored(row: dict[str, Any], comp: dict[str, Any]) -> dict[str, Any]:
    """A row with its compared components, passing when every component does."""
    return {**row, "components": comp, "pass": all(c["pass"] for c in comp.values())}


def phase_peaks(
    result: dict[str, Any], phases: tuple[str, ...] = ("forward", "backward", "step")
) -> dict[str, Any]:
    """The peak snapshot of each phase of the first and the steady iteration of a measurement."""
    return {it: {ph: result[it][ph]["peak"] for ph in phases} for it in ("first", "steady")}


def worst_rel_errors(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The largest |relative error| of each component over ``rows`` (components without an
    estimate, ``rel_error`` None, left out)."""
    worst: dict[str, float] = {}
    for r in rows:
        for name, c in r.get("components", {}).items():
            if c["rel_error"] is not None:
                worst[name] = max(worst.get(name, 0.0), abs(c["rel_error"]))
    return worst


def verdicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How a validation document ends: the worst errors, how many rows pass, the rows."""
    return {
        "worst_rel_error": worst_rel_errors(rows),
        "passed": sum(1 for r in rows if r["pass"]),
        "rows": rows,
    }


def updated(
    committed: dict[str, Any],
    fresh: dict[str, Any],
    order: list[dict[str, Any]],
    configs: dict[str, Any],
    command: str,
) -> dict[str, Any]:
    """``committed`` with the rows of ``fresh`` put in (replacing rows of the same id, new rows
    in ``order``'s order), its other rows untouched; the configs, totals and the command of the
    update recomputed."""
    new = {r["id"]: r for r in fresh["rows"]}
    rows = [new.pop(r["id"], r) for r in committed["rows"]] + list(new.values())
    rank = {r["id"]: i for i, r in enumerate(order)}
    rows.sort(key=lambda r: rank.get(r["id"], len(rank)))
    return {**committed, "configs": configs, "updated": command, **verdicts(rows)}


def versions() -> dict[str, str]:
    """The torch, transformers and Python versions a validation document was measured with."""
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def diff(fresh: dict[str, Any], committed: dict[str, Any]) -> list[str]:
    """Lines describing measured values that changed between two documents' rows (empty:
    identical)."""
    lines = []
    old = {r["id"]: r for r in committed.get("rows", [])}
    for row in fresh.get("rows", []):
        prev = old.get(row["id"])
        if prev is None:
            lines.append(f"{row['id']}: new row")
            continue
        for name, c in row.get("components", {}).items():
            p = prev.get("components", {}).get(name)
            if p is None or p["measured"] != c["measured"] or p["estimated"] != c["estimated"]:
                lines.append(
                    f"{row['id']} {name}: {p and (p['estimated'], p['measured'])} -> "
                    f"{(c['estimated'], c['measured'])}"
                )
    return lines


def validation_file(name: str) -> Path:
    """The file ``name`` in ``validation/`` of the source checkout."""
    return Path(__file__).resolve().parents[2] / "validation" / name


def document_parser(
    module: str,
    description: str | None,
    *,
    out_help: str = "write the document here",
    diff_help: str = "compare with this file",
) -> argparse.ArgumentParser:
    """The command line of ``python -m`` ``module``, which writes a validation document:
    ``--out`` (where to write it) and ``--diff`` (the committed file to compare it with)."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--out", type=Path, default=None, help=out_help)
    parser.add_argument("--diff", type=Path, default=None, help=diff_help)
    return parser


def command_line(module: str, argv: list[str] | None) -> str:
    """The command a document records: ``python -m`` ``module`` and its arguments."""
    args = argv if argv is not None else sys.argv[1:]
    return ("python -m " + module + " " + " ".join(args)).strip()


def write_doc(path: Path | None, doc: dict[str, Any]) -> None:
    """Write ``doc`` as indented JSON to ``path`` (its folder made), unless ``path`` is None."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")


def diff_status(
    path: Path | None,
    doc: dict[str, Any],
    differ: Callable[[dict[str, Any], dict[str, Any]], list[str]] = diff,
) -> int:
    """Print each value of ``doc`` that differs from the committed document at ``path`` (as
    ``differ`` compares two documents); 1 if any does, else 0 (also when ``path`` is None)."""
    if path is None:
        return 0
    changes = differ(doc, json.loads(path.read_text(encoding="utf-8")))
    for line in changes:
        print("changed:", line)
    return 1 if changes else 0


def pass_line(doc: dict[str, Any]) -> str:
    """How many rows of a document pass, and the worst errors."""
    return f"{doc['passed']}/{len(doc['rows'])} rows pass; worst: {doc['worst_rel_error']}"


__all__ = [
    "command_line",
    "diff",
    "diff_status",
    "document_parser",
    "failed",
    "pass_line",
    "phase_peaks",
    "scored",
    "updated",
    "validation_file",
    "verdicts",
    "versions",
    "worst_rel_errors",
    "write_doc",
]
