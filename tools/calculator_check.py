"""The calculator page and the runnable cells in headless Chromium, against the CLI.

``tools/browser_check.py`` calls :func:`check_calculator` on the built site. The page runs
vrammath itself (Pyodide in a Web Worker, docs/_static/vrammath-*.js); this check asserts that:

* cold start: from navigation to live (Python started, vrammath imported) in a fresh browser
  profile, with what dominates (the worker's own timings); the first view (the default setups,
  computed at build time) renders at once;
* 200 random setups (training, fit, serving; valid or refused) give, through
  ``window.vrammath.run(argv)``, exactly the exit status, stdout and stderr of the CLI's
  ``main(argv)`` run here (:func:`vrammath.browser.run`); five of them also through a real
  ``python -m vrammath`` process; ``window.vrammath.estimate(setup)`` returns the parsed JSON;
* the form: a setup typed into it renders the CLI's numbers, its link reproduces it, a bad
  number shows the CLI's own message beside the field; a number change and an option change
  are timed (input to rendered answer);
* every "try it" link of the handbook opens the setup it names, field by field;
* runnable cells: every code cell whose code is shown has the control, and every cell of every
  page runs in the browser (or says in one line which package the bundle lacks); the doctest
  examples of every API page run there and print what their doctests expect;
* the bytes shipped (raw and gzip'd).
"""

from __future__ import annotations

import gzip
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from vrammath.browser import argv_for, run
from vrammath.model.presets import load_gpus, load_model, model_names
from vrammath.notation.units import fmt_gb
from vrammath.notation.vocab import (
    ATTENTIONS,
    ENGINES,
    IMPLEMENTATIONS,
    ITERATIONS,
    KV_DTYPES,
    OPTIMIZERS,
    QUANTS,
    RECIPE_NAMES,
    RECOMPUTES,
    SERVE_WEIGHTS,
    SHARDS,
)

PAGE = "calculator.html"
SETUPS = 200  # random setups compared byte for byte, training, fit and serving together
CLI_RUNS = 5  # of those, also through a real `python -m vrammath` process
LIVE_BUDGET_S = 6.0  # navigation to live, cold (issue 29)
NUMBER_BUDGET_MS = 50.0
OPTION_BUDGET_MS = 500.0
LACKS = re.compile(r"this cell needs (\S+), which the browser bundle")
"""The worker's one line for code that needs a package the browser bundle lacks."""
TARGET_CHOICES = ("q,v", "q,k,v,o", "all-linear")

JS_RUN = """
const done = arguments[arguments.length - 1];
window.vrammath.run(arguments[0]).then((r) => done(r), (e) => done({error: String(e)}));
"""
JS_ESTIMATE = """
const done = arguments[arguments.length - 1];
window.vrammath.estimate(arguments[0]).then((r) => done(r), (e) => done({error: String(e)}));
"""
JS_LIVE = """
const done = arguments[arguments.length - 1];
window.vrammath.ready.then(() => done({live: window.vrammath.liveAt,
  timings: window.vrammath.timings, first: window.vrammath.firstRenderAt}),
  (e) => done({error: String(e)}));
"""
JS_TRY_LINKS = """
return Array.from(document.querySelectorAll('p.vm-try a')).map(
  (a) => [decodeURI(a.href.split('#')[1] || ''), a.getAttribute('data-fields')]);
"""
JS_WAIT_RENDER = """
const done = arguments[arguments.length - 1];
const want = arguments[0];
const t0 = performance.now();
const poll = () => {
  const vm = window.vrammath;
  if ((vm.renders || 0) >= want && vm.idle && vm.idle()) done(vm.renderedAt);
  else if (performance.now() - t0 > 60000) done(null);
  else setTimeout(poll, 5);
};
poll();
"""


# --- random setups ---------------------------------------------------------------------------


