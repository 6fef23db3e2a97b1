// A local stand-in for the Cloudflare Workers KV REST API, served at /client/v4.
//
// It runs as a JavaScript Worker next to the Prism edge in the same Miniflare
// instance and writes through a real KV binding, so what the origin's KV writer
// PUTs here the edge reads at once. Only what Prism and its tests call is
// implemented, with Cloudflare's response envelope and KV error codes:
//
//   GET    /client/v4/accounts/{a}/storage/kv/namespaces        list   (prism deploy edge)
//   POST   /client/v4/accounts/{a}/storage/kv/namespaces        create (prism deploy edge)
//   PUT    .../namespaces/{ns}/bulk                              write up to 10,000 pairs (the KV writer)
//   PUT    .../namespaces/{ns}/values/{url-encoded key}          one raw value (prism keys: revocations)
//   GET    .../namespaces/{ns}/values/{url-encoded key}          one value, raw bytes (tests)
//   POST   .../namespaces/{ns}/bulk/delete                       delete up to 10,000 keys (tests)
//   GET    .../namespaces/{ns}/keys?prefix=&limit=&cursor=       list keys (tests)
//
// Test controls, outside the Cloudflare API and never authenticated or counted:
//
//   POST /_control/faults {status, count, retry_after?, endpoints?, delay_ms?, code?, message?}
//        the next `count` API calls (optionally only to the named endpoints) fail
//        with `status` (429 carries Retry-After); with no status they are only delayed
//   GET  /_control/stats   counts of API calls by endpoint, keys written/deleted, faults
//   POST /_control/reset   clears faults and stats (not the data)
//
// Bindings (set by runtime.mjs): KV (the configured namespace, shared with the
// edge), KV_AUX (registry and data of namespaces created through the API, which
// no Worker binds), CONTROL (a Durable Object holding faults and stats: isolate
// globals are not a safe place for state that must survive and be exact under
// concurrency), and the vars ACCOUNT_ID, API_TOKEN, NAMESPACE_ID, NAMESPACE_TITLE.

const API_PREFIX = "/client/v4";
const MAX_BULK_PAIRS = 10000;
const MAX_KEY_BYTES = 512;
const MIN_TTL_SECONDS = 60;
const LIST_LIMIT_MIN = 10;
const LIST_LIMIT_MAX = 1000;
// Each local put is a file and a database row: a bulk write runs this many at once.
const WRITE_CONCURRENCY = 64;

// Keys in KV_AUX: "ns:{id}" holds a created namespace's registry entry,
// "data:{id}:{key}" its data.
const REGISTRY_PREFIX = "ns:";
const DATA_PREFIX = "data:";

// Cloudflare's KV error codes (the subset this stand-in can produce).
const E = {
  AUTH: 10000,
  UNAVAILABLE: 10001,
  KEY_NOT_FOUND: 10009,
  NAMESPACE_NOT_FOUND: 10013,
  NAMESPACE_EXISTS: 10014,
  MISSING_TITLE: 10019,
  PAYLOAD_TOO_LARGE: 10024,
  NO_ENDPOINT: 10025,
  INVALID_LIMIT: 10028,
  INVALID_REQUEST: 10029,
  KEY_TOO_LONG: 10030,
  INVALID_EXPIRATION_TTL: 10034,
  INVALID_CURSOR: 10041,
  ILLEGAL_KEY: 10042,
  // The account-wide API rate limiter (1,200 requests / 5 minutes) answers 971.
  RATE_LIMITED: 971,
};

class ApiError extends Error {
  constructor(status, code, message, headers = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.headers = headers;
  }
}

function envelope(result, extra = {}) {
  return { success: true, errors: [], messages: [], result, ...extra };
}

function json(body, status = 200, headers = {}) {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json", ...headers },
  });
}

function errorResponse(err) {
  const body = {
    success: false,
    errors: [{ code: err.code, message: err.message }],
    messages: [],
    result: null,
  };
  return json(body, err.status, err.headers);
}

// ---------------------------------------------------------------- storage

// One namespace's data, whichever binding holds it; keys are what API callers see.
class NamespaceStore {
  constructor(kv, prefix) {
    this.kv = kv;
    this.prefix = prefix;
  }

  async get(key) {
    return this.kv.get(this.prefix + key, { type: "arrayBuffer" });
  }

  async put(key, value, options) {
    await this.kv.put(this.prefix + key, value, options);
  }

