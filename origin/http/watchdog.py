"""systemd's watchdog, fed from the event loop: a hung origin is restarted.

The deployed unit (``deploy/aws/userdata.py``) is ``Type=notify`` with ``WatchdogSec=``:
systemd passes ``NOTIFY_SOCKET`` and ``WATCHDOG_USEC`` and restarts the process when no
``WATCHDOG=1`` arrives within that time. The pings come from the loop watch's ticks
(``origin.http.loop_watch``), so they stop exactly when the loop stops running: a
blocked loop, a deadlock, a process stopped. ``READY=1`` goes with the first ping, once
the app has started and its listeners are taking connections.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Mapping

__all__ = ["SystemdWatchdog"]


class SystemdWatchdog:
    """sd_notify(3) over ``NOTIFY_SOCKET``: READY once, then WATCHDOG at least every half
    of ``WATCHDOG_USEC`` (as sd_watchdog_enabled(3) recommends); errors are ignored (the
    pings are best effort: a missed one is what the watchdog is for)."""

    __slots__ = ("_address", "_every", "_last", "_ready", "_socket", "interval")

    def __init__(self, address: str, interval: float) -> None:
        # "@name" is Linux's abstract namespace: a leading NUL byte.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self.interval = interval  # WatchdogSec: silent this long, the process is restarted
        self._every = interval / 2
        self._last = -interval
        self._ready = False
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._socket.setblocking(False)

    @classmethod
    def from_env(cls, env: Mapping[str, str], pid: int | None = None) -> SystemdWatchdog | None:
        """The watchdog systemd asked for, or None (not under systemd, no WatchdogSec=,
        or the variables meant for another process: ``WATCHDOG_PID``)."""
        address, usec = env.get("NOTIFY_SOCKET"), env.get("WATCHDOG_USEC")
        if not address or not usec or not usec.isdigit() or int(usec) == 0:
            return None
        watched = env.get("WATCHDOG_PID")
        if watched and watched != str(pid if pid is not None else os.getpid()):
            return None
        return cls(address, int(usec) / 1_000_000)

    def ping(self) -> None:
        now = time.monotonic()
        if now - self._last < self._every:
            return
        self._last = now
        message = b"WATCHDOG=1" if self._ready else b"READY=1\nWATCHDOG=1"
        self._ready = True
        with contextlib.suppress(OSError):
            self._socket.sendto(message, self._address)

    def close(self) -> None:
        self._socket.close()