def random_training(rng: random.Random) -> dict[str, Any]:
    """A random training setup (valid or not) as the CLI JSON's ``setup`` keys plus ``model``."""
    name = rng.choice(model_names())
    spec = load_model(name)
    kw: dict[str, Any] = {
        "model": name,
        "recipe": rng.choice(RECIPE_NAMES),
        "optimizer": rng.choice(OPTIMIZERS),
        "implementation": rng.choice(IMPLEMENTATIONS),
        "zero": rng.choice((0, 1, 2, 3)),
        "gpus": rng.choice((1, 2, 8, 64, 1000, rng.randint(1, 4096))),
        "micro_batch": rng.choice((1, 2, 4, rng.randint(1, 64))),
        "seq_len": rng.choice((1, 512, 2048, 4096, rng.randint(1, 32768))),
        "attention": rng.choice(ATTENTIONS),
        "recompute": rng.choice(RECOMPUTES),
        "iteration": rng.choice(ITERATIONS) if rng.random() < 0.3 else "steady",
        "device": "cpu" if rng.random() < 0.1 else "cuda",
        "gpu": rng.choice([None, *load_gpus()]),
    }
    if kw["zero"] and rng.random() < 0.25:
        kw["offload_optimizer"] = True
        kw["offload_params"] = kw["zero"] == 3 and rng.random() < 0.5
    if rng.random() < 0.25:
        tps = [t for t in range(1, spec.heads + 1) if spec.heads % t == 0]
        kw["tp"] = rng.choice(tps)
        kw["pp"] = rng.randint(1, min(spec.layers, 16))
        kw["sp"] = kw["tp"] > 1 and rng.random() < 0.5
    elif rng.random() < 0.45:
        kw["lora_rank"] = rng.choice((1, 8, 16, 64, rng.randint(1, 512)))
        kw["lora_targets"] = rng.choice(TARGET_CHOICES).split(",")
        kw["lora_dropout"] = rng.random() < 0.3
        if rng.random() < 0.5:
            kw["quant"] = rng.choice(QUANTS)
    if spec.experts is not None and rng.random() < 0.5:
        count = spec.experts.count
        kw["ep"] = rng.choice([x for x in range(2, count + 1) if count % x == 0])
        kw["gpus"] = kw["ep"] * rng.choice((1, 2, 4))
    if rng.random() < 0.2:
        kw["shard"] = rng.choice(SHARDS)
    if rng.random() < 0.2:
        kw["keep_outputs"] = True
    if rng.random() < 0.25:  # an engine's own rules, with the fields only it reads
        kw["engine"] = rng.choice(ENGINES)
        fsdp = kw["engine"] in ("fsdp2", "accelerate-fsdp2")
        if (fsdp or kw["engine"] in ("zero1-torch", "deepspeed")) and rng.random() < 0.5:
            kw["rank"] = rng.randint(0, kw["gpus"])  # gpus itself is refused by name
        if kw["engine"] == "ddp" and rng.random() < 0.5:
            kw["bucket_view"] = True
        if kw["engine"] == "deepspeed" and rng.random() < 0.5:
            kw["reduce_bucket_size"] = rng.choice((10**6, 2 * 10**8, rng.randint(1, 10**9)))
        if fsdp and rng.random() < 0.5:
            kw["no_reshard"] = True
    return kw


def random_serve(rng: random.Random) -> dict[str, Any]:
    """A random serving setup (valid or not)."""
    name = rng.choice(model_names())
    spec = load_model(name)
    return {
        "model": name,
        "context": rng.choice((1, 512, 4096, 32768, rng.randint(1, 2**20))),
        "batch": rng.choice((1, 8, 64, rng.randint(1, 512))),
        "weights": rng.choice(SERVE_WEIGHTS),
        "kv_dtype": rng.choice(KV_DTYPES),
        "tp": rng.choice((1, 1, 2, 4, 8, rng.randint(1, spec.heads + 1))),
        "block": rng.choice((None, 16, 16, 32, rng.randint(1, 256))),
        "gpu": rng.choice([None, *load_gpus(), *load_gpus()]),
        "gpu_util": rng.choice((0.9, 0.95, 0.5, 1.0, round(rng.uniform(0.05, 1), 3))),
    }


