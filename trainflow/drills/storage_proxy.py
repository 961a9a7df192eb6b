"""The drills' storage relay: a TCP relay in front of the storage endpoint that can make it
unreachable for a while (storage-outage faults)."""

from __future__ import annotations

import socket
import threading
import time


def relay_on(port: int | None) -> StorageProxy | None:
    """The open relay listening on `port` in this process: a fault plan names its relay by port."""
    return _open_relays.get(port) if port is not None else None


_open_relays: dict[int, StorageProxy] = {}


class StorageProxy:
    """A TCP relay in front of the storage endpoint. `outage()` makes it unreachable for a while:
    every connection is dropped and new ones refused, or (`stall`) every request waits unanswered
    until the outage is over, as an endpoint that stops answering."""

    def __init__(self, upstream_host: str, upstream_port: int):
        self.upstream = (upstream_host, upstream_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._down_until = 0.0
        self._stalling = False
        self._up = threading.Event()
        self._up.set()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()
        _open_relays[self.port] = self

    def outage(self, duration_s: float, stall: bool = False) -> None:
        self._down_until = time.monotonic() + duration_s
        self._stalling = stall
        if stall:
            self._up.clear()
            timer = threading.Timer(duration_s, self.end_outage)
            timer.daemon = True
            timer.start()
            return
        with self._lock:
            for sock in list(self._sockets):
                _close(sock)
            self._sockets.clear()

    def end_outage(self) -> None:
        """The endpoint answers again; stalled requests go on where they stood."""
        self._down_until = 0.0
        self._up.set()

    def close(self) -> None:
        self._closed = True
        self.end_outage()
        _open_relays.pop(self.port, None)
        _close(self._listener)
        with self._lock:
            for sock in list(self._sockets):
                _close(sock)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        if time.monotonic() < self._down_until and not self._stalling:
            _close(client)
            return
        self._up.wait()
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            _close(client)
            return
        with self._lock:
            self._sockets.update((client, upstream))
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                self._up.wait()  # a stalled endpoint: the bytes wait here until it answers again
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(source)
            _close(sink)
            with self._lock:
                self._sockets.discard(source)
                self._sockets.discard(sink)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
