"""A loopback TCP relay whose connections can be cut: a network that drops a websocket
while the server behind it lives (tests/test_ecosystem_openenv.py)."""

from __future__ import annotations

import socket
import threading


class Relay:
    """Listens on a free loopback port and pipes each connection to ``target_port``;
    :meth:`cut` closes every open connection (both ends), new ones still go through."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            with self._lock:
                self._open += [downstream, upstream]
            for a, b in ((downstream, upstream), (upstream, downstream)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for sock in (src, dst):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> int:
        """Close every open connection; how many were cut."""
        with self._lock:
            cut, self._open = self._open, []
        for sock in cut:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        return len(cut)

    def close(self) -> None:
        self._listener.close()
        self.cut()
