// The built-in page in a real browser: Debian's Chromium, driven by playwright-core,
// against the real gateway (target/debug/llmgate) on the default model, with API keys
// on. Screenshots go to target/browser/. Run by scripts/test (docs/page.md).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, dirname } from "node:path";
import { fileURLToPath } from "node:url";
import { chromium } from "playwright-core";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const BINARY = join(ROOT, "target", "debug", "llmgate");
const SHOTS = join(ROOT, "target", "browser");
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const PROMPT = "My address is jane.doe@example.com. What is the capital of France?";

let gateway, base, key, browser, dataDir;

/** `count` distinct free ports: each listener stays open until all are chosen, so two
 * calls cannot be handed the same port (CI once gave a gateway its upstream's). */
async function freePorts(count) {
  const servers = await Promise.all(Array.from({ length: count }, () => new Promise((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => resolve(server));
  })));
  const ports = servers.map((server) => server.address().port);
  await Promise.all(servers.map((server) => new Promise((resolve) => server.close(resolve))));
  return ports;
}

async function freePort() {
  return (await freePorts(1))[0];
}

// Every process a test starts, stopped in `after` whatever failed: one left running keeps
// node's event loop alive, and CI once waited 65 minutes on a scripted upstream a failed
// test had not stopped.
const children = new Set();

/** `spawn` for the binary, remembered in `children`. */
function start(args, options) {
  const proc = spawn(BINARY, args, { cwd: ROOT, stdio: ["ignore", "ignore", "inherit"], ...options });
  children.add(proc);
  proc.once("exit", () => children.delete(proc));
  return proc;
}

async function waitReady(url, proc) {
  const deadline = Date.now() + 180_000;
  while (Date.now() < deadline) {
    if (proc.exitCode !== null) throw new Error(`the gateway exited with ${proc.exitCode}`);
    try {
      const r = await fetch(url + "/ready");
      if (r.status === 200) return;
    } catch (_) { /* not listening yet */ }
    await new Promise((r) => setTimeout(r, 300));
  }
  throw new Error("the gateway did not become ready");
}

/** The gateway on the default model at `port`, ready; `extra` are more `serve` flags. */
async function startGateway(port, data, extra = []) {
  const proc = start([
    "serve", "--listen", `127.0.0.1:${port}`, "--workers", "2", "--data-dir", data, ...extra,
  ], { env: { ...process.env, LLMGATE_LOG: "error" } });
  await waitReady(`http://127.0.0.1:${port}`, proc);
  return proc;
}

/** Sends `signal` to `proc` (a gateway or an upstream) and waits for it to exit. */
async function stopProcess(proc, signal = "SIGTERM") {
  if (proc.exitCode !== null || proc.signalCode !== null) return;
  const exited = new Promise((r) => proc.once("exit", r));
  proc.kill(signal);
  await exited;
}

before(async () => {
  dataDir = mkdtempSync(join(tmpdir(), "llmgate-page-"));
  const keys = join(dataDir, "api-keys");
  key = execFileSync(BINARY, ["keys", "add", "page-test", "--file", keys], { encoding: "utf8" }).trim();
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  gateway = await startGateway(port, join(dataDir, "data"), ["--api-keys-file", keys]);
  mkdirSync(SHOTS, { recursive: true });
  browser = await chromium.launch({
    executablePath: CHROMIUM,
    headless: true,
    // Root in CI has no user namespace for the sandbox; the rest keep Chromium off the
    // network (this machine's is closed) and quiet.
    args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync"],
  });
});

