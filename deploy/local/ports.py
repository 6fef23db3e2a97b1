"""Loopback ports for the local stack and the tests."""

from __future__ import annotations

import socket

__all__ = ["free_port", "port_is_free"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (also what connection-refused tests point at)."""
    with socket.socket() as sock:
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
