/* The handbook's Python, in a Web Worker so the page never waits on it: Pyodide (served from
 * _static/pyodide/), the wheels the docs build staged (_static/wheels/: sympy, mpmath, vrammath)
 * (or, where the build had node, their bytecode precompiled by tools/pyodide_bundle.mjs, in one
 * zip, and a memory snapshot of Python with them imported) and what the runnable cells read
 * (pages.zip: docs/vmdocs.py and validation/*.json, unpacked where a checkout has them).
 *
 * Messages in: {id, op, args}. op "call" [command, setup] -> vrammath.browser.call; "tex"
 * [argv] -> component_tex; "run" [argv] -> vrammath.browser.run (all through
 * vrammath.browser.rpc); "cell" [scope, code] -> the cell's output in that scope's namespace.
 * Messages out: {id, result} or {id, error}, and {progress: text, ms} while starting, then
 * {ready: {timings}}.
 */
import { loadPyodide } from "./pyodide/pyodide.mjs";

const STATIC = new URL(".", import.meta.url);
const timings = {};
let py = null;
let rpc = null;
const scopes = new Map();

function progress(text) { postMessage({ progress: text, ms: Math.round(performance.now()) }); }

/** Pyodide restored from the build's memory snapshot (sympy and vrammath.browser imported). */
async function fromSnapshot(indexURL, snapshot) {
  // Pyodide sizes the heap to the snapshot through INITIAL_MEMORY, which this build's wasm does
  // not read: grow the instance's memory to the snapshot's size before Pyodide copies it in.
  const original = { instantiate: WebAssembly.instantiate, instantiateStreaming: WebAssembly.instantiateStreaming };
  const grown = (result) => {
    const memory = (result.instance || result).exports.memory;
    const short = snapshot.length - memory.buffer.byteLength;
    if (short > 0) memory.grow(Math.ceil(short / 65536));
    return result;
  };
  WebAssembly.instantiate = async (...args) => grown(await original.instantiate(...args));
  WebAssembly.instantiateStreaming = async (...args) => grown(await original.instantiateStreaming(...args));
  try {
    return await loadPyodide({ indexURL, fullStdLib: false, _loadSnapshot: snapshot });
  } finally {
    Object.assign(WebAssembly, original);
  }
}

const ready = (async () => {
  let t = performance.now();
  progress("loading the Python runtime");
  const indexURL = new URL("pyodide/", STATIC).href;
  const manifest = await fetch(new URL("wheels/manifest.json", STATIC)).then((r) => r.json());
  const get = (name) => fetch(new URL(`wheels/${name}?v=${manifest.version}`, STATIC))
    .then((r) => { if (!r.ok) throw new Error(`${name}: HTTP ${r.status}`); return r.arrayBuffer(); });
  // what a restored heap already imported is left out of the snapshot's bundle
  const fetchAll = (bundle) => Promise.all(
    [...manifest.wheels, ...(bundle ? [bundle] : []), ...manifest.pages]
      .map((name) => get(name).then((buf) => [name, buf])));
  let wheelsPromise = null;  // the wheels (or the bundle) download while the runtime starts
  if (manifest.snapshot) {
    try {
      wheelsPromise = fetchAll(manifest.snapshot.bundle);
      py = await fromSnapshot(indexURL, new Uint8Array(await get(manifest.snapshot.heap)));
      timings.snapshot = true;
    } catch (err) {  // a snapshot this runtime cannot restore: start Python the long way
      progress(`starting without the snapshot (${err && err.message ? err.message : err})`);
      wheelsPromise.catch(() => {});  // not unpacked: its failure is no error of the page's
      py = null;
    }
  }
  if (!py) {
    wheelsPromise = fetchAll(manifest.bundle);
    py = await loadPyodide({ indexURL, fullStdLib: false });
  }
  timings.runtime_ms = Math.round(performance.now() - t);
  t = performance.now();
  progress("installing sympy and vrammath");
  const fetched = await wheelsPromise;
  const pages = fetched.filter(([name]) => manifest.pages.includes(name));
  for (const [name, buf] of fetched) {
    if (name.endsWith(".whl")) py.unpackArchive(buf, "wheel");
    else if (!manifest.pages.includes(name)) py.unpackArchive(buf, "zip", { extractDir: manifest.site });
  }
  timings.install_ms = Math.round(performance.now() - t);
  t = performance.now();
  progress("importing sympy");  // already in the snapshot's heap, when there is one
  if (manifest.site) {
    const site = JSON.stringify(manifest.site);
    py.runPython(`import sys\nif ${site} not in sys.path:\n    sys.path.insert(0, ${site})`);
  }
  py.runPython("import sympy");
  timings.sympy_ms = Math.round(performance.now() - t);
  t = performance.now();
  progress("importing vrammath");
  rpc = py.pyimport("vrammath.browser").rpc;
  timings.vrammath_ms = Math.round(performance.now() - t);
  // the cells' files, where they lie in a checkout: beside the folder that holds vrammath
  const root = py.runPython("import os, vrammath; os.path.dirname(os.path.dirname(vrammath.__file__))");
  for (const [, buf] of pages) py.unpackArchive(buf, "zip", { extractDir: root });
  for (const dir of manifest.paths || []) py.runPython(`import sys; sys.path.append(${JSON.stringify(`${root}/${dir}`)})`);
  postMessage({ ready: timings });
})();

