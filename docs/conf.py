"""Sphinx configuration for the vrammath handbook.

Three things here are not stock Sphinx:

* **The execution cache is keyed on vrammath's own sources.** MyST-NB's jupyter-cache keys a
  notebook on its cell text alone, so a formula change in ``vrammath/`` would be served stale. We
  hash ``vrammath/**/*.py`` and ``conf/**`` and use one cache folder per hash (older ones are
  removed). ``VRAMMATH_FORCE_EXECUTE=1`` (set by ``nox -s docs`` under CI) executes every page.
* **Math reads offline.** MathJax 3 comes from the ``django-static-mathjax`` wheel (a docs
  dependency, no Django needed) and is copied into a build folder that Sphinx ships as static
  files; no page loads anything from a CDN.
* **Strict.** A failing cell fails the build, stderr output is a warning (and ``-W`` makes it an
  error), and nitpicky cross-references are on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
BUILD = DOCS / "_build"

# The checkout's vrammath, also when it is not installed: for autodoc here and, through
# PYTHONPATH, for the notebook kernels that execute the pages.
# docs/ too, for the pages' shared display helpers and setup registry (docs/vmdocs.py).
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(DOCS))
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(ROOT), str(DOCS), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
)

project = "vrammath"
author = "the vrammath authors"
copyright = "2025, the vrammath authors"

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.doctest",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "sphinxcontrib.bibtex",
    "sphinx_design",
]

exclude_patterns = [
    "_build",
    "vmdocs.py",
    "jupyter_execute",
    ".jupyter_cache",
    "**.ipynb_checkpoints",
]

# --- MyST ------------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "substitution"]
myst_heading_anchors = 3
numfig = True
math_numfig = True
math_eqref_format = "({number})"
numfig_secnum_depth = 0

# --- MyST-NB execution -----------------------------------------------------------------------
# the package, the presets, the measured data the validation pages read, the pages' helpers
_SOURCE_GLOBS = (
    ("vrammath", "**/*.py"),
    ("conf", "**/*"),
    ("validation", "*.json"),
    ("docs", "vmdocs.py"),
)


def sources_hash() -> str:
    """SHA-256 (first 16 hex digits) of vrammath's sources, conf/ and validation/, paths included."""
    digest = hashlib.sha256()
    for folder, pattern in _SOURCE_GLOBS:
        base = ROOT / folder
        for path in sorted(base.glob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(path.relative_to(ROOT).as_posix().encode())
                digest.update(b"\0")
                digest.update(path.read_bytes())
                digest.update(b"\0")
    return digest.hexdigest()[:16]


SOURCES_HASH = sources_hash()
# where docs/vmdocs.py's named_estimate() records the numbers a page glued for a named setup
RECORDS = BUILD / "vmdocs-records" / SOURCES_HASH
os.environ["VRAMMATH_DOCS_RECORDS"] = str(RECORDS)


def place_execution_cache(app, config):  # type: ignore[no-untyped-def]
    """One jupyter-cache per doctree folder and per sources hash; caches for other hashes go.

    The cache sits inside the doctrees (``docs/_build/doctrees/jupyter_cache/<hash>`` for ``nox
    -s docs``, whose HTML and doctest passes share it), so two builds with different doctree
    folders (``nox -s serve``, a build into /tmp) never write one cache at once.
    """
    root = Path(app.doctreedir).resolve() / "jupyter_cache"
    if root.is_dir():  # a cache for other sources can never be valid again
        for old in root.iterdir():
            if old.name != SOURCES_HASH:
                shutil.rmtree(old, ignore_errors=True)
    config.nb_execution_cache_path = str(root / SOURCES_HASH)


# A change in vrammath's sources changes this value, and Sphinx re-reads every page when an "env"
# config value changes (see setup() below): otherwise a page whose text did not change would keep
# its pickled outputs from before the formula change, whatever the execution cache says.
vrammath_sources_hash = SOURCES_HASH

FORCE = os.environ.get("VRAMMATH_FORCE_EXECUTE", "") not in ("", "0", "false")
nb_execution_mode = "force" if FORCE else "cache"
# nb_execution_cache_path is set per build folder by place_execution_cache() (see setup()).
nb_execution_raise_on_error = True
nb_execution_timeout = 300
nb_execution_show_tb = True
nb_output_stderr = "warn"
nb_merge_streams = True
nb_render_markdown_format = "myst"  # Markdown outputs (tables built in cells) get math too
nb_ipywidgets_js: dict[str, dict[str, str]] = {}  # the defaults load require.js from a CDN
nb_mime_priority_overrides = [
    ("html", "text/latex", 0),  # a glued sympy object renders through MathJax, not as a PNG
]

# --- MathJax, bundled --------------------------------------------------------------------------
MATHJAX_STAGE = BUILD / "_mathjax_static"
_MATHJAX_PARTS = (
    "tex-chtml.js",
    "startup.js",
    "core.js",
    "loader.js",
    "input",
    "output/chtml",
    "ui",
    "a11y",
    "adaptors",
    "sre",
)


def stage_mathjax() -> Path:
    """Copy MathJax 3's CommonHTML bundle from the installed wheel into a build folder."""
    spec = importlib.util.find_spec("mathjax")
    origin = Path(spec.origin).parent if spec and spec.origin else None
    es5 = origin / "static" / "mathjax" / "es5" if origin else None
    if es5 is None or not (es5 / "tex-chtml.js").is_file():
        raise RuntimeError(
            "MathJax 3 is not installed: `pip install django-static-mathjax` "
            "(it is in pyproject.toml's docs dependency group; nox -s docs installs it)"
        )
    target = MATHJAX_STAGE / "mathjax"
    stamp = MATHJAX_STAGE / "source.txt"
    if stamp.is_file() and stamp.read_text() == str(es5) and (target / "tex-chtml.js").is_file():
        return MATHJAX_STAGE
    shutil.rmtree(MATHJAX_STAGE, ignore_errors=True)
    for part in _MATHJAX_PARTS:
        src = es5 / part
        dst = target / part
        if src.is_dir():
            shutil.copytree(src, dst)
        elif src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
    license_file = es5.parent / "LICENSE"
    if license_file.is_file():
        shutil.copy2(license_file, target / "LICENSE")
    stamp.write_text(str(es5))
    return MATHJAX_STAGE


# --- Python in the browser: Pyodide and the wheels the pages run -----------------------------------
# The calculator and the "run in the browser" cells run vrammath itself (vrammath/browser.py) in a
# Web Worker. Everything is served from the site: the Pyodide runtime from the npm registry's
# tarball (pinned, checked against the registry's sha512), sympy's and mpmath's wheels from PyPI
# at the versions this build runs, and a wheel of the checkout's vrammath.
PYODIDE_VERSION = "314.0.8"
PYODIDE_INTEGRITY = "sha512-74Wq1kXOC+CCEzAfxuRAO701nAcCMLjf8NrwvWpu8S41dVMXwXmLQ05dYB+F4e46AdnGo0oq7YHSVUpHsoarLQ=="
PYODIDE_FILES = (
    "pyodide.mjs",
    "pyodide.asm.mjs",
    "pyodide.asm.wasm",
    "python_stdlib.zip",
    "pyodide-lock.json",
)
LIVE_STAGE = BUILD / "_live_static"
LIVE_CACHE = BUILD / "_live_cache"  # downloads, kept across sources changes


def _pyodide_tarball() -> Path:
    """The pinned Pyodide npm tarball, downloaded once and checked against its sha512."""
    import base64
    import urllib.request

    def integrity(data: bytes) -> str:  # npm's form: base64 of the sha512
        return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()

    tarball = LIVE_CACHE / f"pyodide-{PYODIDE_VERSION}.tgz"
    want = PYODIDE_INTEGRITY
    if tarball.is_file() and integrity(tarball.read_bytes()) == want:
        return tarball
    url = f"https://registry.npmjs.org/pyodide/-/pyodide-{PYODIDE_VERSION}.tgz"
    with urllib.request.urlopen(url, timeout=300) as response:
        data = response.read()
    got = integrity(data)
    if got != want:
        raise RuntimeError(f"{url}: sha512 {got} is not the pinned {want}")
    LIVE_CACHE.mkdir(parents=True, exist_ok=True)
    tarball.write_bytes(data)
    return tarball


def _dependency_wheels() -> list[Path]:
    """sympy's and mpmath's wheels at the versions installed here (what the CLI runs with)."""
    import subprocess
    from importlib.metadata import version

    wanted = [f"{name}=={version(name)}" for name in ("sympy", "mpmath")]
    folder = LIVE_CACHE / "wheels"
    found = [
        next(iter(folder.glob(f"{w.replace('==', '-')}-py3-none-any.whl")), None) for w in wanted
    ]
    if all(found):
        return [p for p in found if p is not None]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
            str(folder),
            *wanted,
        ],
        check=True,
    )
    return [next(folder.glob(f"{w.replace('==', '-')}-py3-none-any.whl")) for w in wanted]


