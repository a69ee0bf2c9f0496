// llmgate's built-in page: playground, per-token timeline, live view. No dependencies;
// every string from the server is written with textContent, never parsed as HTML.
"use strict";

const KEY_STORE = "llmgate.apiKey"; // sessionStorage: gone when the tab closes
const LIVE_EVERY_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
const state = { key: sessionStorage.getItem(KEY_STORE) || "", abort: null, liveTimer: null, last: null };

// ---- requests ----------------------------------------------------------------------

function headers(json) {
  const h = {};
  if (json) h["content-type"] = "application/json";
  if (state.key) h.authorization = "Bearer " + state.key;
  return h;
}

/** The OpenAI-shaped error of a failed response, as one line. */
async function errorText(response) {
  try {
    const body = await response.json();
    if (body && body.error) {
      const e = body.error;
      return `${response.status} ${e.code || e.type || ""}: ${e.message}` + (e.param ? ` (${e.param})` : "");
    }
  } catch (_) { /* not JSON */ }
  return `${response.status} ${response.statusText}`;
}

async function getJson(path) {
  const response = await fetch(path, { headers: headers(false), cache: "no-store" });
  if (response.status === 401) {
    needKey(await errorText(response));
    throw new Error("unauthorised");
  }
  if (!response.ok) throw new Error(await errorText(response));
  return response.json();
}

// ---- the API key -------------------------------------------------------------------

function needKey(message) {
  const form = $("key-form");
  form.hidden = false;
  setStatus(state.key ? "the key was refused: " + message : "this gateway needs an API key");
  stopLive();
  $("api-key").focus();
}

function setStatus(text) {
  $("gateway-status").textContent = text;
}

$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  state.key = $("api-key").value.trim();
  sessionStorage.setItem(KEY_STORE, state.key);
  $("api-key").value = "";
  start();
});

$("key-forget").addEventListener("click", () => {
  state.key = "";
  sessionStorage.removeItem(KEY_STORE);
  start(); // asks again if the gateway needs a key
});

// ---- models ------------------------------------------------------------------------

async function loadModels() {
  const list = await getJson("/v1/models");
  const select = $("model");
  const chosen = select.value;
  select.replaceChildren();
  for (const model of list.data) {
    const option = document.createElement("option");
    option.value = model.id;
    option.textContent = model.id + (model.ready === false ? " (not ready)" : "");
    select.append(option);
  }
  if (chosen) select.value = chosen;
  showDefaults(list.data);
  select.onchange = () => showDefaults(list.data);
  const ready = list.data.filter((m) => m.ready !== false).length;
  setStatus(`${list.data.length} model${list.data.length === 1 ? "" : "s"}, ${ready} ready`);
}

/** The chosen model's defaults as the placeholders of the fields that take them. */
function showDefaults(models) {
  const model = models.find((m) => m.id === $("model").value);
  const d = (model && model.defaults) || {};
  const shown = (v) => (v === null || v === undefined ? "server default" : `default ${v}`);
  $("temperature").placeholder = shown(d.temperature);
  $("max-tokens").placeholder = shown(d.max_tokens);
  $("seed").placeholder = "random";
}

// ---- the playground ----------------------------------------------------------------

/** The request body; empty fields are left out so that the server's defaults apply. */
function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push({ role: "user", content: $("prompt").value });
  const body = {
    model: $("model").value,
    messages,
    stream: true,
    stream_options: { include_usage: true },
  };
  const number = (id) => ($(id).value.trim() === "" ? null : Number($(id).value));
  const temperature = number("temperature");
  const seed = number("seed");
  const maxTokens = number("max-tokens");
  if (temperature !== null) body.temperature = temperature;
  if (seed !== null) body.seed = seed;
  if (maxTokens !== null) body.max_tokens = maxTokens;
  if ($("logprobs").checked) {
    body.logprobs = true;
    const top = number("top-logprobs");
    if (top) body.top_logprobs = top;
  }
  return body;
}

