"""Sample Python Worker for the local runtime tests (not Prism's edge).

Routes: /imports (what the package imports resolved to), /kv?key= (read the
KV binding), /env?name= (read a var), /bg?key=&value= (write KV after the
response, through background.wait_until).
"""

import importlib
import json

import background
import nsonly.mod
from js import URL, Headers, Object, Response
from pkg import thing
from pkg.sub import deep
from pyodide.ffi import to_js


def _json(body, status=200):
    # A Python dict as `headers` is a fatal Pyodide error in this runtime
    # ("not of type 'Sequence'"): build a real JS Headers / init object.
    headers = Headers.new(to_js([["content-type", "application/json"]]))
    init = to_js({"status": status, "headers": headers}, dict_converter=Object.fromEntries)
    return Response.new(json.dumps(body), init)


def _imports():
    import pkg

    return {
        "thing": thing.VALUE,
        "deep": deep.DEPTH,
        "pkg_init": pkg.FROM_INIT,
        "namespace_package": nsonly.mod.NAME,
        "import_module": importlib.import_module("pkg.sub.deep").DEPTH,
        "thing_package": thing.__package__,
        "deep_name": deep.__name__,
        "pkg_file": pkg.__file__,
        "entry_name": __name__,
    }


async def on_fetch(request, env, ctx):
    url = URL.new(request.url)
    params = url.searchParams
    if url.pathname == "/imports":
        return _json(_imports())
    if url.pathname == "/kv":
        value = await env.PRISM_KV.get(params.get("key"))
        if value is None:
            return _json({"found": False}, status=404)
        return _json({"found": True, "value": value})
    if url.pathname == "/env":
        return _json({"value": getattr(env, params.get("name"), None)})
    if url.pathname == "/bg":
        key, value = params.get("key"), params.get("value")
        background.wait_until(ctx, background.put_later(env.PRISM_KV, key, value))
        return _json({"scheduled": key}, status=202)
    return _json({"error": "not found"}, status=404)
