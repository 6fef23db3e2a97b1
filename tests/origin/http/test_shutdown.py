"""A graceful shutdown (SIGTERM, or a worker retired by SIGHUP) does not reset a connection
whose request is still on its way: it is answered, and the connection then closed
(origin.http.server.DeadlineProtocol.shutdown)."""

from __future__ import annotations

import socket
import threading

from tests.fixtures.origin import RunningOrigin
from tests.polling import wait_for


def refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def test_a_connection_made_before_the_shutdown_gets_its_answer(origin: RunningOrigin) -> None:
    port = origin.server.port
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        wait_for(lambda: len(origin.server._server.server_state.connections) == 1)  # type: ignore[union-attr]
        stopping = threading.Thread(target=origin.server.stop)
        stopping.start()
        wait_for(lambda: refused(port))  # the listener is closed: the shutdown is under way
        conn.sendall(b"GET /healthz HTTP/1.1\r\nhost: origin\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        stopping.join(timeout=10)
    # Answered (uvicorn alone closed it unanswered), then closed: the loop read to its end.
    assert answer.startswith(b"HTTP/1.1 200"), answer