/** Splits an SSE byte stream into the JSON of its `data:` events. */
async function* events(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the stream ended before [DONE]");
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.search(/(\r\n|\r|\n){2}/)) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end).replace(/^(\r\n|\r|\n){2}/, "");
        // Comments (":" keep-alives) carry no data line and are skipped.
        const data = block.split(/\r\n|\r|\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
        if (data === "[DONE]") return;
        if (data) yield JSON.parse(data);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

async function send(event) {
  if (event) event.preventDefault();
  if (state.abort) return;
  const body = requestBody();
  const answer = $("answer");
  answer.replaceChildren();
  $("answer-error").hidden = true;
  $("summary").replaceChildren();
  const run = { tokens: [], chunks: [], text: "", timings: null, usage: null, finish: null, sent: 0, end: 0 };
  state.last = run;
  drawTimeline(run);
  const controller = new AbortController();
  state.abort = controller;
  $("send").disabled = true;
  $("stop").disabled = false;
  answer.setAttribute("aria-busy", "true");
  try {
    run.sent = performance.now();
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers(true), body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) {
      const message = await errorText(response);
      if (response.status === 401) needKey(message);
      throw new Error(message);
    }
    for await (const chunk of events(response)) {
      const at = performance.now() - run.sent;
      if (chunk.error) throw new Error(`${chunk.error.code || chunk.error.type}: ${chunk.error.message}`);
      if (chunk.usage) run.usage = chunk.usage;
      if (chunk.timings) run.timings = chunk.timings;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      if (choice.finish_reason) run.finish = choice.finish_reason;
      const content = choice.delta && choice.delta.content;
      const scored = choice.logprobs && choice.logprobs.content;
      const pieces = scored && scored.length ? scored.map((t) => ({ text: t.token, logprob: t.logprob })) : content ? [{ text: content, logprob: null }] : [];
      for (const piece of pieces) run.tokens.push({ text: piece.text, logprob: piece.logprob, at });
      if (content) {
        run.text += content;
        // The tokens' own texts, where they spell the content exactly; else the content
        // as one piece, coloured by its least likely token.
        const spelled = pieces.map((p) => p.text).join("") === content;
        const least = pieces.reduce((m, p) => (p.logprob !== null && (m === null || p.logprob < m) ? p.logprob : m), null);
        for (const piece of spelled ? pieces : [{ text: content, logprob: least }]) showPiece(piece, at);
      }
      if (content || (scored && scored.length)) run.chunks.push(at);
      if (run.tokens.length % 8 === 0) drawTimeline(run);
    }
    run.end = performance.now() - run.sent;
  } catch (error) {
    if (error.name !== "AbortError") {
      $("answer-error").textContent = error.message;
      $("answer-error").hidden = false;
    }
    run.end = performance.now() - run.sent;
  } finally {
    state.abort = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    answer.setAttribute("aria-busy", "false");
    answer.dataset.done = "true";
    drawTimeline(run);
    showSummary(run);
    showFigures(run);
    refreshLive();
  }
}

/** A band 0 (unlikely) to 4 (likely) for a log-probability. */
function band(logprob) {
  if (logprob === null || logprob === undefined) return "none";
  const p = Math.exp(logprob);
  return p >= 0.9 ? 4 : p >= 0.6 ? 3 : p >= 0.3 ? 2 : p >= 0.1 ? 1 : 0;
}

function showPiece({ text, logprob }, at) {
  const span = document.createElement("span");
  span.className = "tok band-" + band(logprob);
  span.textContent = text;
  span.title = logprob === null ? `${at.toFixed(1)} ms` : `${at.toFixed(1)} ms · logprob ${logprob.toFixed(3)} (p=${Math.exp(logprob).toFixed(3)})`;
  $("answer").append(span);
  delete $("answer").dataset.done;
}

$("ask").addEventListener("submit", send);
$("stop").addEventListener("click", () => state.abort && state.abort.abort());
document.addEventListener("keydown", (event) => {
  if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) {
    if (event.target.closest("#key-form") || !$("ask").reportValidity()) return;
    send(event);
  }
  if (event.key === "Escape" && state.abort) state.abort.abort();
});

// ---- the timeline ------------------------------------------------------------------

