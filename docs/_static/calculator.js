/* The handbook's calculator: vrammath's compiled expressions, evaluated exactly.
 *
 * window.VRAMMATH_DATA (calculator-data.js, written by tools/calculator_build.py) holds every
 * memory expression, printed from sympy to calls on the exact rationals `Z` below, and the term
 * table's columns. This file holds no memory logic: it picks the compiled variant a setup's
 * choices select, evaluates it exactly (BigInt rationals, rounded up as the library rounds), sums
 * rows by the group column, and evaluates the compiled phase peaks of those sums.
 *
 * window.vrammath.estimate(setup) -> {components: {key: bytes}, phases: {...}, totals: {...},
 * gpu: {...}} or {error: "field: message"}; bytes are decimal strings (exact past 2**53).
 */
(function () {
  "use strict";
  const D = window.VRAMMATH_DATA;

  // --- exact rationals: arithmetic only --------------------------------------------------------
  function gcd(a, b) {
    if (a < 0n) a = -a;
    if (b < 0n) b = -b;
    while (b) [a, b] = [b, a % b];
    return a;
  }
  function R(n, d) {
    if (d < 0n) { n = -n; d = -d; }
    const g = gcd(n, d) || 1n;
    return { n: n / g, d: d / g };
  }
  const ONE = R(1n, 1n);
  function cmp(x, y) {
    const c = x.n * y.d - y.n * x.d;
    return c > 0n ? 1 : c < 0n ? -1 : 0;
  }
  function ceilInt(x) {  // BigInt division truncates toward zero
    const q = x.n / x.d;
    return x.n % x.d !== 0n && x.n > 0n ? q + 1n : q;
  }
  function floorInt(x) {
    const q = x.n / x.d;
    return x.n % x.d !== 0n && x.n < 0n ? q - 1n : q;
  }
  const Z = {
    q: (p, q) => R(BigInt(p), BigInt(q === undefined ? 1 : q)),
    add: (...xs) => xs.reduce((a, b) => R(a.n * b.d + b.n * a.d, a.d * b.d)),
    mul: (...xs) => xs.reduce((a, b) => R(a.n * b.n, a.d * b.d)),
    pow: (x, k) => {
      let out = ONE;
      for (let i = 0; i < Math.abs(k); i++) out = Z.mul(out, x);
      return k < 0 ? R(out.d, out.n) : out;
    },
    ceil: (x) => R(ceilInt(x), 1n),
    floor: (x) => R(floorInt(x), 1n),
    max: (...xs) => xs.reduce((a, b) => (cmp(a, b) >= 0 ? a : b)),
    min: (...xs) => xs.reduce((a, b) => (cmp(a, b) <= 0 ? a : b)),
    delta: (x, y) => (cmp(x, y) === 0 ? ONE : R(0n, 1n)),
    ge: (x, y) => cmp(x, y) >= 0,
    gt: (x, y) => cmp(x, y) > 0,
    le: (x, y) => cmp(x, y) <= 0,
    lt: (x, y) => cmp(x, y) < 0,
    eq: (x, y) => cmp(x, y) === 0,
    ne: (x, y) => cmp(x, y) !== 0,
    pw: (...pairs) => {  // sympy's Piecewise: the first pair whose condition holds
      for (const [cond, value] of pairs) if (cond) return value;
      throw new Error("Piecewise: no condition holds");
    },
  };
  const F = D.funcs(Z);
  const num = (x) => R(BigInt(x), 1n);

  // --- validation: the CLI's messages ----------------------------------------------------------
  const FIELDS = Object.fromEntries((D.fields || []).map((f) => [f.name, f]));
  const label = (f) => (f.flag || f.name).replace(/^--/, "");
  function shown(text) {  // Python's repr of a short string
    text = String(text);
    if (text.length > 40) text = text.slice(0, 37) + "...";
    return text.includes("'") && !text.includes('"') ? `"${text}"` : `'${text.replace(/'/g, "\\'")}'`;
  }
  /** The integer a form's text holds, or the CLI's message for it. */
  function parseInteger(name, text) {
    const f = FIELDS[name];
    const digits = String(text).trim();
    const msg = `${label(f)}: must be an integer from ${f.low} to ${f.high} (got ${shown(text)})`;
    if (!(digits.length > 0 && digits.length <= 24) || !/^[+-]?\d+$/.test(digits)) return { error: msg };
    const value = BigInt(digits);
    if ((f.low !== null && value < BigInt(f.low)) || (f.high !== null && value > BigInt(f.high))) {
      return { error: msg };
    }
    return { value: Number(value) };
  }
  function targetKey(targets) {
    const joined = Array.isArray(targets) ? targets.join(",") : String(targets);
    return D.targetSets[joined];
  }
  function featureValue(setup, name) {
    if (name === "tp>1") return setup.tp > 1;
    if (name === "pp>1") return setup.pp > 1;
    if (name === "lora") return setup.lora_rank !== null && setup.lora_rank !== undefined;
    if (name === "lora_targets") return targetKey(setup.lora_targets);
    const value = setup[name];
    return value === undefined ? null : value;
  }
  /** The position of the setup's feature values in a row's dense table (itertools order). */
  function indexOf(setup, feats) {
    let index = 0;
    for (const f of feats) {
      const values = D.features[f].map((x) => JSON.stringify(x));
      const i = values.indexOf(JSON.stringify(featureValue(setup, f)));
      if (i < 0) return -1;
      index = index * values.length + i;
    }
    return index;
  }
  /** A table's entry: null (absent), {err}, or the indices it names; undefined if not there. */
  function entryOf(table, setup, feats) {
    const i = indexOf(setup, feats);
    if (i < 0 || i >= table.length) return undefined;
    const k = table[i];
    if (k === 0) return null;
    return k < 0 ? { err: D.messages[-k - 1] } : D.entries[k - 1];
  }
  function withDefaults(setup) {
    const out = Object.assign({}, D.defaults, setup);
    if (out.lora_targets === undefined || out.lora_targets === null) out.lora_targets = D.defaults.lora_targets;
    return out;
  }

  /** "field: message" where the library refuses ``setup`` (or the calculator does), else null. */
  function validate(setup) {
    const pre = D.presets[setup.model];
    if (!pre) return `model: must be one of ${Object.keys(D.presets).join(", ")} (got ${shown(setup.model)})`;
    for (const f of D.fields) {
      const value = setup[f.name];
      if (f.kind === "zero" && ![0, 1, 2, 3].includes(value)) return D.zeroMsg.replace("'@@'", shown(value));
      if (f.choices.length && f.kind !== "zero" && value !== null && !f.choices.includes(value)) {
        return `${label(f)}: must be one of ${f.choices.join(", ")} (got ${shown(value)})`;
      }
      if (f.low !== null && value !== null && value !== undefined && f.kind !== "zero") {
        const got = parseInteger(f.name, value);
        if (got.error) return got.error;
      }
    }
    if (setup.gpu !== null && setup.gpu !== undefined && !(setup.gpu in D.gpus)) {
      return `gpu: must be one of ${Object.keys(D.gpus).join(", ")} (got ${shown(setup.gpu)})`;
    }
    if (targetKey(setup.lora_targets) === undefined) {
      return `lora_targets: the calculator offers ${D.targets.join("; ")} (others: the CLI)`;
    }
    const feats = Object.keys(D.features);
    const pairs = D.invalid[pre.cls];
    for (let i = 0; i < feats.length; i++) {
      const ki = feats[i] + "=" + JSON.stringify(featureValue(setup, feats[i]));
      if (pairs[ki]) return pairs[ki];
      for (let j = i + 1; j < feats.length; j++) {
        const kj = feats[j] + "=" + JSON.stringify(featureValue(setup, feats[j]));
        const msg = pairs[ki + "&" + kj];
        if (msg) return msg;
      }
    }
    // the numbers the library checks against the model (its messages, the value filled in)
    const fill = (tpl, got) => tpl.replace("{got}", String(got));
    if (setup.tp > 1 && !pre.tps.includes(setup.tp)) {
      return setup.tp in pre.tpErr ? pre.tpErr[setup.tp] : fill(pre.msg.tpBig, setup.tp);
    }
    if (setup.pp > pre.layers) return fill(pre.msg.ppBig, setup.pp);
    if (setup.schedule === "interleaved") {
      if (setup.chunks === 1) return pre.msg.chunksOne;
      if (setup.pp * setup.chunks > pre.layers) return fill(pre.msg.chunksBig, setup.chunks);
    } else if (setup.chunks !== 1) {
      return fill(pre.msg.chunksUnused, setup.chunks);
    }
    return null;
  }

  // --- the estimate: compiled rows, summed by their group column, compiled phases ----------------
  function rowsOf(setup) {
    const out = [];
    for (const row of D.rows) {
      const table = D.variants[row.key][D.rowClass[row.key][setup.model]];
      const entry = entryOf(table, setup, row.relevant);
      if (entry === undefined) {
        return { error: `${row.relevant.join("/")}: this combination is not compiled into the calculator (use the CLI)` };
      }
      if (entry !== null && entry.err) return { error: entry.err };
      out.push({ row, entry });
    }
    return { rows: out };
  }

  function values(setup) {
    const pre = D.presets[setup.model];
    const v = {};
    for (const [k, x] of Object.entries(pre.values)) v[k] = num(x);
    const runs = pre.rankP[setup.tp];  // per pp = 1, 2, ...: [value, repeats, ...]
    for (let i = 0, pp = 0; i < runs.length; i += 2) {
      pp += runs[i + 1];
      if (setup.pp <= pp) { v.P = num(runs[i]); break; }
    }
    for (const [sym, field] of Object.entries(D.runSymbols)) {
      if (setup[field] !== null && setup[field] !== undefined) v[sym] = num(setup[field]);
    }
    return v;
  }

  function estimate(input) {
    const setup = withDefaults(input);
    const error = validate(setup);
    if (error) return { error };
    const built = rowsOf(setup);
    if (built.error) return built;
    const pre = D.presets[setup.model];
    const v = values(setup);
    const exact = {};
    const components = {};
    const detail = [];
    for (const { row, entry } of built.rows) {
      if (entry === null) continue;
      const x = F[entry[0]](v);
      exact[row.key] = x;
      if (row.listed) {
        const bytes = ceilInt(x);
        components[row.key] = bytes.toString();
        detail.push({ key: row.key, label: D.labels[entry[1]], tex: D.tex[entry[2]], device: row.device,
                      group: row.group, live: row.live, bytes });
      }
    }
    // the group totals (W, O, G, A, T, F, R), each the sum of its rows on the GPU
    const g = Object.assign({}, v);
    D.groupSums.forEach(([sym, group, backwardOnly]) => {
      let total = R(0n, 1n);
      for (const { row } of built.rows) {
        if (row.key in exact && row.device === "gpu" && row.group === group &&
            (row.live === "backward") === backwardOnly) total = Z.add(total, exact[row.key]);
      }
      g[sym] = total;
    });
    const phaseEntry = entryOf(D.variants["@phases"][D.rowClass["@phases"][setup.model]], setup, D.phaseFeatures);
    if (phaseEntry === undefined) return { error: `${D.phaseFeatures.join("/")}: this combination is not compiled into the calculator (use the CLI)` };
    if (phaseEntry.err) return { error: phaseEntry.err };
    const phaseExact = phaseEntry.map((i) => F[i](g));
    const phases = {};
    let peak = null;
    let peakValue = null;
    D.phases.forEach((name, i) => {
      phases[name] = ceilInt(phaseExact[i]).toString();
      if (peakValue === null || cmp(phaseExact[i], peakValue) > 0) { peak = name; peakValue = phaseExact[i]; }
    });
    const gpuBytes = ceilInt(Z.max(...phaseExact));
    const sum = (pred) => detail.filter(pred).reduce((a, c) => a + c.bytes, 0n);
    const totals = {
      gpu_bytes: gpuBytes.toString(),
      cpu_bytes: sum((c) => c.device === "cpu").toString(),
      model_state_bytes: sum((c) => c.device === "gpu" && D.stateGroups.includes(c.group)).toString(),
      peak_phase: peak,
    };
    let gpu = null;
    if (setup.gpu) {
      const cap = BigInt(D.gpus[setup.gpu]);
      gpu = { name: setup.gpu, bytes: cap.toString(), fits: gpuBytes <= cap };
    }
    return { model: setup.model, params: String(pre.params), components, phases, totals, gpu,
             detail, phaseGroups: g };
  }

  /** The CLI line for ``setup``: every field that differs from its default. */
  function cliCommand(input) {
    const setup = withDefaults(input);
    const parts = ["vrammath", "estimate", setup.model];
    for (const f of D.fields) {
      if (!f.flag) continue;
      const value = setup[f.name];
      const dflt = D.defaults[f.name];
      if (JSON.stringify(value) === JSON.stringify(dflt) || value === null || value === undefined) continue;
      if (f.kind === "switch") { if (value) parts.push(f.flag); continue; }
      parts.push(f.flag, Array.isArray(value) ? value.join(",") : String(value));
    }
    return parts.join(" ");
  }

  window.vrammath = { estimate, validate: (s) => validate(withDefaults(s)), cliCommand, parseInteger,
                      data: D, Z, funcs: F };
})();