  async delete(key) {
    await this.kv.delete(this.prefix + key);
  }

  async list({ prefix, limit, cursor }) {
    const page = await this.kv.list({ prefix: this.prefix + (prefix ?? ""), limit, cursor });
    const keys = page.keys.map((k) => {
      const item = { name: k.name.slice(this.prefix.length) };
      if (k.expiration !== undefined) item.expiration = k.expiration;
      return item;
    });
    return { keys, cursor: page.list_complete ? "" : page.cursor };
  }
}

function configuredNamespace(env) {
  return {
    id: env.NAMESPACE_ID,
    title: env.NAMESPACE_TITLE || "prism-cache",
    supports_url_encoding: true,
  };
}

async function findNamespace(env, id) {
  if (id === env.NAMESPACE_ID) return configuredNamespace(env);
  return env.KV_AUX.get(REGISTRY_PREFIX + id, { type: "json" });
}

async function allNamespaces(env) {
  const out = [configuredNamespace(env)];
  let cursor;
  do {
    const page = await env.KV_AUX.list({ prefix: REGISTRY_PREFIX, cursor });
    const entries = await Promise.all(
      page.keys.map((k) => env.KV_AUX.get(k.name, { type: "json" })),
    );
    out.push(...entries.filter((e) => e !== null));
    cursor = page.list_complete ? undefined : page.cursor;
  } while (cursor);
  return out;
}

async function storeFor(env, id) {
  const ns = await findNamespace(env, id);
  if (ns === null) throw new ApiError(404, E.NAMESPACE_NOT_FOUND, "namespace not found");
  if (id === env.NAMESPACE_ID) return new NamespaceStore(env.KV, "");
  return new NamespaceStore(env.KV_AUX, `${DATA_PREFIX}${id}:`);
}

// ---------------------------------------------------------------- validation

const encoder = new TextEncoder();

function validateKey(key) {
  if (typeof key !== "string" || key === "") {
    throw new ApiError(400, E.ILLEGAL_KEY, "Key names must not be empty");
  }
  if (key === "." || key === "..") {
    throw new ApiError(400, E.ILLEGAL_KEY, `Illegal key name "${key}". Please use a different name.`);
  }
  const length = encoder.encode(key).byteLength;
  if (length > MAX_KEY_BYTES) {
    throw new ApiError(
      414,
      E.KEY_TOO_LONG,
      `UTF-8 encoded length of ${length} exceeds key length limit of ${MAX_KEY_BYTES}.`,
    );
  }
}

// KV put options for an expiration_ttl (Prism sets no other option); the messages are
// the real API's.
function putOptions(expirationTtl) {
  if (expirationTtl === undefined || expirationTtl === null || expirationTtl === "") return {};
  const ttl = Number(expirationTtl);
  if (!Number.isInteger(ttl) || ttl <= 0) {
    throw new ApiError(
      400,
      E.INVALID_EXPIRATION_TTL,
      `Invalid expiration_ttl of ${expirationTtl}. Please specify integer greater than 0.`,
    );
  }
  if (ttl < MIN_TTL_SECONDS) {
    throw new ApiError(
      400,
      E.INVALID_EXPIRATION_TTL,
      `Invalid expiration_ttl of ${expirationTtl}. Expiration TTL must be at least ${MIN_TTL_SECONDS}.`,
    );
  }
  return { expirationTtl: ttl };
}

async function readJson(request) {
  try {
    return await request.json();
  } catch {
    throw new ApiError(400, E.INVALID_REQUEST, "Could not parse request body as JSON.");
  }
}

function decodeKeySegment(raw) {
  try {
    return decodeURIComponent(raw);
  } catch {
    throw new ApiError(400, E.ILLEGAL_KEY, "Could not URL-decode key name");
  }
}

// Runs `fn` over `items` with at most `limit` in flight.
async function forEachLimited(items, limit, fn) {
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const item = items[next++];
      await fn(item);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
}

// ---------------------------------------------------------------- handlers

async function listNamespaces(env, url) {
  const page = Math.max(1, parseInt(url.searchParams.get("page") ?? "1", 10) || 1);
  const perPage = Math.min(
    1000,
    Math.max(1, parseInt(url.searchParams.get("per_page") ?? "20", 10) || 20),
  );
  const all = await allNamespaces(env);
  const result = all.slice((page - 1) * perPage, page * perPage);
  return json(
    envelope(result, {
      result_info: {
        page,
        per_page: perPage,
        count: result.length,
        total_count: all.length,
        total_pages: Math.ceil(all.length / perPage),
      },
    }),
  );
}