function el(name, attrs, text) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function drawTimeline(run) {
  const svg = $("timeline");
  const W = 800, H = 150, left = 36, right = 10, markTop = 12, markBottom = 62, itlBase = 128;
  svg.replaceChildren();
  const tokens = run.tokens;
  // Before an answer, an empty second.
  const span = tokens.length ? Math.max(run.end || 0, tokens[tokens.length - 1].at, 1) : 1000;
  const x = (ms) => left + (ms / span) * (W - left - right);
  // Time axis with about five ticks at round values.
  const step = niceStep(span / 5);
  for (let t = 0; t <= span; t += step) {
    svg.append(el("line", { class: "grid-line", x1: x(t), x2: x(t), y1: markTop, y2: itlBase }));
    svg.append(el("text", { x: x(t), y: H - 6, "text-anchor": "middle" }, formatMs(t)));
  }
  svg.append(el("line", { class: "axis", x1: left, x2: W - right, y1: itlBase, y2: itlBase }));
  svg.append(el("text", { x: 2, y: markBottom - 20 }, "tokens"));
  svg.append(el("text", { x: 2, y: itlBase - 4 }, "ITL"));
  if (!tokens.length) {
    svg.setAttribute("aria-label", "No answer yet");
    return;
  }
  const ttft = tokens[0].at;
  svg.append(el("line", { class: "ttft", x1: x(ttft), x2: x(ttft), y1: 2, y2: itlBase }));
  svg.append(el("text", { x: Math.min(x(ttft) + 4, W - 90), y: 10 }, `TTFT ${formatMs(ttft)}`));
  const gaps = tokens.slice(1).map((t, i) => t.at - tokens[i].at);
  const maxGap = Math.max(...gaps, 1);
  tokens.forEach((t, i) => {
    const mark = el("line", {
      class: "mark band-" + band(t.logprob), x1: x(t.at), x2: x(t.at), y1: markTop + 4, y2: markBottom,
      "data-index": i, "data-at": t.at.toFixed(2),
    });
    mark.append(el("title", {}, `#${i + 1} ${JSON.stringify(t.text)} at ${t.at.toFixed(1)} ms`));
    svg.append(mark);
    if (i > 0) {
      const gap = gaps[i - 1];
      const h = Math.max(1, (gap / maxGap) * (itlBase - markBottom - 8));
      const bar = el("rect", { class: "itl", x: x(t.at) - 1.5, y: itlBase - h, width: 3, height: h });
      bar.append(el("title", {}, `gap before #${i + 1}: ${gap.toFixed(1)} ms`));
      svg.append(bar);
    }
  });
  svg.setAttribute("aria-label", `${tokens.length} tokens over ${formatMs(span)}; first token at ${formatMs(ttft)}`);
}

function niceStep(raw) {
  const power = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-3))));
  for (const m of [1, 2, 5, 10]) if (m * power >= raw) return m * power;
  return 10 * power;
}

function formatMs(ms) {
  return ms >= 1000 ? (ms / 1000).toFixed(ms >= 10000 ? 0 : 1) + " s" : Math.round(ms) + " ms";
}

// ---- figures -----------------------------------------------------------------------

function percentile(values, q) {
  if (!values.length) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length, Math.max(1, Math.ceil(q * sorted.length))) - 1];
}

function showFigures(run) {
  const body = $("figures").querySelector("tbody");
  body.replaceChildren();
  const t = run.timings || {};
  const tokens = run.tokens;
  // The browser sees chunks, not tokens: its gaps are between chunks that carried text.
  const gaps = run.chunks.slice(1).map((at, i) => at - run.chunks[i]);
  const first = run.chunks[0];
  const last = run.chunks[run.chunks.length - 1];
  // Without log-probabilities a chunk may carry several tokens: count them by usage.
  const n = run.usage ? run.usage.completion_tokens : tokens.length;
  const browserTpot = n > 1 && run.chunks.length > 1 ? (last - first) / (n - 1) : null;
  const itl = t.itl_ms || {};
  const rows = [
    ["TTFT", t.ttft_ms, first],
    ["TPOT", t.tpot_ms, browserTpot],
    ["ITL p50", itl.p50, percentile(gaps, 0.5)],
    ["ITL p95", itl.p95, percentile(gaps, 0.95)],
    ["ITL max", itl.max, gaps.length ? Math.max(...gaps) : null],
    ["end to end", t.e2e_ms, run.end],
    ["queue", t.queue_ms, null],
    // As the server defines it: output tokens over the whole request.
    ["tokens/s", t.tokens_per_second, n && run.end ? (1000 * n) / run.end : null],
    ["output tokens", t.output_tokens, n],
  ];
  for (const [name, server, browser] of rows) {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = name;
    tr.append(th, cell(server), cell(browser));
    body.append(tr);
  }
}

function cell(value) {
  const td = document.createElement("td");
  td.textContent = value === null || value === undefined ? "–" : Number.isInteger(value) ? String(value) : value.toFixed(1);
  return td;
}

