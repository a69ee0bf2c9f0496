// llmgate's built-in page, its drawings: the timeline of an answer (each token or chunk
// at its arrival), the server's figures beside the browser's, and the summary. Loaded
// before page.js, which calls these; both share the page's globals.
"use strict";

const SVG = "http://www.w3.org/2000/svg";

/** A number as text with `digits` decimals; "–" for a figure the server left out (null). */
function fixed(value, digits = 1) {
  return typeof value === "number" && Number.isFinite(value) ? value.toFixed(digits) : "–";
}

/** A band 0 (unlikely) to 4 (likely) for a log-probability. */
function band(logprob) {
  if (logprob === null || logprob === undefined) return "none";
  const p = Math.exp(logprob);
  return p >= 0.9 ? 4 : p >= 0.6 ? 3 : p >= 0.3 ? 2 : p >= 0.1 ? 1 : 0;
}

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