/* The form: built from the declared fields (vrammath.fields metadata, shipped as data). */
(function () {
  "use strict";
  if (typeof document === "undefined") return;  // node: the engine alone (tests)
  const root = document.getElementById("vm-calc");
  if (!root || !window.vrammath) return;
  const t0 = performance.now();
  const vm = window.vrammath;
  const D = vm.data;
  const el = (tag, attrs, ...kids) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    kids.forEach((kid) => node.append(kid));
    return node;
  };
  const fmt = (bytes, unit) => {
    const div = unit === "GB" ? 1e9 : 2 ** 30;
    return (Number(bytes) / div).toFixed(2) + " " + unit;
  };
  const FORM_ORDER = ["model", "gpu", "recipe", "optimizer", "implementation", "zero", "gpus",
    "offload_optimizer", "offload_params", "micro_batch", "seq_len", "attention", "recompute",
    "tp", "sp", "pp", "schedule", "chunks", "lora_rank", "lora_targets", "quant", "lora_dropout",
    "activation_model", "iteration", "device"];
  const fields = Object.fromEntries(D.fields.map((f) => [f.name, f]));
  const inputs = {};
  const errors = {};
  const form = el("form", { class: "vm-form", id: "vm-form" });
  function control(name) {
    const f = fields[name];
    let input;
    const dflt = D.defaults[name];
    if (name === "model") {
      input = el("select", { name });
      Object.keys(D.presets).forEach((m) => input.append(el("option", { value: m, text: m })));
      input.value = "llama-7b" in D.presets ? "llama-7b" : Object.keys(D.presets)[0];
    } else if (f.kind === "switch") {
      input = el("input", { type: "checkbox", name });
      input.checked = !!dflt;
    } else if (name === "gpu" || name === "quant" || f.choices.length || f.kind === "zero" || f.kind === "targets") {
      const opts = name === "gpu" ? ["", ...Object.keys(D.gpus)]
        : name === "quant" ? ["", ...f.choices]
        : f.kind === "zero" ? ["0", "1", "2", "3"]
        : f.kind === "targets" ? D.targets : f.choices;
      input = el("select", { name });
      opts.forEach((o) => input.append(el("option", { value: o, text: o === "" ? "none" : o })));
      input.value = f.kind === "targets" ? "q,v" : dflt === null ? "" : String(dflt);
    } else {
      input = el("input", { type: "text", inputmode: "numeric", name, size: "8" });
      input.value = dflt === null ? "" : String(dflt);
      if (name === "lora_rank") input.placeholder = "none";
    }
    input.id = "vm-in-" + name;
    inputs[name] = input;
    errors[name] = el("span", { class: "vm-field-error", id: "vm-err-" + name });
    const title = name === "model" ? "preset model" : (f.flag || name);
    const lab = el("label", { for: input.id, title: f ? f.help : "model preset", text: title });
    return el("div", { class: "vm-field" }, lab, input, errors[name]);
  }
  FORM_ORDER.forEach((name) => form.append(control(name)));
  const cli = el("code", { id: "vm-cli" });
  const copy = el("button", { type: "button", id: "vm-copy", text: "copy as CLI command" });
  const status = el("div", { id: "vm-status", class: "vm-status" });
  const verdict = el("div", { id: "vm-verdict", class: "vm-verdict" });
  const table = el("table", { id: "vm-components", class: "vm-table" });
  const phases = el("div", { id: "vm-phases" });
  root.append(form, el("div", { class: "vm-cli" }, copy, " ", cli), status, verdict,
              el("h3", { text: "Components (per GPU, and host for offload)" }), table,
              el("h3", { text: "Phase peaks: what is live in each phase" }), phases);

  /** The setup the form holds, or {errors: {field: message}}. */
  function readForm() {
    const setup = {};
    const errs = {};
    for (const name of FORM_ORDER) {
      const input = inputs[name];
      const f = fields[name];
      if (name === "model") { setup.model = input.value; continue; }
      if (f.kind === "switch") { setup[name] = input.checked; continue; }
      if (f.kind === "zero") { setup[name] = Number(input.value); continue; }
      if (f.kind === "targets") { setup[name] = input.value.split(","); continue; }
      if (input.tagName === "SELECT") { setup[name] = input.value === "" ? null : input.value; continue; }
      if (name === "lora_rank" && input.value.trim() === "") { setup[name] = null; continue; }
      const got = vm.parseInteger(name, input.value);
      if (got.error) errs[name] = got.error; else setup[name] = got.value;
    }
    if (setup.lora_targets && setup.lora_targets.join(",") === "all-linear") {
      setup.lora_targets = Object.keys(D.targetSets).find((k) => D.targetSets[k] === "all-linear").split(",");
    }
    return Object.keys(errs).length ? { errors: errs } : { setup };
  }
  function fieldOf(message) {
    const head = message.split(":")[0];
    return D.fields.find((f) => f.name === head || (f.flag || "").replace(/^--/, "") === head);
  }
  function clear() {
    table.replaceChildren();
    phases.replaceChildren();
    verdict.textContent = "";
    Object.values(errors).forEach((e) => { e.textContent = ""; });
    status.textContent = "";
  }
  function showError(message, name) {
    const f = name ? fields[name] : fieldOf(message);
    if (f && errors[f.name]) errors[f.name].textContent = message;
    status.textContent = message;
    status.className = "vm-status vm-bad";
  }
  function writeHash(setup) {
    const parts = [];
    for (const [k, v] of Object.entries(setup)) {
      const dflt = D.defaults[k];
      if (k !== "model" && JSON.stringify(v) === JSON.stringify(dflt)) continue;
      parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(Array.isArray(v) ? v.join(",") : v === null ? "" : v));
    }
    history.replaceState(null, "", "#" + parts.join("&"));
  }
  function readHash() {
    const text = location.hash.replace(/^#/, "");
    if (!text) return;
    for (const part of text.split("&")) {
      const [k, raw] = part.split("=").map(decodeURIComponent);
      const input = inputs[k];
      if (!input) continue;
      if (input.type === "checkbox") input.checked = raw === "true";
      else if (k === "lora_targets") input.value = D.targetSets[raw] || raw;
      else input.value = raw;
    }
  }
  function render() {
    clear();
    const got = readForm();
    if (got.errors) {
      for (const [name, msg] of Object.entries(got.errors)) showError(msg, name);
      return null;
    }
    const setup = got.setup;
    cli.textContent = vm.cliCommand(setup);
    writeHash(setup);
    const est = vm.estimate(setup);
    if (est.error) { showError(est.error); return null; }
    status.className = "vm-status vm-ok";
    status.textContent = `peak per GPU: ${fmt(est.totals.gpu_bytes, "GB")} / ${fmt(est.totals.gpu_bytes, "GiB")} (${est.totals.peak_phase})`;
    if (est.gpu) {
      const free = BigInt(est.gpu.bytes) - BigInt(est.totals.gpu_bytes);
      const abs = free < 0n ? -free : free;
      verdict.textContent = `${est.gpu.name} (${fmt(est.gpu.bytes, "GB")} / ${fmt(est.gpu.bytes, "GiB")}): ` +
        (est.gpu.fits ? "fits, headroom " : "does NOT fit, short by ") + `${fmt(abs, "GB")} / ${fmt(abs, "GiB")}`;
      verdict.className = "vm-verdict " + (est.gpu.fits ? "vm-ok" : "vm-bad");
    }
    table.append(el("tr", {}, ...["component", "device", "GB (1e9 B)", "GiB (2^30 B)", "formula"].map((h) => el("th", { text: h }))));
    for (const c of est.detail) {
      table.append(el("tr", { "data-key": c.key },
        el("td", { text: c.label }), el("td", { text: c.device }),
        el("td", { class: "vm-num", text: fmt(c.bytes, "GB") }), el("td", { class: "vm-num", text: fmt(c.bytes, "GiB") }),
        el("td", { class: "vm-tex", text: "\\(" + c.tex + "\\)" })));
    }
    if (est.totals.cpu_bytes !== "0") {
      table.append(el("tr", {}, el("td", { text: "total CPU per rank" }), el("td", { text: "cpu" }),
        el("td", { class: "vm-num", text: fmt(est.totals.cpu_bytes, "GB") }),
        el("td", { class: "vm-num", text: fmt(est.totals.cpu_bytes, "GiB") }), el("td")));
    }
    // bars: each phase's peak, beside the group totals live in the iteration
    const top = Math.max(...Object.values(est.phases).map(Number), est.gpu ? Number(est.gpu.bytes) : 0, 1);
    const names = Object.fromEntries(D.groupSums.map(([sym]) => [sym, sym.replace(/^G_/, "").replace(/_/g, " ")]));
    for (const [name, bytes] of Object.entries(est.phases)) {
      const bar = el("div", { class: "vm-bar" + (name === est.totals.peak_phase ? " vm-peak" : "") });
      bar.style.width = (100 * Number(bytes) / top).toFixed(2) + "%";
      phases.append(el("div", { class: "vm-phase", "data-phase": name },
        el("span", { class: "vm-phase-name", text: name }), el("div", { class: "vm-track" }, bar),
        el("span", { class: "vm-num", text: `${fmt(bytes, "GB")} / ${fmt(bytes, "GiB")}` })));
    }
    const groups = el("div", { class: "vm-groups" }, el("span", { class: "vm-phase-name", text: "group totals" }));
    const track = el("div", { class: "vm-track" });
    D.groupSums.forEach(([sym], i) => {
      const g = est.phaseGroups[sym];
      const x = Number(g.n) / Number(g.d);
      if (x <= 0) return;
      const seg = el("div", { class: "vm-seg vm-seg-" + i, title: `${names[sym]}: ${fmt(Math.ceil(x), "GB")}` });
      seg.style.width = (100 * x / top).toFixed(2) + "%";
      track.append(seg);
    });
    groups.append(track, el("span", { class: "vm-legend", text: Object.values(names).join(" · ") }));
    phases.append(groups);
    typeset(table);
    return est;
  }
  // MathJax loads after this script: typeset the formulas once it has started
  function typeset(node) {
    const mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) {
      mj.startup.promise.then(() => mj.typesetPromise([node])).catch(() => {});
    } else {
      setTimeout(() => { if (document.contains(node)) typeset(node); }, 200);
    }
  }
  form.addEventListener("input", render);
  form.addEventListener("change", render);
  copy.addEventListener("click", () => {
    const text = cli.textContent;
    if (navigator.clipboard) navigator.clipboard.writeText(text).catch(() => {});
    copy.textContent = "copied";
    setTimeout(() => { copy.textContent = "copy as CLI command"; }, 1500);
  });
  readHash();
  render();
  window.vrammath.render = render;
  window.vrammath.firstRenderMs = performance.now() - t0;
  window.vrammath.firstRenderAt = performance.now();  // since navigation start
})();
