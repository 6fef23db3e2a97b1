"""``prism origin serve --workers N`` (N > 1): N worker processes on one public port.

uvicorn's own supervisor (``uvicorn.supervisors.Multiprocess``) does the work: it runs
in the parent, which binds the public listener and hands it to every worker (started
with multiprocessing's spawn), restarts a worker that died or stopped answering its
pings, replaces them one by one on SIGHUP (each replacement serving before its old
worker is stopped) and on SIGTERM / SIGINT stops them all gracefully: each worker's
uvicorn stops accepting, lets its requests finish (streams to their ``[DONE]``) and
exits; the parent then exits 0.

What is added here:

- each worker builds its own app (``Settings.from_env()``, ``create_app``), event loop
  and Redis connection in the child, served exactly as a single origin is
  (``origin.http.server.uvicorn_config``), and binds a private admin listener on
  127.0.0.1 (any free port), which it tells the parent over a pipe;
- the parent serves the public admin port itself (``origin.instance.admin``: one
  ``/metrics``, ``/healthz`` and ``/dashboard`` for the instance) from a thread;
- a worker that dies is logged with its exit code (or signal) before it is restarted;
- under systemd (``NOTIFY_SOCKET``, ``WATCHDOG_USEC``) the parent says READY once every
  worker serves, and pings the watchdog from its supervision loop while they answer; a
  worker whose event loop has not ticked for the watchdog's time is killed and replaced,
  as systemd restarts a single origin whose loop is stuck that long (the pings above come
  from a thread of the worker's own, which a stuck loop does not stop). Each worker's loop
  watch (``origin.http.loop_watch``, ten ticks a second) writes the time of its last tick
  into memory shared with the parent: nothing per request.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
import time
from multiprocessing import Pipe

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors.multiprocess import Multiprocess, Process

from ..http.asgi import Routes
from ..http.watchdog import SystemdWatchdog
from .admin import WorkerView, instance_admin
from .worker import WorkerOptions, worker_server

__all__ = ["Supervisor", "WorkerProcess", "serve_workers"]

log = logging.getLogger("prism.origin")

# Seconds a replacement worker may take to serve on SIGHUP (uvicorn allows its ping timeout,
# 5 s: less than importing and building the app takes on a busy machine).
START_TIMEOUT = 60.0
_SPAWN = multiprocessing.get_context("spawn")


class WorkerProcess(Process):
    """uvicorn's worker process, running the origin: its ``target`` runs in the child."""

    def __init__(
        self, config: uvicorn.Config, sockets: list[socket.socket], options: WorkerOptions
    ):
        self.options = options
        self._told, self._tell = Pipe(duplex=False)  # the child sends its admin port
        # time.monotonic() at the worker loop's last tick (0: not started): one shared double.
        self.beat = _SPAWN.RawValue("d", 0.0)
        self._admin_port: int | None = None
        self._port_lock = threading.Lock()
        self.started = False  # at the last ping: the worker's server had started
        super().__init__(config, sockets)

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state.pop("_port_lock")  # the parent's alone
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._port_lock = threading.Lock()

    def target(self, sockets: list[socket.socket] | None = None) -> None:  # pragma: no cover
        # Answer the supervisor's pings from the start ("not started yet" until the server
        # is): importing and building the app can take longer than its ping timeout.
        threading.Thread(target=self.always_pong, daemon=True).start()
        beat = self.beat

        def tick() -> None:
            beat.value = time.monotonic()

        server, admin = worker_server(self.options, tick)
        self._server = server
        self._tell.send(admin.getsockname()[1])
        server.run([*(sockets or []), admin])

    @property
    def admin_port(self) -> int | None:
        with self._port_lock:
            if self._admin_port is None:
                try:
                    if self._told.poll():
                        self._admin_port = int(self._told.recv())
                except (OSError, EOFError):
                    return None
            return self._admin_port

    def is_alive(self, timeout: float = 5) -> bool:
        if not self.process.is_alive():
            return False
        started = self._healthcheck(timeout)
        self.started = started is True
        return started is not None

    def stalled(self, now: float, limit: float) -> float | None:
        """Seconds since the worker's loop last ticked, if more than ``limit`` (None: it
        ticked since, or has not started yet)."""
        last = self.beat.value
        return now - last if last and now - last > limit else None

    def close_pipes(self) -> None:
        self._told.close()
        self._tell.close()