def stage_live() -> Path:
    """Stage Pyodide and the wheels under docs/_build/_live_static (shipped as static files):
    again only when the pin or vrammath's sources changed."""
    import json
    import subprocess
    import tarfile
    import zipfile

    stamp = LIVE_STAGE / "source.txt"
    bundler = ROOT / "tools" / "pyodide_bundle.mjs"
    # staged again when the pin, the package, the bundler or this staging (this file) change
    recipe = hashlib.sha256(bundler.read_bytes() + Path(__file__).read_bytes()).hexdigest()
    key = f"{PYODIDE_VERSION} {SOURCES_HASH} {recipe}"
    if stamp.is_file() and stamp.read_text() == key:
        return LIVE_STAGE
    shutil.rmtree(LIVE_STAGE, ignore_errors=True)
    runtime = LIVE_STAGE / "pyodide"
    runtime.mkdir(parents=True)
    with tarfile.open(_pyodide_tarball()) as tar:
        for name in PYODIDE_FILES:
            member = tar.extractfile(f"package/{name}")
            if member is None:
                raise RuntimeError(f"pyodide {PYODIDE_VERSION}: no {name} in the tarball")
            (runtime / name).write_bytes(member.read())
    wheels = LIVE_STAGE / "wheels"
    wheels.mkdir()
    for wheel in _dependency_wheels():
        shutil.copy2(wheel, wheels / wheel.name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(ROOT),
        ],
        check=True,
    )
    names = sorted(p.name for p in wheels.glob("*.whl"))
    # what the pages' runnable cells read besides the package, at the paths they have in the
    # checkout (the worker unpacks it where vrammath's parent folder is): the docs helpers
    # (vmdocs, importable from docs/) and the committed measurements of validation/
    with zipfile.ZipFile(wheels / "pages.zip", "w", zipfile.ZIP_DEFLATED) as pages:
        for path in [DOCS / "vmdocs.py", *sorted((ROOT / "validation").glob("*.json"))]:
            pages.write(path, path.relative_to(ROOT).as_posix())
    manifest = {
        "wheels": names,
        "pages": ["pages.zip"],
        "paths": ["docs"],
        "version": SOURCES_HASH,
    }
    (wheels / "manifest.json").write_text(json.dumps(manifest, indent=1))
    node = shutil.which("node")
    if node:  # precompiled by the browser's own Python: the page starts seconds sooner
        subprocess.run([node, str(bundler), str(LIVE_STAGE)], check=True)
        for name in names:  # shipped inside the bundle
            (wheels / name).unlink()
    else:
        print("vrammath docs: no node here, so the browser compiles sympy at every page load")
    stamp.write_text(key)
    return LIVE_STAGE