def random_vllm(rng: random.Random) -> dict[str, Any]:
    """A random setup of ``serve --engine vllm`` (valid or not: MoE and mixed-window models,
    quantized weights and out-of-range releases are refused by name)."""
    name = rng.choice(model_names())
    spec = load_model(name)
    out: dict[str, Any] = {
        "model": name,
        "weights": rng.choice(("bf16", "bf16", "fp16", "int4")),
        "kv_dtype": rng.choice(KV_DTYPES),
        "tp": rng.choice((1, 1, 2, 4, 8, rng.randint(1, spec.heads + 1))),
        "gpu": rng.choice(list(load_gpus())),
        "version": rng.choice(("0.11.0", "0.10.1", "0.6.4", "0.7.3", "0.20.0", "0.33.1", "0.5.0")),
        "max_model_len": rng.choice((None, 2048, 32768, rng.randint(1, 2**20))),
    }
    if rng.random() < 0.3:
        out["gpu_memory_utilization"] = rng.choice((0.5, 0.95, round(rng.uniform(0.05, 1), 3)))
    if rng.random() < 0.3:
        out["max_num_seqs"] = rng.choice((64, 256, rng.randint(1, 4096)))
    if rng.random() < 0.3:
        out["sampler"] = rng.choice(("pytorch", "flashinfer", "triton"))
    if rng.random() < 0.2:
        out["disable_custom_all_reduce"] = True
    if rng.random() < 0.2:
        out["disable_hybrid_kv_cache_manager"] = True
    return out


def random_hf(rng: random.Random) -> dict[str, Any]:
    """A random setup of ``serve --engine hf`` (valid or not: other decoders, quantized weights
    and as many new tokens as the context are refused by name)."""
    context = rng.choice((2, 512, 4096, 32768, rng.randint(1, 2**17)))
    return {
        "model": rng.choice(model_names()),
        "context": context,
        "batch": rng.choice((1, 8, rng.randint(1, 256))),
        "weights": rng.choice(("bf16", "bf16", "fp16", "int4")),
        "gpu": rng.choice([None, *load_gpus()]),
        "new_tokens": rng.choice((128, 1, context, rng.randint(1, 4096))),
    }


def random_sglang(rng: random.Random) -> dict[str, Any]:
    """A random setup of ``serve --engine sglang`` (valid or not)."""
    out = random_vllm(rng)
    del out["version"], out["max_model_len"]
    out.pop("gpu_memory_utilization", None)
    out.pop("max_num_seqs", None)
    for key in ("sampler", "disable_custom_all_reduce", "disable_hybrid_kv_cache_manager"):
        out.pop(key, None)
    out["sglang_version"] = rng.choice(("0.4.6", "0.4.6", "0.5.2", "0.3.0"))
    if rng.random() < 0.6:
        out["mem_fraction_static"] = rng.choice((0.8, 0.88, round(rng.uniform(0.05, 1), 3)))
    if rng.random() < 0.3:
        out["page_size"] = rng.choice((1, 16, 64, rng.randint(1, 512)))
    return out


def random_argvs(rng: random.Random, n: int) -> list[list[str]]:
    """``n`` command lines: half training, a quarter fit (a GPU given), an eighth serving, an
    eighth under vLLM's, SGLang's or generate()'s rule."""
    out = []
    for i in range(n):
        if i % 4 in (0, 1):
            out.append([*argv_for("estimate", random_training(rng)), "--json"])
        elif i % 4 == 2:
            kw = random_training(rng)
            kw["gpu"] = rng.choice(list(load_gpus()))
            if rng.random() < 0.3:
                kw["headroom"] = rng.choice((0.05, 0.1))
            # fit solves each unknown by search: keep the setups small enough to answer fast
            kw["gpus"] = min(kw["gpus"], 64)
            out.append([*argv_for("fit", kw), "--json"])
        elif i % 8 == 3:
            out.append([*argv_for("serve", random_serve(rng)), "--json"])
        elif i % 16 == 7:
            out.append([*argv_for("vllm", random_vllm(rng)), "--json"])
        elif i % 32 == 15:
            out.append([*argv_for("hf", random_hf(rng)), "--json"])
        else:
            out.append([*argv_for("sglang", random_sglang(rng)), "--json"])
    return out


# --- the checks --------------------------------------------------------------------------------


def _wait_live(driver: Any) -> dict[str, Any]:
    driver.set_script_timeout(180)
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return !!window.vrammath"))
    got: dict[str, Any] = driver.execute_async_script(JS_LIVE)
    return got


