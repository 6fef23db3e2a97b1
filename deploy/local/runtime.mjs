// Runs Prism's Workers locally in the pinned Workers runtime (Miniflare 3 / workerd),
// which embeds Pyodide and so runs Python Workers offline.
//
// Usage:
//   node deploy/local/runtime.mjs CONFIG.json   config from a file
//   node deploy/local/runtime.mjs -             config as JSON on stdin (read to EOF)
//
// Config (JSON):
//   {
//     "host": "127.0.0.1",
//     "edge": {"port": 8787, "root": "<staged worker dir>", "entry": "entry.py",
//              "vars": {"NAME": "string", ...}, "kv_binding": "PRISM_KV"} | null,
//     "kv_api": {"port": 8788, "account_id": "local", "api_token": "..."} | null,
//     "extra_workers": [{"name": "floor", "port": 8799, "root": "...", "entry": "entry.py",
//                        "vars": {}, "kv_binding": "PRISM_KV" (optional)}],
//     (edge and extra workers also take "warmup_path": "/..." (optional): a GET
//      sent before "ready", since Python Workers import their modules on the
//      first request; a 5xx answer fails the start)
//     "kv_namespace_id": "prism-local",
//     "kv_namespace_title": "prism-cache",        (optional)
//     "persist_dir": "<dir for KV persistence>",  (optional: in-memory without it)
//     "node_modules": "<dir holding miniflare>",  (optional: normal resolution without it)
//     "compatibility_date": "2024-11-01",         (optional)
//     "compatibility_flags": ["python_workers"]   (optional, Python Workers only)
//   }
// Port 0 picks a free port; the ready line reports the real one.
//
// All Workers run in ONE Miniflare instance, each on its own socket (Miniflare's
// per-worker `unsafeDirectSockets`), and all bind the same KV namespace id, so a
// value the KV REST stand-in writes is read by the edge at once. Python Workers
// get every .py file under `root` as a module, the entry first (else workerd
// fails with "runtime failed to start"); `.js`/`.mjs` entries run as ES modules.
//
// Protocol with the parent: stdout carries exactly one JSON line,
//   {"ready": true, "edge": "http://127.0.0.1:8787",
//    "kv_api": "http://127.0.0.1:8788/client/v4", "extra": {"floor": "http://..."},
//    "timings": {"runtime_ms": 3100, "warmup_ms": {"edge": 40}}}
// or {"ready": false, "error": "..."} followed by exit 1. Everything else (Miniflare
// and workerd logs, Worker console output, uncaught Worker errors) goes to stderr.
// SIGINT, SIGTERM, or EOF on a stdin pipe disposes the runtime (no workerd left
// behind) and exits 0, so the runtime dies with the parent that holds the pipe.

import { fstatSync, readFileSync, readdirSync, statSync } from "node:fs";
import { createRequire } from "node:module";
import net from "node:net";
import path from "node:path";
import readline from "node:readline";
import { fileURLToPath, pathToFileURL } from "node:url";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const DEFAULT_COMPAT_DATE = "2024-11-01";
const PYTHON_FLAGS = ["python_workers"];

// Keep stdout for the one protocol line: Miniflare logs through console.log.
const writeProtocolLine = (obj) => process.stdout.write(JSON.stringify(obj) + "\n");
console.log = (...args) => console.error(...args);
console.info = (...args) => console.error(...args);

function fail(message, code = 1) {
  writeProtocolLine({ ready: false, error: message });
  process.exit(code);
}

function readConfig(arg) {
  if (arg === undefined) fail("usage: node runtime.mjs CONFIG.json | -");
  const text = arg === "-" ? readFileSync(0, "utf8") : readFileSync(arg, "utf8");
  return JSON.parse(text);
}

async function loadMiniflare(nodeModules) {
  if (nodeModules) {
    const require = createRequire(path.join(nodeModules, "noop.js"));
    return import(pathToFileURL(require.resolve("miniflare")).href);
  }
  return import("miniflare");
}

