// A JavaScript extra Worker: reads the shared KV binding like the Python sample.
export default {
  async fetch(request, env) {
    const url = new URL(request.url);
    if (url.pathname === "/kv") {
      const value = await env.PRISM_KV.get(url.searchParams.get("key"));
      return Response.json({ found: value !== null, value }, { status: value === null ? 404 : 200 });
    }
    return Response.json({ worker: "floor-js", greeting: env.GREETING ?? null });
  },
};
