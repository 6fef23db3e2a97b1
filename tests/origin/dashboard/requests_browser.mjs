// Drives the system's Chromium (playwright-core) through the dashboard's Requests page as a
// person would: sign in, open Requests, filter by layer, page with Next and Previous, open
// a request by clicking its row and by its id. Prints one JSON line for
// tests/origin/dashboard/test_requests.py.
// Usage: node requests_browser.mjs ADMIN_URL ADMIN_KEY SCREENSHOT_PATH
import { chromium } from "playwright-core";

const [adminUrl, adminKey, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  await page.goto(adminUrl + "/dashboard");
  const problems = []; // from here on: the sign-in page's 401 is logged by design
  page.on("console", (m) => { if (m.type() === "error") problems.push(m.text()); });
  page.on("pageerror", (e) => problems.push(String(e)));
  page.on("response", (r) => { if (r.status() >= 400) problems.push(r.status() + " " + r.url()); });
  await page.fill("#key", adminKey);
  await Promise.all([page.waitForNavigation(), page.click("button")]);

  let loads = 0;
  async function loaded() {
    loads += 1;
    await page.waitForFunction((n) => window.prismRequests.loads >= n, loads, { timeout: 15000 });
    return page.evaluate(() => window.prismRequests.rows.slice());
  }
  async function opened(id) {
    await page.waitForFunction((want) => window.prismRequests.detail === want, id, { timeout: 15000 });
  }

  await page.click("#tab-requests");
  const all = await loaded();

  await page.selectOption("select[name=layer]", "miss");
  await page.click("#requests-search");
  const misses = await loaded();

  await page.selectOption("select[name=layer]", "redis");
  await page.fill("input[name=limit]", "5");
  await page.click("#requests-search");
  const pages = [await loaded()];
  await page.click("#requests-next");
  pages.push(await loaded());
  const nextDisabled = await page.isDisabled("#requests-next");
  await page.click("#requests-previous");
  const previous = await loaded();

  await page.selectOption("select[name=layer]", "");
  await page.fill("input[name=limit]", "50");
  await page.click("#requests-search");
  await loaded();
  await page.click("#requests tbody tr[data-id='rp-beta-miss']");
  await opened("rp-beta-miss");
  const detail = await page.evaluate(() => ({
    id: document.getElementById("detail-id").textContent,
    stages: [...document.querySelectorAll(".stage-bar")].map((b) => b.dataset.stage),
    stageWidths: [...document.querySelectorAll(".stage-bar")].map((b) => b.getBoundingClientRect().width),
    attempts: [...document.querySelectorAll("#detail-attempts tbody tr")].map((r) => r.innerText),
    request: document.getElementById("detail-request").textContent,
    response: document.getElementById("detail-response").textContent,
    facts: document.getElementById("detail-facts").innerText,
  }));
  const injected = await page.evaluate(() => document.getElementById("injected") !== null);
  await page.locator("#request-detail").scrollIntoViewIfNeeded();
  await page.screenshot({ path: screenshot });

  await page.fill("input[name=id]", "rp-miss-2");
  await page.click("#request-open");
  await opened("rp-miss-2");
  const byId = await page.textContent("#detail-id");
  const errors = await page.evaluate(() => window.prismRequests.errors);
  console.log(JSON.stringify({ all, misses, pages, nextDisabled, previous, detail, injected, byId, errors, problems }));
} finally {
  await browser.close();
}