def check_cold_start(base: str, root: Path, make_driver: Any) -> tuple[list[str], list[str]]:
    """Navigation to live in a fresh profile (nothing cached): the time and what dominates."""
    profile = Path(tempfile.mkdtemp(prefix="vrammath-cold-"))
    driver = make_driver(profile)
    try:
        driver.get(f"{base}/{PAGE}")
        got = _wait_live(driver)
        rows = driver.find_elements(By.CSS_SELECTOR, "#vm-components tr[data-key]")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
    if "error" in got:
        return [], [f"the page did not go live: {got['error']}"]
    live_s = got["live"] / 1000
    t = got["timings"]
    started = "restored from the build's snapshot" if t.get("snapshot") else "started"
    lines = [
        f"calculator: first view {got['first']:.0f} ms after navigation (the build's answers, "
        f"{len(rows)} rows); live {live_s:.1f} s after navigation, cold (runtime {started} "
        f"{t['runtime_ms']} ms, install {t['install_ms']} ms, import sympy {t['sympy_ms']} ms, "
        f"import vrammath {t['vrammath_ms']} ms)"
    ]
    problems = []
    if not rows:
        problems.append("the first view shows no components before Python starts")
    manifest = json.loads((root / "_static" / "wheels" / "manifest.json").read_text())
    if manifest.get("snapshot") and not t.get("snapshot"):
        problems.append("the build shipped a memory snapshot but the worker could not restore it")
    if live_s > LIVE_BUDGET_S:
        lines.append(f"calculator: NOTE live took {live_s:.1f} s (target {LIVE_BUDGET_S:.0f} s)")
    return lines, problems


def check_equality(driver: Any, base: str, seed: int = 29) -> tuple[list[str], list[str]]:
    """Random command lines: the page's run against the CLI's main() here, byte for byte."""
    driver.get(f"{base}/{PAGE}")
    _wait_live(driver)
    rng = random.Random(seed)
    argvs = random_argvs(rng, SETUPS)
    problems: list[str] = []
    ok = refused = 0
    page_ms = []
    for i, argv in enumerate(argvs):
        t0 = time.perf_counter()
        got = driver.execute_async_script(JS_RUN, argv)
        page_ms.append(1000 * (time.perf_counter() - t0))
        want = run(argv)
        if got != want:
            problems.append(f"{' '.join(argv)}: page {str(got)[:300]} != CLI {str(want)[:300]}")
            continue
        ok += want["rc"] == 0
        refused += want["rc"] != 0
        if i < CLI_RUNS:
            proc = subprocess.run(
                [sys.executable, "-m", "vrammath", *argv],
                capture_output=True,
                text=True,
                check=False,
            )
            if (proc.returncode, proc.stdout, proc.stderr) != (
                got["rc"],
                got["stdout"],
                got["stderr"],
            ):
                problems.append(f"{' '.join(argv)}: the page differs from `python -m vrammath`")
    setup = {"model": "llama-7b", "zero": 3, "gpus": 8, "gpu": "a100-80gb"}
    api = driver.execute_async_script(JS_ESTIMATE, setup)
    want_api = json.loads(run([*argv_for("estimate", setup), "--json"])["stdout"])
    if api != want_api:
        problems.append("window.vrammath.estimate(setup) differs from the CLI's JSON")
    page_ms.sort()
    lines = [
        f"calculator: {len(argvs)} random command lines (training, fit, serving) byte-equal to "
        f"the CLI: {ok} answered, {refused} refused with the CLI's message; "
        f"{CLI_RUNS} of them also through `python -m vrammath`; median {page_ms[len(page_ms) // 2]:.0f} ms, "
        f"slowest {page_ms[-1]:.0f} ms per run in the page"
    ]
    return lines, problems


def _fill(driver: Any, prefix: str, values: dict[str, Any], reset: bool = False) -> None:
    """Type ``values`` into the form (selects by value, checkboxes clicked) and fire input;
    with ``reset``, every other field is the CLI's default."""
    driver.execute_script(
        """
        const [prefix, values, reset] = arguments;
        if (reset) {  // every field back to the CLI's default first
          for (const input of document.getElementById(prefix + 'form').elements) {
            if (input.type === 'checkbox') input.checked = false;
            else if (input.dataset.default !== undefined) input.value = input.dataset.default;
          }
        }
        for (const [name, value] of Object.entries(values)) {
          const input = document.getElementById(prefix + 'in-' + name);
          if (input.type === 'checkbox') input.checked = value === true;
          else input.value = Array.isArray(value) ? value.join(',') : String(value);
        }
        document.getElementById(prefix + 'form').dispatchEvent(new Event('input'));
        """,
        prefix,
        values,
        reset,
    )


