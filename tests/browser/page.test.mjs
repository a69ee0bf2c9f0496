// The built-in page in a real browser: Debian's Chromium, driven by playwright-core,
// against the real gateway (target/debug/llmgate) on the default model, with API keys
// on. Screenshots go to target/browser/. Run by scripts/test (docs/page.md).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, mkdirSync, rmSync } from "node:fs";
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

function freePort() {
  return new Promise((resolve) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
  });
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

before(async () => {
  dataDir = mkdtempSync(join(tmpdir(), "llmgate-page-"));
  const keys = join(dataDir, "api-keys");
  key = execFileSync(BINARY, ["keys", "add", "page-test", "--file", keys], { encoding: "utf8" }).trim();
  const port = await freePort();
  base = `http://127.0.0.1:${port}`;
  gateway = spawn(BINARY, [
    "serve", "--listen", `127.0.0.1:${port}`, "--workers", "2",
    "--data-dir", join(dataDir, "data"), "--api-keys-file", keys,
  ], { cwd: ROOT, stdio: ["ignore", "ignore", "inherit"], env: { ...process.env, LLMGATE_LOG: "error" } });
  await waitReady(base, gateway);
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
  if (gateway) {
    gateway.kill("SIGTERM");
    await new Promise((r) => gateway.once("exit", r));
  }
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

/** A page at `width`×`height` that records every request and every console error. */
async function open(width, height, mobile = false) {
  const context = await browser.newContext({ viewport: { width, height }, isMobile: mobile, hasTouch: mobile });
  const page = await context.newPage();
  const seen = { requests: [], errors: [] };
  page.on("request", (r) => seen.requests.push(r.url()));
  page.on("console", (m) => {
    // A refused key is a 401 the browser reports itself; anything else is a defect.
    if (m.type() === "error" && !/status of 401/.test(m.text())) seen.errors.push(m.text());
  });
  page.on("pageerror", (e) => seen.errors.push(String(e)));
  const response = await page.goto(base + "/");
  return { context, page, seen, response };
}

async function liveRequests(page) {
  return Number(await page.locator("#live").getAttribute("data-requests"));
}

test("the page plays, times each token, refuses a wrong key and shows the live view", async () => {
  const { context, page, seen, response } = await open(1280, 900);
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
  await page.screenshot({ path: join(SHOTS, "wrong-key.png") });

  await page.fill("#api-key", key);
  await page.click("#key-form button[type=submit]");
  await page.locator("#model option").first().waitFor({ state: "attached" });
  await page.locator("#live[data-requests]").waitFor({ state: "attached" });
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
  // Tokens are coloured by their log-probability.
  assert.ok(await page.locator("#answer .tok:not(.band-none)").count() > 0);

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
  await page.screenshot({ path: join(SHOTS, "phone.png"), fullPage: true });
  assert.deepEqual(seen.errors, []);
  await context.close();
});
