"""What the handbook's pages share: tables, figures, unit formatting, glue, and named setups.

Pages import ``vrammath`` (the public API, for every number) and this module (for how a number
is shown). Nothing here adds, subtracts or re-derives a memory term.

* :func:`md_table`, :func:`svg`, :func:`gbs`, :func:`gibs`, :func:`pct`, :func:`g` -- display.
* :data:`SETUPS` -- the registry of named setups that more than one page shows. A page takes a
  named setup with :func:`named` and glues its numbers from :func:`named_estimate`, which also
  records them (``docs/_build/vmdocs-records/<sources hash>/<page>.json``); ``conf.py``'s
  ``build-finished`` hook fails the build if two pages recorded different numbers for one name
  or if they differ from ``vrammath estimate ... --json`` for that setup.
* :func:`fits_text` -- every "fits / does not fit" sentence, from :meth:`vrammath.Estimate.fits`,
  with the engine it assumes; :func:`fit_cell` and :func:`engine_cell` -- a verdict table's
  cells (a table with a "fit" column has an "engine" column: ``conf.py`` checks it).
* :func:`calculator_link` -- a worked example's link to the calculator, the setup in its fragment.
"""

from __future__ import annotations

import html
import io
import json
import os
import re
import subprocess
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import quote

import sympy

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ModuleNotFoundError:  # the browser's Python (a page's runnable cells): only svg() needs it
    plt = None
from IPython.display import HTML, SVG, Markdown
from myst_nb import glue

import vrammath as vm

# A page that counts memory past a model's trained context says so: the library's
# ContextWarning fails the cell (and the build) unless the page declared the model with
# beyond_context, whose note it then glues (context_note).
warnings.simplefilter("error", vm.ContextWarning)


def beyond_context(*specs: vm.ModelSpec) -> None:
    """Declare that this page counts memory past these models' trained contexts on purpose (and
    glues :func:`context_note` where it does): their :class:`vrammath.ContextWarning` is silenced
    for the rest of the page; any other model's still fails the cell."""
    for spec in specs:
        warnings.filterwarnings(
            "ignore", message=re.escape(f"{spec.name}: "), category=vm.ContextWarning
        )


# --- display -----------------------------------------------------------------------------------


def md_table(header: list[str] | tuple[str, ...], rows: Any) -> Markdown:
    """A Markdown table (rendered by MyST, so ``$math$`` in cells works)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return Markdown("\n".join(lines))


def svg(fig: Any) -> SVG:
    """The figure as SVG (independent of the matplotlib backend), then closed."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    return SVG(buf.getvalue())


def gbs(x: float) -> str:
    """Bytes as GB (1e9 bytes), labelled."""
    return f"{x / vm.GB:,.2f} GB"


def gibs(x: float) -> str:
    """Bytes as GiB (2**30 bytes), labelled."""
    return f"{x / vm.GiB:,.2f} GiB"


def count(n: int) -> str:
    """An integer with thousands separators that may break after a comma in a narrow column."""
    return f"{n:,}".replace(",", ",\u200b")


def pct(part: float, whole: float) -> float:
    """``part`` as a percentage of ``whole``: the two quantities the sentence names."""
    return 100 * float(part) / float(whole)


def formula_error(formula: float, real: float) -> float:
    """How far a published formula is from the real value (measured, or implementation-exact),
    in percent *of the real value*: the one base for every formula-against-reality comparison
    on the site (``+19`` reads "the formula says 19 % more than the layer keeps").

    >>> round(formula_error(108.0, 90.0))
    20
    """
    return 100 * (float(formula) / float(real) - 1)


def g(name: str, value: Any) -> Any:
    """Glue a value for the prose (not displayed where computed); returns it."""
    glue(name, value, display=False)
    return value


def component_split(names: list[str]) -> tuple[list[str], dict[str, dict[str, int]]]:
    """Every parameter component any of ``names`` has (experts, router and shared experts
    included) and each model's count per component; the columns of a model sum to its count,
    or the page fails to build (a component left out of a table is a silent wrong)."""
    counts = {n: vm.param_counts(vm.load_model(n)) for n in names}
    columns = list(dict.fromkeys(c for n in names for c in counts[n]))
    for n in names:
        split = sum(counts[n].get(c, 0) for c in columns)
        if split != vm.param_count(vm.load_model(n)):
            raise AssertionError(f"{n}: the components sum to {split:,}, not the model's count")
    return columns, {n: {c: counts[n].get(c, 0) for c in columns} for n in names}