def _renders(driver: Any) -> int:
    return int(driver.execute_script("return window.vrammath.renders || 0"))


def _timed_change(driver: Any, values: dict[str, Any]) -> float:
    """Milliseconds from a form change to its rendered answer."""
    before = _renders(driver)
    t0 = driver.execute_script("return performance.now()")
    _fill(driver, "vm-", values)
    done = driver.execute_async_script(JS_WAIT_RENDER, before + 1)
    return float(done - t0) if done is not None else float("inf")


def check_form(driver: Any, base: str) -> tuple[list[str], list[str]]:
    """Typed setups render the CLI's numbers and reproduce from their link; a bad number shows
    the CLI's message beside its field; changes are timed."""
    problems: list[str] = []
    cases = [
        {"model": "llama-7b", "zero": 3, "gpus": 8, "gpu": "a100-80gb"},
        {"model": "gpt2", "recipe": "fp32", "micro_batch": 4, "seq_len": 1024},
        {"model": "llama-2-7b", "lora_rank": 16, "quant": "nf4", "recompute": "full"},
        {"model": "gpt-175b", "tp": 8, "pp": 8, "sp": True, "recompute": "selective", "gpus": 64},
        {"model": "mixtral-8x7b", "ep": 8, "gpus": 8, "zero": 1, "gpu": "h100-80gb"},
    ]
    driver.get(f"{base}/{PAGE}")
    _wait_live(driver)
    js_rows = (
        "return Array.from(document.querySelectorAll('#vm-components tr[data-key]'))"
        ".map(r => [r.dataset.key, r.children[2].textContent]);"
    )
    for case in cases:
        before = _renders(driver)
        _fill(driver, "vm-", case, reset=True)
        driver.execute_async_script(JS_WAIT_RENDER, before + 1)
        want = run([*argv_for("estimate", case), "--json"])
        if want["rc"]:
            problems.append(f"form case refused by the CLI: {case}: {want['stderr'].strip()}")
            continue
        table = {
            c["key"]: fmt_gb(c["bytes"])
            for c in json.loads(want["stdout"])["components"]
            if c["bytes"] is not None
        }
        rows = dict(driver.execute_script(js_rows))
        if rows != table:
            problems.append(f"form {case}: table {rows} != CLI {table}")
        hash_ = driver.execute_script("return location.hash")
        driver.get("about:blank")
        driver.get(f"{base}/{PAGE}{hash_}")
        _wait_live(driver)
        driver.execute_async_script(JS_WAIT_RENDER, 1)
        if dict(driver.execute_script(js_rows)) != rows:
            problems.append(f"form {case}: the link {hash_} does not reproduce the table")
    bad = [("micro_batch", "0"), ("seq_len", "2.5"), ("gpus", "-3"), ("tp", "3"), ("pp", "2000000"),
           ("lora_rank", "-1")]  # fmt: skip
    driver.get(f"{base}/{PAGE}")
    _wait_live(driver)
    checked = 0
    for name, text in bad:
        before = _renders(driver)
        _fill(driver, "vm-", {"model": "llama-7b", name: text}, reset=True)
        driver.execute_async_script(JS_WAIT_RENDER, before + 1)
        argv = driver.execute_script("return document.getElementById('vm-cli').textContent")
        want = run([*argv.split()[1:], "--json"])
        line = next((ln for ln in want["stderr"].splitlines() if "error:" in ln), "")
        beside = driver.find_element(By.ID, f"vm-err-{name}").text
        if want["rc"] != 2 or not line or beside != line.removeprefix("vrammath: error: "):
            problems.append(f"bad {name}={text!r}: the page shows {beside!r}, the CLI {line!r}")
        else:
            checked += 1
        _fill(driver, "vm-", {name: driver.execute_script(
            f"return document.getElementById('vm-in-{name}').dataset.default")})  # fmt: skip
        driver.execute_async_script(JS_WAIT_RENDER, _renders(driver) + 1)
    numbers = [_timed_change(driver, {"micro_batch": b}) for b in (2, 3, 4, 5, 6)]
    options = [_timed_change(driver, {"recompute": r}) for r in ("full", "none", "full", "none")]
    numbers.sort()
    options.sort()
    engines = _check_engine_tabs(driver, base, problems)
    lines = [
        f"calculator: {len(cases)} typed setups render the CLI's table and reproduce from their link; "
        f"{checked} of {len(bad)} bad numbers show the CLI's message beside the field; "
        f"{engines} typed setups of the vLLM and SGLang tabs print the lines their CLI answer prints",
        f"calculator: a number change renders in {numbers[len(numbers) // 2]:.0f} ms (median), an "
        f"option change in {options[len(options) // 2]:.0f} ms (targets {NUMBER_BUDGET_MS:.0f} and "
        f"{OPTION_BUDGET_MS:.0f} ms)",
    ]
    return lines, problems