async function createNamespace(env, request) {
  const body = await readJson(request);
  const title = typeof body?.title === "string" ? body.title.trim() : "";
  if (title === "") throw new ApiError(400, E.MISSING_TITLE, "missing title");
  const existing = await allNamespaces(env);
  if (existing.some((ns) => ns.title === title)) {
    throw new ApiError(400, E.NAMESPACE_EXISTS, "a namespace with this account ID and title already exists");
  }
  const ns = { id: crypto.randomUUID().replaceAll("-", ""), title, supports_url_encoding: true };
  await env.KV_AUX.put(REGISTRY_PREFIX + ns.id, JSON.stringify(ns));
  return json(envelope(ns));
}

async function bulkPut(env, id, request, control) {
  const store = await storeFor(env, id);
  const pairs = await readJson(request);
  if (!Array.isArray(pairs)) {
    throw new ApiError(400, E.INVALID_REQUEST, "Request body must be an array of key-value pairs.");
  }
  if (pairs.length > MAX_BULK_PAIRS) {
    throw new ApiError(
      413,
      E.PAYLOAD_TOO_LARGE,
      `Too many key-value pairs: ${pairs.length} (at most ${MAX_BULK_PAIRS} per request).`,
    );
  }
  // Validate everything before writing anything, so a bad pair never leaves
  // half a batch behind.
  const writes = pairs.map((pair) => {
    if (pair === null || typeof pair !== "object") {
      throw new ApiError(400, E.INVALID_REQUEST, "Each element must be an object with key and value.");
    }
    validateKey(pair.key);
    if (typeof pair.value !== "string") {
      throw new ApiError(400, E.INVALID_REQUEST, `Value for key "${pair.key}" must be a string.`);
    }
    return { key: pair.key, value: pair.value, options: putOptions(pair.expiration_ttl) };
  });
  const unsuccessful = [];
  await forEachLimited(writes, WRITE_CONCURRENCY, async (w) => {
    try {
      await store.put(w.key, w.value, w.options);
    } catch {
      unsuccessful.push(w.key);
    }
  });
  const written = writes.length - unsuccessful.length;
  await control.add({ bulk_put_keys: written });
  return json(envelope({ successful_key_count: written, unsuccessful_keys: unsuccessful }));
}

async function bulkDelete(env, id, request, control) {
  const store = await storeFor(env, id);
  const keys = await readJson(request);
  if (!Array.isArray(keys) || keys.some((k) => typeof k !== "string")) {
    throw new ApiError(400, E.INVALID_REQUEST, "Request body must be an array of key names.");
  }
  if (keys.length > MAX_BULK_PAIRS) {
    throw new ApiError(413, E.PAYLOAD_TOO_LARGE, `Too many keys: ${keys.length} (at most ${MAX_BULK_PAIRS}).`);
  }
  keys.forEach(validateKey);
  const unsuccessful = [];
  await forEachLimited(keys, WRITE_CONCURRENCY, async (key) => {
    try {
      await store.delete(key);
    } catch {
      unsuccessful.push(key);
    }
  });
  const deleted = keys.length - unsuccessful.length;
  await control.add({ bulk_delete_keys: deleted });
  return json(envelope({ successful_key_count: deleted, unsuccessful_keys: unsuccessful }));
}

async function getValue(env, id, key) {
  const store = await storeFor(env, id);
  validateKey(key);
  const value = await store.get(key);
  if (value === null) throw new ApiError(404, E.KEY_NOT_FOUND, "key not found");
  return new Response(value, {
    status: 200,
    headers: { "content-type": "application/octet-stream" },
  });
}

async function putValue(env, id, key, request) {
  const store = await storeFor(env, id);
  validateKey(key);
  await store.put(key, await request.arrayBuffer(), {});
  return json(envelope({}));
}