class Supervisor(Multiprocess):
    """``Multiprocess`` with origin workers, their deaths logged, and the admin view."""

    def __init__(
        self,
        config: uvicorn.Config,
        sockets: list[socket.socket],
        admin_socket: socket.socket,
        options: WorkerOptions,
        watchdog: SystemdWatchdog | None = None,
    ) -> None:
        super().__init__(config, sockets)
        self.options = options
        self.admin_socket = admin_socket
        self.watchdog = watchdog
        # A worker's loop silent this long is stuck: systemd's watchdog time, when there is one.
        self.stall_limit = watchdog.interval if watchdog is not None else None
        self.restarts = 0
        self.retiring: list[WorkerProcess] = []  # replaced on SIGHUP, finishing their requests
        self.failed = False  # a worker failed to start: the instance stopped
        self.processes: list[WorkerProcess] = []  # type: ignore[assignment]

    def spawn(self) -> WorkerProcess:
        process = WorkerProcess(self.config, self.sockets, self.options)
        process.start()
        return process

    def workers(self) -> list[WorkerView]:
        return [
            WorkerView(index, process.pid, process.admin_port)
            for index, process in enumerate(list(self.processes))
        ]

    def init_processes(self) -> None:
        for _ in range(self.processes_num):
            self.processes.append(self.spawn())

    def keep_subprocess_alive(self) -> None:
        if self.should_exit.is_set():
            return
        for index, process in enumerate(self.processes):
            limit = self.stall_limit
            stalled = process.stalled(time.monotonic(), limit) if limit is not None else None
            if stalled is None and process.is_alive(timeout=self.config.timeout_worker_healthcheck):
                continue
            hung = process.process.is_alive()
            process.kill()
            process.join()
            process.close_pipes()
            code = process.exitcode
            if code == STARTUP_FAILURE:
                log.error("origin worker %d (pid %s) failed to start: stopping", index, process.pid)
                self.failed = True
                self.should_exit.set()
                return
            if self.should_exit.is_set():
                return
            if stalled is not None:
                why = f"ran no event loop tick for {stalled:.0f} s: killed"
            elif hung:
                why = "did not answer its supervisor: killed"
            elif code is not None and code < 0:
                why = f"died of {signal.Signals(-code).name} (exit code {code})"
            else:
                why = f"exited with code {code}"
            replacement = self.processes[index] = self.spawn()
            self.restarts += 1
            log.error(
                "origin worker %d (pid %s) %s; restarted as pid %s",
                index,
                process.pid,
                why,
                replacement.pid,
            )

    def restart_all(self) -> None:
        """SIGHUP: each worker replaced by a new one once the new one serves. The old one is
        stopped gracefully and reaped later (``reap``): its streams may take minutes, and
        this loop must go on supervising (and feeding systemd's watchdog) meanwhile."""
        for index, old in enumerate(self.processes):
            if self.should_exit.is_set():
                return
            new = self.spawn()
            if not self._ready(new):
                new.kill()
                new.join()
                new.close_pipes()
                if not self.should_exit.is_set():
                    log.error(
                        "origin worker %d's replacement (pid %s) was not ready in time;"
                        " keeping pid %s and stopping the restart",
                        index,
                        new.pid,
                        old.pid,
                    )
                return
            self.processes[index] = new
            old.terminate()
            self.retiring.append(old)

    def _ready(self, process: WorkerProcess) -> bool:
        """Until ``process`` serves (False: it exited, or not within ``START_TIMEOUT``)."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and not self.should_exit.is_set():
            if not process.process.is_alive():
                return False
            if process.is_ready(timeout=1):
                process.started = True
                return True
            self.ping_watchdog()  # the other workers serve meanwhile
            time.sleep(0.1)
        return False

    def reap(self) -> None:
        """Join the retired workers that have finished."""
        for process in list(self.retiring):
            if not process.process.is_alive():
                process.join()
                process.close_pipes()
                self.retiring.remove(process)

    def ping_watchdog(self) -> None:
        if self.watchdog is not None and all(p.started for p in self.processes):
            self.watchdog.ping()

    def handle_ttin(self) -> None:
        self.processes_num += 1
        self.processes.append(self.spawn())

    def run(self) -> None:
        log.info("origin supervisor %d: %d workers", os.getpid(), self.processes_num)
        admin = _AdminThread(instance_admin(self.workers, lambda: self.restarts), self.admin_socket)
        self.init_processes()
        admin.start()
        try:
            while not self.should_exit.wait(0.5):
                self.handle_signals()
                self.keep_subprocess_alive()
                self.reap()
                self.ping_watchdog()
            self.terminate_all()
            self.join_all()
            for process in self.retiring:  # SIGTERMed already: let them finish
                process.join()
        finally:
            admin.stop()
        log.info("origin supervisor %d: stopped", os.getpid())


class _AdminThread:
    """uvicorn serving the instance's admin app on the admin socket, in a thread (no
    signal handlers there: the supervisor's main thread has them)."""

    def __init__(self, app: Routes, sock: socket.socket) -> None:
        config = uvicorn.Config(
            app,
            log_level="warning",
            log_config=None,
            access_log=False,
            lifespan="on",
            interface="asgi3",  # a compiled app's __call__ is no coroutine function to uvicorn
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="prism-admin", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def serve_workers(
    workers: int,
    public: socket.socket,
    admin: socket.socket,
    options: WorkerOptions,
    watchdog: SystemdWatchdog | None = None,
) -> bool:
    """Supervise ``workers`` origin workers on ``public`` until SIGTERM / SIGINT, the
    instance's admin view on ``admin``; False when a worker failed to start."""
    # The parent's config: what the supervisor reads (the workers' count, health-check
    # time, logging); each worker builds its own, with its app, in the child.
    config = uvicorn.Config(
        "origin.instance.worker:unused", workers=workers, log_level=options.log_level
    )
    supervisor = Supervisor(config, [public], admin, options, watchdog)
    supervisor.run()
    sys.stdout.flush()
    return not supervisor.failed