#: what each phase peak holds: a peak's label comes from its phase (the estimate's own
#: ``peak_phase``), never from prose
PHASE_HOLDS = {
    "forward_peak": "the forward peak (the states and the activations kept so far)",
    "backward_peak": "the backward peak (the states, the kept activations and the gradients)",
    "step_peak": "the optimizer-step peak (the states and the step's temporaries; the activations "
    "are freed)",
}


def peak_text(est: vm.Estimate) -> str:
    """The estimate's per-GPU peak with what it is: its phase and what that phase holds.

    >>> print(peak_text(vm.estimate(vm.Setup(vm.load_model("llama-7b")))))
    134.77 GB, the optimizer-step peak (the states and the step's temporaries; the activations are freed)
    """
    return f"{gbs(est.gpu_bytes)}, {PHASE_HOLDS[est.peak_phase]}"


def context_note(tokens: int, *specs: vm.ModelSpec, serving: bool = False) -> str:
    """What a page says when it counts memory past a model's trained context: the CLI's own
    line for each model past it (``ModelSpec.past_context``, the line ``setup_warnings`` gives,
    or with ``serving`` the one ``serve_warnings`` gives), or ``""``.

    >>> context_note(2048, vm.load_model("llama-7b"))
    ''
    >>> context_note(4096, vm.load_model("llama-7b"))[:60]
    "Past a model's trained context the numbers still count its m"
    """
    field = "context" if serving else "seq_len"
    past = [
        f"{spec.name}: {line}"
        for spec in specs
        if (line := spec.past_context(field, tokens)) is not None
    ]
    if not past:
        return ""
    return (
        "Past a model's trained context the numbers still count its memory, as they would for a "
        "context extended by RoPE scaling; how well the model does there is another matter ("
        + "; ".join(past)
        + ")."
    )


def fits_text(est: vm.Estimate) -> str:
    """ "fits" or "does not fit", from :meth:`vrammath.Estimate.fits` (the CLI's comparison), and
    under which engine (:func:`vrammath.engine_name`): a verdict holds for the engine it assumes.

    >>> fits_text(vm.estimate(vm.Setup(vm.load_model("llama-7b"), zero=3, gpus=8, gpu="A100-80GB")))
    'fits under ZeRO-3 as a flat partition (the plain loop)'
    """
    return f"{fit_cell(est, yes='fits', no='does not fit')} under {vm.engine_name(est.setup)}"


def fit_cell(est: vm.Estimate, *, yes: str = "yes", no: str = "**no**") -> str:
    """A table's verdict cell; the table names the engine in a column whose header says
    "engine" (:func:`engine_cell`; ``conf.py``'s ``check_fit_tables`` fails the build otherwise)."""
    verdict = est.fits()
    if verdict is None:
        raise ValueError("the setup names no GPU")
    return yes if verdict else no


def engine_cell(setup: vm.Setup) -> str:
    """The engine column of a verdict table: :func:`vrammath.engine_name`."""
    return vm.engine_name(setup)


def latex(obj: sympy.Basic) -> str:
    """LaTeX in the notation table's symbols (``P`` is written ``\\Psi``), for table cells."""
    names = {row.symbol: row.latex for row in vm.symbols.notation()}
    return sympy.latex(obj, symbol_names=names)


def _notation_latex(obj: sympy.Basic) -> str:
    return "$\\displaystyle " + latex(obj) + "$"


def use_notation() -> None:
    """Render glued sympy objects with the notation table's LaTeX (``P`` prints as Psi)."""
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/latex"].for_type(sympy.Basic, _notation_latex)


use_notation()

# --- the validation sets -------------------------------------------------------------------------

#: the committed measurements with a pass/fail per row, in the order the validation pages list them
VALIDATION_SETS = (
    ("matrix.json", "training steps (MemTracker, fake mode)", "validation-matrix"),
    ("archs.json", "every architecture", "validation-archs"),
    ("engines.json", "engines (fake process groups)", "validation-engines"),
    ("generate.json", "transformers' generate() (real CPU tensors)", "validation-generate"),
)