// Every .py file under root, entry first, as Miniflare module descriptors.
function pythonModules(root, entry) {
  const files = [];
  const walk = (dir) => {
    for (const name of readdirSync(dir).sort()) {
      if (name.startsWith(".") || name === "__pycache__" || name === "node_modules") continue;
      const full = path.join(dir, name);
      if (statSync(full).isDirectory()) walk(full);
      else if (name.endsWith(".py")) files.push(full);
    }
  };
  walk(root);
  const entryPath = path.resolve(root, entry);
  if (!files.includes(entryPath)) throw new Error(`entry module ${entryPath} not found`);
  return [entryPath, ...files.filter((f) => f !== entryPath)].map((p) => ({
    type: "PythonModule",
    path: p,
  }));
}

function userWorker(spec, config, kvNamespaceId) {
  const root = path.resolve(spec.root);
  const entry = spec.entry ?? "entry.py";
  const isPython = entry.endsWith(".py");
  const worker = {
    name: spec.name,
    compatibilityDate: config.compatibility_date ?? DEFAULT_COMPAT_DATE,
    compatibilityFlags: isPython ? (config.compatibility_flags ?? PYTHON_FLAGS) : [],
    bindings: { ...(spec.vars ?? {}) },
    unsafeDirectSockets: [{ host: config.host, port: spec.port ?? 0 }],
  };
  if (isPython) {
    worker.modulesRoot = root;
    worker.modules = pythonModules(root, entry);
  } else {
    worker.modulesRoot = root;
    worker.modules = true;
    worker.scriptPath = path.resolve(root, entry);
  }
  if (spec.kv_binding) worker.kvNamespaces = { [spec.kv_binding]: kvNamespaceId };
  return worker;
}

function kvApiWorker(spec, config, kvNamespaceId) {
  return {
    name: "kv_api",
    modules: true,
    // Without an explicit root Miniflare resolves the script against the cwd and
    // fails ("can't use '..'") when started from outside the repo.
    modulesRoot: HERE,
    scriptPath: path.join(HERE, "kv_api.js"),
    compatibilityDate: config.compatibility_date ?? DEFAULT_COMPAT_DATE,
    bindings: {
      ACCOUNT_ID: spec.account_id ?? "local",
      API_TOKEN: spec.api_token ?? "",
      NAMESPACE_ID: kvNamespaceId,
      NAMESPACE_TITLE: config.kv_namespace_title ?? "prism-cache",
    },
    // Namespaces created through the API live in an auxiliary namespace no
    // other Worker binds; their registry too, so both survive restarts.
    kvNamespaces: { KV: kvNamespaceId, KV_AUX: `${kvNamespaceId}--kv-api-aux` },
    durableObjects: { CONTROL: "ControlState" },
    unsafeDirectSockets: [{ host: config.host, port: spec.port ?? 0 }],
  };
}

// Fails early with a clear message when a fixed port is taken (workerd only
// says "runtime failed to start" and prints the bind error on stderr).
async function assertPortFree(host, port, what) {
  if (!port) return;
  await new Promise((resolve) => {
    const probe = net.createServer();
    probe.once("error", (err) => {
      const reason = err.code === "EADDRINUSE" ? "is in use" : `cannot be bound (${err.code})`;
      fail(`port ${port} on ${host} for ${what} ${reason}`);
    });
    probe.listen({ host, port, exclusive: true }, () => probe.close(resolve));
  });
}

// A Python Worker imports its modules on the first request, not at start-up:
// one request makes start-up pay the whole cold start and surfaces import errors.
async function warmUp(url) {
  const res = await fetch(url, {
    headers: { "x-prism-warmup": "1" },
    signal: AbortSignal.timeout(120_000), // the parent's own deadline is usually shorter
  });
  await res.arrayBuffer();
  return res.status;
}

// Sends workerd's output to stderr and remembers bind failures for the error line.
function runtimeStdio(state) {
  return (stdout, stderr) => {
    readline.createInterface(stdout).on("line", (line) => process.stderr.write(line + "\n"));
    readline.createInterface(stderr).on("line", (line) => {
      const m = line.match(/Address already in use; toString\(\) = (\S+)/);
      if (m) state.bindError = `address ${m[1]} is in use`;
      process.stderr.write(line + "\n");
    });
  };
}

