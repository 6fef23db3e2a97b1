"""The floor Worker: the cheapest answer a Python Worker can give in the local runtime.

The benchmark compares Prism's edge with this, in the same runtime and over the
same loopback socket, so what is left is what the edge itself costs. It does no
work: no body read, no imports beyond the FFI, one constant response. With
``?kv=KEY`` it first reads KEY from KV, the second floor: what one KV read costs
any Worker here, whatever it does around it.
"""

from typing import Any

from js import Response


async def on_fetch(request: Any, env: Any, ctx: Any) -> Any:
    url = request.url
    if "?kv=" in url:
        await env.PRISM_KV.get(url.split("?kv=", 1)[1])
    return Response.new('{"ok":true}')
