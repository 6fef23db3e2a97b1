"""Linux network namespaces on one bridge: each local part on its own "machine".

``Network.create(names)`` makes one namespace per name (``ip netns add``), each joined by
a veth pair to a bridge in the caller's namespace, with its own address on one /24 (the
bridge holds ``.1``). Anything started inside ``network.entered(name)`` (a thread's
sockets, and the children it spawns, which inherit the thread's namespace) lives there;
the delay proxies stay in the caller's namespace on the bridge address, between them.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and ``ip``; ``available()`` says why not.
Without namespaces, ``Network.loopback(names)`` gives every part 127.0.0.1 and entering
is a no-op, so a caller runs the same code either way.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["NetnsError", "Network", "available"]

_CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsError(RuntimeError):
    """An ``ip`` command failed; said with its output."""


def available() -> str | None:
    """None when namespaces can be made here, else why not (one line)."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
    if shutil.which("ip") is None:
        return "no `ip` command (apt-get install iproute2)"
    if not os.path.exists("/proc/thread-self/ns/net"):
        return "no /proc/thread-self/ns/net"
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()[:300]}")


def _setns(fd: int) -> None:
    if _libc.setns(fd, _CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise NetnsError(f"setns: {os.strerror(errno)}")


@dataclass
class Network:
    """Namespaces by name, each with an address; ``gateway`` is the caller's side."""

    gateway: str  # the bridge's address, where the delay proxies listen
    addresses: dict[str, str]  # name -> address inside that namespace
    namespaces: dict[str, str] = field(default_factory=dict)  # name -> `ip netns` name
    bridge: str | None = None

    @property
    def isolated(self) -> bool:
        return bool(self.namespaces)

    @classmethod
    def loopback(cls, names: Sequence[str]) -> Network:
        return cls("127.0.0.1", dict.fromkeys(names, "127.0.0.1"))

    @classmethod
    def create(cls, names: Sequence[str], tag: str | None = None) -> Network:
        """One namespace per name on a new bridge; ``stop()`` removes them all."""
        tag = tag or str(os.getpid() % 100_000)
        subnet = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
        bridge = f"pbr{tag}"
        network = cls(f"{subnet}.1", {}, bridge=bridge)
        try:
            _ip("link", "add", bridge, "type", "bridge")
            _ip("addr", "add", f"{network.gateway}/24", "dev", bridge)
            _ip("link", "set", bridge, "up")
            for number, name in enumerate(names, start=2):
                namespace, outside, inside = f"prism{tag}-{name}", f"pv{tag}-{number}", "eth0"
                _ip("netns", "add", namespace)
                network.namespaces[name] = namespace
                _ip("link", "add", outside, "type", "veth", "peer", "name", f"pi{tag}-{number}")
                _ip("link", "set", f"pi{tag}-{number}", "netns", namespace)
                _ip("-n", namespace, "link", "set", f"pi{tag}-{number}", "name", inside)
                _ip("link", "set", outside, "master", bridge, "up")
                address = f"{subnet}.{number}"
                _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", inside)
                _ip("-n", namespace, "link", "set", inside, "up")
                _ip("-n", namespace, "link", "set", "lo", "up")
                network.addresses[name] = address
        except BaseException:
            network.stop()
            raise
        return network

    @contextlib.contextmanager
    def entered(self, name: str) -> Iterator[None]:
        """This thread in ``name``'s namespace (and the children it spawns meanwhile)."""
        namespace = self.namespaces.get(name)
        if namespace is None:
            yield
            return
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            there = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
            try:
                _setns(there)
            finally:
                os.close(there)
            try:
                yield
            finally:
                _setns(home)
        finally:
            os.close(home)

    def stop(self) -> None:
        """Remove the namespaces (their veth pairs go with them) and the bridge."""
        for namespace in self.namespaces.values():
            with contextlib.suppress(NetnsError):
                _ip("netns", "del", namespace)
        self.namespaces.clear()
        if self.bridge is not None:
            with contextlib.suppress(NetnsError):
                _ip("link", "del", self.bridge)
            self.bridge = None

    def __enter__(self) -> Network:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
