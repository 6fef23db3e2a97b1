// Drives the system's Chromium (playwright-core, pinned in package.json) through the
// dashboard as a person would: the sign-in form (a wrong key, then the right one), the
// charts filling with data. Prints one JSON line for tests/origin/dashboard/test_dashboard.py.
// Usage: node dashboard_browser.mjs ADMIN_URL ADMIN_KEY SCREENSHOT_PATH
import { chromium } from "playwright-core";

const [adminUrl, adminKey, screenshot] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
try {
  const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
  let problems = [];
  page.on("console", (m) => { if (m.type() === "error") problems.push(m.text()); });
  page.on("pageerror", (e) => problems.push(String(e)));

  const first = await page.goto(adminUrl + "/dashboard");
  const signIn = { status: first.status(), form: await page.isVisible("input#key") };

  await page.fill("#key", "not-the-admin-key-at-all");
  const [wrongResponse] = await Promise.all([page.waitForNavigation(), page.click("button")]);
  const wrong = { status: wrongResponse.status(), message: await page.textContent(".error") };

  problems = []; // the 401s above are logged as console errors by design
  await page.fill("#key", adminKey);
  const [rightResponse] = await Promise.all([page.waitForNavigation(), page.click("button")]);
  const right = { status: rightResponse.status(), url: page.url() };

  await page.waitForFunction(() => {
    const s = window.prismDashboard;
    const chart = s && s.charts["chart-requests"];
    return chart && chart.plot.data[0].length > 1 && s.updates >= 2;
  }, null, { timeout: 30000 });
  await page.waitForTimeout(300); // uPlot draws on the next animation frame

  const charts = await page.evaluate(() => {
    const out = {};
    for (const [id, chart] of Object.entries(window.prismDashboard.charts)) {
      const canvas = document.querySelector("#" + id + " canvas");
      const ctx = canvas.getContext("2d");
      const pixels = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
      let painted = 0;
      for (let i = 3; i < pixels.length; i += 4) if (pixels[i] !== 0) painted++;
      out[id] = {
        points: chart.plot.data[0].length,
        series: chart.plot.series.slice(1).map((s) => s.label),
        numbers: chart.plot.data.slice(1).map((col) => col.filter((v) => v != null && v > 0).length),
        painted: painted,
        width: canvas.width,
      };
    }
    return out;
  });
  const tables = {
    providers: await page.$$eval("#providers tbody tr", (rows) => rows.map((r) => r.innerText)),
    projects: await page.$$eval("#projects tbody tr", (rows) => rows.map((r) => r.innerText)),
  };
  const cookies = (await page.context().cookies()).map((c) => ({
    name: c.name, httpOnly: c.httpOnly, sameSite: c.sameSite, path: c.path,
  }));
  await page.screenshot({ path: screenshot });
  console.log(JSON.stringify({ signIn, wrong, right, charts, tables, cookies, problems }));
} finally {
  await browser.close();
}