async function listKeys(env, id, url) {
  const store = await storeFor(env, id);
  const rawLimit = url.searchParams.get("limit");
  let limit = LIST_LIMIT_MAX;
  if (rawLimit !== null) {
    limit = Number(rawLimit);
    if (!Number.isInteger(limit) || limit < LIST_LIMIT_MIN || limit > LIST_LIMIT_MAX) {
      throw new ApiError(
        400,
        E.INVALID_LIMIT,
        `Invalid key_count_limit of ${rawLimit}. Please specify an integer between ${LIST_LIMIT_MIN} and ${LIST_LIMIT_MAX}.`,
      );
    }
  }
  const cursor = url.searchParams.get("cursor") || undefined;
  let page;
  try {
    page = await store.list({ prefix: url.searchParams.get("prefix") ?? "", limit, cursor });
  } catch {
    throw new ApiError(400, E.INVALID_CURSOR, 'invalid "list keys" cursor');
  }
  return json(
    envelope(page.keys, { result_info: { count: page.keys.length, cursor: page.cursor } }),
  );
}

// ---------------------------------------------------------------- routing

// Maps (method, path under /client/v4) to an endpoint name and its handler.
function route(method, path) {
  const base = path.match(/^\/accounts\/([^/]+)\/storage\/kv\/namespaces(?:\/([^/]+)(\/.*)?)?$/);
  if (base === null) return { endpoint: "unknown" };
  const [, account, nsId, rest] = base;
  const key = (prefix) =>
    rest?.startsWith(prefix) && rest.length > prefix.length
      ? decodeKeySegment(rest.slice(prefix.length))
      : null;
  const at = (endpoint, handler) => ({ account, endpoint, handler });

  if (nsId === undefined) {
    if (method === "GET") return at("namespaces_list", (c) => listNamespaces(c.env, c.url));
    if (method === "POST") return at("namespace_create", (c) => createNamespace(c.env, c.request));
    return { endpoint: "unknown" };
  }
  if (rest === undefined) return { endpoint: "unknown" };
  if (rest === "/bulk" && method === "PUT") {
    return at("bulk_put", (c) => bulkPut(c.env, nsId, c.request, c.control));
  }
  if (rest === "/bulk/delete" && method === "POST") {
    return at("bulk_delete", (c) => bulkDelete(c.env, nsId, c.request, c.control));
  }
  if (rest === "/keys" && method === "GET") {
    return at("keys_list", (c) => listKeys(c.env, nsId, c.url));
  }
  if (rest.startsWith("/values/")) {
    if (method === "GET") return at("value_get", (c) => getValue(c.env, nsId, key("/values/")));
    if (method === "PUT") return at("value_put", (c) => putValue(c.env, nsId, key("/values/"), c.request));
  }
  return { endpoint: "unknown" };
}

// A thin client for the ControlState Durable Object.
function controlClient(env) {
  const stub = env.CONTROL.get(env.CONTROL.idFromName("control"));
  const call = async (op, body) => {
    const res = await stub.fetch(`http://control/${op}`, {
      method: "POST",
      body: JSON.stringify(body ?? {}),
    });
    return res.json();
  };
  return {
    begin: (endpoint) => call("begin", { endpoint }),
    add: (counts) => call("add", { counts }),
    faults: (spec) => call("faults", spec),
    stats: () => call("stats"),
    reset: () => call("reset"),
  };
}

function authError(env, request) {
  if (!env.API_TOKEN) return null;
  const header = request.headers.get("authorization");
  if (header === null || !header.startsWith("Bearer ")) {
    return new ApiError(401, E.AUTH, "Authentication error");
  }
  if (header.slice("Bearer ".length).trim() !== env.API_TOKEN) {
    return new ApiError(403, E.AUTH, "Authentication error");
  }
  return null;
}

async function handleControl(request, url, control) {
  const op = url.pathname.slice("/_control/".length);
  if (op === "stats" && request.method === "GET") return json(await control.stats());
  if (op === "reset" && request.method === "POST") return json(await control.reset());
  if (op === "faults" && request.method === "POST") {
    const spec = await readJson(request);
    const status = spec.status ?? 0;
    const count = spec.count ?? 1;
    if (!Number.isInteger(count) || count < 0 || !Number.isInteger(status)) {
      throw new ApiError(400, E.INVALID_REQUEST, "faults need integer status and count");
    }
    if (status !== 0 && (status < 400 || status > 599)) {
      throw new ApiError(400, E.INVALID_REQUEST, "fault status must be 4xx or 5xx");
    }
    return json(await control.faults({ ...spec, status, count }));
  }
  throw new ApiError(404, E.NO_ENDPOINT, "unknown control endpoint");
}

