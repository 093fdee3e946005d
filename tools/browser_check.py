"""Open the built handbook in headless Chromium and check what a reader would see.

Usage: ``python tools/browser_check.py docs/_build/html`` (``nox -s browser`` runs it after
``nox -s docs``). Needs Debian's ``chromium`` and ``chromium-driver`` and the ``selenium`` package.

It serves the built site from a local HTTP server on 127.0.0.1, visits every HTML page and checks:

* every page: no SEVERE entry in the browser console, and no request leaves 127.0.0.1 (the
  site must read offline; every other host is also made unresolvable for the browser);
* pages with math: MathJax typeset it (``mjx-container`` elements exist) without TeX errors;
* pages with images: every ``<img>`` loaded (``naturalWidth > 0``);
* the search page finds results for "ZeRO";
* the calculator and the runnable cells (``tools/calculator_check.py``): vrammath running in
  the page answers random setups byte for byte as the CLI does, the form and the "try it" links,
  the cold start and the time of a change;
* layout, at 1400 px and at 390 px wide: the main text column does not overflow horizontally,
  no table sits in a collapsed block (a hidden code cell's "Show code cell content"), and at
  1400 px every table fits its column (a reader sees every column without scrolling).

It prints what it saw, saves screenshots of the landing page and one chapter page to
``docs/_build/screenshots/`` (beside the html folder), and exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.server
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from calculator_check import check_calculator  # tools/, beside this script
from selenium import webdriver
from selenium.common.exceptions import TimeoutException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
SKIP_DIRS = {"_static", "_sources", "_images", "_downloads", ".doctrees", "jupyter_execute"}
SEARCH_TERM = "ZeRO"
MATH_TIMEOUT_S = 30
SEARCH_TIMEOUT_S = 30
SCREENSHOT_PAGES = (
    "index.html",
    "handbook/quickstart.html",
    "reference/notation.html",
    "calculator.html",
)
WIDTHS = (1400, 390)  # a desktop window and a phone, CSS pixels
WIDE = WIDTHS[0]  # where every table must fit its column

# JavaScript run in the page -----------------------------------------------------------------
JS_HAS_MATH = """
return document.querySelectorAll(
  'div.math, span.math, .math-wrapper, mjx-container, script[type^="math/tex"]'
).length;
"""
JS_MATH_DONE = """
const done = arguments[arguments.length - 1];
if (!window.MathJax) { done('no-mathjax'); return; }
const wait = () => {
  if (window.MathJax.startup && window.MathJax.startup.promise) {
    window.MathJax.startup.promise.then(() => done('ok'), (e) => done('error: ' + e));
  } else { setTimeout(wait, 100); }
};
wait();
"""
JS_MATH_COUNTS = """
return [document.querySelectorAll('mjx-container').length,
        document.querySelectorAll('mjx-merror, mjx-container [data-mjx-error]').length];
"""
JS_IMAGES = """
return Array.from(document.images).map(
  (img) => [img.currentSrc || img.src, img.complete, img.naturalWidth]);
"""
JS_LAYOUT = """
const article = document.querySelector('.bd-article') || document.querySelector('main')
  || document.body;
const doc = document.documentElement;
const hidden = document.querySelectorAll(
  'details.hide table, .tag_hide-cell table, .tag_hide-output table').length;
const wide = Array.from(article.querySelectorAll('table')).filter((t) => {
  if (t.offsetParent === null) { return false; }  // not displayed (closed dropdown)
  const box = t.parentElement.getBoundingClientRect();
  return t.getBoundingClientRect().width > Math.min(box.width, article.clientWidth) + 2;
}).map((t) => (t.querySelector('th') ? t.querySelector('th').textContent : '').trim().slice(0, 40));
return [doc.scrollWidth - doc.clientWidth, article.scrollWidth - article.clientWidth, hidden, wide];
"""
JS_SEARCH_HITS = """
const items = document.querySelectorAll('#search-results ul.search li, ul.search li');
const progress = document.getElementById('search-progress');
return [items.length, progress ? progress.textContent : ''];
"""


@dataclass
class PageReport:
    """What one page showed."""

    path: str
    math_elements: int = 0
    math_errors: int = 0
    images: int = 0
    broken_images: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    """A static file handler that does not log every request to stderr."""

    def log_message(self, format: str, *args: object) -> None:
        return


def serve(root: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """Serve ``root`` on an ephemeral port of 127.0.0.1 in a daemon thread."""
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    host, port = server.server_address[:2]
    return server, f"http://{host}:{port}"


def make_driver(profile: Path) -> webdriver.Chrome:
    """Debian's headless Chromium, a fresh profile, no network beyond 127.0.0.1."""
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1440,1000",
        f"--user-data-dir={profile}",
        # Any host but the local server is unresolvable: a CDN dependency shows up as an error.
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def pages(root: Path) -> list[str]:
    """Every built HTML page, relative to ``root``, landing page first."""
    found = []
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts[:-1]):
            continue
        found.append(rel.as_posix())
    found.sort(key=lambda p: (p != "index.html", p))
    return found


