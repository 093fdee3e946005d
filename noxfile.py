"""Sessions: `nox` runs everything CI runs; `nox -s docs` builds the handbook.

Each session installs what it needs into its own virtual environment from pyproject.toml's
dependency groups, so a fresh machine needs only Python and nox.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import nox

nox.needs_version = ">=2025.2.9"
nox.options.default_venv_backend = "venv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "typecheck", "tests", "docs", "build", "measure", "browser"]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml("pyproject.toml")
TORCH = "torch==2.13.0"  # pinned: an unpinned torch pulls a multi-GB CUDA build
# pinned to the versions validation/matrix.json and lora_kv.json were measured with: the diff
# of a fresh measurement against them must not move with a new release
MEASURE_DEPS = [TORCH, "transformers==5.24.0", "peft==0.21.2", "accelerate==1.15.0"]
DOCS_OUT = ROOT / "docs" / "_build"


def _group(name: str) -> list[str]:
    return list(nox.project.dependency_groups(PYPROJECT, name))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install(*_group("lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the package."""
    session.install(*_group("lint"), "-e", ".")
    session.run("mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """pytest over tests/ and the package's doctests (measurement tests live in `measure`)."""
    session.install(*_group("test"), "-e", ".")
    session.run("pytest", "-m", "not measure and not gpu", *session.posargs)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the handbook (HTML, strict) and run every doctest in it.

    Pages execute through a cache keyed on vrammath's sources (see docs/conf.py); under CI, or
    with `nox -s docs -- --force`, every page executes afresh. Both builders share one doctree
    folder, so the doctest pass reuses the HTML pass's executed pages.
    """
    session.install(*_group("docs"), "-e", ".")
    session.run("python", "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3")
    force = os.environ.get("CI") == "true" or "--force" in session.posargs
    env = {"VRAMMATH_FORCE_EXECUTE": "1" if force else "0"}
    args = ["-n", "-W", "--keep-going", "-j", "1", "-d", str(DOCS_OUT / "doctrees")]
    fresh = ["-E"] if force else []  # re-read (and so execute) every page, not just changed ones
    session.run(
        "sphinx-build", "-b", "html", *fresh, *args, "docs", str(DOCS_OUT / "html"), env=env
    )
    session.run("sphinx-build", "-b", "doctest", *args, "docs", str(DOCS_OUT / "doctest"), env=env)
    session.log(f"handbook: {DOCS_OUT / 'html' / 'index.html'}")


@nox.session
def serve(session: nox.Session) -> None:
    """Live preview of the handbook at http://127.0.0.1:8000 (rebuilds on change)."""
    session.install(*_group("docs"), "sphinx-autobuild", "-e", ".")
    session.run("python", "-m", "ipykernel", "install", "--sys-prefix", "--name", "python3")
    session.run(
        "sphinx-autobuild",
        "docs",
        str(DOCS_OUT / "serve"),
        "-d",
        str(DOCS_OUT / "serve-doctrees"),
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--watch",
        "vrammath",
        "--watch",
        "conf",
        # the build's own writes (execution cache, staged MathJax, bytecode) are not changes
        "--ignore",
        str(DOCS_OUT),
        "--re-ignore",
        r"(__pycache__|\.ipynb_checkpoints|\.pyc$)",
        *session.posargs,
    )


@nox.session
def build(session: nox.Session) -> None:
    """Build the wheel, install it in a fresh venv outside the repo, and load a preset from it."""
    session.install("build")
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    session.run("python", "-m", "build", "--wheel", "--outdir", str(dist))
    wheels = sorted(dist.glob("vrammath-*.whl"))
    if len(wheels) != 1:
        session.error(f"expected one wheel in {dist}, found {wheels}")
    tmp = Path(session.create_tmp()).resolve() / "smoke"
    shutil.rmtree(tmp, ignore_errors=True)
    session.run(sys.executable, "-m", "venv", str(tmp), external=True)
    py = str(tmp / "bin" / "python")
    session.run(py, "-m", "pip", "install", "-q", str(wheels[0]), external=True)
    session.run(
        py,
        str(ROOT / "tools" / "wheel_smoke.py"),
        external=True,
        env={"PYTHONPATH": ""},
    )


@nox.session
def measure(session: nox.Session) -> None:
    """Measure real models with PyTorch's memory tracker and compare with vrammath (validation).

    By default the quick set (what CI runs): each measurement test's cases that show every
    architecture, dtype, kernel and recipe once (tests/measure/conftest.py), the quick rows of
    the validation matrix, every architecture of validation/archs.json and the engines' quick
    rows, each diffed against the committed file (a changed number fails). `-- --full` runs
    every case and every matrix row; `-- --regenerate` rewrites the committed files instead.
    """
    session.install(*MEASURE_DEPS, *_group("test"), "-e", ".")
    regenerate = "--regenerate" in session.posargs
    full = "--full" in session.posargs or regenerate
    args = [a for a in session.posargs if a not in ("--regenerate", "--full")]
    session.run(
        "pytest", "-m", "measure or gpu", "tests/measure", *(["--full"] if full else []), *args
    )
    matrix = ["python", "-m", "vrammath.measure.matrix", *([] if full else ["--quick"])]
    archs = ["python", "-m", "vrammath.measure.archs"]
    if regenerate:
        session.run(*matrix, "--out", "validation/matrix.json")
        session.run(*archs, "--out", "validation/archs.json")
    else:
        # every architecture's parameters, activations and phase peaks (validation/archs.json)
        fresh_archs = Path(session.create_tmp()).resolve() / "archs.json"
        session.run(*archs, "--out", str(fresh_archs), "--diff", "validation/archs.json")
        fresh = Path(session.create_tmp()).resolve() / "matrix.json"
        session.run(*matrix, "--out", str(fresh), "--diff", "validation/matrix.json")
        # the real engines' quick rows (FSDP2, ZeroRedundancyOptimizer, fp32-master) against
        # validation/engines.json; DeepSpeed's rows need deepspeed, which the extra does not pin
        engines = Path(session.create_tmp()).resolve() / "engines.json"
        session.run(
            "python",
            "-m",
            "vrammath.measure.engines",
            "--quick",
            "--out",
            str(engines),
            "--diff",
            "validation/engines.json",
        )


@nox.session
def browser(session: nox.Session) -> None:
    """Open the built handbook in headless Chromium and check math, figures, search, console."""
    session.install("selenium>=4.20", ".")  # the calculator check computes the expected bytes
    _ensure_chromium(session)
    if not (DOCS_OUT / "html" / "index.html").is_file():
        session.error("build the handbook first: nox -s docs")
    session.run("python", "tools/browser_check.py", str(DOCS_OUT / "html"))


def _ensure_chromium(session: nox.Session) -> None:
    """Debian's chromium + chromium-driver: found, installed (as root with apt-get), or named."""
    needed = ("chromium", "chromedriver")
    if all(shutil.which(cmd) for cmd in needed):
        return
    apt = shutil.which("apt-get")
    if apt and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        session.run(apt, "update", "-qq", external=True, env=env)
        session.run(
            apt, "install", "-y", "-qq", "chromium", "chromium-driver", external=True, env=env
        )
    if not all(shutil.which(cmd) for cmd in needed):
        session.error(
            "the browser check needs Chromium and ChromeDriver: install Debian's chromium and "
            "chromium-driver (apt-get install chromium chromium-driver), then rerun"
        )


@nox.session
def bench(session: nox.Session) -> None:
    """Speed benchmarks (sweeps vs sympy subs, import and CLI cold start); ratios in one run."""
    session.install(*_group("bench"), "-e", ".")
    session.run(
        "pytest", "benchmarks", "--benchmark-only", "-p", "no:cacheprovider", *session.posargs
    )


@nox.session
def compare(session: nox.Session) -> None:
    """Run DeepSpeed's, accelerate's and Megatron's estimators on vrammath's setups (not in CI).

    Writes validation/estimators.json. DeepSpeed installs without its CUDA ops (DS_BUILD_OPS=0)
    against the pinned CPU torch already in the environment.
    """
    session.install(TORCH, "transformers>=5,<6", "accelerate>=1.0", "setuptools", "wheel")
    session.install("--no-build-isolation", "deepspeed", env={"DS_BUILD_OPS": "0"})
    session.install("-e", ".")
    session.run("python", "tools/compare_estimators.py", *session.posargs)