html_static_path = ["_static", str(stage_mathjax()), str(stage_live())]
mathjax_path = "mathjax/tex-chtml.js"  # relative to _static
mathjax3_config = {
    "tex": {"tags": "ams"},
    "options": {"menuOptions": {"settings": {"assistiveMml": True}}},
}

# --- HTML ---------------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "vrammath handbook"
html_css_files = ["vrammath.css"]
html_js_files = ["vrammath-live.js"]  # window.vrammath and the runnable cells, on every page
html_favicon = "_static/favicon.svg"
html_last_updated_fmt = None
html_copy_source = True
html_show_sourcelink = True
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "use_issues_button": False,
    "use_edit_page_button": False,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
    "show_navbar_depth": 1,
}
html_context = {"default_mode": "light"}

# --- Citations ----------------------------------------------------------------------------------
bibtex_bibfiles = ["references.bib"]
bibtex_default_style = "plain"
bibtex_reference_style = "author_year"

# --- API reference ------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_numpy_docstring = True
napoleon_google_docstring = False
# sympy's docstring order has an "Explanation" section: render it as Notes are (a rubric, not a
# section whose label would clash across modules)
napoleon_custom_sections = [("Explanation", "Notes")]

# Nitpicky mode (-n): with no intersphinx, names from other packages cannot resolve; anything of
# vrammath's own that fails to resolve is still an error.
nitpick_ignore_regex = [
    # the type variables of notation.signatures.after (private names, no page of their own)
    (r"py:class", r"(vrammath\.notation\.signatures\.)?_[PTR]"),
    (r"py:.*", r"(sympy|numpy|np|pathlib|collections|typing|typing_extensions|dataclasses)(\..*)?"),
    # the serve command's argparse types (the CLI's parser has no page of its own)
    (r"py:class", r"(argparse\.[A-Za-z_]+|Parser)"),
    (r"py:.*", r"(Path|Mapping|Sequence|Iterable|Iterator|Callable|Literal|Any|Self|TypeAlias)"),
    (r"py:.*", r"(Symbol|Expr|Basic|Rational|Integer|Float|Number|Matrix|Eq|Piecewise)"),
    (r"py:.*", r"(sympy\.core\..*|sympy\.[a-z_.]+)"),
    # autodoc splits the default of estimate(terms=TERMS) at the comma of tuple[Term, ...]
    (r"py:class", r"tuple\[~vrammath\.compose\.(table|rows)\.Term"),
    (r"py:class", r"(vrammath\.notation\.vocab\._S|callable|sequence|iterable)"),
    # the values of Literal types in signatures (e.g. "sdpa"): choices, not classes
    (r"py:class", r'".*"'),
    (r"py:class", r"(int|float|str|bool|bytes|object|dict|list|tuple|set|frozenset|None)"),
    (r"py:class", r"(Ellipsis|ellipsis|EllipsisType|types\..*)"),
    (r"py:class", r"(ValueError|Exception|TypeError|KeyError)"),
    (r"py:class", r"(fractions|decimal|enum|functools)\..*"),
    (r"py:class", r"npt\..*"),  # numpy.typing, imported for annotations only
]

