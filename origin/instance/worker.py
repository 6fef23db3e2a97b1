"""One worker of ``prism origin serve --workers N``, built in the child process.

Everything here runs after the spawn, so each worker has its own settings (read from
the environment it inherited), app, event loop and Redis connection, served exactly as
a single origin is; only the public listener comes from the parent.
"""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn
from uvicorn.config import STARTUP_FAILURE

__all__ = ["WorkerOptions", "worker_server"]


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """What a worker needs besides the environment (pickled to it at spawn)."""

    log_level: str = "warning"


def worker_server(
    options: WorkerOptions, on_loop_tick: Callable[[], None] | None = None
) -> tuple[uvicorn.Server, socket.socket]:
    """The worker's server and its private admin listener (127.0.0.1, any free port);
    ``on_loop_tick``: the app's loop watch calls it at each tick (the supervisor's beat);
    a worker whose settings fail exits with uvicorn's start-up failure code, which stops
    the supervisor (every worker would fail the same way). Called in the child: the
    origin's modules are imported here, not in the supervisor."""
    from ..app import create_app
    from ..http.server import bind, freeze_heap, uvicorn_config
    from ..settings import Settings, SettingsError

    try:
        settings = Settings.from_env()
        admin = bind("127.0.0.1", 0)
        app = create_app(settings, admin_port=admin.getsockname()[1], on_loop_tick=on_loop_tick)
    except (SettingsError, OSError) as error:
        print(f"Error: {error}", file=sys.stderr)
        sys.exit(STARTUP_FAILURE)
    logging.basicConfig(level=options.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    if settings.access_log:
        from ..http.access_log import print_access_log

        print_access_log()
    config = uvicorn_config(app, settings, options.log_level)
    freeze_heap()
    return uvicorn.Server(config), admin