def drain_logs(driver: webdriver.Chrome, base: str) -> tuple[list[str], list[str]]:
    """SEVERE console entries and requests to anything but the local server since last call."""
    severe = [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
    local = urlsplit(base).netloc
    external = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") != "Network.requestWillBeSent":
            continue
        url = message["params"]["request"]["url"]
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about", "chrome", "chrome-untrusted", "devtools"):
            continue
        if parts.netloc != local:
            external.append(url)
    return severe, external


def check_page(driver: webdriver.Chrome, base: str, rel: str) -> PageReport:
    """Load one page and check its math, images and console."""
    report = PageReport(rel)
    driver.get(f"{base}/{rel}")
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    if driver.execute_script(JS_HAS_MATH):
        driver.set_script_timeout(MATH_TIMEOUT_S)
        try:
            state = driver.execute_async_script(JS_MATH_DONE)
        except TimeoutException:
            state = "timeout"
        if state != "ok":
            report.problems.append(f"MathJax did not finish: {state}")
        report.math_elements, report.math_errors = driver.execute_script(JS_MATH_COUNTS)
        if report.math_elements == 0:
            report.problems.append("page has math but no mjx-container was rendered")
        if report.math_errors:
            report.problems.append(f"{report.math_errors} TeX error(s) in rendered math")
    images = driver.execute_script(JS_IMAGES)
    report.images = len(images)
    report.broken_images = [src for src, complete, width in images if not complete or width <= 0]
    if report.broken_images:
        report.problems.append(f"images not loaded: {report.broken_images}")
    report.console_errors, report.external_requests = drain_logs(driver, base)
    if report.console_errors:
        report.problems.append(f"console errors: {report.console_errors}")
    if report.external_requests:
        report.problems.append(f"requests off this machine: {report.external_requests}")
    return report


def check_layout(driver: webdriver.Chrome, base: str, rel: str, width: int) -> list[str]:
    """Load one page at ``width`` CSS pixels and check what a reader who does not open code sees."""
    driver.set_window_size(width, 1000)
    driver.get(f"{base}/{rel}")
    WebDriverWait(driver, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    if driver.execute_script(JS_HAS_MATH):
        driver.set_script_timeout(MATH_TIMEOUT_S)
        with contextlib.suppress(TimeoutException):  # check_page reports MathJax problems
            driver.execute_async_script(JS_MATH_DONE)
    page_over, column_over, hidden, wide = driver.execute_script(JS_LAYOUT)
    drain_logs(driver, base)
    problems = []
    if page_over > 1 or column_over > 1:
        problems.append(
            f"{width} px: horizontal overflow (page {page_over} px, main column {column_over} px)"
        )
    if hidden:
        problems.append(f"{width} px: {hidden} table(s) inside a collapsed code cell")
    if width == WIDE and wide:
        problems.append(f"{width} px: table(s) wider than the text column: {wide}")
    return problems


def check_search(driver: webdriver.Chrome, base: str) -> tuple[int, list[str]]:
    """Search for SEARCH_TERM; return the number of hits and any problems."""
    driver.get(f"{base}/search.html?q={SEARCH_TERM}")
    deadline = time.monotonic() + SEARCH_TIMEOUT_S
    hits, progress = 0, ""
    while time.monotonic() < deadline:
        hits, progress = driver.execute_script(JS_SEARCH_HITS)
        if hits and "found" in progress.lower():
            break
        time.sleep(0.25)
    problems = []
    if not hits:
        problems.append(f"search for {SEARCH_TERM!r} found nothing (progress: {progress!r})")
    severe, external = drain_logs(driver, base)
    if severe:
        problems.append(f"console errors on the search page: {severe}")
    if external:
        problems.append(f"requests off this machine from the search page: {external}")
    return hits, problems


def screenshot(driver: webdriver.Chrome, base: str, rel: str, out: Path) -> Path | None:
    """Save a screenshot of one page (after its math is typeset) under ``out``."""
    driver.get(f"{base}/{rel}")
    if driver.execute_script(JS_HAS_MATH):
        driver.set_script_timeout(MATH_TIMEOUT_S)
        driver.execute_async_script(JS_MATH_DONE)
    out.mkdir(parents=True, exist_ok=True)
    target = out / (rel.replace("/", "__").removesuffix(".html") + ".png")
    driver.save_screenshot(str(target))
    drain_logs(driver, base)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("html", type=Path, help="the built site (docs/_build/html)")
    parser.add_argument(
        "--screenshots",
        type=Path,
        default=None,
        help="where to save screenshots (default: screenshots/ beside the html folder)",
    )
    args = parser.parse_args(argv)
    root: Path = args.html.resolve()
    if not (root / "index.html").is_file():
        print(f"browser check: no index.html in {root}; build the handbook first", file=sys.stderr)
        return 2
    shots = args.screenshots or root.parent / "screenshots"
    for tool in (CHROMIUM, CHROMEDRIVER):
        if not Path(tool).exists():
            print(f"browser check: {tool} is missing (apt-get install chromium chromium-driver)")
            return 2

    server, base = serve(root)
    profile = Path(tempfile.mkdtemp(prefix="vrammath-chromium-"))
    failures: list[str] = []
    reports: list[PageReport] = []
    started = time.monotonic()
    driver = make_driver(profile)
    crashes: list[str] = []

    def on_page(check: Callable[..., Any], rel: str, *args: Any) -> Any:
        """Run one page's check; a crashed tab gets a new browser and one more try.

        Headless Chromium's renderer has crashed under a loaded CI machine ("tab crashed" on
        a plain navigation) where the same build passed here: one crash is reported and retried,
        a second on the same page is a failure.
        """
        nonlocal driver
        for attempt in (1, 2):
            try:
                return check(driver, base, rel, *args)
            except WebDriverException as err:
                if "crash" not in str(err):
                    raise
                crashes.append(rel)
                print(f"browser check: the tab crashed on {rel} (try {attempt})", file=sys.stderr)
                with contextlib.suppress(WebDriverException):
                    driver.quit()
                driver = make_driver(profile / f"after-crash-{len(crashes)}")
        failures.append(f"{rel}: the tab crashed twice")
        return None

    try:
        for rel in pages(root):
            report = on_page(check_page, rel)
            if report is None:
                continue
            reports.append(report)
            failures.extend(f"{rel}: {problem}" for problem in report.problems)
        for width in WIDTHS:
            for rel in pages(root):
                failures.extend(f"{rel}: {p}" for p in on_page(check_layout, rel, width) or [])
            saved_at = shots / f"{width}px"
            for rel in SCREENSHOT_PAGES:
                if (root / rel).is_file():
                    screenshot(driver, base, rel, saved_at)
        driver.set_window_size(1440, 1000)
        calc_lines, calc_problems = check_calculator(driver, base, root, make_driver)
        failures.extend(f"calculator.html: {problem}" for problem in calc_problems)
        # what the live parts logged or fetched while they ran (the worker's requests included)
        severe, external = drain_logs(driver, base)
        failures.extend(f"live parts: console error {m}" for m in severe)
        failures.extend(f"live parts: request off this machine {u}" for u in external)
        hits, search_problems = check_search(driver, base)
        failures.extend(f"search.html: {problem}" for problem in search_problems)
        saved = [
            screenshot(driver, base, rel, shots)
            for rel in SCREENSHOT_PAGES
            if (root / rel).is_file()
        ]
    finally:
        driver.quit()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)

    with_math = [r for r in reports if r.math_elements]
    with_images = [r for r in reports if r.images]
    print(f"browser check of {root} ({time.monotonic() - started:.1f} s)")
    print(f"  pages visited:     {len(reports)}")
    print(
        f"  math:              {sum(r.math_elements for r in reports)} mjx-container elements "
        f"on {len(with_math)} pages, {sum(r.math_errors for r in reports)} TeX errors"
    )
    for r in with_math:
        print(f"                     {r.math_elements:5d}  {r.path}")
    print(
        f"  images:            {sum(r.images for r in reports)} on {len(with_images)} pages, "
        f"{sum(len(r.broken_images) for r in reports)} not loaded"
    )
    print(f"  search {SEARCH_TERM!r}:      {hits} results")
    print(f"  console errors:    {sum(len(r.console_errors) for r in reports)}")
    print(f"  external requests: {sum(len(r.external_requests) for r in reports)}")
    print(f"  layout checked at: {', '.join(f'{w} px' for w in WIDTHS)}")
    print(
        f"  tab crashes:       {len(crashes)} (retried once each){': ' if crashes else ''}"
        f"{', '.join(crashes)}"
    )
    for line in calc_lines:
        print(f"  {line}")
    for path in saved:
        print(f"  screenshot:        {path}")
    if failures:
        print(f"FAILED: {len(failures)} problem(s)")
        for failure in failures:
            print(f"  - {failure}")
        return 1
    print("browser check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
