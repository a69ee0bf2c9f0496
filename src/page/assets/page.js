// llmgate's built-in page: playground, per-token timeline, live view. No dependencies;
// every string from the server is written with textContent, never parsed as HTML.
"use strict";

const KEY_STORE = "llmgate.apiKey"; // sessionStorage: gone when the tab closes
const LIVE_EVERY_MS = 2000;
// While the gateway cannot be reached, the live view asks again after 2, 4, 8 … 30 s.
const RETRY_MAX_MS = 30000;
const SVG = "http://www.w3.org/2000/svg";

const $ = (id) => document.getElementById(id);
const state = {
  key: sessionStorage.getItem(KEY_STORE) || "", abort: null, liveTimer: null, last: null,
  // Milliseconds until the next live refresh: LIVE_EVERY_MS, longer while unreachable.
  liveDelay: LIVE_EVERY_MS, liveLoop: null, unreachable: false, models: 0, ready: 0,
};

/** A number as text with `digits` decimals; "–" for a figure the server left out (null). */
function fixed(value, digits = 1) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "–";
}

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

/** A failed fetch (no answer at all) as an error that says the gateway is unreachable. */
class Unreachable extends Error {}

async function getJson(path) {
  let response;
  try {
    response = await fetch(path, { headers: headers(false), cache: "no-store" });
  } catch (error) {
    throw new Unreachable(`the gateway is unreachable (${error.message})`);
  }
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
  const refused = Boolean(state.key);
  state.models = 0;
  setStatus(refused ? "the key was refused: " + message : "this gateway needs an API key");
  $("api-key").setAttribute("aria-invalid", String(refused));
  setSendable(false, refused ? "The key was refused: enter a valid API key above." : "Enter an API key above to send.");
  stopLive();
  $("api-key").focus();
}

/** Send works only with a model to send to; otherwise it is off and says why. */
function setSendable(on, why = "") {
  $("send").disabled = !on || Boolean(state.abort);
  $("send-note").textContent = on ? "" : why;
  $("send-note").hidden = on;
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
  state.models = list.data.length;
  state.ready = ready;
  setSendable(list.data.length > 0, "The gateway serves no model.");
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
  if (!$("model").value) {
    showAnswerError($("send-note").textContent || "There is no model to send to.");
    return;
  }
  const body = requestBody();
  const answer = $("answer");
  answer.replaceChildren();
  $("answer-error").hidden = true;
  $("summary").replaceChildren();
  // With log-probabilities each token is a mark; without them the browser sees only
  // chunks (one may carry several tokens), so a mark is a chunk.
  const run = {
    scored: Boolean(body.logprobs), tokens: [], chunks: [], unscored: [], timings: null,
    usage: null, finish: null, sent: 0, end: 0,
  };
  state.last = run;
  drawTimeline(run);
  const controller = new AbortController();
  state.abort = controller;
  $("send").disabled = true;
  $("stop").disabled = false;
  answer.setAttribute("aria-busy", "true");
  let received = false;
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
    received = true;
    for await (const chunk of events(response)) {
      const at = performance.now() - run.sent;
      if (chunk.error) throw new Error(`${chunk.error.code || chunk.error.type}: ${chunk.error.message}`);
      if (chunk.usage) run.usage = chunk.usage;
      if (chunk.timings) run.timings = chunk.timings;
      const choice = chunk.choices && chunk.choices[0];
      if (!choice) continue;
      if (choice.finish_reason) run.finish = choice.finish_reason;
      const content = (choice.delta && choice.delta.content) || "";
      const scored = (choice.logprobs && choice.logprobs.content) || [];
      if (run.scored) {
        for (const t of scored) run.tokens.push({ text: t.token, logprob: t.logprob, at });
        showScored(run, content, scored, at);
      } else if (content) {
        run.tokens.push({ text: content, logprob: null, at });
        showPiece({ text: content, logprob: null }, at);
      }
      if (content || scored.length) run.chunks.push(at);
      if (run.tokens.length % 8 === 0) drawTimeline(run);
    }
    run.end = performance.now() - run.sent;
  } catch (error) {
    if (error.name !== "AbortError") {
      // fetch rejects with a TypeError when the connection fails or breaks off.
      const lost = error instanceof TypeError;
      showAnswerError(lost && received ? `The connection to the gateway broke off mid-answer (${error.message}).`
        : lost ? `The gateway is unreachable (${error.message}).` : error.message);
    }
    run.end = performance.now() - run.sent;
  } finally {
    state.abort = null;
    $("stop").disabled = true;
    setSendable(state.models > 0, $("send-note").textContent);
    answer.setAttribute("aria-busy", "false");
    answer.dataset.done = "true";
    drawTimeline(run);
    showSummary(run);
    showFigures(run);
    if (!state.unreachable) refreshLive();
  }
}

