/* The handbook's calculator: a form over the CLI's own fields, answered by the CLI itself.
 *
 * The form is built from the fields vrammath declares (the page's #vm-data, written at build
 * time by vrammath.browser.page_data), its state is a command line, and every answer is what
 * `vrammath <command> ... --json` prints, run by vrammath in the browser (vrammath-live.js). No
 * memory logic lives here: this file lays out the CLI's JSON. The default setup's answers were
 * computed at build time and show at once; the page goes live when Python has started.
 */
(function () {
  "use strict";
  const root = document.getElementById("vm-calc");
  const dataNode = document.getElementById("vm-data");
  if (!root || !dataNode || !window.vrammath) return;
  const vm = window.vrammath;
  const D = JSON.parse(dataNode.textContent);
  const el = vm.el;  // document.createElement with attributes and children (vrammath-live.js)
  const fmt = (bytes, unit) => (Number(bytes) / (unit === "GB" ? 1e9 : 2 ** 30)).toFixed(2) + " " + unit;
  const both = (bytes) => `${fmt(bytes, "GB")} / ${fmt(bytes, "GiB")}`;
  const label = (f) => (f.flag || f.name).replace(/^--/, "");
  // per tab, the fields shown unfolded (null: all of them)
  const MAIN = {
    estimate: ["model", "gpu", "recipe", "optimizer", "zero", "gpus", "micro_batch", "seq_len",
      "recompute", "offload_optimizer", "lora_rank", "quant"],
    fit: ["model", "gpu", "recipe", "optimizer", "zero", "gpus", "micro_batch", "seq_len",
      "recompute", "lora_rank", "quant", "headroom"],
    serve: null,
    hf: null,
    vllm: null,
    sglang: null,
  };
  const TABS = [
    { name: "estimate", prefix: "vm-", title: "Training: vrammath estimate" },
    { name: "fit", prefix: "vm-fit-", title: "Fit: vrammath fit" },
    { name: "serve", prefix: "vm-sv-", title: "Serving: vrammath serve" },
    { name: "hf", prefix: "vm-hf-", title: "generate(): vrammath serve --engine hf" },
    { name: "vllm", prefix: "vm-vl-", title: "vLLM's budget: vrammath serve --engine vllm" },
    { name: "sglang", prefix: "vm-sg-", title: "SGLang's budget: vrammath serve --engine sglang" },
  ];

  // --- the forms: one control per field the CLI declares --------------------------------------
  function control(tab, f) {
    const initial = (D.initial[tab.name].fields || {})[f.name];
    let input;
    if (f.kind === "switch") {
      input = el("input", { type: "checkbox", name: f.name });
    } else if (f.kind === "gpu" || f.choices.length || f.kind === "zero") {
      const opts = f.kind === "gpu" ? D.gpus.map((g) => g.key) : f.kind === "zero" ? ["0", "1", "2", "3"] : f.choices;
      input = el("select", { name: f.name });
      if (f.optional) input.append(el("option", { value: "", text: "none" }));
      opts.forEach((o) => input.append(el("option", { value: o, text: o })));
    } else {
      input = el("input", { type: "text", name: f.name, size: "8", autocomplete: "off",
        inputmode: f.kind === "value" && f.low !== null ? "numeric" : "text" });
      if (f.optional) input.placeholder = f.name === "block" ? "no paging" : "none";
    }
    const dflt = initial !== undefined ? initial : f.default;
    setValue(input, dflt);
    input.id = tab.prefix + "in-" + f.name;
    input.dataset.default = textOf(f.default);
    return input;
  }
  function textOf(value) {
    if (value === null || value === undefined) return "";
    if (Array.isArray(value)) return value.join(",");
    return String(value);
  }
  function setValue(input, value) {
    if (input.type === "checkbox") { input.checked = value === true || value === "true"; return; }
    const text = textOf(value);
    if (input.tagName === "SELECT") {  // presets are matched as the CLI matches them
      const option = Array.from(input.options).find((o) => o.value.toLowerCase() === text.toLowerCase());
      input.value = option ? option.value : text;
    } else {
      input.value = text;
    }
  }
  function makeTab(tab) {
    tab.fields = D.forms[tab.name];
    tab.inputs = {};
    tab.errors = {};
    const form = el("form", { class: "vm-form", id: tab.prefix + "form" });
    const model = el("select", { name: "model", id: tab.prefix + "in-model" });
    D.models.forEach((m) => model.append(el("option", { value: m, text: m })));
    model.value = D.initial[tab.name].model;
    tab.inputs.model = model;
    const fields = [{ name: "model", flag: null, help: "a model preset (vrammath models)" }, ...tab.fields];
    // the fields most setups change stay in view; the rest fold under "more options"
    const more = el("div", { class: "vm-form vm-more-fields" });
    tab.more = el("details", { class: "vm-more" }, el("summary", { text: "more options" }), more);
    for (const f of fields) {
      const input = f.name === "model" ? model : control(tab, f);
      input.title = f.help || "";
      tab.inputs[f.name] = input;
      tab.errors[f.name] = el("span", { class: "vm-field-error", id: tab.prefix + "err-" + f.name });
      const box = el("div", { class: "vm-field" },
        el("label", { for: input.id, title: f.help, text: f.name === "model" ? "model" : f.flag }),
        input, tab.errors[f.name]);
      (MAIN[tab.name] === null || MAIN[tab.name].includes(f.name) ? form : more).append(box);
    }
    if (more.childElementCount) form.append(tab.more);
    tab.form = form;
    tab.cli = el("code", { id: tab.prefix + "cli" });
    tab.copy = el("button", { type: "button", class: "vm-copy", text: "copy as CLI command" });
    tab.download = el("button", { type: "button", class: "vm-copy", text: "download JSON" });
    tab.status = el("div", { id: tab.prefix + "status", class: "vm-status" });
    tab.verdict = el("div", { id: tab.prefix + "verdict", class: "vm-verdict" });
    tab.warnings = el("ul", { id: tab.prefix + "warnings", class: "vm-warnings" });
    tab.table = el("table", { id: tab.prefix + "components", class: "vm-table" });
    tab.bars = el("div", { id: tab.prefix + "phases", class: "vm-bars" });
    tab.panel = el("div", { class: "vm-panel", id: tab.prefix + "panel" }, form,
      el("div", { class: "vm-cli" }, tab.copy, " ", tab.download, " ", tab.cli),
      tab.status, tab.verdict, tab.warnings, tab.table, tab.bars);
    tab.copy.addEventListener("click", () => {
      if (navigator.clipboard) navigator.clipboard.writeText(tab.cli.textContent).catch(() => {});
      tab.copy.textContent = "copied";
      setTimeout(() => { tab.copy.textContent = "copy as CLI command"; }, 1500);
    });
    tab.download.addEventListener("click", () => {
      if (!tab.json) return;
      const a = el("a", { href: URL.createObjectURL(new Blob([tab.json], { type: "application/json" })),
        download: `vrammath-${tab.name}.json` });
      a.click();
      setTimeout(() => URL.revokeObjectURL(a.href), 1000);
    });
    form.addEventListener("submit", (e) => e.preventDefault());
    form.addEventListener("input", () => schedule(tab));
    form.addEventListener("change", () => schedule(tab));
    return tab;
  }

  /** The form as a command line: the model, then every field that is not the CLI's default. */
  function argvOf(tab) {
    const head = (D.heads || {})[tab.name] || [tab.name];  // an engine tab: serve ... --engine X
    const argv = [head[0], tab.inputs.model.value, ...head.slice(1)];
    for (const f of tab.fields) {
      const input = tab.inputs[f.name];
      if (f.kind === "switch") {
        if (input.checked) argv.push(f.flag);
        continue;
      }
      const text = input.value.trim();
      if (text === input.dataset.default) continue;
      if (text === "" && f.optional) {
        if (f.name === "block") argv.push("--no-paging");
        continue;
      }
      argv.push(f.flag, text);
    }
    return argv;
  }
  const quote = (a) => (/^[\w@%+=:,./-]+$/.test(a) ? a : "'" + a.replace(/'/g, "'\\''") + "'");

  // --- the answers: the CLI's JSON laid out -----------------------------------------------------
  function clear(tab) {
    [tab.table, tab.bars, tab.verdict, tab.warnings].forEach((n) => n.replaceChildren());
    Object.values(tab.errors).forEach((e) => { e.textContent = ""; });
  }
  function fieldOf(tab, message) {
    const text = message.replace(/^vrammath: error: /, "").replace(/^argument [^:]+: /, "");
    const head = text.split(":")[0].trim();
    const f = tab.fields.find((x) => x.name === head || label(x) === head || x.name === head.replace(/-/g, "_"));
    return f ? f.name : head === "model" ? "model" : null;
  }
  function showError(tab, message) {
    const name = fieldOf(tab, message);
    if (name && tab.errors[name]) {
      tab.errors[name].textContent = message.replace(/^vrammath: error: /, "");
      if (tab.more.contains(tab.errors[name])) tab.more.open = true;
    }
    tab.status.textContent = message;
    tab.status.className = "vm-status vm-bad";
  }
  const header = (names) => el("tr", {}, ...names.map((h) => el("th", { text: h })));
  function row(cells, attrs) {
    return el("tr", attrs || {}, ...cells.map(([text, cls]) => el("td", cls ? { class: cls, text } : { text })));
  }
  function bar(name, bytes, top, gpu, peak) {
    const track = el("div", { class: "vm-track" });
    const seg = el("div", { class: "vm-seg vm-seg-1", title: `${name}: ${both(bytes)}` });
    seg.style.width = (100 * Number(bytes) / top).toFixed(3) + "%";
    track.append(seg);
    if (gpu) {
      const cap = el("div", { class: "vm-cap", title: gpu.name });
      cap.style.left = (100 * Number(gpu.bytes) / top).toFixed(3) + "%";
      track.append(cap);
    }
    return el("div", { class: "vm-phase" + (peak ? " vm-peak" : ""), "data-phase": name },
      el("span", { class: "vm-phase-name", text: name.replace(/_/g, " ") }), track,
      el("span", { class: "vm-num", text: both(bytes) }));
  }
  function renderEstimate(tab, d, tex) {
    const t = d.totals;
    tab.status.className = "vm-status vm-ok";
    tab.status.textContent = `peak per GPU: ${both(t.gpu_bytes)} (${t.peak_phase.replace(/_/g, " ")})`;
    if (d.gpu) {
      const free = BigInt(d.gpu.bytes) - BigInt(t.gpu_bytes);
      tab.verdict.append(el("div", { class: d.gpu.fits ? "vm-ok" : "vm-bad",
        text: `${d.gpu.name} (${both(d.gpu.bytes)}): ` + (d.gpu.fits ? "fits, headroom " : "does NOT fit, short by ") +
          both(free < 0n ? -free : free) }));
    }
    if (d.moe) {
      tab.verdict.append(el("div", { text: `mixture of experts: ${d.moe.total_params.toLocaleString("en")} parameters, ` +
        `${d.moe.active_params.toLocaleString("en")} active per token` }));
    }
    tab.table.append(header(["component", "device", "GB (1e9 B)", "GiB (2^30 B)", "formula"]));
    for (const c of d.components) {
      if (c.bytes === null) continue;
      const formula = el("td", { class: "vm-tex" });
      formula.textContent = tex && tex[c.key] ? "\\(" + tex[c.key] + "\\)" : c.expr || "";
      const r = row([[c.label + (c.note ? ` (${c.note})` : "")], [c.device], [fmt(c.bytes, "GB"), "vm-num"],
        [fmt(c.bytes, "GiB"), "vm-num"]], { "data-key": c.key });
      r.append(formula);
      tab.table.append(r);
    }
    tab.table.append(row([[`peak per GPU (${t.peak_phase.replace(/_/g, " ")})`], ["gpu"], [fmt(t.gpu_bytes, "GB"), "vm-num"],
      [fmt(t.gpu_bytes, "GiB"), "vm-num"], [""]], { class: "vm-total" }));
    if (Number(t.cpu_bytes) > 0) {
      tab.table.append(row([["host memory per rank"], ["cpu"], [fmt(t.cpu_bytes, "GB"), "vm-num"],
        [fmt(t.cpu_bytes, "GiB"), "vm-num"], [""]], { class: "vm-total" }));
    }
    (d.unestimated || []).forEach((u) => tab.warnings.append(el("li", { text: "not estimated: " + (u.label || u.key || u) })));
    tab.bars.append(el("h3", { text: "Phase peaks per GPU" }));
    const top = Math.max(...Object.values(d.phases).map(Number), d.gpu ? Number(d.gpu.bytes) : 0, 1);
    for (const [name, bytes] of Object.entries(d.phases)) tab.bars.append(bar(name, bytes, top, d.gpu, name === t.peak_phase));
  }
  function renderFit(tab, d) {
    const b = d.budget;
    tab.status.className = "vm-status vm-ok";
    tab.status.textContent = `${b.gpu}: ${both(b.usable_bytes)} usable of ${both(b.capacity_bytes)} ` +
      `(reserve ${both(b.reserve_bytes)}, headroom ${b.headroom})`;
    tab.table.append(header(["question", "answer", "peak per GPU at the answer", "status"]));
    for (const [key, a] of Object.entries(d.answers)) {
      tab.table.append(row([[a.question], [a.value === null ? "none" : Number(a.value).toLocaleString("en"), "vm-num"],
        [a.bytes === null ? "" : both(a.bytes), "vm-num"], [a.status + (a.verified ? ", verified" : "")]], { "data-key": key }));
    }
  }
  function renderServe(tab, d) {
    const s = d.setup;
    tab.status.className = "vm-status vm-ok";
    tab.status.textContent = `weights + KV cache per GPU: ${both(d.total_bytes)}`;
    if (d.gpu) {
      const g = d.gpu;
      tab.verdict.append(el("div", { class: g.fits ? "vm-ok" : "vm-bad", text: `${g.name} (${both(g.bytes)}), ` +
        `${Math.round(s.gpu_util * 100)}% for weights + KV: ${g.fits ? "fits" : "does NOT fit"}; KV budget ${both(g.kv_budget_bytes)}` }),
      el("div", { id: "vm-sv-max", text: `at ${s.context} tokens: at most ${g.max_batch_at_context} sequences; ` +
        `for ${s.batch} sequence(s): at most ${g.max_context_at_batch} tokens each` }));
    }
    tab.table.append(header(["component", "GB (1e9 B)", "GiB (2^30 B)", "formula"]));
    const rows = [["weights", `weights (${s.weights}, per GPU)`, d.weights_bytes, ""],
      ["quant_constants", "quantization constants", d.quant_constants_bytes, ""],
      ["kv_cache", `KV cache (${s.batch} x ${s.context} tokens, ${s.kv_dtype})`, d.kv_cache_bytes, d.kv_cache_expr]];
    if (d.gpu) rows.push(["reserve", `runtime reserve (${Math.round((1 - s.gpu_util) * 100)}% of the GPU)`, d.reserve_bytes, ""]);
    for (const [key, text, bytes, expr] of rows) {
      tab.table.append(row([[text], [fmt(bytes, "GB"), "vm-num"], [fmt(bytes, "GiB"), "vm-num"], [expr, "vm-tex"]], { "data-key": key }));
    }
    tab.table.append(row([["weights + KV cache per GPU"], [fmt(d.total_bytes, "GB"), "vm-num"],
      [fmt(d.total_bytes, "GiB"), "vm-num"], [""]], { class: "vm-total" }));
    const top = Math.max(Number(d.total_with_reserve_bytes), d.gpu ? Number(d.gpu.bytes) : 0, 1);
    tab.bars.append(bar("per GPU", d.total_with_reserve_bytes, top, d.gpu, false));
  }
  function renderHf(tab, d) {
    const h = d.hf;
    const g = h.gpu;
    tab.status.className = "vm-status " + (!g || g.fits ? "vm-ok" : "vm-bad");
    tab.status.textContent = `peak tensor bytes of generate(): ${both(h.total_bytes)}` +
      (g ? ` on ${g.name}: ${g.fits ? "fits" : "does NOT fit"}` : "");
    if (g) {
      tab.verdict.append(el("div", { id: "vm-hf-max", text: `${g.name} (${both(g.usable_bytes)} usable, ` +
        `${both(g.outside_tensors_bytes)} of it CUDA context and cuBLAS workspaces): at most ` +
        `${Number(g.max_batch).toLocaleString("en")} sequences of ${Number(h.prompt_tokens).toLocaleString("en")} ` +
        `prompt + ${Number(h.new_tokens).toLocaleString("en")} new tokens` }));
    }
    tab.table.append(header(["per GPU", "GB (1e9 B)", "GiB (2^30 B)", "where"]));
    const rows = [["weights", `weights (${d.setup.weights}) and RoPE's buffers`,
      Number(h.weights_bytes) + Number(h.buffer_bytes), ""],
    ["prefill", "prefill's peak, cache included", h.prefill_peak_bytes, h.prefill_peak_at]];
    if (h.decode_peak_at !== "none") rows.push(["decode", "last decode step's peak", h.decode_peak_bytes, h.decode_peak_at]);
    rows.push(["kv_cache", "KV cache at the end", h.kv_cache_bytes, "DynamicCache"],
      ["total", "= peak tensor bytes", h.total_bytes, "weights + the larger peak"]);
    for (const [key, text, bytes, where] of rows) {
      tab.table.append(row([[text], [fmt(bytes, "GB"), "vm-num"], [fmt(bytes, "GiB"), "vm-num"], [where]], { "data-key": key }));
    }
    tab.warnings.append(...d.assumptions.map((a) => el("li", { class: "vm-note", text: "assumed: " + a })));
  }
  function renderVllm(tab, d) {
    const v = d.vllm;
    tab.status.className = "vm-status " + (v.starts ? "vm-ok" : "vm-bad");
    tab.status.textContent = `vLLM ${v.version} (the rule of ${v.rule}): ${Number(v.kv_tokens).toLocaleString("en")} ` +
      `tokens of KV cache per GPU, ${Number(v.max_concurrency).toFixed(2)} requests of ` +
      `${Number(v.max_model_len).toLocaleString("en")} tokens at once; ${v.starts ? "starts" : "does NOT start"}`;
    tab.verdict.append(el("div", { id: "vm-vl-lines", class: "vm-verdict" },
      ...v.lines.map((l) => el("div", { text: l }))));
    tab.table.append(header(["per GPU", "GB (1e9 B)", "GiB (2^30 B)", "what vLLM measures"]));
    const rows = [["requested", `total x gpu_memory_utilization ${v.gpu_memory_utilization}`, v.requested_bytes,
      v.total_measured ? "the total torch reports" : "nvidia-smi's total (no measured usable size)"],
    ["weights", "- weights and the rotary cache", v.weights_bytes, "model_memory_usage"],
    ["activation_peak", `- profile run's peak (${v.profile_tokens} tokens, ${v.profile_seqs} requests)`,
      v.activation_peak_bytes, "torch peak increase"],
    ["non_torch", "- memory outside torch", v.non_torch_bytes, "a measured constant"]];
    if (Number(v.cuda_graph_bytes) > 0) rows.push(["cuda_graphs", "- CUDA graphs", v.cuda_graph_bytes, "estimated (0.20 on)"]);
    rows.push(["available", "= available for the KV cache", v.available_kv_bytes, "available_kv_cache_memory"]);
    for (const [key, text, bytes, what] of rows) {
      tab.table.append(row([[text], [fmt(bytes, "GB"), "vm-num"], [fmt(bytes, "GiB"), "vm-num"], [what]], { "data-key": key }));
    }
  }
  function renderSglang(tab, d) {
    const g = d.sglang;
    const ok = Number(g.max_total_num_tokens) > 0;
    tab.status.className = "vm-status " + (ok ? "vm-ok" : "vm-bad");
    tab.status.textContent = `SGLang ${g.version}: ${Number(g.max_total_num_tokens).toLocaleString("en")} tokens of ` +
      `KV cache per GPU (mem_fraction_static ${g.mem_fraction_static}); ${ok ? "starts" : "does NOT start"}`;
    tab.verdict.append(el("div", { id: "vm-sg-lines", class: "vm-verdict" },
      ...g.lines.map((l) => el("div", { text: l }))));
    tab.table.append(header(["per GPU", "GB (1e9 B)", "GiB (2^30 B)", "what SGLang measures"]));
    const rows = [["free", "free before the weights load", g.free_before_load_bytes,
      g.total_measured ? "the total torch reports, less the CUDA context" : "nvidia-smi's total (no measured usable size)"],
    ["weights", "- weights and the rotary cache", g.weights_bytes, "the weights' load"],
    ["kv", `= the KV cache's share (x ${g.mem_fraction_static} first)`, g.kv_bytes, "rest_memory"]];
    for (const [key, text, bytes, what] of rows) {
      tab.table.append(row([[text], [fmt(bytes, "GB"), "vm-num"], [fmt(bytes, "GiB"), "vm-num"], [what]], { "data-key": key }));
    }
  }
  const RENDER = { estimate: renderEstimate, fit: renderFit, serve: renderServe, hf: renderHf, vllm: renderVllm, sglang: renderSglang };

  /** Show one CLI run: {rc, stdout, stderr} of `argv --json`. */
  function show(tab, argv, got, tex) {
    clear(tab);
    tab.cli.textContent = "vrammath " + argv.map(quote).join(" ");
    tab.json = got.rc === 0 ? got.stdout : null;
    const lines = got.stderr.split("\n").filter(Boolean);
    lines.filter((l) => l.startsWith("vrammath: warning: "))
      .forEach((l) => tab.warnings.append(el("li", { class: "vm-warning", text: l.replace("vrammath: ", "") })));
    if (got.rc !== 0) {
      showError(tab, lines.find((l) => l.includes("error:")) || lines[lines.length - 1] || `exit status ${got.rc}`);
      return;
    }
    RENDER[tab.name](tab, JSON.parse(got.stdout), tex);
    typeset(tab.table);
  }
  function typeset(node) {
    const mj = window.MathJax;
    if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(() => mj.typesetPromise([node])).catch(() => {});
    else setTimeout(() => { if (document.contains(node)) typeset(node); }, 200);
  }

  // --- state: the URL fragment, the tabs, the live runs -----------------------------------------
  const tabs = Object.fromEntries(TABS.map((t) => [t.name, makeTab(Object.assign({}, t))]));
  const buttons = Object.fromEntries(TABS.map((t) => [t.name,
    el("button", { type: "button", id: "vm-tab-" + t.name, class: "vm-tab", text: t.title })]));
  const live = el("div", { id: "vm-live", class: "vm-live" });
  root.append(el("div", { class: "vm-tabs", role: "tablist" }, ...Object.values(buttons)), live,
    ...Object.values(tabs).map((t) => t.panel));
  let current = "estimate";
  function select(name) {
    current = name;
    for (const [k, tab] of Object.entries(tabs)) {
      tab.panel.hidden = k !== name;
      buttons[k].classList.toggle("vm-active", k === name);
    }
  }
  const HASH_TAB = { serve: "serve", fit: "fit", hf: "hf", vllm: "vllm", sglang: "sglang" };
  function writeHash() {
    const tab = tabs[current];
    const parts = HASH_TAB[current] ? ["tab=" + current] : [];
    parts.push("model=" + encodeURIComponent(tab.inputs.model.value));
    for (const f of tab.fields) {
      const input = tab.inputs[f.name];
      const text = input.type === "checkbox" ? String(input.checked) : input.value;
      if ((input.type === "checkbox" && !input.checked) || text === input.dataset.default) continue;
      parts.push(encodeURIComponent(f.name) + "=" + encodeURIComponent(text).replace(/%2C/g, ","));
    }
    history.replaceState(null, "", "#" + parts.join("&"));
  }
  function readHash() {
    const text = location.hash.replace(/^#/, "");
    const pairs = text ? text.split("&").map((p) => p.split("=").map(decodeURIComponent)) : [];
    const name = (pairs.find(([k]) => k === "tab") || [null, "estimate"])[1];
    select(tabs[name] ? name : "estimate");
    const tab = tabs[current];
    for (const [k, value] of pairs) {
      if (!tab.inputs[k] || value === undefined) continue;
      setValue(tab.inputs[k], value);
      if (tab.more.contains(tab.inputs[k])) tab.more.open = true;
    }
    return pairs.some(([k]) => k !== "tab");
  }

  const pending = {};
  function schedule(tab) {
    tab.dirty = true;
    clearTimeout(pending[tab.name]);
    pending[tab.name] = setTimeout(() => compute(tab), 0);  // one run for an input + change pair
  }
  let runs = 0;
  async function compute(tab) {
    const argv = argvOf(tab);
    if (tab === tabs[current]) writeHash();
    tab.cli.textContent = "vrammath " + argv.map(quote).join(" ");
    if (!vm.liveAt) { tab.status.className = "vm-status"; tab.status.textContent = "waiting for Python ..."; }
    const run = ++runs;
    tab.latest = run;
    tab.dirty = false;
    tab.busy = run;
    try {
      const got = await vm.run([...argv, "--json"]);
      if (tab.latest !== run) return;  // a newer setup is on its way
      show(tab, argv, got, null);
      tab.shownArgv = argv.join("\u0000");
      vm.renderedAt = performance.now();
      vm.renders = (vm.renders || 0) + 1;
      if (tab.name === "estimate" && got.rc === 0) {  // then the formulas, for MathJax
        const tex = await vm.tex(argv);
        if (tab.latest === run) show(tab, argv, got, tex);
      }
    } catch (err) {
      if (tab.latest === run) showError(tab, err.message);
    } finally {
      if (tab.busy === run) tab.busy = 0;
    }
  }
  /** No run pending or in flight (the browser check waits for this). */
  vm.idle = () => Object.values(tabs).every((t) => !t.dirty && !t.busy);

  for (const [name, button] of Object.entries(buttons)) {
    button.addEventListener("click", () => { select(name); writeHash(); if (tabs[name].shownArgv !== argvOf(tabs[name]).join("\u0000")) compute(tabs[name]); });
  }
  window.addEventListener("hashchange", () => { readHash(); compute(tabs[current]); });

  // first view: the build's answers for the default setups, while Python starts
  const named = readHash();
  for (const tab of Object.values(tabs)) {
    const first = D.initial[tab.name];
    if (argvOf(tab).join("\u0000") === first.argv.join("\u0000")) {
      show(tab, first.argv, first.run, first.tex);
      tab.shownArgv = first.argv.join("\u0000");
    }
  }
  if (named) writeHash();
  vm.firstRenderAt = performance.now();
  live.textContent = "starting Python in your browser ...";
  vm.onProgress((p) => { live.textContent = `Python: ${p} ... (${((performance.now() - vm.startedAt) / 1000).toFixed(1)} s)`; });
  vm.start().then((timings) => {
    live.className = "vm-live vm-ok";
    live.textContent = `live: vrammath runs in your browser (started in ${((vm.liveAt - vm.startedAt) / 1000).toFixed(1)} s)`;
    for (const tab of Object.values(tabs)) {
      if (tab.shownArgv !== argvOf(tab).join("\u0000") && (tab === tabs[current] || tab.shownArgv === undefined)) compute(tab);
    }
  }, (err) => {
    live.className = "vm-live vm-bad";
    live.textContent = err.message;
  });
  vm.select = select;
  vm.compute = () => compute(tabs[current]);
})();