#: typed setups of the engine tabs: (tab, its element prefix, the setup)
ENGINE_CASES = (
    ("vllm", "vm-vl-", {"model": "llama-3.1-8b", "gpu": "H100-80GB", "max_model_len": 32768,
                        "gpu_memory_utilization": 0.8}),
    ("vllm", "vm-vl-", {"model": "qwen2.5-7b", "gpu": "A100-80GB", "version": "0.6.5"}),
    ("vllm", "vm-vl-", {"model": "gemma-3-27b-text", "gpu": "H100-80GB", "max_model_len": 32768,
                        "sampler": "flashinfer"}),
    ("vllm", "vm-vl-", {"model": "qwen2-7b", "gpu": "A100-80GB", "tp": 2, "version": "0.10.1",
                        "disable_custom_all_reduce": True}),
    ("sglang", "vm-sg-", {"model": "qwen3-8b", "gpu": "A100-80GB", "mem_fraction_static": 0.85}),
    ("hf", "vm-hf-", {"model": "qwen2.5-7b", "gpu": "A100-40GB", "context": 8192,
                      "new_tokens": 256}),
)  # fmt: skip


def _check_engine_tabs(driver: Any, base: str, problems: list[str]) -> int:
    """Each engine tab, typed into, shows the startup lines the CLI's JSON answer holds."""
    done = 0
    for tab, prefix, case in ENGINE_CASES:
        driver.get(f"{base}/{PAGE}#tab={tab}")
        _wait_live(driver)
        before = _renders(driver)
        _fill(driver, prefix, case, reset=True)
        driver.execute_async_script(JS_WAIT_RENDER, before + 1)
        got = run([*argv_for(tab, case), "--json"])
        if got["rc"]:
            problems.append(f"engine tab {tab} {case}: refused by the CLI: {got['stderr'].strip()}")
            continue
        answer = json.loads(got["stdout"])[tab]
        if tab == "hf":  # no startup lines: the largest batch the page says
            want = f"at most {answer['gpu']['max_batch']:,} sequences"
            shown = driver.execute_script("return document.getElementById('vm-hf-max').textContent")
            shown = want if want in shown else shown
        else:
            want = answer["lines"]
            shown = driver.execute_script(
                f"return Array.from(document.querySelectorAll('#{prefix}lines div'))"
                ".map(d => d.textContent)"
            )
        if shown != want:
            problems.append(f"engine tab {tab} {case}: the page shows {shown}, the CLI {want}")
        else:
            done += 1
    return done


def _same(name: str, want: str, got: str) -> bool:
    want = unquote(want)
    if name == "gpu":
        return want.lower() == got.lower()
    return want == got