# --- doctest builder ----------------------------------------------------------------------------
doctest_global_setup = "import vrammath"


# --- cross-references to vrammath by short name -----------------------------------------------


def resolve_short_vrammath_name(app, env, node, contnode):  # type: ignore[no-untyped-def]
    """Resolve ``:class:`InputError``` in a docstring to the one ``vrammath.*.InputError``.

    Docstrings name the package's own classes and functions without their module; a name that
    matches exactly one documented vrammath object links there, anything else stays unresolved
    (and nitpicky mode reports it).
    """
    from sphinx.util.nodes import make_refnode

    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "").lstrip("~.")
    if not target or target.startswith("vrammath."):
        return None
    domain = env.get_domain("py")
    suffix = "." + target
    matches = [
        (name, entry)
        for name, entry in domain.objects.items()
        if name.startswith("vrammath.") and name.endswith(suffix) and not entry.aliased
    ]
    if len(matches) != 1:
        return None
    name, entry = matches[0]
    return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, name)


_FOOTNOTE_DEF = re.compile(r"^(\s*)\.\. \[(\d+)\]")
_FOOTNOTE_REF = re.compile(r"\[(\d+)\]_")


def unique_footnotes(app, what, name, obj, options, lines):  # type: ignore[no-untyped-def]
    """Give numpydoc-style ``.. [1]`` references in a docstring labels unique to that docstring.

    Several docstrings on one API page each define ``[1]``; docutils would see duplicate targets.
    ``[1]`` becomes the auto-numbered ``[#vrammath-x-y-1]`` (and ``[1]_`` likewise).
    """
    label = re.sub(r"[^0-9A-Za-z]+", "-", name)
    for i, line in enumerate(lines):
        defined = _FOOTNOTE_DEF.sub(lambda m: f"{m.group(1)}.. [#{label}-{m.group(2)}]", line)
        lines[i] = _FOOTNOTE_REF.sub(lambda m: f"[#{label}-{m.group(1)}]_", defined)


def check_named_setups(app, exception):  # type: ignore[no-untyped-def]
    """Fail the build if two pages glued different numbers for one named setup, or if a page's
    numbers differ from ``vrammath estimate ... --json`` for that setup (see docs/vmdocs.py)."""
    if exception is not None or app.builder.name != "html":
        return
    import json
    import subprocess

    import vmdocs

    seen: dict[str, tuple[str, dict[str, Any]]] = {}
    problems = []
    for path in sorted(RECORDS.glob("*.json")) if RECORDS.is_dir() else []:
        page = path.stem.replace("__", "/")
        for name, record in json.loads(path.read_text()).items():
            if name not in seen:
                seen[name] = (page, dict(record))
                continue
            first_page, first = seen[name]
            for key, value in record.items():
                if key in first and first[key] != value:
                    problems.append(
                        f"{name!r} {key}: {page} and {first_page} glue different numbers"
                    )
                first.setdefault(key, value)
    for name, (page, record) in sorted(seen.items()):
        if "estimate" not in record:
            continue
        out = subprocess.run(
            [sys.executable, "-m", "vrammath", "estimate", *vmdocs.cli_args(name)],
            capture_output=True,
            text=True,
            check=True,
        )
        cli = json.loads(out.stdout)
        cli_record = {
            "totals": cli["totals"],
            "phases": cli["phases"],
            "components": {c["key"]: c["bytes"] for c in cli["components"]},
            "fits": None if cli["gpu"] is None else cli["gpu"]["fits"],
        }
        if cli_record != record["estimate"]:
            problems.append(f"{name!r}: {page} differs from `vrammath estimate --json`")
    if problems:
        raise RuntimeError("named setups disagree:\n  " + "\n  ".join(problems))
    print(f"named setups: {len(seen)} checked against each other and the CLI's --json")


