"""A request body over the retrieval server's limit: the client gets the 413, at once.

A server that answers 413 and closes before reading the rest of the body resets the
connection, and a client still sending it sees a transport error instead of the answer;
``RetrievalClient`` used to retry that as transient. Planted here: bodies of 12 MB and
40 MB with a ``content-length`` and 8 MB streamed without one, each sent whole by a raw
socket that reads the answer only afterwards (the server must read and drop them first);
``RetrievalClient`` against the real server with bodies under and over its check size;
and ``RetrievalClient`` against a server that resets without a word but advertises its
limit (the client must not send the body at all).
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("faiss")

from retrieval_index.client import CHECK_BODY_BYTES, RetrievalClient, RetrievalError  # noqa: E402
from retrieval_index.dense import DenseSearcher  # noqa: E402
from retrieval_index.offline import offline_index  # noqa: E402
from retrieval_index.server import ServerLimits, running_server  # noqa: E402

LIMIT = 4096
#: body_timeout_s generous: a loaded machine drains 40 MB slowly
LIMITS = ServerLimits(max_body_bytes=LIMIT, body_timeout_s=60.0)
#: a backoff no test waits for: a retry would show as seconds
SLOW_BACKOFF = 5.0


@pytest.fixture(scope="module")
def url():
    searcher = DenseSearcher.load(offline_index("dense", 0, 0.03, progress=False))
    with running_server(searcher, limits=LIMITS) as base:
        yield base


def send_whole_then_read(url: str, size: int, chunked: bool) -> tuple[int, dict]:
    """POST /retrieve with a ``size``-byte body written entirely before the answer is read
    (as an HTTP client does); (status, JSON body) of the answer. A small send buffer, so
    that the body cannot hide in the kernel's buffers."""
    host, port = url.removeprefix("http://").split(":")
    body = b'{"queries": ["' + b"x" * (size - 18) + b'"]}'
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 16)
        framing = b"transfer-encoding: chunked" if chunked else f"content-length: {len(body)}".encode()
        sock.sendall(b"POST /retrieve HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                     + framing + b"\r\n\r\n")
        if chunked:
            for i in range(0, len(body), 1 << 16):
                piece = body[i: i + (1 << 16)]
                sock.sendall(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            sock.sendall(b"0\r\n\r\n")
        else:
            sock.sendall(body)
        answer = b""
        while chunk := sock.recv(1 << 16):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


@pytest.mark.parametrize(("size", "chunked"), [(12 << 20, False), (40 << 20, False), (8 << 20, True)],
                         ids=["12MB", "40MB", "8MB-chunked"])
def test_a_client_that_sends_the_whole_body_reads_the_413(url, size, chunked):
    status, payload = send_whole_then_read(url, size, chunked)  # a reset raises ConnectionResetError here
    assert status == 413 and payload["error"] == "body_too_large", payload
    assert str(LIMIT) in payload["detail"], payload


@pytest.mark.parametrize("size", [10 << 20, 3 << 20, CHECK_BODY_BYTES // 2])
def test_the_client_reports_a_body_over_the_limit_at_once(url, size):
    client = RetrievalClient(url, retries=3, backoff=SLOW_BACKOFF)
    started = time.monotonic()
    with pytest.raises(RetrievalError, match="413|limit") as err:
        client.search(["y" * size], 3)
    assert time.monotonic() - started < SLOW_BACKOFF, "retried"
    body = json.dumps({"queries": ["y" * size], "topk": 3, "return_scores": True}, separators=(",", ":"))
    digits = str(err.value).replace(",", "")
    assert err.value.status == 413 and str(LIMIT) in digits and str(len(body)) in digits, str(err.value)
    assert client.search(["a city on a river"], 2)  # the client still works


class ResettingServer:
    """An HTTP server that resets any ``/retrieve`` connection without a word, before
    reading the body (a proxy or server that closes early, on a network where the 413
    is lost), and advertises its limit at ``GET /info``."""

    def __init__(self, limit: int):
        self.limit, self.posts = limit, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            head = b""
            while b"\r\n\r\n" not in head:
                chunk = conn.recv(4096)
                if not chunk:
                    return
                head += chunk
            if head.startswith(b"GET /info"):
                body = json.dumps({"index": {}, "limits": {"max_body_bytes": self.limit}}).encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
                return
            self.posts += 1
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize("size", [10 << 20, 1 << 20, 200_000])
def test_a_body_over_the_advertised_limit_is_never_sent(size):
    server = ResettingServer(limit=100_000)
    try:
        client = RetrievalClient(server.url, retries=2, backoff=SLOW_BACKOFF)
        started = time.monotonic()
        with pytest.raises(RetrievalError) as err:
            client.search(["z" * size], 3)
        assert time.monotonic() - started < SLOW_BACKOFF, "retried"
        assert err.value.status == 413 and "100,000" in str(err.value), str(err.value)
        assert server.posts == 0
    finally:
        server.close()


def test_a_server_without_info_is_sent_the_body_as_before():
    class NoInfo(ResettingServer):
        def _handle(self, conn: socket.socket) -> None:
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(1 << 16)
                if head.startswith(b"GET /info"):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    return
                self.posts += 1
                length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                got = len(head.partition(b"\r\n\r\n")[2])
                while got < length:
                    got += len(conn.recv(1 << 16))
                answer = b'{"result": [[]]}'
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n"
                             b"content-length: " + str(len(answer)).encode() + b"\r\n\r\n" + answer)

    server = NoInfo(limit=0)
    try:
        client = RetrievalClient(server.url, retries=0)
        assert client.search(["w" * (CHECK_BODY_BYTES * 2)], 3) == [[]]
        assert client.max_body_bytes() is None and server.posts == 1
    finally:
        server.close()