async function main() {
  const configArg = process.argv[2];
  const config = readConfig(configArg);
  config.host ??= "127.0.0.1";
  const kvNamespaceId = config.kv_namespace_id ?? "prism-local";
  const { Miniflare, Log, LogLevel } = await loadMiniflare(config.node_modules);

  const workers = [];
  const named = []; // [role, worker name, its config spec]
  if (config.edge) {
    await assertPortFree(config.host, config.edge.port, "the edge worker");
    workers.push(userWorker({ name: "edge", ...config.edge }, config, kvNamespaceId));
    named.push(["edge", "edge", config.edge]);
  }
  if (config.kv_api) {
    await assertPortFree(config.host, config.kv_api.port, "the KV API stand-in");
    workers.push(kvApiWorker(config.kv_api, config, kvNamespaceId));
    named.push(["kv_api", "kv_api"]);
  }
  for (const extra of config.extra_workers ?? []) {
    if (!extra.name || named.some(([, name]) => name === extra.name)) {
      fail(`extra worker needs a unique name other than edge/kv_api, got ${extra.name}`);
    }
    await assertPortFree(config.host, extra.port, `worker ${extra.name}`);
    workers.push(userWorker(extra, config, kvNamespaceId));
    named.push(["extra", extra.name, extra]);
  }
  if (workers.length === 0) fail("nothing to run: edge, kv_api and extra_workers are all empty");

  const state = { bindError: null };
  const began = performance.now(); // the runtime starts in the constructor
  const mf = new Miniflare({
    host: config.host,
    port: 0, // Miniflare's own entry socket; every Worker has its direct socket.
    verbose: true, // else uncaught errors inside a Worker are never shown
    log: new Log(LogLevel.INFO),
    handleRuntimeStdio: runtimeStdio(state),
    cf: false, // no fetch of the real Request.cf (offline); a placeholder is used
    kvPersist: config.persist_dir ? path.resolve(config.persist_dir) : false,
    workers,
  });

  let disposing = null;
  const shutdown = (code) => {
    disposing ??= mf
      .dispose()
      .catch(() => {}) // a runtime that never started has nothing left to dispose
      .finally(() => process.exit(code));
    return disposing;
  };
  // Miniflare (via exit-hook) installs SIGINT/SIGTERM handlers that SIGKILL
  // workerd without waiting and exit with 130/143, leaving an unreaped workerd
  // behind; replace them with a dispose that waits. Its exit hook stays as a
  // last resort for unexpected exits.
  process.removeAllListeners("SIGINT");
  process.removeAllListeners("SIGTERM");
  process.on("SIGINT", () => shutdown(0));
  process.on("SIGTERM", () => shutdown(0));
  // A pipe on stdin belongs to the parent: its EOF means the parent is gone.
  // (With config on stdin, or a terminal / /dev/null there, do not watch.)
  if (configArg !== "-") {
    const st = (() => {
      try {
        return fstatSync(0);
      } catch {
        return null;
      }
    })();
    if (st !== null && (st.isFIFO() || st.isSocket())) {
      process.stdin.on("end", () => shutdown(0));
      process.stdin.on("error", () => shutdown(0));
      process.stdin.resume();
    }
  }

  try {
    await mf.ready;
    const timings = { runtime_ms: Math.round(performance.now() - began), warmup_ms: {} };
    const urls = {};
    const extra = {};
    for (const [role, name, spec] of named) {
      const url = (await mf.unsafeGetDirectURL(name)).href.replace(/\/$/, "");
      if (role === "extra") extra[name] = url;
      else urls[role] = role === "kv_api" ? url + "/client/v4" : url;
      if (spec?.warmup_path) {
        const t0 = performance.now();
        const status = await warmUp(url + spec.warmup_path);
        timings.warmup_ms[name] = Math.round(performance.now() - t0);
        if (status >= 500) {
          // Let workerd's traceback reach stderr before the parent reads it.
          await new Promise((r) => setTimeout(r, 300));
          throw new Error(
            `worker ${name} answered the warm-up request ${spec.warmup_path} with ${status}` +
              " (an import error or an uncaught exception: the traceback is on stderr)",
          );
        }
      }
    }
    writeProtocolLine({
      ready: true,
      edge: urls.edge ?? null,
      kv_api: urls.kv_api ?? null,
      extra,
      timings,
    });
  } catch (err) {
    const reason = state.bindError ?? err?.message ?? String(err);
    writeProtocolLine({ ready: false, error: reason });
    await shutdown(1);
  }
}

main().catch((err) => {
  fail(`runtime launcher failed: ${err?.stack ?? err}`);
});
