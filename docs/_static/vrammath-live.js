/* window.vrammath: the library itself, in a Web Worker (vrammath-worker.mjs), on every page.
 *
 * The worker starts on first use (the calculator starts it at once; a "run in the browser"
 * button on a code cell starts it on click). Every answer is the CLI's own:
 *   vrammath.estimate(setup) / fit / serve / hf / vllm / sglang (setup) -> Promise of the JSON that
 *     `vrammath <command> ... --json` prints, or {error, rc} with the CLI's error line;
 *     setup = the `setup` object of that JSON (any subset) plus `model`.
 *   vrammath.run(argv) -> Promise of {rc, stdout, stderr} of `vrammath argv...`.
 *   vrammath.call(command, setup) -> Promise of {argv, rc, json, stdout, stderr, error}.
 * Opened from file://, browsers refuse module workers and WebAssembly: `ready` rejects with a
 * one-line message saying how to serve the site.
 */
(function () {
  "use strict";
  const STATIC = new URL(".", document.currentScript.src);
  const FILE_MESSAGE = "The live parts need the site served over HTTP (browsers refuse WebAssembly " +
    "from file://): python -m http.server -d docs/_build/html, then open http://localhost:8000/";
  let worker = null;
  let seq = 0;
  const pending = new Map();
  const listeners = [];
  let resolveReady;
  let rejectReady;
  const ready = new Promise((resolve, reject) => { resolveReady = resolve; rejectReady = reject; });
  ready.catch(() => {});  // a page that never starts the worker has nothing to report

  function start() {
    if (worker !== null) return ready;
    if (location.protocol === "file:") {
      worker = false;
      rejectReady(new Error(FILE_MESSAGE));
      return ready;
    }
    vm.startedAt = performance.now();
    worker = new Worker(new URL("vrammath-worker.mjs", STATIC), { type: "module" });
    worker.onmessage = (event) => {
      const m = event.data;
      if (m.progress) {
        vm.progress = m.progress;
        listeners.forEach((f) => f(m.progress));
      } else if (m.ready) {
        vm.timings = m.ready;
        vm.liveAt = performance.now();
        resolveReady(m.ready);
      } else if (m.failed) {
        rejectReady(new Error("the browser's Python did not start: " + m.failed));
      } else {
        const p = pending.get(m.id);
        pending.delete(m.id);
        vm.lastMs = m.ms;
        if (m.error) p.reject(new Error(m.error)); else p.resolve(m.result);
      }
    };
    worker.onerror = (e) => rejectReady(new Error("the browser's Python did not start: " + (e.message || "worker error")));
    return ready;
  }
  function ask(op, args) {
    start();
    if (worker === false) return Promise.reject(new Error(FILE_MESSAGE));
    const id = ++seq;
    return new Promise((resolve, reject) => {
      pending.set(id, { resolve, reject });
      worker.postMessage({ id, op, args });
    });
  }
  async function command(name, setup) {
    const out = await ask("call", [name, setup]);
    return out.rc === 0 ? out.json : { error: out.error || out.stderr.trim(), rc: out.rc };
  }
  const vm = {
    start,
    ready,
    FILE_MESSAGE,
    onProgress: (f) => listeners.push(f),
    call: (name, setup) => ask("call", [name, setup]),
    run: (argv) => ask("run", [argv]),
    tex: (argv) => ask("tex", [argv]),  // LaTeX of each component of an estimate command line
    cell: (scope, code) => ask("cell", [scope, code]),
    estimate: (setup) => command("estimate", setup),
    fit: (setup) => command("fit", setup),
    serve: (setup) => command("serve", setup),
    hf: (setup) => command("hf", setup),  // serve --engine hf
    vllm: (setup) => command("vllm", setup),  // serve --engine vllm
    sglang: (setup) => command("sglang", setup),  // serve --engine sglang
  };
  window.vrammath = vm;
  // a page that needs Python at once says so in its head (the calculator): start while it loads
  if (document.querySelector('meta[name="vrammath-live"][content="start"]')) start();

  // --- runnable cells: every code cell of a page can be edited and run here -------------------
  const el = (tag, attrs, ...kids) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    kids.forEach((kid) => node.append(kid));
    return node;
  };
  vm.el = el;  // the calculator builds its page with it too
  function cellSource(cell) {
    const pre = cell.querySelector(".cell_input pre");
    return pre ? pre.textContent : "";
  }
  /** Every code cell of a MyST-NB page's source, in order (hidden ones too). */
  function parseCells(text) {
    const cells = [];
    const lines = text.split("\n");
    for (let i = 0; i < lines.length; i++) {
      if (!/^```\{code-cell\}/.test(lines[i])) continue;
      i++;
      if (lines[i] === "---") {  // a YAML block of options
        i++;
        while (i < lines.length && lines[i] !== "---") i++;
        i++;
      } else {
        while (i < lines.length && /^:[\w-]+:/.test(lines[i])) i++;
      }
      const body = [];
      while (i < lines.length && !/^```\s*$/.test(lines[i])) body.push(lines[i++]);
      cells.push(body.join("\n").trim());
    }
    return cells;
  }
  let sources = null;
  /** The page's cells from its source (_sources/PAGE.md, shipped with the site). */
  function pageCells() {
    if (sources === null) {
      const root = document.documentElement.dataset.content_root || "";
      // documentation_options.js declares it with const: a global name, not a window property
      const page = typeof DOCUMENTATION_OPTIONS !== "undefined" ? DOCUMENTATION_OPTIONS.pagename : "";
      sources = fetch(`${root}_sources/${page}.md`).then((r) => {
        if (!r.ok) throw new Error(`this page's source is not in the site (${r.status})`);
        return r.text();
      }).then(parseCells);
    }
    return sources;
  }
  vm.pageCells = pageCells;
  let ranUpTo = 0;  // the page's cells before this one have run in the page's namespace
  async function runBefore(index, scope) {
    const cells = await pageCells();
    for (; ranUpTo < index; ranUpTo++) {
      const got = await vm.cell(scope, cells[ranUpTo]);
      if (got.error) throw new Error(`an earlier cell of this page failed: ${got.error}`);
    }
  }
  /** A "run in the browser" button after ``anchor``: it opens ``source()`` for editing, and
   * ``run(code)`` (a promise of the worker's cell result) runs it. */
  function runControl(anchor, source, run) {
    const button = el("button", { type: "button", class: "vm-run-button", text: "run in the browser" });
    const box = el("div", { class: "vm-run", hidden: "" });
    anchor.after(el("div", { class: "vm-run-bar" }, button), box);
    button.addEventListener("click", () => {
      if (!box.hidden) { box.hidden = true; return; }
      box.hidden = false;
      if (box.childElementCount) return;
      const editor = el("textarea", { class: "vm-run-code", spellcheck: "false", rows: "8" });
      editor.value = source();
      const go = el("button", { type: "button", class: "vm-run-go", text: "run" });
      const status = el("div", { class: "vm-run-status" });
      const output = el("pre", { class: "vm-run-output" });
      box.append(editor, go, status, output);
      vm.onProgress((p) => { if (status.dataset.waiting) status.textContent = p + " ..."; });
      go.addEventListener("click", async () => {
        output.textContent = "";
        status.className = "vm-run-status";
        status.dataset.waiting = "1";
        status.textContent = vm.progress ? vm.progress + " ..." : "starting Python ...";
        try {
          const got = await run(editor.value);
          status.textContent = got.error ? "error: " + got.error : "done";
          status.className = "vm-run-status " + (got.error ? "vm-bad" : "vm-ok");
          output.textContent = [got.output, got.value].filter(Boolean).join("\n");
        } catch (err) {
          status.className = "vm-run-status vm-bad";
          status.textContent = err.message;
        } finally {
          delete status.dataset.waiting;
        }
      });
    });
  }
  function addRunControls() {
    if (document.getElementById("vm-calc")) return;  // the calculator is live already
    const cells = Array.from(document.querySelectorAll("div.cell")).filter((c) => c.querySelector(".cell_input pre"));
    const scope = location.pathname;
    cells.forEach((cell) => runControl(cell.querySelector(".cell_input"), () => cellSource(cell), async (code) => {
      const all = await pageCells();
      const index = all.indexOf(cellSource(cell).trim());
      if (index < 0) throw new Error("this cell is not in the page's source");
      await runBefore(index, scope);
      const got = await vm.cell(scope, code);
      ranUpTo = Math.max(ranUpTo, index + 1);
      return got;
    }));
  }
  // --- the API pages' doctest examples, runnable the same way ---------------------------------
  /** A doctest block's examples: [code, expected output] per ">>> " prompt. */
  function examplesOf(block) {
    const examples = [];
    for (const line of block.textContent.split("\n")) {
      if (line.startsWith(">>> ")) examples.push([line.slice(4), []]);
      else if (line.startsWith("... ") || line === "...") examples[examples.length - 1][0] += "\n" + line.slice(4);
      else if (examples.length) examples[examples.length - 1][1].push(line);
    }
    return examples.map(([code, out]) => [code, out.join("\n").trim()]);
  }
  const apiPage = () => {
    const page = typeof DOCUMENTATION_OPTIONS !== "undefined" ? DOCUMENTATION_OPTIONS.pagename : "";
    const m = /^reference\/api\/([\w.]+)$/.exec(page);
    return m ? "vrammath." + m[1] : null;
  };
  const DOCTEST_SCOPE = location.pathname + "#doctest";
  let preluded = null;
  /** The documented module's namespace, as the doctests have it (docs/reference/api/*.md). */
  async function prelude() {
    if (preluded === null) {
      preluded = vm.cell(DOCTEST_SCOPE, `import importlib\nglobals().update(vars(importlib.import_module(${JSON.stringify(apiPage())})))`);
    }
    const pre = await preluded;
    if (pre.error) throw new Error(pre.error);
  }
  /** Run a doctest block's examples in the documented module's namespace, as the doctests run. */
  async function runExamples(examples) {
    const scope = DOCTEST_SCOPE;
    await prelude();
    const shown = [];
    for (const [code, expected] of examples) {
      const got = await vm.cell(scope, code);
      const text = [got.output.trim(), got.value].filter(Boolean).join("\n");
      shown.push({ code, expected, got: got.error ? got.output.trim() || got.error : text, error: got.error });
      if (got.error && !expected.startsWith("Traceback")) break;  // a refusal may be the point
    }
    return shown;
  }
  vm.examplesOf = (index) => examplesOf(document.querySelectorAll("div.doctest")[index]);
  vm.runExamples = runExamples;
  function addDoctestControls() {
    if (!apiPage()) return;
    document.querySelectorAll("div.doctest").forEach((block) => runControl(block,
      () => examplesOf(block).map(([code]) => code).join("\n"),
      async (code) => { await prelude(); return vm.cell(DOCTEST_SCOPE, code); }));
  }
  function addControls() { addRunControls(); addDoctestControls(); }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", addControls);
  else addControls();
})();