function faultResponse(fault) {
  const headers = {};
  if (fault.status === 429) headers["retry-after"] = String(fault.retry_after ?? 1);
  const code =
    fault.code ?? (fault.status === 429 ? E.RATE_LIMITED : fault.status >= 500 ? E.UNAVAILABLE : E.INVALID_REQUEST);
  const message =
    fault.message ??
    (fault.status === 429
      ? "Please wait and consider throttling your request speed"
      : "service temporarily unavailable");
  return errorResponse(new ApiError(fault.status, code, message, headers));
}

async function handleApi(request, env, url, control) {
  const path = url.pathname.slice(API_PREFIX.length);
  const match = route(request.method, path);
  const decision = await control.begin(match.endpoint);
  if (decision.fault) {
    if (decision.fault.delay_ms) await new Promise((r) => setTimeout(r, decision.fault.delay_ms));
    if (decision.fault.status) return faultResponse(decision.fault);
  }
  const denied = authError(env, request);
  if (denied !== null) {
    await control.add({ auth_failures: 1 });
    throw denied;
  }
  if (match.handler === undefined) {
    throw new ApiError(404, E.NO_ENDPOINT, `No route for ${request.method} ${url.pathname}`);
  }
  if (match.account !== env.ACCOUNT_ID) {
    // What Cloudflare answers for an account the token cannot see.
    throw new ApiError(403, E.AUTH, "Authentication error");
  }
  return match.handler({ env, request, url, control });
}

export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    const control = controlClient(env);
    try {
      if (url.pathname.startsWith("/_control/")) return await handleControl(request, url, control);
      if (url.pathname === API_PREFIX || url.pathname.startsWith(API_PREFIX + "/")) {
        return await handleApi(request, env, url, control);
      }
      throw new ApiError(404, E.NO_ENDPOINT, `No route for ${request.method} ${url.pathname}`);
    } catch (err) {
      if (err instanceof ApiError) return errorResponse(err);
      console.error("kv_api: unhandled error", err?.stack ?? err);
      return errorResponse(new ApiError(500, E.UNAVAILABLE, `internal error: ${err?.message ?? err}`));
    }
  },
};

// ---------------------------------------------------------------- control state

// Faults and stats. A single Durable Object instance serializes every update,
// so counts are exact and "the next K calls" means exactly K under concurrency.
export class ControlState {
  constructor(state) {
    this.storage = state.storage;
  }

  async fetch(request) {
    const op = new URL(request.url).pathname.slice(1);
    const body = await request.json();
    if (op === "begin") return Response.json(await this.begin(body.endpoint));
    if (op === "add") return Response.json(await this.add(body.counts));
    if (op === "faults") return Response.json(await this.setFaults(body));
    if (op === "stats") return Response.json(await this.stats());
    if (op === "reset") return Response.json(await this.reset());
    return new Response("unknown op", { status: 404 });
  }

  async stats() {
    return (await this.storage.get("stats")) ?? { total_calls: 0 };
  }

  async add(counts) {
    const stats = await this.stats();
    for (const [name, n] of Object.entries(counts)) stats[name] = (stats[name] ?? 0) + n;
    await this.storage.put("stats", stats);
    return stats;
  }

  // Counts the call and decides whether it is one of the next K faulted calls.
  async begin(endpoint) {
    const counts = { total_calls: 1, [`${endpoint}_calls`]: 1 };
    const faults = (await this.storage.get("faults")) ?? [];
    let fault = null;
    const active = faults.find(
      (f) => f.remaining > 0 && (!f.endpoints || f.endpoints.includes(endpoint)),
    );
    if (active !== undefined) {
      active.remaining -= 1;
      fault = { ...active };
      counts.faults_injected = 1;
      await this.storage.put("faults", faults.filter((f) => f.remaining > 0));
    }
    await this.add(counts);
    return { fault };
  }

  async setFaults(spec) {
    const faults = (await this.storage.get("faults")) ?? [];
    const fault = {
      status: spec.status,
      remaining: spec.count,
      retry_after: spec.retry_after,
      delay_ms: spec.delay_ms,
      code: spec.code,
      message: spec.message,
      endpoints: Array.isArray(spec.endpoints) ? spec.endpoints : null,
    };
    // count 0 clears pending faults instead of queueing a no-op.
    const next = spec.count === 0 ? [] : [...faults, fault];
    await this.storage.put("faults", next);
    return { pending: next };
  }

  async reset() {
    await this.storage.delete(["faults", "stats"]);
    return { total_calls: 0 };
  }
}