def _last_commit_date(path: Path) -> str:
    """The date of the last commit that changed ``path`` (when it was last measured), or a
    dash where the checkout has no history."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%cs", "--", str(path)],
            capture_output=True, text=True, check=True, cwd=path.parent,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "-"
    return out or "-"


def validation_summary() -> list[tuple[str, str, int, int, str, str, str]]:
    """Per validation set: file, what it measures, the page's label, rows passing, rows, the
    worst relative error over its components and the date it was last committed."""
    root = Path(__file__).resolve().parents[1] / "validation"
    out = []
    for name, what, label in VALIDATION_SETS:
        data = json.loads((root / name).read_text(encoding="utf-8"))
        rows = [r for r in data["rows"] if "pass" in r]
        worst = max(data.get("worst_rel_error", {}).values(), default=0.0)
        passed = sum(1 for r in rows if r["pass"])
        date = _last_commit_date(root / name)
        out.append((name, what, passed, len(rows), f"{100 * worst:.2f} %", date, label))
    return out


# --- links to the calculator --------------------------------------------------------------------


def calculator_fragment(setup: vm.Setup | vm.Serve) -> str:
    """The calculator's URL fragment for ``setup``: ``tab=serve`` for a serving setup, the model,
    then every declared field that differs from its default, as the page writes it.

    >>> calculator_fragment(vm.Setup(vm.load_model("llama-7b"), zero=3, gpus=8, sp=False))
    'model=llama-7b&zero=3&gpus=8'
    >>> calculator_fragment(vm.Serve(vm.load_model("llama-2-7b"), block=None, gpu="A100-80GB"))
    'tab=serve&model=llama-2-7b&block=&gpu=A100-80GB'
    """
    from vrammath.notation.fields import field_values

    defaults = field_values(type(setup)(setup.model))
    parts = ["tab=serve"] if isinstance(setup, vm.Serve) else []
    parts.append("model=" + quote(setup.model.name, safe=""))
    for key, value in field_values(setup).items():
        if value == defaults[key]:
            continue
        if isinstance(value, list):
            text = ",".join(value)
        elif isinstance(value, bool):
            text = "true" if value else "false"
        else:
            text = "" if value is None else str(value)
        parts.append(f"{quote(key, safe='')}={quote(text, safe=',')}")
    return "&".join(parts)


def calculator_link(
    setup: vm.Setup | vm.Serve, page: str, text: str = "Try this setup in the calculator"
) -> HTML:
    """A link from ``page`` (``"handbook/activations"``) to the calculator with ``setup``
    filled in (see :func:`calculator_fragment`)."""
    up = "../" * page.count("/")
    fragment = calculator_fragment(setup)
    # escaped: a bare "&micro_batch" in an attribute is read by browsers as the entity "µ"
    href = html.escape(f"{up}calculator.html#{fragment}", quote=True)
    # the fields the link names, for the browser check to compare with the form it opens
    fields = html.escape(json.dumps(dict(p.split("=", 1) for p in fragment.split("&"))))
    return HTML(
        f'<p class="vm-try"><a href="{href}" data-fields="{fields}">'
        f"{html.escape(text)} &rarr;</a></p>"
    )


#: the calculator's first view: per tab, the model and the fields that differ from the CLI's
#: defaults (fit needs a GPU)
CALCULATOR_DEFAULTS: dict[str, dict[str, Any]] = {
    "estimate": {"model": "llama-7b"},
    "fit": {"model": "llama-7b", "gpu": "a100-80gb"},
    "serve": {"model": "llama-7b"},
    "hf": {"model": "llama-3.1-8b", "gpu": "H100-80GB"},
    "vllm": {"model": "llama-3.1-8b", "gpu": "H100-80GB", "max_model_len": 32768},
    "sglang": {"model": "llama-3.1-8b", "gpu": "H100-80GB"},
}


def calculator_data() -> HTML:
    """The calculator page's data (docs/_static/calculator.js): the fields the CLI declares
    (:func:`vrammath.browser.page_data`) and, per tab, the default setup's command line and what
    the CLI printed for it, so the first view needs no wait."""
    from vrammath import browser

    data = browser.page_data()
    data["initial"] = {}
    for command, setup in CALCULATOR_DEFAULTS.items():
        argv = browser.argv_for(command, setup)
        run = browser.run([*argv, "--json"])
        if run["rc"] != 0:
            raise RuntimeError(f"the calculator's default {argv} is refused: {run['stderr']}")
        data["initial"][command] = {
            "model": setup["model"],
            "fields": {k: v for k, v in setup.items() if k != "model"},
            "argv": argv,
            "run": run,
            "tex": browser.component_tex(argv) if command == "estimate" else None,
        }
    text = json.dumps(data, sort_keys=True).replace("</", "<\\/")
    return HTML(f'<script type="application/json" id="vm-data">{text}</script>')


# --- named setups --------------------------------------------------------------------------------

#: name -> (preset, Setup fields). One entry per setup that more than one page shows.
SETUPS: dict[str, tuple[str, dict[str, Any]]] = {
    # the activations chapter and bank: LLaMA-7B, ZeRO-3 over 8 A100s, one sequence, SDPA
    "llama7b-zero3-8xa100": (
        "llama-7b",
        {
            "zero": 3,
            "gpus": 8,
            "micro_batch": 1,
            "seq_len": 2048,
            "attention": "sdpa",
            "implementation": "fused",
            "gpu": "A100-80GB",
        },
    ),
    # the 72B question's offload plan (audit row 14 and "Checking the advice")
    "qwen72b-zero3-offload-full-b4": (
        "qwen2-72b",
        {
            "zero": 3,
            "gpus": 8,
            "offload_optimizer": True,
            "micro_batch": 4,
            "seq_len": 4096,
            "implementation": "fused",
            "recompute": "full",
            "gpu": "A100-80GB",
        },
    ),
    "qwen72b-zero3-offload-none-b4": (
        "qwen2-72b",
        {
            "zero": 3,
            "gpus": 8,
            "offload_optimizer": True,
            "micro_batch": 4,
            "seq_len": 4096,
            "implementation": "fused",
            "gpu": "A100-80GB",
        },
    ),
    # the 72B question's "micro-batch 2, full recomputation, no offload" (rows 16 and 22)
    "qwen72b-zero3-full-b2": (
        "qwen2-72b",
        {
            "zero": 3,
            "gpus": 8,
            "micro_batch": 2,
            "seq_len": 4096,
            "implementation": "fused",
            "recompute": "full",
            "gpu": "A100-80GB",
        },
    ),
    # the MoE chapter's and bank's QLoRA case: Mixtral-8x7B, NF4 base, attention adapters
    "mixtral-qlora-attn-l40s": (
        "mixtral-8x7b",
        {
            "recipe": "bf16-pure",
            "lora_rank": 16,
            "lora_targets": "q,k,v,o",
            "quant": "nf4",
            "micro_batch": 1,
            "seq_len": 2048,
            "recompute": "full",
            "gpu": "L40S-48GB",
        },
    ),
}

_CLI_FLAGS = {
    "recipe": "--recipe",
    "optimizer": "--optimizer",
    "implementation": "--impl",
    "zero": "--zero",
    "gpus": "--gpus",
    "micro_batch": "--batch",
    "seq_len": "--seq",
    "attention": "--attention",
    "recompute": "--recompute",
    "gpu": "--gpu",
    "lora_rank": "--lora-rank",
    "lora_targets": "--lora-targets",
    "quant": "--quant",
}
_CLI_SWITCHES = {"offload_optimizer": "--offload-optimizer", "offload_params": "--offload-params"}


def named(name: str, **changes: Any) -> vm.Setup:
    """The registered setup ``name`` (``changes`` give a variant, which is not recorded)."""
    preset, fields = SETUPS[name]
    return vm.Setup(vm.load_model(preset), **{**fields, **changes})


def cli_args(name: str) -> list[str]:
    """``vrammath estimate`` arguments for the registered setup ``name``."""
    preset, fields = SETUPS[name]
    args = [preset]
    for key, value in fields.items():
        if key in _CLI_SWITCHES:
            if value:
                args.append(_CLI_SWITCHES[key])
        else:
            args += [_CLI_FLAGS[key], str(value)]
    return [*args, "--json"]


def record_of(est: vm.Estimate) -> dict[str, Any]:
    """The numbers a page may glue for a setup, as the CLI's JSON names them."""
    data: dict[str, Any] = vm.estimate_dict(est)
    return {
        "totals": data["totals"],
        "phases": data["phases"],
        "components": {c["key"]: c["bytes"] for c in data["components"]},
        "fits": None if data["gpu"] is None else data["gpu"]["fits"],
    }


