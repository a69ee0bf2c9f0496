// llmgate's built-in page: playground, live view and start-up (the timeline and the
// figures are timeline.js's, loaded first). No dependencies; every string from the
// server is written with textContent, never parsed as HTML.
"use strict";

const KEY_STORE = "llmgate.apiKey"; // sessionStorage: gone when the tab closes
const LIVE_EVERY_MS = 2000;
// While the gateway cannot be reached, the live view asks again after 2, 4, 8 … 30 s.
const RETRY_MAX_MS = 30000;

const $ = (id) => document.getElementById(id);
const state = {
  key: sessionStorage.getItem(KEY_STORE) || "", abort: null, liveTimer: null, last: null,
  // Milliseconds until the next live refresh: LIVE_EVERY_MS, longer while unreachable.
  liveDelay: LIVE_EVERY_MS, liveLoop: null, unreachable: false, models: 0, ready: 0,
};


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
  // A proxy in front of a gateway that is down answers for it.
  if ([502, 503, 504].includes(response.status) && !response.headers.get("x-request-id")) {
    throw new Unreachable(`the gateway is unreachable (a proxy answered ${response.status})`);
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
  // Rebuilt only when the list changed: an open list or a screen reader's place in it
  // survives the refreshes while a model loads.
  const labels = list.data.map((m) => m.id + (m.ready === false ? " (not ready)" : ""));
  if (labels.join("\n") !== [...select.options].map((o) => o.textContent).join("\n")) {
    select.replaceChildren(...list.data.map((model, i) => {
      const option = document.createElement("option");
      option.value = model.id;
      option.textContent = labels[i];
      return option;
    }));
    select.value = chosen;
    if (!select.value && select.options.length) select.selectedIndex = 0;
  }
  showDefaults(list.data);
  select.onchange = () => showDefaults(list.data);
  const ready = list.data.filter((m) => m.ready !== false).length;
  setStatus(`${list.data.length} model${list.data.length === 1 ? "" : "s"}, ${ready} ready`);
  state.models = list.data.length;
  state.ready = ready;
  $("api-key").setAttribute("aria-invalid", "false");
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
  // The shortcut reaches here with Send off: no key yet, a refused one, no gateway.
  if (state.models === 0 || !$("model").value) {
    showAnswerError($("send-note").textContent || "There is no model to send to.");
    return;
  }
  const body = requestBody();
  const answer = $("answer");
  answer.replaceChildren();
  // Not done until this answer is: the last one's mark goes with its text.
  delete answer.dataset.done;
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
    if (!state.unreachable) refreshLive(false);
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
  // Each token takes its own text from the front of what waits; what is left (the start
  // of a token still to come) waits on. Where the tokens do not spell the text (a
  // character split across tokens), the text is one piece coloured by the least likely.
  const pieces = [];
  let rest = text;
  for (const t of scored) {
    if (!t.token) continue;
    if (!rest.startsWith(t.token)) {
      const known = scored.map((s) => s.logprob).filter((lp) => typeof lp === "number");
      pieces.splice(0, pieces.length, { text, logprob: known.length ? Math.min(...known) : null });
      rest = "";
      break;
    }
    pieces.push({ text: t.token, logprob: typeof t.logprob === "number" ? t.logprob : null });
    rest = rest.slice(t.token.length);
  }
  for (const piece of pieces) showPiece(piece, at);
  if (rest) run.unscored.push(showPiece({ text: rest, logprob: null, pending: true }, at));
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

/** One refresh; `fromLoop`: the live loop's own, whose failures lengthen its back-off. */
async function refreshLive(fromLoop) {
  let stats;
  try {
    stats = await getJson("/stats");
  } catch (error) {
    if (error instanceof Unreachable) unreachable(error.message, fromLoop);
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
  showReplicas(stats);
  showShadows(stats);
  const rows = $("records").querySelector("tbody");
  rows.replaceChildren();
  for (const doc of stats.records) {
    const llm = doc.llm || {};
    const gen = doc.gen_ai || {};
    rows.append(row([
      doc["@timestamp"] ? new Date(doc["@timestamp"]).toLocaleTimeString() : "",
      (gen.request || {}).model || "",
      // The error's type where it says more than the outcome ("cancelled" twice does not).
      (llm.status || "–") + (doc.error && doc.error.type && doc.error.type !== llm.status ? " · " + doc.error.type : ""),
      gen.usage ? String(gen.usage.output_tokens ?? "–") : "",
      ms(llm.ttft_ms),
      fixed(llm.tpot_ms),
      ((gen.response || {}).finish_reasons || []).join(", "),
      llm.prompt_excerpt === undefined ? "–" : String(llm.prompt_excerpt),
    ]));
  }
}

/** A table row of `values`, as text. */
function row(values) {
  const tr = document.createElement("tr");
  for (const value of values) {
    const td = document.createElement("td");
    td.textContent = value;
    tr.append(td);
  }
  return tr;
}

/**
 * Each replica of an upstream model served by several: its routing state now (why it is
 * out, and for how long), what this gateway has in flight there, and what it served in
 * the window. Hidden while no model has replicas.
 */
function showReplicas(stats) {
  const upstreams = stats.upstreams || [];
  const many = upstreams.filter((u) => u.endpoints.length > 1 || u.endpoints.some((e) => e.state !== "up"));
  $("replicas").hidden = many.length === 0;
  const rows = $("replica-table").querySelector("tbody");
  rows.replaceChildren();
  for (const upstream of many) {
    for (const e of upstream.endpoints) {
      const seen = (stats.endpoints || {})[e.endpoint] || { served: 0, failed_attempts: 0, ttft_ms: {}, tpot_ms: {} };
      const out = e.back_in_secs != null ? `, back in ${fixed(e.back_in_secs, 0)} s` : "";
      const tr = row([
        `${upstream.model} (${upstream.policy})`,
        e.endpoint,
        e.state + (e.reason ? ` · ${e.reason}` : "") + out + (e.canary && e.canary.drifting ? " · drifting" : ""),
        String(e.outstanding),
        String(seen.served),
        String(seen.failed_attempts),
        `${ms(seen.ttft_ms.p50)} / ${ms(seen.ttft_ms.p95)}`,
        `${fixed(seen.tpot_ms.p50)} / ${fixed(seen.tpot_ms.p95)}`,
      ]);
      tr.dataset.state = e.state;
      rows.append(tr);
    }
  }
}

/**
 * Each shadowed model and its candidate: the pairs compared and, per figure, the
 * candidate's difference with its interval and the verdict. Hidden while nothing is
 * shadowed.
 */
function showShadows(stats) {
  const shadows = stats.shadows || [];
  $("shadows").hidden = shadows.length === 0;
  const rows = $("shadow-table").querySelector("tbody");
  rows.replaceChildren();
  for (const pair of shadows) {
    for (const f of pair.figures) {
      const interval = f.ci_low == null ? "–" : `${fixed(f.ci_low, 3)} … ${fixed(f.ci_high, 3)}`;
      const tr = row([
        `${pair.primary} → ${pair.candidate}`,
        String(pair.compared),
        `${pair.identical} / ${pair.different} / ${pair.failed}`,
        f.figure,
        f.difference == null ? "–" : `${fixed(f.difference, 3)} (${f.statistic})`,
        interval,
        f.verdict.replaceAll("_", " "),
      ]);
      tr.dataset.verdict = f.verdict;
      rows.append(tr);
    }
  }
}

/**
 * The gateway did not answer: say so where the model count stood, mark the live figures
 * as stale (they are the last ones seen) and ask less often, up to every RETRY_MAX_MS.
 */
function unreachable(message, fromLoop = true) {
  if (!state.unreachable) state.liveDelay = LIVE_EVERY_MS;
  else if (fromLoop) state.liveDelay = Math.min(2 * state.liveDelay, RETRY_MAX_MS);
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
    try {
      if (document.visibilityState === "visible" || state.unreachable) await refreshLive(true);
    } finally {
      if (state.liveLoop === loop) state.liveTimer = setTimeout(tick, state.liveDelay);
    }
  };
  // Unreachable already (the first listing failed): the first retry after its delay.
  state.liveTimer = setTimeout(tick, state.unreachable ? state.liveDelay : 0);
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
    if (error.message === "unauthorised") return; // the key form asks
    if (error instanceof Unreachable) unreachable(error.message);
    else setStatus("could not list the models: " + error.message);
    // Not up yet, gone, or failing: the live view keeps trying and lists the models
    // once the gateway answers.
    $("key-form").hidden = !state.key;
    startLive();
    return;
  }
  $("key-form").hidden = !state.key;
  startLive();
}

drawTimeline({ tokens: [], end: 0 });
new ResizeObserver(() => drawTimeline(state.last || { tokens: [], end: 0 })).observe($("timeline"));
start();
