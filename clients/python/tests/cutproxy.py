"""A loopback TCP proxy whose connections a test can cut, as a network failure would."""

import socket
import threading
from urllib.parse import urlsplit


class CutProxy:
    """Forwards 127.0.0.1:<port> to the gateway of url; cut() resets every open connection."""

    def __init__(self, url: str):
        u = urlsplit(url)
        self.target = (u.hostname, u.port)
        self.lsock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.lsock.getsockname()[1]}"
        self.conns: list = []
        self.accepted = 0
        self.lock = threading.Lock()
        self.threads: list = []
        self._spawn(self._accept)

    def _spawn(self, fn, *args):
        t = threading.Thread(target=fn, args=args, daemon=True)
        t.start()
        self.threads.append(t)

    def _accept(self):
        while True:
            try:
                c, _ = self.lsock.accept()
            except OSError:
                return
            u = socket.create_connection(self.target)
            with self.lock:
                self.conns += [c, u]
                self.accepted += 1
            self._spawn(self._pump, c, u)
            self._spawn(self._pump, u, c)

    @staticmethod
    def _pump(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> int:
        """Cuts every connection open now: no close frame, no end of stream or body."""
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
                s.shutdown(socket.SHUT_RDWR)  # wakes the pump blocked in recv (a bare close would not)
                s.close()
            except OSError:
                pass
        return len(conns) // 2

    def close(self):
        self.lsock.close()
        self.cut()