function showAnswerError(message) {
  $("answer-error").textContent = message;
  $("answer-error").hidden = false;
}

/**
 * A chunk's text with the tokens it completes. The server sends each token with the
 * chunk that completes its text, so text may come before its token (held back for a stop
 * sequence, or a character split across tokens): it shows uncoloured until its token
 * arrives, then takes the token's colour.
 */
function showScored(run, content, scored, at) {
  if (content) run.unscored.push(showPiece({ text: content, logprob: null, pending: true }, at));
  if (!scored.length) return;
  const text = run.unscored.map((span) => span.textContent).join("");
  if (!text) return; // tokens with no text of their own (the end of the answer)
  for (const span of run.unscored) span.remove();
  run.unscored = [];
  // The tokens' own texts where they spell the text exactly; else the text as one
  // piece, coloured by its least likely token.
  const spelled = scored.map((t) => t.token).join("") === text;
  const least = Math.min(...scored.map((t) => t.logprob));
  for (const t of spelled ? scored : [{ token: text, logprob: least }]) showPiece({ text: t.token, logprob: t.logprob }, at);
}

/** A band 0 (unlikely) to 4 (likely) for a log-probability. */
function band(logprob) {
  if (logprob === null || logprob === undefined) return "none";
  const p = Math.exp(logprob);
  return p >= 0.9 ? 4 : p >= 0.6 ? 3 : p >= 0.3 ? 2 : p >= 0.1 ? 1 : 0;
}

function showPiece({ text, logprob, pending }, at) {
  const span = document.createElement("span");
  span.className = "tok band-" + band(logprob) + (pending ? " pending" : "");
  span.textContent = text;
  span.title = logprob === null ? `${at.toFixed(1)} ms` : `${at.toFixed(1)} ms · logprob ${logprob.toFixed(3)} (p=${Math.exp(logprob).toFixed(3)})`;
  const answer = $("answer");
  // Follow the answer as it grows, unless the reader has scrolled up in it.
  const following = answer.scrollHeight - answer.scrollTop - answer.clientHeight < 24;
  answer.append(span);
  if (following) answer.scrollTop = answer.scrollHeight;
  delete answer.dataset.done;
  return span;
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
  // Drawn at the size it is shown, one unit a pixel: text keeps its shape at any width
  // (a stretched viewBox would widen the letters), and a resize draws it again.
  const W = Math.max(320, Math.round(svg.getBoundingClientRect().width) || 800);
  const H = 150, left = 50, right = 10, markTop = 12, markBottom = 62, itlBase = 128;
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.replaceChildren();
  const tokens = run.tokens;
  // Before an answer, an empty second.
  const span = tokens.length ? Math.max(run.end || 0, tokens[tokens.length - 1].at, 1) : 1000;
  const x = (ms) => left + (ms / span) * (W - left - right);
  // Time axis with about five ticks at round values.
  const step = niceStep(span / 5);
  for (let t = 0; t <= span; t += step) {
    svg.append(el("line", { class: "grid-line", x1: x(t), x2: x(t), y1: markTop, y2: itlBase }));
    // A label near the right edge ends at its tick instead of centring on it.
    const end = x(t) > W - right - 30;
    svg.append(el("text", { x: end ? W - 2 : x(t), y: H - 6, "text-anchor": end ? "end" : "middle" }, formatMs(t)));
  }
  svg.append(el("line", { class: "axis", x1: left, x2: W - right, y1: itlBase, y2: itlBase }));
  svg.append(el("text", { x: 2, y: markBottom - 20 }, run.scored === false ? "chunks" : "tokens"));
  svg.append(el("text", { x: 2, y: itlBase - 4 }, "ITL"));
  if (!tokens.length) {
    svg.setAttribute("aria-label", "No answer yet");
    return;
  }
  const ttft = tokens[0].at;
  svg.append(el("line", { class: "ttft", x1: x(ttft), x2: x(ttft), y1: 2, y2: itlBase }));
  // The label reads rightwards from the line, or leftwards where the line is near the end.
  const late = x(ttft) > W - 110;
  svg.append(el("text", { class: "ttft-label", x: late ? x(ttft) - 4 : x(ttft) + 4, y: 10, "text-anchor": late ? "end" : "start" }, `TTFT ${formatMs(ttft)}`));
  const gaps = tokens.slice(1).map((t, i) => t.at - tokens[i].at);
  const maxGap = Math.max(...gaps, 1);
  tokens.forEach((t, i) => {
    const mark = el("line", {
      class: "mark band-" + band(t.logprob), x1: x(t.at), x2: x(t.at), y1: markTop + 4, y2: markBottom,
      "data-index": i, "data-at": t.at.toFixed(2),
    });
    mark.append(el("title", {}, `${run.scored === false ? "chunk" : "token"} #${i + 1} ${JSON.stringify(t.text)} at ${t.at.toFixed(1)} ms`));
    svg.append(mark);
    if (i > 0) {
      const gap = gaps[i - 1];
      const h = Math.max(1, (gap / maxGap) * (itlBase - markBottom - 8));
      const bar = el("rect", { class: "itl", x: x(t.at) - 1.5, y: itlBase - h, width: 3, height: h });
      bar.append(el("title", {}, `gap before #${i + 1}: ${gap.toFixed(1)} ms`));
      svg.append(bar);
    }
  });
  svg.setAttribute("aria-label", `${tokens.length} ${run.scored === false ? "chunks" : "tokens"} over ${formatMs(span)}; first token at ${formatMs(ttft)}`);
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
  td.textContent = Number.isInteger(value) ? String(value) : fixed(value);
  return td;
}

