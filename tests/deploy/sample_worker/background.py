"""The waitUntil pattern (docs/architecture.md): a task plus a real JS Promise.

Handing ctx.waitUntil a coroutine, a future or a KV promise gives JS a borrowed
proxy that dies at once; a Promise resolved by the task's done-callback lives
until the work is finished.
"""

import asyncio

from js import Promise
from pyodide.ffi import create_once_callable


def wait_until(ctx, awaitable):
    task = asyncio.ensure_future(awaitable)

    def executor(resolve, reject):
        def done(t):
            if t.cancelled():
                reject("cancelled")
            elif t.exception() is not None:
                reject(repr(t.exception()))
            else:
                resolve(None)

        task.add_done_callback(done)

    ctx.waitUntil(Promise.new(create_once_callable(executor)))
    return task


async def put_later(kv, key, value):
    # Sleep first so the write certainly happens after the response was sent.
    await asyncio.sleep(0.05)
    await kv.put(key, value)
