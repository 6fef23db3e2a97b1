"""Network namespaces on one bridge (deploy/local/netns.py): each part on its own
"machine", reachable from the others by its address, gone when the network stops."""

from __future__ import annotations

import socket
import subprocess

import pytest

from deploy.local import netns

WHY_NOT = netns.available()


def namespaces() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


@pytest.mark.skipif(WHY_NOT is not None, reason=f"no network namespaces: {WHY_NOT}")
def test_parts_in_their_namespaces_reach_each_other_and_leave_nothing_behind() -> None:
    network = netns.Network.create(["left", "right"], tag=f"t{id(object()) % 10_000}")
    try:
        assert network.isolated
        left, right = network.addresses["left"], network.addresses["right"]
        with network.entered("left"):
            server = socket.create_server((left, 0))
            # A child started here lives here too: it sees the namespace's address.
            seen = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
            assert left in seen and right not in seen
        with server:
            port = server.getsockname()[1]
            with pytest.raises(OSError):  # not bound in the caller's namespace
                socket.create_server((left, 0)).close()
            with network.entered("right"), socket.create_connection((left, port), timeout=2):
                pass
            with socket.create_connection((left, port), timeout=2):  # from the bridge's side
                pass
        assert all(name in namespaces() for name in network.namespaces.values())
    finally:
        made = list(network.namespaces.values())
        network.stop()
    assert not any(name in namespaces() for name in made)


def test_loopback_is_the_same_interface_with_nothing_to_enter() -> None:
    network = netns.Network.loopback(["left", "right"])
    assert not network.isolated
    assert network.addresses == {"left": "127.0.0.1", "right": "127.0.0.1"}
    with network.entered("left"):
        server = socket.create_server(("127.0.0.1", 0))
    with server, socket.create_connection(server.getsockname(), timeout=2):
        pass  # the same namespace as the caller's
    network.stop()
