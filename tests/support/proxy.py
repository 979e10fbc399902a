"""A TCP proxy on loopback that can stop forwarding: a store that accepts connections but
answers nothing (a black-holed path, a Redis stuck in a long command, a failover's first
seconds), which neither stopping nor SIGSTOPping the Redis itself quite is."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from typing import Any

__all__ = ["StallingProxy"]


class StallingProxy:
    """Forwards ``127.0.0.1:<port>`` to *upstream* until :meth:`stall`, and again after
    :meth:`resume`; while stalled, connections are accepted and nothing moves either way."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ, None)
        self._peers: dict[socket.socket, socket.socket] = {}
        self._stalled = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stalling-proxy", daemon=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> StallingProxy:
        self._thread.start()
        return self

    def stall(self) -> None:
        self._stalled.set()

    def resume(self) -> None:
        self._stalled.clear()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        for sock in [self._listener, *self._peers]:
            sock.close()
        self._selector.close()

    def _run(self) -> None:
        while not self._closed.is_set():
            for key, _ in self._selector.select(timeout=0.05):
                sock: Any = key.fileobj
                if sock is self._listener:
                    self._accept()
                elif not self._stalled.is_set():
                    self._forward(sock)
            if self._stalled.is_set():  # readable sockets are left unread: do not spin
                self._closed.wait(0.02)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
            upstream = socket.create_connection(self.upstream, timeout=2)
        except OSError:
            return
        for sock in (client, upstream):
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ, None)
        self._peers[client], self._peers[upstream] = upstream, client

    def _forward(self, sock: socket.socket) -> None:
        peer = self._peers.get(sock)
        try:
            data = sock.recv(65536)
            if data and peer is not None:
                peer.setblocking(True)
                peer.sendall(data)
                peer.setblocking(False)
                return
        except OSError:
            pass  # reset by either side: the pair goes
        self._drop(sock)

    def _drop(self, sock: socket.socket) -> None:
        peer = self._peers.pop(sock, None)
        for one in (sock, peer):
            if one is None:
                continue
            self._peers.pop(one, None)
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(one)
            one.close()
