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
function vmEngine(D) {
  "use strict";
  // D: window.VRAMMATH_DATA (calculator-data.js, unpacked)

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
  // the compiled expressions write small integers as numbers, larger ones as decimal strings
  const N = (x) => (typeof x === "object" ? x : R(BigInt(x), 1n));
  const Z = {
    q: (p, q) => R(BigInt(p), BigInt(q === undefined ? 1 : q)),
    add: (...xs) => xs.map(N).reduce((a, b) => R(a.n * b.d + b.n * a.d, a.d * b.d)),
    mul: (...xs) => xs.map(N).reduce((a, b) => R(a.n * b.n, a.d * b.d)),
    pow: (x, k) => {
      let out = ONE;
      for (let i = 0; i < Math.abs(k); i++) out = Z.mul(out, x);
      return k < 0 ? R(out.d, out.n) : out;
    },
    ceil: (x) => R(ceilInt(N(x)), 1n),
    floor: (x) => R(floorInt(N(x)), 1n),
    max: (...xs) => xs.map(N).reduce((a, b) => (cmp(a, b) >= 0 ? a : b)),
    min: (...xs) => xs.map(N).reduce((a, b) => (cmp(a, b) <= 0 ? a : b)),
    delta: (x, y) => (cmp(N(x), N(y)) === 0 ? ONE : R(0n, 1n)),
    ge: (x, y) => cmp(N(x), N(y)) >= 0,
    gt: (x, y) => cmp(N(x), N(y)) > 0,
    le: (x, y) => cmp(N(x), N(y)) <= 0,
    lt: (x, y) => cmp(N(x), N(y)) < 0,
    eq: (x, y) => cmp(N(x), N(y)) === 0,
    ne: (x, y) => cmp(N(x), N(y)) !== 0,
    pw: (...pairs) => {  // sympy's Piecewise: the first pair whose condition holds
      for (const [cond, value] of pairs) if (cond) return N(value);
      throw new Error("Piecewise: no condition holds");
    },
  };
  const F = D.funcs(Z).map((f) => (v) => N(f(v)));
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
  function parseInteger(name, text, fields) {
    const f = (fields || FIELDS)[name];
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
    if (name === "ep>1") return setup.ep > 1;
    if (name === "lora") return setup.lora_rank !== null && setup.lora_rank !== undefined;
    if (name === "lora_targets") return targetKey(setup.lora_targets);
    const value = setup[name];
    return value === undefined ? null : value;
  }
  const FEATURE_NAMES = Object.keys(D.features || {});
  /** A decision tree's leaf for the setup: null (absent), {err}, or the indices it names;
   *  undefined where the setup's value of a feature the tree branches on is not offered. */
  function entryOf(tree, setup) {
    let node = tree;
    while (Array.isArray(node)) {  // [i]: the shared node D.nodes[i] = [feature index, children]
      const [index, kids] = D.nodes[node[0]];
      const f = FEATURE_NAMES[index];
      const i = D.features[f].map((x) => JSON.stringify(x)).indexOf(JSON.stringify(featureValue(setup, f)));
      if (i < 0) return undefined;
      node = kids[i];
    }
    if (node === 0) return null;
    return node < 0 ? { err: named(D.messages[-node - 1], setup) } : D.entries[node - 1];
  }
  /** A refusal with the preset's name where the generator wrote {model} (shared trees). */
  function named(message, setup) {
    return message.replace("{model}", setup.model);
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
    // fields only Korthikanti-style mixture-of-experts layouts read, which the calculator refuses
    for (const name of D.uncompiled) {
      if (JSON.stringify(setup[name]) !== JSON.stringify(D.defaults[name])) {
        return `${name}: the calculator keeps the default (${shown(D.defaults[name])}); it is read only by the Korthikanti-style mixture-of-experts layouts (use the CLI)`;
      }
    }
    const fill = (tpl, got) => tpl.replace("{got}", String(got));
    if (setup.ep !== 1) {  // vrammath.moe.check_ep, its messages
      if (!pre.msg.experts) return fill(pre.msg.epNone, setup.ep);
      if (pre.msg.experts % setup.ep) return fill(pre.msg.epExperts, setup.ep);
      if (setup.gpus % setup.ep) return fill(pre.msg.epGpus, setup.ep).replace("{gpus}", String(setup.gpus));
    }
    const feats = Object.keys(D.features);
    const pairs = D.invalid[pre.cls];
    for (let i = 0; i < feats.length; i++) {
      const ki = feats[i] + "=" + JSON.stringify(featureValue(setup, feats[i]));
      if (ki in pairs) return named(D.messages[pairs[ki]], setup);
      for (let j = i + 1; j < feats.length; j++) {
        const kj = feats[j] + "=" + JSON.stringify(featureValue(setup, feats[j]));
        if (ki + "&" + kj in pairs) return named(D.messages[pairs[ki + "&" + kj]], setup);
      }
    }
    // the numbers the library checks against the model (its messages, the value filled in)
    const tpMsg = tpRefusal(pre.tp, pre.heads)(setup.tp);
    if (tpMsg) return tpMsg;
    if (setup.pp > pre.layers) return fill(pre.msg.ppBig, setup.pp);
    if (setup.shard !== "flat" && setup.gpus === 1) return fill(pre.msg.shardOne, shown(setup.shard));
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
      const entry = entryOf(table, setup);
      if (entry === undefined) return { error: `${row.key}: this combination is not compiled into the calculator (use the CLI)` };
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
    v[D.dim0Symbol] = F[pre.dim0](v);  // used only by the rows _built gave the dim-0 shard
    return v;
  }

  function estimate(input) {
    const setup = withDefaults(input);
    const error = validate(setup);
    if (error) return { error };
    // estimate's own refusals first (a model it does not compose), as the library raises them
    const phaseEntry = entryOf(D.variants["@phases"][D.rowClass["@phases"][setup.model]], setup);
    if (phaseEntry === undefined) return { error: "phases: this combination is not compiled into the calculator (use the CLI)" };
    if (phaseEntry.err) return { error: phaseEntry.err };
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
    // an entry ["z", group, if 0, if not]: the phase model treats an empty group apart
    let phaseFuncs = phaseEntry;
    while (phaseFuncs[0] === "z") {
      const total = g[D.groupSums[phaseFuncs[1]][0]];
      phaseFuncs = D.entries[(total.n === 0n ? phaseFuncs[2] : phaseFuncs[3]) - 1];
    }
    const phaseExact = phaseFuncs.map((i) => F[i](g));
    const phases = {};
    let peak = null;
    let peakValue = null;
    D.phases.forEach((name, i) => {
      phases[name] = ceilInt(phaseExact[i]).toString();
      if (peakValue === null || cmp(phaseExact[i], peakValue) > 0) { peak = name; peakValue = phaseExact[i]; }
    });
    // what is live at each phase's peak: the phase's compiled expression with the group totals
    // put in one by one (the steps telescope to the phase; "other" is what no group holds)
    const phaseParts = {};
    D.phases.forEach((name, i) => {
      const cur = Object.assign({}, g);
      D.groupSums.forEach(([sym]) => { cur[sym] = R(0n, 1n); });
      let prev = F[phaseFuncs[i]](cur);
      const parts = [["other", prev]];
      for (const [sym] of D.groupSums) {
        cur[sym] = g[sym];
        const now = F[phaseFuncs[i]](cur);
        parts.push([sym, Z.add(now, Z.mul(prev, Z.q("-1")))]);
        prev = now;
      }
      phaseParts[name] = parts.map(([k, x]) => [k, Number(x.n) / Number(x.d)]);
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
    let host = null;
    if (setup.gpu) {
      const cap = BigInt(D.gpus[setup.gpu]);
      gpu = { name: setup.gpu, bytes: cap.toString(), fits: gpuBytes <= cap };
      // vrammath.budget.host_check: the offloaded bytes per rank, times the ranks a node holds
      const node = D.hosts[setup.gpu];
      const perRank = BigInt(totals.cpu_bytes);
      const ranks = BigInt(Math.min(setup.gpus * setup.tp * setup.pp, node.gpus_per_node));
      host = { per_rank_bytes: totals.cpu_bytes, ranks_per_node: Number(ranks),
               need_bytes: (perRank * ranks).toString(), node: node.node,
               limit_bytes: node.host_bytes === null ? null : String(node.host_bytes),
               fits: perRank === 0n ? true : node.host_bytes === null ? null : perRank * ranks <= BigInt(node.host_bytes) };
    }
    return { model: setup.model, params: String(pre.params), components, phases, totals, gpu, host,
             detail, phaseGroups: g, phaseParts };
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

  // --- serving: vrammath.inference.serve's compiled expressions ---------------------------------
  const S = D.serve || { presets: {}, fields: [], defaults: {} };
  const SFIELDS = Object.fromEntries(S.fields.map((f) => [f.name, f]));
  /** The values of a serving expression: the preset's sizes, and the run's numbers in the symbols
   *  kv_values fills with them (the block as ``block or 1``, as vrammath.inference.serve). */
  function serveValues(pre, setup, over) {
    const run = Object.assign({}, setup, over || {});
    const v = {};
    for (const [k, x] of Object.entries(pre.values)) v[k] = num(x);
    for (const [sym, field] of Object.entries(pre.run)) {
      const value = field === "kv_dtype" ? S.kvBytes[run.kv_dtype] : field === "block" ? run.block || 1 : run[field];
      v[sym] = num(value);
    }
    return v;
  }
  /** The library's message for a refused tensor-parallel size, else null. */
  function tpRefusal(tp, heads) {
    const fill = (i) => tp.templates[i];
    return (size) => {
      const i = size > heads ? tp.big : tp.refused[size];
      return i === undefined ? null : fill(i).replace("{got}", String(size));
    };
  }
  /** The CLI's message for a fraction in (0, 1] (vrammath.cli's number parser). */
  function parseFraction(name, text) {
    const f = SFIELDS[name] || { name };
    const value = String(text).length <= 40 && /^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/.test(String(text)) ? Number(text) : NaN;
    if (!(value > 0 && value <= 1)) return { error: `${label(f)}: must be a number in (0, 1] (got ${shown(text)})` };
    return { value };
  }
  function validateServe(setup) {
    const pre = S.presets[setup.model];
    if (!pre) return `model: must be one of ${Object.keys(S.presets).join(", ")} (got ${shown(setup.model)})`;
    for (const f of S.fields) {
      const value = setup[f.name];
      if (f.choices.length && !f.choices.includes(value)) {
        return `${label(f)}: must be one of ${f.choices.join(", ")} (got ${shown(value)})`;
      }
      if (f.low !== null && value !== null && value !== undefined) {
        const got = parseInteger(f.name, value, SFIELDS);
        if (got.error) return got.error;
      }
      if (f.kind === "fraction") {
        const got = parseFraction(f.name, value);
        if (got.error) return got.error;
      }
    }
    if (setup.gpu !== null && setup.gpu !== undefined && !(setup.gpu in D.gpus)) {
      return `gpu: must be one of ${Object.keys(D.gpus).join(", ")} (got ${shown(setup.gpu)})`;
    }
    return tpRefusal(pre.tp, pre.heads)(setup.tp);
  }

  /** vrammath serve MODEL --json's numbers: {components, phases, totals, gpu} or {error}. */
  function serve(input) {
    const setup = Object.assign({}, S.defaults, input);
    const error = validateServe(setup);
    if (error) return { error };
    const pre = S.presets[setup.model];
    const tp = setup.tp > 1 ? 1 : 0;
    const paged = setup.block === null ? 0 : 1;
    const [wf, cf] = pre.weights[setup.weights][tp];
    const v = serveValues(pre, setup);
    const weights = ceilInt(F[wf](v));
    const consts = ceilInt(F[cf](v));
    const kvOf = (batch, context) => floorInt(F[pre.kv[tp][paged]](serveValues(pre, setup, { batch, context })));
    const kv = kvOf(setup.batch, setup.context);
    const perToken = floorInt(F[pre.perToken[tp]](serveValues(pre, setup, { batch: 1, context: 1 })));
    let reserve = 0n;
    let gpu = null;
    if (setup.gpu) {
      // ServeEstimate.reserve_bytes: the library's own float product, truncated
      const cap = BigInt(D.gpus[setup.gpu]);
      reserve = cap - BigInt(Math.trunc(Number(cap) * setup.gpu_util));
      const budget = cap - reserve - weights - consts;
      const seq = (context) => kvOf(1, context);
      // ServeEstimate.max_batch and max_context: the same division and bisection
      const n = BigInt(setup.batch);
      const limit = S.contextLimit;
      let maxContext;
      if (n * seq(1) > budget) maxContext = 0;
      else if (n * seq(limit) <= budget) maxContext = limit;
      else {
        let lo = 1;
        let hi = limit;
        while (hi - lo > 1) {
          const mid = Math.floor((lo + hi) / 2);
          if (n * seq(mid) <= budget) lo = mid; else hi = mid;
        }
        maxContext = lo;
      }
      gpu = { name: setup.gpu, bytes: cap.toString(), fits: kv <= budget, kv_budget_bytes: budget.toString(),
              max_batch_at_context: Number((budget > 0n ? budget : 0n) / seq(setup.context)),
              max_context_at_batch: maxContext };
    }
    const total = weights + consts + kv;
    const totals = {
      weights_bytes: weights.toString(),
      quant_constants_bytes: consts.toString(),
      kv_cache_bytes: kv.toString(),
      kv_bytes_per_token: perToken.toString(),
      reserve_bytes: reserve.toString(),
      total_bytes: total.toString(),
      total_with_reserve_bytes: (total + reserve).toString(),
    };
    return { model: setup.model, components: { weights: totals.weights_bytes,
             quant_constants: totals.quant_constants_bytes, kv_cache: totals.kv_cache_bytes },
             phases: {}, totals, gpu, kvTex: D.tex[pre.kvTex[tp][paged]] };
  }

  /** The CLI line for a serving setup: every field that differs from its default. */
  function serveCommand(input) {
    const setup = Object.assign({}, S.defaults, input);
    const parts = ["vrammath", "serve", setup.model];
    for (const f of S.fields) {
      if (!f.flag) continue;
      const value = setup[f.name];
      if (JSON.stringify(value) === JSON.stringify(S.defaults[f.name])) continue;
      if (f.name === "block" && value === null) { parts.push("--no-paging"); continue; }
      if (value === null || value === undefined) continue;
      parts.push(f.flag, String(value));
    }
    return parts.join(" ");
  }

  window.vrammath = { estimate, serve, validate: (s) => validate(withDefaults(s)), validateServe,
                      cliCommand, serveCommand, parseInteger, parseFraction, data: D, Z, funcs: F };
}

/* The page: two forms built from the declared fields (vrammath.fields metadata, shipped as data),
 * the tables and bars of the engine's results. Display only: every number comes from the engine. */
function vmPage() {
  "use strict";
  if (typeof document === "undefined") return;  // node: the engine alone (tests)
  const root = document.getElementById("vm-calc");
  if (!root || !window.vrammath) return;
  const t0 = performance.now();
  const vm = window.vrammath;
  const D = vm.data;
  const S = D.serve;
  const el = (tag, attrs, ...kids) => {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "text") node.textContent = v; else node.setAttribute(k, v);
    }
    kids.forEach((kid) => node.append(kid));
    return node;
  };
  const fmt = (bytes, unit) => (Number(bytes) / (unit === "GB" ? 1e9 : 2 ** 30)).toFixed(2) + " " + unit;
  const both = (bytes) => `${fmt(bytes, "GB")} / ${fmt(bytes, "GiB")}`;
  const TRAIN = ["model", "gpu", "recipe", "optimizer", "implementation", "zero", "gpus", "shard",
    "offload_optimizer", "offload_params", "micro_batch", "seq_len", "attention", "recompute",
    "keep_outputs", "tp", "sp", "pp", "ep", "schedule", "chunks", "lora_rank", "lora_targets", "quant",
    "lora_dropout", "activation_model", "iteration", "device"];
  const SERVE = ["model", "gpu", "weights", "kv_dtype", "context", "batch", "tp", "block", "gpu_util"];
  const GROUP_NAMES = { other: "phase transients" };
  D.groupSums.forEach(([sym, group, backward]) => {
    GROUP_NAMES[sym] = backward ? "reduce buffer (backward)" : group.replace(/-/g, " ");
  });
  const PART_ORDER = ["other", ...D.groupSums.map(([sym]) => sym)];

  /** One form: a control per declared field, an error span beside each. */
  function makeForm(prefix, order, declared, defaults) {
    const fields = Object.fromEntries(declared.map((f) => [f.name, f]));
    const inputs = {};
    const errors = {};
    const form = el("form", { class: "vm-form", id: prefix + "form" });
    for (const name of order) {
      const f = fields[name] || { name, flag: null, choices: [], kind: "value", help: "" };
      if (name !== "model" && !(name in fields)) continue;
      const dflt = defaults[name];
      let input;
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
        input.value = f.kind === "targets" ? D.targets[0] : dflt === null ? "" : String(dflt);
      } else {
        input = el("input", { type: "text", inputmode: f.kind === "fraction" ? "decimal" : "numeric", name, size: "8" });
        input.value = dflt === null ? "" : String(dflt);
        if (name === "lora_rank") input.placeholder = "none";
        if (name === "block") input.placeholder = "no paging";
      }
      input.id = prefix + "in-" + name;
      inputs[name] = input;
      errors[name] = el("span", { class: "vm-field-error", id: prefix + "err-" + name });
      const title = name === "model" ? "preset model" : (f.flag || name);
      const help = name === "model" ? "a model preset of conf/models" : f.help;
      form.append(el("div", { class: "vm-field" }, el("label", { for: input.id, title: help, text: title }), input, errors[name]));
    }
    return { form, inputs, errors, fields };
  }

  /** The setup a form holds, or {errors: {field: the CLI's message}}. */
  function readForm(tab) {
    const setup = {};
    const errs = {};
    for (const [name, input] of Object.entries(tab.inputs)) {
      const f = tab.fields[name] || {};
      if (name === "model") setup.model = input.value;
      else if (f.kind === "switch") setup[name] = input.checked;
      else if (f.kind === "zero") setup[name] = Number(input.value);
      else if (f.kind === "targets") setup[name] = (D.targetLists[input.value] || input.value).split(",");
      else if (input.tagName === "SELECT") setup[name] = input.value === "" ? null : input.value;
      else if ((name === "lora_rank" || name === "block") && input.value.trim() === "") setup[name] = null;
      else {
        const got = f.kind === "fraction" ? vm.parseFraction(name, input.value)
          : vm.parseInteger(name, input.value, tab.fields);
        if (got.error) errs[name] = got.error; else setup[name] = got.value;
      }
    }
    return Object.keys(errs).length ? { errors: errs } : { setup };
  }

  function makeTab(prefix, order, declared, defaults, title) {
    const tab = makeForm(prefix, order, declared, defaults);
    tab.cli = el("code", { id: prefix + "cli" });
    tab.copy = el("button", { type: "button", id: prefix + "copy", class: "vm-copy", text: "copy as CLI command" });
    tab.status = el("div", { id: prefix + "status", class: "vm-status" });
    tab.verdict = el("div", { id: prefix + "verdict", class: "vm-verdict" });
    tab.table = el("table", { id: prefix + "components", class: "vm-table" });
    tab.bars = el("div", { id: prefix + "phases", class: "vm-bars" });
    tab.barsTitle = el("h3", { text: "" });
    tab.panel = el("div", { class: "vm-panel", id: prefix + "panel" }, tab.form,
      el("div", { class: "vm-cli" }, tab.copy, " ", tab.cli), tab.status, tab.verdict,
      el("h3", { text: title }), tab.table, tab.barsTitle, tab.bars);
    tab.copy.addEventListener("click", () => {
      if (navigator.clipboard) navigator.clipboard.writeText(tab.cli.textContent).catch(() => {});
      tab.copy.textContent = "copied";
      setTimeout(() => { tab.copy.textContent = "copy as CLI command"; }, 1500);
    });
    return tab;
  }
  const train = makeTab("vm-", TRAIN, D.fields, D.defaults, "Components (per GPU, and host for offload)");
  const serve = makeTab("vm-sv-", SERVE, S.fields, S.defaults, "Components (per GPU)");
  train.name = "train";
  serve.name = "serve";
  const tabs = { train, serve };
  const buttons = {
    train: el("button", { type: "button", id: "vm-tab-train", class: "vm-tab", text: "Training: vrammath estimate" }),
    serve: el("button", { type: "button", id: "vm-tab-serve", class: "vm-tab", text: "Serving: vrammath serve" }),
  };
  root.append(el("div", { class: "vm-tabs", role: "tablist" }, buttons.train, buttons.serve), train.panel, serve.panel);
  let current = "train";
  function select(name) {
    current = name;
    for (const [k, tab] of Object.entries(tabs)) {
      tab.panel.hidden = k !== name;
      buttons[k].classList.toggle("vm-active", k === name);
    }
  }

  function clear(tab) {
    tab.table.replaceChildren();
    tab.bars.replaceChildren();
    tab.barsTitle.textContent = "";
    tab.verdict.textContent = "";
    tab.status.textContent = "";
    tab.cli.textContent = "";
    Object.values(tab.errors).forEach((e) => { e.textContent = ""; });
  }
  function showError(tab, message, name) {
    if (!name) {
      const head = message.split(":")[0];
      const f = Object.values(tab.fields).find((x) => x.name === head || (x.flag || "").replace(/^--/, "") === head);
      name = f ? f.name : head === "model" ? "model" : null;
    }
    if (name && tab.errors[name]) tab.errors[name].textContent = message;
    tab.status.textContent = message;
    tab.status.className = "vm-status vm-bad";
  }
  function row(cells, attrs) {
    return el("tr", attrs || {}, ...cells.map(([text, cls]) => el("td", cls ? { class: cls, text } : { text })));
  }
  const header = (names) => el("tr", {}, ...names.map((h) => el("th", { text: h })));
  function texCell(tex) { return tex ? "\\(" + tex + "\\)" : ""; }
  /** A horizontal stacked bar: [name, bytes, class] segments over ``top`` bytes. */
  function stacked(segments, top) {
    const track = el("div", { class: "vm-track" });
    segments.forEach(([name, bytes, cls]) => {
      if (!(bytes > 0)) return;
      const seg = el("div", { class: "vm-seg " + cls, title: `${name}: ${both(Math.round(bytes))}` });
      seg.style.width = (100 * bytes / top).toFixed(3) + "%";
      track.append(seg);
    });
    return track;
  }

  function writeHash() {
    const tab = tabs[current];
    const got = readForm(tab);
    if (got.errors) return;
    const defaults = current === "train" ? D.defaults : S.defaults;
    const parts = current === "serve" ? ["tab=serve"] : [];
    for (const [k, v] of Object.entries(got.setup)) {
      if (k !== "model" && JSON.stringify(v) === JSON.stringify(defaults[k])) continue;
      const text = Array.isArray(v) ? v.join(",") : v === null ? "" : String(v);
      parts.push(encodeURIComponent(k) + "=" + encodeURIComponent(text));
    }
    history.replaceState(null, "", "#" + parts.join("&"));
  }
  // the forms as first built (the defaults): a link states its whole setup, the rest default
  const INITIAL = {};
  for (const [name, tab] of Object.entries(tabs)) {
    INITIAL[name] = Object.fromEntries(Object.entries(tab.inputs).map(
      ([k, input]) => [k, input.type === "checkbox" ? input.checked : input.value]));
  }
  function readHash() {
    const text = location.hash.replace(/^#/, "");
    const pairs = text ? text.split("&").map((part) => part.split("=").map(decodeURIComponent)) : [];
    const tabName = (pairs.find(([k]) => k === "tab") || [null, "train"])[1] === "serve" ? "serve" : "train";
    select(tabName);
    for (const [k, input] of Object.entries(tabs[tabName].inputs)) {
      if (input.type === "checkbox") input.checked = INITIAL[tabName][k]; else input.value = INITIAL[tabName][k];
    }
    for (const [k, raw] of pairs) {
      const input = tabs[tabName].inputs[k];
      if (!input || raw === undefined) continue;
      if (input.type === "checkbox") input.checked = raw === "true";
      else if (k === "lora_targets") input.value = D.targetSets[raw] || raw;
      else input.value = raw;
    }
  }

  function renderTrain() {
    const tab = train;
    clear(tab);
    const got = readForm(tab);
    if (got.errors) {
      for (const [name, msg] of Object.entries(got.errors)) showError(tab, msg, name);
      return null;
    }
    tab.cli.textContent = vm.cliCommand(got.setup);
    const est = vm.estimate(got.setup);
    if (est.error) { showError(tab, est.error); return null; }
    tab.status.className = "vm-status vm-ok";
    tab.status.textContent = `peak per GPU: ${both(est.totals.gpu_bytes)} (${est.totals.peak_phase})`;
    const lines = [];
    if (est.gpu) {
      const free = BigInt(est.gpu.bytes) - BigInt(est.totals.gpu_bytes);
      lines.push([`${est.gpu.name} (${both(est.gpu.bytes)}): ` + (est.gpu.fits ? "fits, headroom " : "does NOT fit, short by ") +
        both(free < 0n ? -free : free), est.gpu.fits]);
    }
    if (est.host && est.totals.cpu_bytes !== "0") {
      const h = est.host;
      const text = `host: ${both(h.per_rank_bytes)} per rank x ${h.ranks_per_node} rank(s) per node = ${both(h.need_bytes)}`;
      lines.push([h.limit_bytes === null ? text + " (not checked: no node preset holds this GPU)"
        : `${text} of ${both(h.limit_bytes)} (${h.node}): ${h.fits ? "fits" : "does NOT fit"}`, h.fits !== false]);
    }
    tab.verdict.replaceChildren(...lines.map(([text, ok]) => el("div", { class: ok ? "vm-ok" : "vm-bad", text })));
    tab.table.append(header(["component", "device", "GB (1e9 B)", "GiB (2^30 B)", "formula"]));
    for (const c of est.detail) {
      tab.table.append(row([[c.label], [c.device], [fmt(c.bytes, "GB"), "vm-num"], [fmt(c.bytes, "GiB"), "vm-num"],
        [texCell(c.tex), "vm-tex"]], { "data-key": c.key }));
    }
    tab.table.append(row([[`peak per GPU (${est.totals.peak_phase})`], ["gpu"], [fmt(est.totals.gpu_bytes, "GB"), "vm-num"],
      [fmt(est.totals.gpu_bytes, "GiB"), "vm-num"], [""]], { class: "vm-total" }));
    if (est.totals.cpu_bytes !== "0") {
      tab.table.append(row([["total CPU per rank"], ["cpu"], [fmt(est.totals.cpu_bytes, "GB"), "vm-num"],
        [fmt(est.totals.cpu_bytes, "GiB"), "vm-num"], [""]], { class: "vm-total" }));
    }
    tab.barsTitle.textContent = "Phase peaks: what is live at each phase's peak";
    const top = Math.max(...Object.values(est.phases).map(Number), est.gpu ? Number(est.gpu.bytes) : 0, 1);
    for (const [name, bytes] of Object.entries(est.phases)) {
      const parts = est.phaseParts[name].map(([k, x], i) => [GROUP_NAMES[k], x, "vm-seg-" + PART_ORDER.indexOf(k)]);
      const track = stacked(parts, top);
      if (est.gpu) {
        const cap = el("div", { class: "vm-cap", title: est.gpu.name });
        cap.style.left = (100 * Number(est.gpu.bytes) / top).toFixed(3) + "%";
        track.append(cap);
      }
      tab.bars.append(el("div", { class: "vm-phase" + (name === est.totals.peak_phase ? " vm-peak" : ""), "data-phase": name },
        el("span", { class: "vm-phase-name", text: name.replace(/_/g, " ") }), track,
        el("span", { class: "vm-num", text: both(bytes) })));
    }
    const legend = el("div", { class: "vm-legend" });
    PART_ORDER.forEach((k, i) => legend.append(el("span", { class: "vm-key" }, el("i", { class: "vm-seg-" + i }), " " + GROUP_NAMES[k])));
    if (est.gpu) legend.append(el("span", { class: "vm-key" }, el("i", { class: "vm-cap-key" }), " " + est.gpu.name));
    tab.bars.append(legend);
    return est;
  }

  function renderServe() {
    const tab = serve;
    clear(tab);
    const got = readForm(tab);
    if (got.errors) {
      for (const [name, msg] of Object.entries(got.errors)) showError(tab, msg, name);
      return null;
    }
    tab.cli.textContent = vm.serveCommand(got.setup);
    const est = vm.serve(got.setup);
    if (est.error) { showError(tab, est.error); return null; }
    const s = Object.assign({}, S.defaults, got.setup);
    const t = est.totals;
    tab.status.className = "vm-status vm-ok";
    tab.status.textContent = `weights + KV cache per GPU: ${both(t.total_bytes)}`;
    if (est.gpu) {
      const g = est.gpu;
      const use = Math.round(s.gpu_util * 100);
      tab.verdict.replaceChildren(
        el("div", { class: g.fits ? "vm-ok" : "vm-bad", text: `${g.name} (${both(g.bytes)}), ${use}% for weights + KV: ` +
          (g.fits ? "fits" : "does NOT fit") + `; KV budget ${both(g.kv_budget_bytes)}` }),
        el("div", { id: "vm-sv-max", text: `at ${s.context} tokens: at most ${g.max_batch_at_context} sequences; ` +
          `for ${s.batch} sequence(s): at most ${g.max_context_at_batch} tokens each` }));
    }
    tab.table.append(header(["component", "GB (1e9 B)", "GiB (2^30 B)", "formula"]));
    const rows = [
      ["weights", `weights (${s.weights}, per GPU)`, t.weights_bytes, ""],
      ["quant_constants", "quantization constants", t.quant_constants_bytes, ""],
      ["kv_cache", `KV cache (${s.batch} x ${s.context} tokens, ${s.kv_dtype})`, t.kv_cache_bytes, est.kvTex],
    ];
    if (est.gpu) rows.push(["reserve", `runtime reserve (${Math.round((1 - s.gpu_util) * 100)}% of the GPU)`, t.reserve_bytes, ""]);
    for (const [key, label, bytes, tex] of rows) {
      tab.table.append(row([[label], [fmt(bytes, "GB"), "vm-num"], [fmt(bytes, "GiB"), "vm-num"], [texCell(tex), "vm-tex"]], { "data-key": key }));
    }
    tab.table.append(row([["weights + KV cache per GPU"], [fmt(t.total_bytes, "GB"), "vm-num"], [fmt(t.total_bytes, "GiB"), "vm-num"], [""]], { class: "vm-total" }));
    tab.barsTitle.textContent = "The GPU: weights, KV cache and the runtime reserve";
    const top = Math.max(Number(t.total_with_reserve_bytes), est.gpu ? Number(est.gpu.bytes) : 0, 1);
    const track = stacked([["weights", Number(t.weights_bytes), "vm-seg-1"], ["quantization constants", Number(t.quant_constants_bytes), "vm-seg-2"],
      ["KV cache", Number(t.kv_cache_bytes), "vm-seg-4"], ["runtime reserve", Number(t.reserve_bytes), "vm-seg-0"]], top);
    if (est.gpu) {
      const cap = el("div", { class: "vm-cap", title: est.gpu.name });
      cap.style.left = (100 * Number(est.gpu.bytes) / top).toFixed(3) + "%";
      track.append(cap);
    }
    tab.bars.append(el("div", { class: "vm-phase" }, el("span", { class: "vm-phase-name", text: "per GPU" }), track,
      el("span", { class: "vm-num", text: both(t.total_with_reserve_bytes) })));
    const legend = el("div", { class: "vm-legend" });
    [["vm-seg-1", "weights"], ["vm-seg-2", "quantization constants"], ["vm-seg-4", "KV cache"], ["vm-seg-0", "runtime reserve"]]
      .forEach(([cls, text]) => legend.append(el("span", { class: "vm-key" }, el("i", { class: cls }), " " + text)));
    tab.bars.append(legend);
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
  function render() {
    const est = current === "train" ? renderTrain() : renderServe();
    writeHash();
    typeset(tabs[current].table);
    return est;
  }
  for (const tab of [train, serve]) {
    tab.form.addEventListener("input", render);
    tab.form.addEventListener("change", render);
    tab.form.addEventListener("submit", (e) => e.preventDefault());
  }
  for (const name of ["train", "serve"]) buttons[name].addEventListener("click", () => { select(name); render(); });
  window.addEventListener("hashchange", () => { readHash(); render(); });
  readHash();
  render();
  window.vrammath.render = render;
  window.vrammath.select = select;
  window.vrammath.firstRenderMs = performance.now() - t0;
  window.vrammath.firstRenderAt = performance.now();  // since navigation start
}

/* calculator-data.js ships the data gzip-compressed (base64): unpack it with the browser's own
 * DecompressionStream, then start the engine and the page. Tests in node set VRAMMATH_DATA. */
(function () {
  "use strict";
  function start() {
    vmEngine(window.VRAMMATH_DATA);
    if (typeof document !== "undefined") vmPage();
  }
  if (window.VRAMMATH_DATA || !window.VRAMMATH_PACKED) { start(); return; }
  const bytes = Uint8Array.from(atob(window.VRAMMATH_PACKED), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  new Response(stream).text().then((text) => {
    new Function(text)();  // the data script the generator wrote: window.VRAMMATH_DATA = ...
    start();
  });
})();
