// Precompile the browser's Python packages with the browser's own Python (docs/conf.py runs this
// when node is present): Pyodide, in node, unpacks the staged wheels, compiles every module to
// bytecode beside its source (legacy layout, so the bytecode is the module) and writes a zip of
// the bytecode and the package data, without the sources (nor the packages' test suites). Importing sympy from bytecode takes a
// fraction of compiling it from source at every page load.
//
// It then boots a fresh Pyodide from that zip as the page's worker would, imports sympy and
// vrammath.browser, and writes a memory snapshot of it: the worker restores the snapshot instead
// of starting Python and importing (seconds of the cold start; Pyodide's `_makeSnapshot` /
// `_loadSnapshot`). The snapshot holds the heap, not the file system: the worker still unpacks
// the zip, for the package data and the modules imported later.
//
// Usage: node tools/pyodide_bundle.mjs STAGE  (STAGE holds pyodide/ and wheels/manifest.json)
import { readFileSync, writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";

const stage = resolve(process.argv[2]);
const { loadPyodide } = await import(pathToFileURL(join(stage, "pyodide", "pyodide.mjs")).href);
const manifest = JSON.parse(readFileSync(join(stage, "wheels", "manifest.json"), "utf8"));
const py = await loadPyodide({ indexURL: join(stage, "pyodide") + "/" });
for (const wheel of manifest.wheels) {
  py.unpackArchive(new Uint8Array(readFileSync(join(stage, "wheels", wheel))), "wheel");
}
const zipped = py.runPython(`
import compileall, importlib.util, io, json, os, re, warnings, zipfile
warnings.simplefilter("ignore", SyntaxWarning)  # sympy's own test-runner code, not ours
# where unpackArchive(..., "wheel") put the packages
site = os.path.dirname(os.path.dirname(importlib.util.find_spec("vrammath").origin))
# the packages' own test suites are not run in the browser: neither compiled nor shipped
SKIP = re.compile(r"/(tests|benchmarks)/")
ok = compileall.compile_dir(site, quiet=1, legacy=True, rx=SKIP)
if not ok:
    raise SystemExit("compileall failed")
buf = io.BytesIO()
with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    for root, dirs, files in os.walk(site):
        dirs[:] = sorted(d for d in dirs if d not in ("tests", "benchmarks"))
        for name in sorted(files):
            if name.endswith(".py"):
                continue  # its bytecode is beside it
            path = os.path.join(root, name)
            z.write(path, os.path.relpath(path, site))
    if "sympy/__init__.pyc" not in z.namelist():
        raise SystemExit(f"no sympy bytecode under {site}")
(site, buf.getvalue())
`);
const [site, data] = zipped.toJs();
const bytes = data;
writeFileSync(join(stage, "wheels", "site-packages.zip"), bytes);

const fresh = await loadPyodide({ indexURL: join(stage, "pyodide") + "/", fullStdLib: false, _makeSnapshot: true });
fresh.unpackArchive(bytes, "zip", { extractDir: site });
fresh.runPython(`import sys; sys.path.insert(0, ${JSON.stringify(site)}); import sympy, vrammath.browser`);
const snapshot = fresh.makeMemorySnapshot();
writeFileSync(join(stage, "wheels", "snapshot.bin"), snapshot);
// what the snapshot holds imported need not be unpacked again: a second zip without it (the
// package data and the modules imported later), which is what a restored worker unpacks
const loaded = fresh.runPython(`
import json, os, sys
site = ${JSON.stringify(site)}
json.dumps(sorted(
    os.path.relpath(m.__file__, site) for m in list(sys.modules.values())
    if getattr(m, "__file__", None) and m.__file__.startswith(site + "/")
))
`);
py.globals.set("_loaded", loaded);
const rest = py.runPython(`
loaded = set(json.loads(_loaded))
if len(loaded) < 100:
    raise SystemExit(f"only {len(loaded)} modules of the bundle are in the snapshot")
out = io.BytesIO()
with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as full:  # buf: the bundle, written above
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        for info in full.infolist():
            if info.filename not in loaded:
                z.writestr(info, full.read(info.filename))
out.getvalue()
`);
const restBytes = rest.toJs();
writeFileSync(join(stage, "wheels", "site-packages-rest.zip"), restBytes);
// the manifest the worker reads: the bundle (and where it unpacks) instead of the wheels
writeFileSync(join(stage, "wheels", "manifest.json"), JSON.stringify({
  ...manifest, wheels: [], bundle: "site-packages.zip", site,
  snapshot: { heap: "snapshot.bin", bundle: "site-packages-rest.zip" },
}, null, 1));
console.log(`pyodide bundle: ${manifest.wheels.join(", ")} precompiled, ${(bytes.length / 1e6).toFixed(1)} MB; `
  + `snapshot after importing vrammath ${(snapshot.length / 1e6).toFixed(1)} MB, `
  + `${JSON.parse(loaded).length} modules in it, the rest ${(restBytes.length / 1e6).toFixed(1)} MB`);