after(async () => {
  if (browser) await browser.close();
  if (gateway) await stopProcess(gateway);
  await Promise.all([...children].map((proc) => stopProcess(proc, "SIGKILL")));
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

/** A page at `width`×`height` that records every request and every console error. */
async function open(width, height, mobile = false, at = base) {
  const context = await browser.newContext({ viewport: { width, height }, isMobile: mobile, hasTouch: mobile });
  const page = await context.newPage();
  const seen = { requests: [], errors: [] };
  page.on("request", (r) => seen.requests.push(r.url()));
  page.on("console", (m) => {
    // A refused key is a 401 the browser reports itself; anything else is a defect.
    if (m.type() === "error" && !/status of 401/.test(m.text())) seen.errors.push(m.text());
  });
  page.on("pageerror", (e) => seen.errors.push(String(e)));
  const response = await page.goto(at + "/");
  return { context, page, seen, response };
}

async function liveRequests(page) {
  return Number(await page.locator("#live").getAttribute("data-requests"));
}

async function useKey(page) {
  await page.locator("#key-form").waitFor({ state: "visible" });
  await page.fill("#api-key", key);
  await page.press("#api-key", "Enter");
  await page.locator("#model option").first().waitFor({ state: "attached" });
}

/** Runs `body` on a desktop-sized page with the API key entered, then checks the page
 * logged no error and closes it. */
async function withKeyedPage(body) {
  const { context, page, seen } = await open(1366, 900);
  await useKey(page);
  await body({ page, seen });
  assert.deepEqual(seen.errors, []);
  await context.close();
}

/** Sends the form with the given fields (ids to values; logprobs: true or false). */
async function ask(page, fields) {
  for (const [id, value] of Object.entries(fields)) {
    if (id === "logprobs") await page.setChecked("#logprobs", value);
    else await page.fill("#" + id, String(value));
  }
  await page.click("#send");
}

/** Makes the page's chat requests run to their max-tokens (vLLM's `ignore_eos`, which the
 * gateway honours): where the model's end token, or the degeneration guard, would end a
 * greedy answer moves with the CPU's floating point, and a test that needs a long answer
 * (one still running when it is stopped, one that outgrows its box) must get one. */
async function toMaxTokens(page) {
  await page.route("**/v1/chat/completions", (route) => {
    const body = JSON.parse(route.request().postData() || "{}");
    return route.continue({ postData: JSON.stringify({ ...body, ignore_eos: true }) });
  });
}

async function answered(page) {
  await page.locator("#answer[data-done=true]").waitFor({ timeout: 120_000 });
}

/** Every text of the timeline inside its box, drawn one unit a pixel (not stretched). */
async function timelineTextFits(page) {
  return page.evaluate(() => {
    const svg = document.getElementById("timeline");
    const box = svg.getBoundingClientRect();
    const m = svg.getScreenCTM();
    const outside = [...svg.querySelectorAll("text")].map((t) => [t.textContent, t.getBoundingClientRect()])
      .filter(([, r]) => r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5 || r.bottom > box.bottom + 0.5)
      .map(([text]) => text);
    return { outside, scaleX: m.a, scaleY: m.d };
  });
}

test("the page plays, times each token, refuses a wrong key and shows the live view", async () => {
  const { context, page, seen, response } = await open(1366, 900);
  const csp = response.headers()["content-security-policy"];
  assert.match(csp, /default-src 'none'/);
  assert.match(csp, /script-src 'self'/);
  assert.match(csp, /connect-src 'self'/);

  // Keys are on: the page asks for one, and a wrong one is refused.
  await page.locator("#key-form").waitFor({ state: "visible" });
  assert.equal(await page.locator("#model option").count(), 0);
  await page.fill("#api-key", "llmgate-not-a-key");
  await page.press("#api-key", "Enter");
  await page.locator("#gateway-status", { hasText: "refused" }).waitFor();
  assert.equal(await page.locator("#model option").count(), 0, "no models without a valid key");
  // Send is off and says why, instead of doing nothing.
  assert.equal(await page.locator("#send").isDisabled(), true);
  assert.match(await page.locator("#send-note").textContent(), /key was refused/);
  assert.equal(await page.getAttribute("#api-key", "aria-invalid"), "true");
  assert.equal(await page.getAttribute("#api-key", "placeholder"), "llmgate-…");
  await page.screenshot({ path: join(SHOTS, "wrong-key.png") });

  await page.fill("#api-key", key);
  await page.click("#key-form button[type=submit]");
  await page.locator("#model option").first().waitFor({ state: "attached" });
  await page.locator("#live[data-requests]").waitFor({ state: "attached" });
  assert.equal(await page.locator("#send").isEnabled(), true);
  assert.equal(await page.locator("#send-note").isHidden(), true);
  assert.equal(await page.locator("#send kbd").first().isVisible(), true, "the shortcut, on a laptop");
  // The default model's defaults (docs/defaults.md), from /v1/models.
  assert.equal(await page.getAttribute("#temperature", "placeholder"), "default 0.7");
  assert.equal(await page.getAttribute("#max-tokens", "placeholder"), "default 512");
  const before = await liveRequests(page);

  // A prompt, sent with the keyboard: seed, temperature, budget and logprobs set.
  await page.fill("#prompt", PROMPT);
  await page.fill("#temperature", "0.7");
  await page.fill("#seed", "42");
  await page.fill("#max-tokens", "24");
  await page.check("#logprobs");
  await page.focus("#prompt");
  await page.keyboard.press("Control+Enter");
  await page.locator("#answer[data-done=true]").waitFor({ timeout: 120_000 });
  assert.equal(await page.locator("#answer-error").isHidden(), true, await page.locator("#answer-error").textContent());
  const streamed = await page.locator("#answer").textContent();

  // The API, asked the same without streaming, answers the same text.
  const api = await fetch(base + "/v1/chat/completions", {
    method: "POST",
    headers: { "content-type": "application/json", authorization: `Bearer ${key}` },
    body: JSON.stringify({
      model: await page.locator("#model").inputValue(),
      messages: [{ role: "user", content: PROMPT }],
      temperature: 0.7, seed: 42, max_tokens: 24, logprobs: true,
    }),
  }).then((r) => r.json());
  assert.ok(streamed.length > 0, "an answer streamed in");
  assert.equal(streamed, api.choices[0].message.content);

  // One timeline mark per output token, in time order, after a TTFT mark.
  const marks = await page.locator("#timeline .mark").evaluateAll((ls) => ls.map((l) => Number(l.dataset.at)));
  assert.equal(marks.length, api.usage.completion_tokens);
  assert.deepEqual(marks, [...marks].sort((a, b) => a - b));
  assert.equal(await page.locator("#timeline .ttft").count(), 1);
  assert.equal(await page.locator("#timeline .itl").count(), marks.length - 1);
  // The server's figures beside the browser's; the finish reason and repetition rate.
  const ttftRow = await page.locator("#figures tbody tr", { hasText: "TTFT" }).locator("td").allTextContents();
  assert.ok(ttftRow.every((v) => Number(v) > 0), `TTFT: ${ttftRow}`);
  assert.equal(await page.locator("[data-figure=finish-reason]").textContent(), api.choices[0].finish_reason);
  assert.match(await page.locator("[data-figure=repetition-rate]").textContent(), /^\d\.\d{3}$/);
  // Tokens are coloured by their log-probability, every one of them.
  assert.ok(await page.locator("#answer .tok:not(.band-none)").count() > 0);
  assert.equal(await page.locator("#answer .tok.band-none").count(), 0);
  // The timeline's labels keep their shape and stay inside it.
  const fit = await timelineTextFits(page);
  assert.deepEqual(fit.outside, [], "labels cut at the timeline's edge");
  assert.ok(Math.abs(fit.scaleX - fit.scaleY) < 1e-6, `stretched: ${fit.scaleX} × ${fit.scaleY}`);
  assert.match(await page.locator("#figures-note").textContent(), /chunks/);

  // The live view moves, and its records are redacted.
  const deadline = Date.now() + 15_000;
  while ((await liveRequests(page)) <= before && Date.now() < deadline) await page.waitForTimeout(250);
  assert.ok((await liveRequests(page)) > before, "the live view counted the request");
  await page.locator("#records tbody tr").first().waitFor();
  const records = await page.locator("#records").textContent();
  assert.match(records, /<EMAIL>/);
  assert.doesNotMatch(records, /jane\.doe@example\.com/);
  assert.doesNotMatch(await page.content(), /jane\.doe@example\.com<\/td>/);

  await page.screenshot({ path: join(SHOTS, "laptop.png"), fullPage: true });
  assert.deepEqual(seen.requests.filter((u) => !u.startsWith(base + "/")), [], "nothing from another origin");
  assert.deepEqual(seen.errors, []);
  await context.close();
});

test("the page fits a phone's width and is usable with the keyboard", async () => {
  const { context, page, seen } = await open(390, 844, true);
  await page.locator("#key-form").waitFor({ state: "visible" });
  await page.fill("#api-key", key);
  await page.keyboard.press("Enter");
  await page.locator("#model option").first().waitFor({ state: "attached" });
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than the phone`);
  // Tab from the message box reaches the send button through the settings.
  await page.focus("#prompt");
  const order = [];
  for (let i = 0; i < 8; i++) {
    await page.keyboard.press("Tab");
    order.push(await page.evaluate(() => document.activeElement.id));
  }
  assert.ok(order.includes("temperature") && order.includes("send"), order.join(" "));
  // No keyboard shortcut offered on a touch screen.
  assert.equal(await page.locator("#send kbd").first().isVisible(), false);
  await page.screenshot({ path: join(SHOTS, "phone.png"), fullPage: true });
  assert.deepEqual(seen.errors, []);
  await context.close();
});

test("a figure the server leaves out shows as – and the table keeps its rows", () => withKeyedPage(async ({ page, seen }) => {
  // One token: no TPOT (it needs two), so its record says "tpot_ms": null.
  await ask(page, { prompt: "Say hi.", "max-tokens": 1 });
  await answered(page);
  // The record is written as the request ends, a moment after the answer's last frame.
  let newest;
  for (const deadline = Date.now() + 10_000; Date.now() < deadline; await page.waitForTimeout(200)) {
    const stats = await fetch(base + "/stats", { headers: { authorization: `Bearer ${key}` } }).then((r) => r.json());
    newest = stats.records[0];
    if (newest && newest.gen_ai.usage && newest.gen_ai.usage.output_tokens === 1) break;
  }
  assert.equal(newest.gen_ai.usage.output_tokens, 1, JSON.stringify(newest));
  assert.equal(newest.llm.tpot_ms, null, "the newest record has no TPOT");
  // The newest row is the one-token answer's, once a refresh has shown it.
  await page.locator("#records tbody tr").first().locator("td:nth-child(4)", { hasText: /^1$/ }).waitFor({ timeout: 10_000 });
  const first = await page.locator("#records tbody tr").first().locator("td").allTextContents();
  assert.equal(first[5], "–", `TPOT of the one-token answer: ${first}`);
  assert.equal(await page.locator("#figures tbody tr", { hasText: "TPOT" }).locator("td").first().textContent(), "–");
}));

test("Stop ends an answer quietly, and the record says cancelled once", () => withKeyedPage(async ({ page, seen }) => {
  await toMaxTokens(page);
  await ask(page, { prompt: "Write a long story about a lighthouse keeper.", "max-tokens": 400 });
  await page.locator("#answer .tok").nth(4).waitFor({ timeout: 120_000 });
  assert.equal(await page.locator("#send").isDisabled(), true, "no second send while one runs");
  await page.click("#stop");
  await answered(page);
  assert.equal(await page.locator("#answer-error").isHidden(), true, "stopping is not an error");
  assert.equal(await page.locator("#send").isEnabled(), true);
  assert.equal(await page.locator("#stop").isDisabled(), true);
  const marks = await page.locator("#timeline .mark").count();
  assert.ok(marks >= 5 && marks < 400, `${marks} marks`);
  const row = page.locator("#records tbody tr", { hasText: "cancelled" }).first();
  await row.waitFor({ timeout: 15_000 });
  const outcome = (await row.locator("td").allTextContents())[2];
  assert.equal(outcome, "cancelled", "the outcome says it once");
}));

test("without log-probabilities a mark is a chunk; a long answer scrolls in its box", () => withKeyedPage(async ({ page, seen }) => {
  await toMaxTokens(page);
  await ask(page, { prompt: "Write a long essay about the history of Rome.", "max-tokens": 400, temperature: 0, logprobs: false });
  await answered(page);
  assert.equal(await page.locator("#answer-error").isHidden(), true, await page.locator("#answer-error").textContent());
  const marks = await page.locator("#timeline .mark").count();
  const out = Number(await page.locator("#figures tbody tr", { hasText: "output tokens" }).locator("td").first().textContent());
  assert.ok(marks > 0 && marks <= out, `${marks} chunks for ${out} tokens`);
  assert.match(await page.getAttribute("#timeline", "aria-label"), /chunks over/);
  assert.equal(await page.locator("#answer .tok:not(.band-none)").count(), 0, "nothing to colour by");
  // The answer box stops growing and follows the text; the timeline stays in view below.
  const box = await page.evaluate(() => {
    const a = document.getElementById("answer");
    const rem = parseFloat(getComputedStyle(document.documentElement).fontSize);
    return { height: a.getBoundingClientRect().height, rem, scroll: a.scrollHeight, client: a.clientHeight, top: a.scrollTop };
  });
  assert.ok(box.height <= 23 * box.rem, `the answer is ${box.height}px high`);
  assert.ok(box.scroll > box.client, "the answer is longer than its box (a longer answer needed)");
  assert.ok(box.scroll - box.top - box.client < 2, "scrolled to the end of the answer");
  await page.screenshot({ path: join(SHOTS, "long-answer.png") });
}));

test("text that comes before its token is coloured when the token arrives", () => withKeyedPage(async ({ page, seen }) => {
  // A stream as the server sends one with stop sequences: the text "Hel" is held for its
  // token "Hello", which comes with the next chunk; the end-of-text token has no text.
  const chunk = (delta, logprobs, extra = {}) => "data: " + JSON.stringify({
    id: "x", object: "chat.completion.chunk", created: 0, model: "m",
    choices: [{ index: 0, delta, logprobs: logprobs && { content: logprobs.map(([token, logprob]) => ({ token, logprob, bytes: [], top_logprobs: [] })) }, finish_reason: null, ...extra }],
  }) + "\n\n";
  const body = [
    chunk({ role: "assistant", content: "" }, null),
    chunk({ content: "Hel" }, []),
    chunk({ content: "lo" }, [["Hello", -0.01]]),
    chunk({ content: " world" }, [[" world", -2.5]]),
    chunk({}, [["<|im_end|>", -0.1]], { finish_reason: "stop" }),
    "data: " + JSON.stringify({ id: "x", object: "chat.completion.chunk", created: 0, model: "m", choices: [], usage: { prompt_tokens: 3, completion_tokens: 3, total_tokens: 6 } }) + "\n\n",
    "data: [DONE]\n\n",
  ].join("");
  await page.route("**/v1/chat/completions", (route) => route.fulfill({ status: 200, contentType: "text/event-stream", body }));
  await ask(page, { prompt: "hi" });
  await answered(page);
  assert.equal(await page.locator("#answer").textContent(), "Hello world");
  assert.equal(await page.locator("#timeline .mark").count(), 3, "one mark per token, as usage counts them");
  assert.deepEqual(await page.locator("#answer .tok").evaluateAll((ts) => ts.map((t) => [t.textContent, t.className])),
    [["Hello", "tok band-4"], [" world", "tok band-0"]]);

  // Text held past its token's end: "Hello wor" comes with "Hello" only; " wor" waits
  // for " world", which brings "ld". A log-probability of -inf arrives as null.
  const split = [
    chunk({ role: "assistant", content: "" }, null),
    chunk({ content: "Hello wor" }, [["Hello", -0.01]]),
    chunk({ content: "ld" }, [[" world", -2.5]]),
    chunk({ content: "!" }, [["!", null]]),
    chunk({}, [], { finish_reason: "stop" }),
    "data: [DONE]\n\n",
  ].join("");
  await page.unroute("**/v1/chat/completions");
  await page.route("**/v1/chat/completions", (route) => route.fulfill({ status: 200, contentType: "text/event-stream", body: split }));
  await ask(page, { prompt: "hi" });
  await answered(page);
  assert.deepEqual(await page.locator("#answer .tok").evaluateAll((ts) => ts.map((t) => [t.textContent, t.className])),
    [["Hello", "tok band-4"], [" world", "tok band-0"], ["!", "tok band-none"]]);
}));

test("a proxy's 502 for a gateway that is down is shown unreachable; Ctrl+Enter sends nothing then", async () => {
  const { context, page, seen } = await open(1366, 900);
  await useKey(page);
  // The gateway's own answers carry x-request-id; a proxy's 502 does not.
  await page.route("**/stats", (route) => route.fulfill({ status: 502, contentType: "text/html", body: "<h1>502 Bad Gateway</h1>" }));
  await page.locator("#gateway-status", { hasText: "a proxy answered 502" }).waitFor({ timeout: 10_000 });
  await page.locator("#live[data-stale]").waitFor({ state: "attached" });
  assert.equal(await page.locator("#send").isDisabled(), true);
  const sent = seen.requests.filter((u) => u.endsWith("/v1/chat/completions")).length;
  await page.focus("#prompt");
  await page.keyboard.press("Control+Enter");
  await page.locator("#answer-error", { hasText: "unreachable" }).waitFor();
  assert.equal(seen.requests.filter((u) => u.endsWith("/v1/chat/completions")).length, sent, "nothing sent");
  await page.unroute("**/stats");
  await page.locator("#gateway-status", { hasText: "1 model, 1 ready" }).waitFor({ timeout: 15_000 });
  assert.equal(await page.locator("#send").isEnabled(), true);
  assert.deepEqual(seen.errors.filter((e) => !/status of 502/.test(e)), []);
  await context.close();
});

test("a gateway that goes away mid-answer is shown unreachable, asked less often, and found again", async () => {
  const port = await freePort();
  const at = `http://127.0.0.1:${port}`;
  const data = join(dataDir, "restart");
  let proc = await startGateway(port, data);
  const { context, page, seen } = await open(390, 844, true, at);
  try {
    await page.locator("#model option").first().waitFor({ state: "attached" });
    // Keys are off: no key form, and it takes no room on a phone.
    assert.equal(await page.locator("#key-form").isVisible(), false);
    assert.equal(await page.evaluate(() => getComputedStyle(document.getElementById("key-form")).display), "none");
    await toMaxTokens(page);
    await ask(page, { prompt: "Write a long story about a lighthouse keeper.", "max-tokens": 400 });
    await page.locator("#answer .tok").nth(2).waitFor({ timeout: 120_000 });
    await stopProcess(proc, "SIGKILL");
    await answered(page);
    assert.match(await page.locator("#answer-error").textContent(), /broke off mid-answer/);
    await page.locator("#gateway-status", { hasText: "unreachable" }).waitFor({ timeout: 10_000 });
    await page.locator("#live[data-stale]").waitFor({ state: "attached" });
    assert.equal(await page.locator("#send").isDisabled(), true);
    // Backing off: fewer tries than one every 2 s.
    const tries = () => seen.requests.filter((u) => u.endsWith("/stats")).length;
    const before = tries();
    await page.waitForTimeout(12_000);
    const during = tries() - before;
    assert.ok(during >= 1 && during <= 4, `${during} tries of /stats in 12 s`);
    await page.screenshot({ path: join(SHOTS, "unreachable.png"), fullPage: true });
    proc = await startGateway(port, data);
    await page.locator("#gateway-status", { hasText: "1 model, 1 ready" }).waitFor({ timeout: 60_000 });
    await page.locator("#live:not([data-stale])").waitFor({ state: "attached" });
    assert.equal(await page.locator("#send").isEnabled(), true);
    // The browser reports the broken stream and each refused connection itself; nothing
    // else may fail.
    assert.deepEqual(seen.errors.filter((e) => !/net::ERR_(CONNECTION_REFUSED|EMPTY_RESPONSE|CONNECTION_RESET|INCOMPLETE_CHUNKED_ENCODING)/.test(e)), []);
  } finally {
    await context.close();
    await stopProcess(proc);
  }
});

test("a model on several replicas shows each, the one that is gone out, and where requests went", async () => {
  const [upPort, gonePort, port] = await freePorts(3);
  const upstream = start(["scripted-upstream", "--listen", `127.0.0.1:${upPort}`, "--tokens", "6",
    "--tokens-per-second", "200"]);
  const at = `http://127.0.0.1:${port}`;
  let proc, context;
  try {
    proc = await startGateway(port, join(dataDir, "fleet"), ["--model-id", "fleet", "--upstream-model", "scripted",
      "--upstream-url", `http://127.0.0.1:${upPort}/v1,http://127.0.0.1:${gonePort}/v1`]);
    let page, seen;
    ({ context, page, seen } = await open(1366, 900, false, at));
    await page.locator("#model option").first().waitFor({ state: "attached" });
    for (let i = 0; i < 3; i++) {
      await ask(page, { prompt: `Hello ${i}` });
      await answered(page);
    }
    const table = page.locator("#replica-table tbody tr");
    await page.locator("#replicas").waitFor({ state: "visible", timeout: 10_000 });
    await table.nth(1).waitFor();
    const [up, gone] = [await table.nth(0).locator("td").allTextContents(), await table.nth(1).locator("td").allTextContents()];
    assert.equal(up[1], `http://127.0.0.1:${upPort}/v1`);
    assert.equal(up[2], "up");
    assert.equal(up[0], "fleet (least_outstanding)");
    // The gone one: out since the first probe, and no request was lost to it.
    assert.equal(gone[1], `http://127.0.0.1:${gonePort}/v1`);
    assert.match(gone[2], /^ejected · upstream_unreachable, back in \d+ s$/);
    assert.equal(await table.nth(1).getAttribute("data-state"), "ejected");
    await page.locator("#replica-table tbody tr").first().locator("td:nth-child(5)", { hasText: /^3$/ }).waitFor({ timeout: 10_000 });
    assert.match((await table.nth(0).locator("td").allTextContents())[6], /^\d+ \/ \d+$/, "its TTFT p50 / p95");
    await page.screenshot({ path: join(SHOTS, "replicas.png"), fullPage: true });
    assert.deepEqual(seen.errors, []);
  } finally {
    if (context) await context.close();
    if (proc) await stopProcess(proc);
    await stopProcess(upstream);
  }
});

test("a shadowed model shows its candidate's verdicts, the worse ones marked", async () => {
  const [fastPort, slowPort, port] = await freePorts(3);
  const scripted = (p, extra) => start(["scripted-upstream", "--listen", `127.0.0.1:${p}`, "--tokens", "6",
    "--tokens-per-second", "0", ...extra]);
  const upstreams = [scripted(fastPort, []), scripted(slowPort, ["--first-delay-ms", "40", "--words", "la"])];
  const config = join(dataDir, "shadow.toml");
  writeFileSync(config, [
    "[[models]]", 'id = "current"', 'engine = "upstream"', `url = "http://127.0.0.1:${fastPort}/v1"`,
    'upstream_model = "scripted"', 'shadow = { model = "next", share = 1.0, max_in_flight = 32 }',
    "[[models]]", 'id = "next"', 'engine = "upstream"', `url = "http://127.0.0.1:${slowPort}/v1"`,
    'upstream_model = "scripted"', "",
  ].join("\n"));
  const at = `http://127.0.0.1:${port}`;
  let proc;
  try {
    proc = await startGateway(port, join(dataDir, "shadow"), ["--config", config]);
    for (let i = 0; i < 12; i++) {
      const r = await fetch(`${at}/v1/chat/completions`, {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ model: "current", messages: [{ role: "user", content: `Hello ${i}` }], max_tokens: 6 }),
      });
      assert.equal(r.status, 200);
    }
    const { context, page, seen } = await open(1366, 900, false, at);
    try {
      await page.locator("#shadows").waitFor({ state: "visible", timeout: 10_000 });
      const ttft = page.locator("#shadow-table tbody tr", { hasText: "ttft_ms" });
      await ttft.locator("td:nth-child(2)", { hasText: /^12$/ }).waitFor({ timeout: 10_000 });
      const cells = await ttft.locator("td").allTextContents();
      assert.equal(cells[0], "current → next");
      assert.equal(cells[6], "worse");
      assert.equal(await ttft.getAttribute("data-verdict"), "worse");
      const tokens = await page.locator("#shadow-table tbody tr", { hasText: "completion_tokens" }).locator("td").allTextContents();
      assert.equal(tokens[6], "not distinguishable");
      await page.screenshot({ path: join(SHOTS, "shadows.png"), fullPage: true });
      assert.deepEqual(seen.errors, []);
    } finally {
      await context.close();
    }
  } finally {
    if (proc) await stopProcess(proc);
    for (const u of upstreams) await stopProcess(u);
  }
});

test("the live view has no replicas table for a model in this process", () => withKeyedPage(async ({ page, seen }) => {
  await page.locator("#live-cards .card").first().waitFor();
  assert.equal(await page.locator("#replicas").isHidden(), true);
  assert.equal(await page.locator("#shadows").isHidden(), true);
}));
