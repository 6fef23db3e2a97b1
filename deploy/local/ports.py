"""Loopback ports for the local stack and the tests."""

from __future__ import annotations

import random
import socket

__all__ = ["free_port", "port_is_free"]

# Below the kernels' ephemeral ranges (Linux 32768-60999, BSD and macOS 49152-65535): a port
# the kernel handed out for bind(0) is also one it may give the next outgoing connection,
# which then holds it when the server it was chosen for binds (seen on a busy machine).
_PORTS = (20_000, 32_000)


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (also what connection-refused tests point at)."""
    for _ in range(200):
        port = random.randint(*_PORTS)
        if port_is_free(host, port):
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