def follow_aliases_home(app, modname, attribute):  # type: ignore[no-untyped-def]
    """viewcode's source link for a documented alias such as ``X = dict[str, int]``: its own
    module's source (the alias's ``__module__`` is ``builtins``, which has no source page)."""
    obj = importlib.import_module(modname)
    for part in attribute.split("."):
        obj = getattr(obj, part, None)
    return modname if getattr(obj, "__module__", None) == "builtins" else None


def check_module_links(app, exception):  # type: ignore[no-untyped-def]
    """Fail the build if the source-code index links a page that was not written."""
    index = Path(app.outdir) / "_modules" / "index.html"
    if exception is not None or app.builder.name != "html" or not index.is_file():
        return
    links = re.findall(r'href="([^"#]+\.html)"', index.read_text())
    missing = [link for link in links if not (index.parent / link).resolve().is_file()]
    if missing:
        raise RuntimeError(f"_modules/index.html links pages that do not exist: {missing}")


def drop_nested_documents(app, doctree):  # type: ignore[no-untyped-def]
    """Point every node at the page's own document before Sphinx pickles it.

    MyST's ``eval-rst`` blocks (every API page) parse into a nested document whose settings hold
    the whole build environment; the text nodes keep a reference to it, so each API page's
    doctree pickled the environment with it (viewcode's copy of every module's source, 1.2 MB a
    page, 68 MB for the reference section), and every incremental build read them all back.
    """
    for node in doctree.findall():
        if getattr(node, "_document", None) not in (None, doctree):
            node.document = doctree


def check_fit_tables(app, exception):  # type: ignore[no-untyped-def]
    """Fail the build if a verdict table (a "fits" / "fits?" / "GPU fits" column, or cells that
    say "fits" / "does not fit") has no column naming the engine its verdicts assume: a verdict
    holds for one engine (vmdocs.fit_cell, vmdocs.engine_cell)."""
    if exception is not None or app.builder.name != "html":
        return
    out = Path(app.outdir)
    problems = []

    def texts(html: str, tag: str) -> list[str]:
        cells = re.findall(rf"<{tag}[^>]*>(.*?)</{tag}>", html, re.S)
        return [re.sub(r"<[^>]+>", "", c).strip().lower() for c in cells]

    for page in sorted(out.rglob("*.html")):
        if "_modules" in page.parts or "_static" in page.parts:
            continue
        for table in re.findall(r"<table.*?</table>", page.read_text(encoding="utf-8"), re.S):
            head = texts(table, "th")
            if any("claimed" in c for c in head):  # an audit quotes the source's own verdicts
                continue
            verdicts = any(re.search(r"\bfits?\b", c) for c in head) or any(
                re.fullmatch(r"(fits|does not fit)", c) for c in texts(table, "td")
            )
            if verdicts and not any("engine" in c for c in head):
                problems.append(f"{page.relative_to(out)}: {head}")
    if problems:
        raise RuntimeError("verdict tables without an engine column:\n" + "\n".join(problems))


def setup(app):  # type: ignore[no-untyped-def]
    app.add_config_value("vrammath_sources_hash", "", "env", types=[str])
    app.connect("config-inited", place_execution_cache, priority=100)
    app.connect("missing-reference", resolve_short_vrammath_name)
    app.connect("doctree-read", drop_nested_documents)
    app.connect("autodoc-process-docstring", unique_footnotes)
    app.connect("build-finished", check_named_setups)
    app.connect("build-finished", check_module_links)
    app.connect("build-finished", check_fit_tables)
    app.connect("viewcode-follow-imported", follow_aliases_home)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
