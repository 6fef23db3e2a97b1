// The request log's walkthrough on the dashboard's Requests page, in the system's Chromium
// (playwright-core): sign in, open Requests, read each row's cells as a person sees them,
// then open each of the walkthrough's requests and read its stages. Prints one JSON line
// for tests/deploy/test_request_log_walkthrough.py.
// Usage: node walkthrough_browser.mjs ADMIN_URL ADMIN_KEY SCREENSHOT_PATH ID [ID ...]
import { chromium } from "playwright-core";

const [adminUrl, adminKey, screenshot, ...ids] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 900 } });
  await page.goto(adminUrl + "/dashboard");
  const problems = []; // from here on: the sign-in page's 401 is logged by design
  page.on("console", (m) => { if (m.type() === "error") problems.push(m.text()); });
  page.on("pageerror", (e) => problems.push(String(e)));
  await page.fill("#key", adminKey);
  await Promise.all([page.waitForNavigation(), page.click("button")]);

  await page.click("#tab-requests");
  await page.fill("input[name=limit]", "200");
  await page.click("#requests-search");
  await page.waitForFunction((want) => {
    const s = window.prismRequests;
    return s && want.every((id) => s.rows.includes(id));
  }, ids, { timeout: 15000 });
  const headers = await page.$$eval("#requests thead th", (cells) => cells.map((c) => c.textContent));
  const rows = {};
  for (const id of ids) {
    const cells = await page.$$eval(`#requests tbody tr[data-id='${id}'] td`, (tds) => tds.map((td) => td.textContent));
    rows[id] = Object.fromEntries(headers.map((name, i) => [name, cells[i]]));
  }
  const stages = {};
  for (const id of ids) {
    await page.click(`#requests tbody tr[data-id='${id}']`);
    await page.waitForFunction((want) => window.prismRequests.detail === want, id, { timeout: 15000 });
    stages[id] = await page.$$eval(".stage-bar", (bars) => bars.map((b) => b.dataset.stage));
  }
  await page.screenshot({ path: screenshot, fullPage: true });
  const counts = await page.$$eval("#requests tbody tr[data-id]", (trs) => trs.map((tr) => tr.dataset.id));
  console.log(JSON.stringify({ rows, stages, listed: counts, problems }));
} finally {
  await browser.close();
}