function showSummary(run) {
  const t = run.timings || {};
  const items = [
    ["finish reason", run.finish || "–"],
    ["repetition rate", t.repetition_rate === undefined ? "–" : t.repetition_rate.toFixed(3)],
    ["degenerated", t.degenerated === undefined ? "–" : String(t.degenerated)],
    ["mean logprob", t.mean_logprob === null || t.mean_logprob === undefined ? "–" : t.mean_logprob.toFixed(3)],
    ["tokens", run.usage ? `${run.usage.prompt_tokens} in, ${run.usage.completion_tokens} out` : String(run.tokens.length)],
  ];
  const dl = $("summary");
  dl.replaceChildren();
  for (const [name, value] of items) {
    const dt = document.createElement("dt");
    dt.textContent = name;
    const dd = document.createElement("dd");
    dd.textContent = value;
    dd.dataset.figure = name.replace(/ /g, "-");
    dl.append(dt, dd);
  }
}

// ---- the live view -----------------------------------------------------------------

function card(label, value) {
  const div = document.createElement("div");
  div.className = "card";
  const l = document.createElement("div");
  l.className = "label";
  l.textContent = label;
  const v = document.createElement("div");
  v.className = "value";
  v.textContent = value;
  div.append(l, v);
  return div;
}

const ms = (v) => (v === null || v === undefined ? "–" : Math.round(v) + "");

async function refreshLive() {
  let stats;
  try {
    stats = await getJson("/stats");
  } catch (error) {
    if (error.message !== "unauthorised") $("live-age").textContent = "(" + error.message + ")";
    return;
  }
  $("live-age").textContent = `(last ${stats.window_secs / 60} minutes; up ${formatMs(stats.uptime_secs * 1000)})`;
  $("live-cards").replaceChildren(
    card("running / waiting", `${stats.running} / ${stats.waiting}`),
    card("in flight", `${stats.in_flight} of ${stats.max_in_flight}`),
    card("requests", String(stats.requests)),
    card("TTFT p50 / p95 ms", `${ms(stats.ttft_ms.p50)} / ${ms(stats.ttft_ms.p95)}`),
    card("TPOT p50 / p95 ms", `${ms(stats.tpot_ms.p50)} / ${ms(stats.tpot_ms.p95)}`),
    card("tokens/s (1 min)", stats.tokens_per_second.toFixed(1)),
  );
  $("live").dataset.requests = String(stats.requests);
  const errors = $("live-errors");
  errors.replaceChildren();
  const kinds = Object.entries(stats.errors);
  for (const [kind, count] of kinds.length ? kinds : [["none", null]]) {
    const li = document.createElement("li");
    li.textContent = count === null ? kind : `${kind}: ${count}`;
    errors.append(li);
  }
  const rows = $("records").querySelector("tbody");
  rows.replaceChildren();
  for (const doc of stats.records) {
    const llm = doc.llm || {};
    const gen = doc.gen_ai || {};
    const tr = document.createElement("tr");
    const values = [
      doc["@timestamp"] ? new Date(doc["@timestamp"]).toLocaleTimeString() : "",
      (gen.request || {}).model || "",
      llm.status + (doc.error ? " · " + doc.error.type : ""),
      gen.usage ? String(gen.usage.output_tokens) : "",
      ms(llm.ttft_ms),
      llm.tpot_ms === undefined ? "–" : llm.tpot_ms.toFixed(1),
      ((gen.response || {}).finish_reasons || []).join(", "),
      llm.prompt_excerpt === undefined ? "–" : String(llm.prompt_excerpt),
    ];
    for (const value of values) {
      const td = document.createElement("td");
      td.textContent = value;
      tr.append(td);
    }
    rows.append(tr);
  }
}

function startLive() {
  stopLive();
  refreshLive();
  state.liveTimer = setInterval(() => {
    if (document.visibilityState === "visible") refreshLive();
  }, LIVE_EVERY_MS);
}

function stopLive() {
  if (state.liveTimer) clearInterval(state.liveTimer);
  state.liveTimer = null;
}

// ---- start -------------------------------------------------------------------------

async function start() {
  try {
    await loadModels();
  } catch (error) {
    if (error.message !== "unauthorised") setStatus("could not list the models: " + error.message);
    return;
  }
  $("key-form").hidden = !state.key;
  startLive();
}

drawTimeline({ tokens: [], end: 0 });
start();
