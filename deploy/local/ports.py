"""Loopback ports for the local stack and the tests."""

from __future__ import annotations

import random
import socket
from collections import deque

__all__ = ["free_port", "port_is_free", "share_ports"]

# Below the kernels' ephemeral ranges (Linux 32768-60999, BSD and macOS 49152-65535): a port
# the kernel handed out for bind(0) is also one it may give the next outgoing connection,
# which then holds it when the server it was chosen for binds (seen on a busy machine).
_RANGE = (20_000, 32_000)
_PORTS = list(_RANGE)  # the part this process draws from (share_ports)
# What this process handed out lately: a port chosen for a child still starting up is
# free until the child binds it, and a second call must not hand it out again.
_GIVEN: deque[int] = deque(maxlen=1024)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (also what connection-refused tests point at)."""
    low, high = _PORTS
    for _ in range(200):
        port = random.randint(low, high)
        if port not in _GIVEN and port_is_free(host, port):
            _GIVEN.append(port)
            return port
    with socket.socket() as sock:  # that whole range busy: whatever the kernel gives
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        # As servers bind: a port whose old connections linger in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def share_ports(index: int, count: int) -> None:
    """Draw this process's ports from the ``index``-th of ``count`` equal parts of the
    range: processes choosing ports side by side (the test suite's workers) then never
    choose the same one, even for a child that binds it seconds later."""
    low, high = _RANGE
    size = (high - low) // count
    _PORTS[:] = [low + index * size, low + (index + 1) * size - 1]