def check_links(driver: Any, base: str, root: Path) -> tuple[list[str], list[str]]:
    """Every "try it" link of the handbook, followed as the browser parses it, opens the setup it
    names (each field) and the CLI's answer for it."""
    problems: list[str] = []
    links: dict[str, tuple[str, dict[str, str]]] = {}
    for page in sorted(root.rglob("*.html")):
        if 'class="vm-try"' not in page.read_text():
            continue
        rel = page.relative_to(root).as_posix()
        driver.get(f"{base}/{rel}")
        for fragment, fields in driver.execute_script(JS_TRY_LINKS):
            links.setdefault(fragment, (rel, json.loads(fields or "{}")))
    for fragment, (rel, fields) in sorted(links.items()):
        driver.get("about:blank")
        driver.get(f"{base}/{PAGE}#{fragment}")
        _wait_live(driver)
        driver.execute_async_script(JS_WAIT_RENDER, 1)
        prefix = {"serve": "vm-sv-", "fit": "vm-fit-"}.get(fields.get("tab", ""), "vm-")
        rows = driver.find_elements(By.CSS_SELECTOR, f"#{prefix}components tr[data-key]")
        bad = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".vm-status.vm-bad") if e.text]
        if not rows or bad:
            problems.append(f"link #{fragment}: no table ({'; '.join(bad) or 'nothing shown'})")
        if not fields:
            problems.append(f"{rel}: a 'try it' link without the fields it names")
        for name, want in fields.items():
            if name == "tab":
                continue
            elems = driver.find_elements(By.ID, f"{prefix}in-{name}")
            got = "(no such field)"
            if elems:
                elem = elems[0]
                is_box = elem.get_attribute("type") == "checkbox"
                got = (
                    ("true" if elem.is_selected() else "false")
                    if is_box
                    else elem.get_attribute("value") or ""
                )
            if not _same(name, want, got):
                problems.append(
                    f"{rel}: the link sets {name}={unquote(want)}, the form shows {got!r}"
                )
    return [
        f"calculator: {len(links)} 'try it' links open the setup they name, field by field"
    ], problems


def check_cells(driver: Any, base: str, root: Path) -> tuple[list[str], list[str]]:
    """Every page with code cells: a run control on each cell whose code is shown, and every
    cell run in the browser, in order, in the page's namespace -- each must run, or say in one
    line which package the browser bundle lacks."""
    problems: list[str] = []
    with_cells = [
        page.relative_to(root).as_posix()
        for page in sorted(root.rglob("*.html"))
        if 'class="cell docutils container"' in (text := page.read_text())
        or 'class="cell tag_' in text
    ]
    ran = 0
    needs: Counter[str] = Counter()
    driver.set_script_timeout(300)
    for rel in with_cells:
        driver.get(f"{base}/{rel}")
        shown = driver.execute_script(
            "return document.querySelectorAll('div.cell .cell_input pre').length"
        )
        buttons = driver.execute_script("return document.querySelectorAll('.vm-run-button').length")
        if buttons != shown:
            problems.append(f"{rel}: {buttons} run controls for {shown} cells with code shown")
        sources = driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "window.vrammath.pageCells().then(done, (e) => done(String(e)));"
        )
        if not isinstance(sources, list) or not sources:
            problems.append(f"{rel}: the page's cells could not be read: {sources}")
            continue
        for i, source in enumerate(sources):
            got = driver.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "window.vrammath.cell(location.pathname, arguments[0])"
                ".then(done, (e) => done({error: String(e)}));",
                source,
            )
            if got.get("error") is None:
                ran += 1
            elif lacks := LACKS.match(got["error"]):
                needs[lacks.group(1)] += 1
            else:
                problems.append(f"{rel} cell {i + 1}: {got['error']}")
    lacking = ", ".join(f"{name} {n}" for name, n in sorted(needs.items())) or "none"
    lines = [
        f"runnable cells: {ran + sum(needs.values())} cells of {len(with_cells)} pages run in the "
        f"browser: {ran} ran, {sum(needs.values())} said which package the bundle lacks "
        f"({lacking})"
    ]
    return lines, problems


def _normal(text: str) -> str:
    return " ".join(text.split())


def _matches(got: str, want: str) -> bool:
    """doctest's comparison with NORMALIZE_WHITESPACE and ELLIPSIS."""
    pattern = ".*".join(re.escape(part) for part in _normal(want).split("..."))
    return re.fullmatch(pattern, _normal(got), re.S) is not None