function showSummary(run) {
  const t = run.timings || {};
  const items = [
    ["finish reason", run.finish || "–"],
    ["repetition rate", fixed(t.repetition_rate, 3)],
    ["degenerated", typeof t.degenerated === "boolean" ? String(t.degenerated) : "–"],
    ["mean logprob", fixed(t.mean_logprob, 3)],
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

const ms = (v) => fixed(v, 0);

async function refreshLive() {
  let stats;
  try {
    stats = await getJson("/stats");
  } catch (error) {
    if (error instanceof Unreachable) unreachable(error.message);
    else if (error.message !== "unauthorised") $("live-age").textContent = "(" + error.message + ")";
    return;
  }
  if (state.unreachable) {
    state.unreachable = false;
    state.liveDelay = LIVE_EVERY_MS;
    delete $("live").dataset.stale;
  }
  // Back from a restart, or a model still loading: the list (and the header) follows.
  if (state.ready < state.models || state.models === 0) {
    try {
      await loadModels();
    } catch (_) { /* the next refresh tries again */ }
  }
  $("live-age").textContent = `(last ${stats.window_secs / 60} minutes; up ${formatMs(stats.uptime_secs * 1000)})`;
  $("live-cards").replaceChildren(
    card("running / waiting", `${stats.running} / ${stats.waiting}`),
    card("in flight", `${stats.in_flight} of ${stats.max_in_flight}`),
    card("requests", String(stats.requests)),
    card("TTFT p50 / p95 ms", `${ms(stats.ttft_ms.p50)} / ${ms(stats.ttft_ms.p95)}`),
    card("TPOT p50 / p95 ms", `${ms(stats.tpot_ms.p50)} / ${ms(stats.tpot_ms.p95)}`),
    card("tokens/s (1 min)", fixed(stats.tokens_per_second)),
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
      // The error's type where it says more than the outcome ("cancelled" twice does not).
      (llm.status || "–") + (doc.error && doc.error.type && doc.error.type !== llm.status ? " · " + doc.error.type : ""),
      gen.usage ? String(gen.usage.output_tokens ?? "–") : "",
      ms(llm.ttft_ms),
      fixed(llm.tpot_ms),
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

/**
 * The gateway did not answer: say so where the model count stood, mark the live figures
 * as stale (they are the last ones seen) and ask less often, up to every RETRY_MAX_MS.
 */
function unreachable(message) {
  if (!state.unreachable) state.liveDelay = LIVE_EVERY_MS;
  else state.liveDelay = Math.min(2 * state.liveDelay, RETRY_MAX_MS);
  state.unreachable = true;
  state.models = 0;
  $("live").dataset.stale = "true";
  $("live-age").textContent = `(stale since ${new Date().toLocaleTimeString()})`;
  setStatus(`${message}; trying again in ${Math.round(state.liveDelay / 1000)} s`);
  setSendable(false, "The gateway is unreachable.");
}

/** Refreshes the live view now and then again, as long as it is started. */
function startLive() {
  stopLive();
  const loop = (state.liveLoop = {}); // a later start or a stop ends this loop
  const tick = async () => {
    if (document.visibilityState === "visible" || state.unreachable) await refreshLive();
    if (state.liveLoop === loop) state.liveTimer = setTimeout(tick, state.liveDelay);
  };
  state.liveTimer = setTimeout(tick, 0);
}

function stopLive() {
  clearTimeout(state.liveTimer);
  state.liveTimer = null;
  state.liveLoop = null;
}

// ---- start -------------------------------------------------------------------------

async function start() {
  try {
    await loadModels();
  } catch (error) {
    if (error instanceof Unreachable) {
      // Not up yet, or gone: the live view keeps trying and lists the models once it answers.
      unreachable(error.message);
      $("key-form").hidden = !state.key;
      startLive();
    } else if (error.message !== "unauthorised") {
      setStatus("could not list the models: " + error.message);
    }
    return;
  }
  $("key-form").hidden = !state.key;
  startLive();
}

drawTimeline({ tokens: [], end: 0 });
new ResizeObserver(() => drawTimeline(state.last || { tokens: [], end: 0 })).observe($("timeline"));
start();