def record(name: str, page: str, key: str, value: Any) -> Any:
    """Record one glued value of the named setup ``name`` on ``page`` for the build's check."""
    folder = os.environ.get("VRAMMATH_DOCS_RECORDS")
    if folder:
        path = Path(folder) / (page.replace("/", "__") + ".json")
        path.parent.mkdir(parents=True, exist_ok=True)
        records = json.loads(path.read_text()) if path.is_file() else {}
        records.setdefault(name, {})[key] = value
        path.write_text(json.dumps(records, indent=1, sort_keys=True))
    return value


def named_estimate(name: str, page: str) -> vm.Estimate:
    """``vm.estimate`` of the registered setup ``name``, recorded for the build's check."""
    est = vm.estimate(named(name))
    record(name, page, "estimate", record_of(est))
    return est


def longest_sequence(name: str, page: str, **changes: Any) -> int:
    """``vm.longest_sequence`` (256-token steps, the default reserve) of a registered setup with
    ``changes``, recorded for the build's check; 0 if none fits."""
    sol = vm.longest_sequence(vm.estimate(named(name, **changes)), multiple_of=256)
    assert sol.status != "ok" or sol.verified
    value = int(sol.value) if sol.status == "ok" else 0
    tag = ",".join(f"{k}={v}" for k, v in sorted(changes.items()))
    return int(record(name, page, f"longest_sequence[{tag}]", value))