// What the pages' cells import for display in the build (IPython's display classes, MyST-NB's
// glue): here a cell's value is shown as text, and glue records nothing.
const SHIMS = `
import sys, types
try:
    import IPython.display
except ModuleNotFoundError:
    class _Shown:
        def __init__(self, data=None, **kwargs):
            self.data = data
        def __repr__(self):
            return str(self.data)
    _display = types.ModuleType("IPython.display")
    _display.HTML = _display.SVG = _display.Markdown = _display.Math = _display.Latex = _Shown
    _display.display = print
    _ipython = types.ModuleType("IPython")
    _ipython.display = _display
    _ipython.get_ipython = lambda: None  # no notebook shell: vmdocs.use_notation does nothing
    sys.modules.update({"IPython": _ipython, "IPython.display": _display})
try:
    import myst_nb
except ModuleNotFoundError:
    _myst_nb = types.ModuleType("myst_nb")
    _myst_nb.glue = lambda name, value, display=True: None
    sys.modules["myst_nb"] = _myst_nb

import builtins
from pyodide.code import eval_code as _vm_eval_code

# Plotting packages the browser bundle lacks (no wheel of them for this runtime is published
# where the build can fetch one). A cell may import them: the names resolve, and the first use
# raises the package's ModuleNotFoundError, so only the cells that draw say what they need.
_VM_ABSENT = ("matplotlib", "numpy")


class _VmAbsent:
    """Stands for a package the bundle lacks, or any name inside it."""

    def __init__(self, root):
        self._vm_root = root

    def _vm_missing(self, *args, **kwargs):
        raise ModuleNotFoundError(f"No module named '{self._vm_root}'", name=self._vm_root)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if self._vm_root == "matplotlib" and name == "use":  # the backend: nothing draws here
            return lambda *args, **kwargs: None
        return self

    __call__ = __getitem__ = __setitem__ = __iter__ = __len__ = _vm_missing
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _vm_missing
    __truediv__ = __rtruediv__ = __pow__ = __float__ = __int__ = _vm_missing


def _vm_import(name, globals=None, locals=None, fromlist=(), level=0):
    try:
        return builtins.__import__(name, globals, locals, fromlist, level)
    except ModuleNotFoundError as err:
        root = name.partition(".")[0]
        if level or root not in _VM_ABSENT or (err.name or "").partition(".")[0] != root:
            raise
        return _VmAbsent(root)


def _vm_scope():
    """A page's namespace: the builtins, with imports of the absent packages resolving."""
    return {"__builtins__": {**vars(builtins), "__import__": _vm_import}}


def _vm_cell(code, scope):
    """Run a cell in scope; the repr of its last bare expression, as Jupyter shows it."""
    value = _vm_eval_code(code, scope)
    if value is None:
        return None
    scope["_"] = value  # the last value shown, as the interactive prompt (and doctest) keep it
    return repr(value)
`;
let shimmed = false;

/** One handbook cell in the namespace of ``scope`` (a page): its output, or its error. */
function runCell(scope, code) {
  if (!shimmed) { py.runPython(SHIMS); shimmed = true; }
  if (!scopes.has(scope)) scopes.set(scope, py.globals.get("_vm_scope")());
  const out = [];
  py.setStdout({ batched: (s) => out.push(s) });
  py.setStderr({ batched: (s) => out.push(s) });
  try {
    const shown = py.globals.get("_vm_cell")(code, scopes.get(scope));
    return { output: out.join("\n"), value: shown === undefined ? null : shown, error: null };
  } catch (err) {
    const text = String(err.message || err);
    const lines = text.trim().split("\n");
    let last = lines[lines.length - 1];
    const missing = /ModuleNotFoundError: No module named '([^'.]+)/.exec(text);
    if (missing) last = `this cell needs ${missing[1]}, which the browser bundle does not include (run it with nox -s docs or in Python)`;
    return { output: out.join("\n"), value: null, error: last, traceback: text };
  } finally {
    py.setStdout({});
    py.setStderr({});
  }
}

onmessage = async (event) => {
  const { id, op, args } = event.data;
  try {
    await ready;
    const t = performance.now();
    const result = op === "cell" ? runCell(args[0], args[1]) : JSON.parse(rpc(op, JSON.stringify(args)));
    postMessage({ id, result, ms: performance.now() - t });
  } catch (err) {
    postMessage({ id, error: String(err && err.message ? err.message : err) });
  }
};
ready.catch((err) => postMessage({ failed: String(err && err.message ? err.message : err) }));
