"""The semantic model in a process of its own, so the origin's event loop never waits for it.

In the origin's own process the model ran in a thread beside the event loop, sharing its
GIL: the thread needs it around each model call (tokenizing, the arrays in and out), and
every time the loop gave the GIL up for a system call (a socket write to a client, a
provider, Redis) it could find the thread holding it and wait. Measured at 200 unique
misses a second on 2 cores, the loop was busy 79 % of the time with the semantic layer on
against 25 % off, most of the difference in those waits, though the embedding itself ran
in the thread. Here the model runs in a child process (this module's ``main``, started on
the first embedding, its standard streams the pipe): the embedder's thread only writes
the texts and reads the vectors back, blocking in system calls that release the GIL.

The child loads the model as the thread did (``engine.load_model``), tokenizes and embeds
(``encoding.encode_texts``) and answers each batch with the vectors' bytes and the CPU time
it took. It exits when its pipe closes, so it never outlives the origin. One that dies is
started again for the next batch, and the batch it had is sent once more.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

__all__ = ["EncoderProcess", "main"]

_LENGTH = struct.Struct("<I")


class EncoderProcess:
    """The parent's side: ``load`` then ``encode`` from one thread (the embedder's)."""

    def __init__(self, engine: str, directory: Path, cache_dir: Path, threads: int) -> None:
        self._load_args = (engine, str(directory), str(cache_dir), threads)
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # close() may come from another thread
        self.name = ""
        self.kind = ""  # the child's model class ("OnnxSentenceModel" or "SentenceModel")
        self.dimensions = 0

    def load(self) -> None:
        """Start the child and load the model there; raises with the child's reason."""
        self._start()

    def encode(self, texts: list[str]) -> tuple[list[bytes | None], float]:
        """Each text's vector (float32 bytes; None: it cannot be compared), and the CPU
        seconds the child spent. A child that died is started again and asked once more."""
        try:
            found: tuple[list[bytes | None], float] = self._ask(("encode", texts))
        except (OSError, EOFError, pickle.UnpicklingError):
            self._stop()
            self._start()
            found = self._ask(("encode", texts))
        return found

    def close(self) -> None:
        self._stop()

    def _start(self) -> None:
        child = subprocess.Popen(
            # Not ``-m`` this module: the package imports it first, which ``-m`` warns about.
            [sys.executable, "-c", f"from {__name__} import main; main()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        with self._lock:
            self._child = child
        name, kind, dimensions = self._ask(("load", *self._load_args))
        self.name, self.kind, self.dimensions = name, kind, dimensions

    def _ask(self, message: tuple[Any, ...]) -> Any:
        child = self._child
        if child is None or child.stdin is None or child.stdout is None:
            raise OSError("the semantic model's process is not running")
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        child.stdin.write(_LENGTH.pack(len(data)) + data)
        child.stdin.flush()
        ok, answer = _read(child.stdout)
        if not ok:  # the child's own failure (the model could not be loaded)
            raise RuntimeError(answer)
        return answer

    def _stop(self) -> None:
        with self._lock:
            child, self._child = self._child, None
        if child is None:
            return
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _read(stream: IO[bytes]) -> Any:
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        raise EOFError("the semantic model's process ended")
    (length,) = _LENGTH.unpack(head)
    data = stream.read(length)
    if len(data) < length:
        raise EOFError("the semantic model's process ended")
    return pickle.loads(data)


def _write(stream: IO[bytes], message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _serve(requests: IO[bytes], replies: IO[bytes]) -> None:
    """The child: one request at a time until the pipe closes."""
    from .encoding import encode_texts
    from .engine import EncodingModel, load_model

    model: EncodingModel | None = None
    while True:
        try:
            message = _read(requests)
        except EOFError:
            return
        kind, *args = message
        try:
            if kind == "load":
                engine, directory, cache_dir, threads = args
                model = load_model(engine, Path(directory), Path(cache_dir), threads)
                _write(replies, (True, (model.name, type(model).__name__, model.dimensions)))
            elif model is not None:
                cpu = time.thread_time()
                vectors = encode_texts(model, args[0])
                out = [None if v is None else v.tobytes() for v in vectors]
                _write(replies, (True, (out, time.thread_time() - cpu)))
            else:
                _write(replies, (False, "no model loaded"))
        except Exception as error:  # the model's failure, told to the parent
            _write(replies, (False, f"{type(error).__name__}: {error}"))


def main() -> None:
    """The child ``EncoderProcess`` starts."""
    import signal

    # Ctrl-C in a terminal reaches the whole process group: the origin stops this child
    # itself (its pipe closes), so it must not die first in the middle of a batch.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The replies get the pipe; anything a library prints goes to stderr, not into them.
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    _serve(sys.stdin.buffer, replies)
