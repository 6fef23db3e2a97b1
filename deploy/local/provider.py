"""A local stand-in for OpenAI and Anthropic, with fault injection: running it.

Real HTTP, deterministic and fast: the floor in benchmarks, the provider in
the test suite and the "local demo provider" of ``prism dev``.

Reply rule: ``Echo: <last user text, truncated> [<tag>]``, where ``tag`` is a
short hash of the request body minus transport-only fields (``stream``,
``stream_options``, ``user``, ``metadata``). The same body always gets the
same content, streamed or not; different bodies get different content.

Run it: ``python -m deploy.local.provider --host 127.0.0.1 --port 9100``, or in-process
as a ``ProviderServer`` (a background thread on a free port). The app itself is in
``deploy.local.provider_app``, its replies in ``provider_replies``, the wire formats in
``provider_openai``, ``provider_anthropic`` and ``provider_sse``, the model lists in
``provider_models``, the faults and control
endpoints in ``provider_faults``, the settings in ``provider_settings``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from types import TracebackType

import uvicorn

from deploy.local.asgi_thread import ThreadedServer
from deploy.local.ports import free_port
from deploy.local.provider_app import create_provider_app
from deploy.local.provider_faults import Fault, ProviderControl
from deploy.local.provider_settings import DEFAULT_MODELS, ProviderSettings

__all__ = [
    "DEFAULT_MODELS",
    "Fault",
    "ProviderControl",
    "ProviderServer",
    "ProviderSettings",
    "closed_port",
    "create_provider_app",
    "main",
]


def closed_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on, for connection-refused tests."""
    return free_port(host)


class ProviderServer:
    """The provider on a free loopback port, served by uvicorn in a background thread.

    ``stop()`` then ``start()`` serves the same app (faults, counters) on the same port
    again: between the two, connections are refused, as in a provider's outage.
    """

    def __init__(
        self,
        settings: ProviderSettings | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        startup_timeout: float = 10.0,
    ) -> None:
        self.settings = settings or ProviderSettings()
        self._server = ThreadedServer(
            create_provider_app(self.settings),
            host=host,
            port=port,
            lifespan="off",
            graceful_shutdown=1,  # stalled streams must not hold up stop()
        )
        self._startup_timeout = startup_timeout
        self._control: ProviderControl | None = None

    @property
    def host(self) -> str:
        return self._server.host

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def control(self) -> ProviderControl:
        if self._control is None:
            raise RuntimeError("ProviderServer is not running")
        return self._control

    def start(self) -> ProviderServer:
        if self._control is not None:
            raise RuntimeError("ProviderServer already started")
        self._server.start(timeout=self._startup_timeout)
        self._control = ProviderControl(self.url)
        return self

    def stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        self._server.stop()

    def __enter__(self) -> ProviderServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line runner (``python -m deploy.local.provider``)."""
    parser = argparse.ArgumentParser(
        prog="python -m deploy.local.provider",
        description="Local OpenAI/Anthropic stand-in with fault injection.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--tokens-per-second", type=float, default=0.0)
    parser.add_argument("--chunk-count", type=int, default=ProviderSettings().chunk_count)
    parser.add_argument("--reply-words", type=int, default=0)
    parser.add_argument("--api-key", default=None)
    args = parser.parse_args(argv)
    settings = ProviderSettings(
        latency_ms=args.latency_ms,
        tokens_per_second=args.tokens_per_second,
        chunk_count=args.chunk_count,
        reply_words=args.reply_words,
        api_key=args.api_key,
    )
    # uvicorn's default http="auto" picks httptools when it is installed, h11 otherwise.
    uvicorn.run(
        create_provider_app(settings),
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
    )


if __name__ == "__main__":
    main()