def check_doctests(driver: Any, base: str, root: Path) -> tuple[list[str], list[str]]:
    """Every API page's doctest examples run in the browser, in their module's namespace: no
    error, and the output the doctest expects (compared with ELLIPSIS and NORMALIZE_WHITESPACE);
    code that needs a package the bundle lacks must say so in one line."""
    problems: list[str] = []
    ran = same = needs = 0
    driver.set_script_timeout(300)
    api_pages = sorted((root / "reference" / "api").glob("*.html"))
    for page in api_pages:
        rel = page.relative_to(root).as_posix()
        driver.get(f"{base}/{rel}")
        blocks = driver.execute_script("return document.querySelectorAll('div.doctest').length")
        buttons = driver.execute_script(
            "return document.querySelectorAll('div.doctest + .vm-run-bar').length"
        )
        if buttons != blocks:
            problems.append(f"{rel}: {buttons} run controls for {blocks} doctest blocks")
        for i in range(blocks):
            shown = driver.execute_async_script(
                "const done = arguments[arguments.length - 1];"
                "window.vrammath.runExamples(window.vrammath.examplesOf(arguments[0]))"
                ".then(done, (e) => done(String(e)));",
                i,
            )
            if not isinstance(shown, list):
                problems.append(f"{rel} block {i + 1}: {shown}")
                continue
            for example in shown:
                ran += 1
                expected = example["expected"]
                if expected.startswith("Traceback (most recent call last):"):
                    # the example shows a refusal: the browser must raise the same last line
                    want = expected.splitlines()[-1]
                    if example["error"] and _matches(example["error"], want):
                        same += 1
                    else:
                        problems.append(f"{rel}: {example['code']!r} should raise {want!r}")
                    continue
                if example["error"] and LACKS.match(example["error"]):
                    needs += 1
                elif example["error"]:
                    problems.append(f"{rel}: {example['code']!r} raised {example['error']}")
                elif _matches(example["got"], example["expected"]):
                    same += 1
                else:
                    problems.append(
                        f"{rel}: {example['code']!r} gave {example['got'][:200]!r}, the doctest "
                        f"expects {example['expected'][:200]!r}"
                    )
    lines = [
        f"doctest examples: {ran} examples of {len(api_pages)} API pages ran in the browser, "
        f"{same} printed what the doctest expects (ELLIPSIS, whitespace normalized), {needs} said "
        "which package the bundle lacks"
    ]
    return lines, problems


def shipped(root: Path) -> list[str]:
    """What a reader's browser downloads for the live parts: raw and gzip'd bytes."""
    static = root / "_static"
    manifest = json.loads((static / "wheels" / "manifest.json").read_text())
    bundle = [manifest["bundle"]] if "bundle" in manifest else []
    snapshot = manifest.get("snapshot")
    # a restored worker fetches the heap and the rest of the bundle, not the whole bundle
    wheels = [
        *manifest["wheels"],
        *([snapshot["heap"], snapshot["bundle"]] if snapshot else bundle),
    ]
    parts = [
        *sorted((static / "pyodide").iterdir()),
        *(static / "wheels" / name for name in [*wheels, *manifest["pages"], "manifest.json"]),
        *(static / n for n in ("vrammath-live.js", "vrammath-worker.mjs", "calculator.js")),
    ]
    lines = []
    raw_total = zipped_total = 0
    for path in parts:
        raw = path.stat().st_size
        zipped = len(gzip.compress(path.read_bytes(), 6))
        raw_total += raw
        zipped_total += zipped
        lines.append(
            f"  shipped: {path.relative_to(static)} {raw / 1e6:.2f} MB, gzip {zipped / 1e6:.2f} MB"
        )
    lines.append(f"  shipped in all: {raw_total / 1e6:.1f} MB, gzip'd {zipped_total / 1e6:.1f} MB")
    if snapshot:
        for name in bundle:
            path = static / "wheels" / name
            lines.append(
                f"  fetched only where the snapshot cannot be restored: wheels/{name} "
                f"{path.stat().st_size / 1e6:.2f} MB"
            )
    return lines


def check_calculator(
    driver: Any, base: str, root: Path, make_driver: Any
) -> tuple[list[str], list[str]]:
    """Every check of the live parts; (summary lines, problems)."""
    if not (root / PAGE).is_file():
        return [], [f"{PAGE} is missing"]
    started = time.monotonic()
    lines: list[str] = []
    problems: list[str] = []
    for check in (
        lambda: check_cold_start(base, root, make_driver),
        lambda: check_equality(driver, base),
        lambda: check_form(driver, base),
        lambda: check_links(driver, base, root),
        lambda: check_cells(driver, base, root),
        lambda: check_doctests(driver, base, root),
    ):
        more_lines, more = check()
        lines += more_lines
        problems += more
    lines += shipped(root)
    lines.append(f"calculator: checked in {time.monotonic() - started:.1f} s")
    return lines, problems
