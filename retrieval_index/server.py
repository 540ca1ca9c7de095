"""``trace-gym index serve``: the Search-R1 retrieval API over HTTP, with request batching.

Routes (JSON in and out; every error is a 4xx JSON body ``{"error": code, "detail": text}``):

``POST /retrieve``
    ``{"queries": [str, ...], "topk": int (optional, default 3), "return_scores": bool
    (optional, default false)}`` -> ``{"result": [[item, ...] per query]}`` where an item is
    ``{"document": {"id", "contents"}, "score": float}`` with scores, and the document
    ``{"id", "contents"}`` alone without (Search-R1's shapes; unlike Search-R1's own
    server, ``return_scores: false`` works).
``GET /health``
    ``{"status": "ok"}``.
``GET /info``
    the index manifest (model, pooling, dims, count, corpus checksum ...), the request
    limits, and batching counters.

Bad requests, each with its own ``error`` code: a body over ``max_body_bytes`` (413
``body_too_large``; the rest of the body is read and dropped first, up to
``max_drain_bytes`` and within ``body_timeout_s``, so that the client, still sending,
reads the 413 instead of a connection reset), a body not read within ``body_timeout_s`` (408 ``body_timeout``), a
body that is not a JSON object, is nested deeper than ``max_json_depth`` or holds a
number of more than ``max_json_digits`` digits (400 ``invalid_json``; measured before the
body is parsed), a missing or mistyped field (422 ``missing_field`` / ``wrong_type``), an
unknown field (422 ``unknown_field``), an empty or whitespace-only query (422
``empty_query``), a query holding a lone surrogate, which UTF-8 cannot encode (422
``unencodable_query``), a query over ``max_query_chars`` (422 ``query_too_long``), more
than ``max_queries`` queries (422 ``too_many_queries``), ``topk`` outside ``[1,
max_topk]`` (422 ``topk_out_of_range``), more than ``max_queued_queries`` queries
already waiting (429 ``queue_full``; the client retries it).

A search that fails inside the searcher is narrowed down to the queries that fail (the
batch is split in halves until each failing query stands alone): a query that fails alone
while others succeed, or while a query that succeeded before still does, gets 422
``unsearchable_query`` and fails only its own request; every other request of the batch
is answered. Only when the searcher fails on everything (it is down) is the answer 503
``search_failed`` (the client retries it).

Batching, fair: requests wait in a queue; one worker deals their queries into a batch,
one query per request per round, until it holds ``max_batch_queries`` queries or
``max_batch_chars`` characters or each request its ``request_share`` (waiting at most
``batch_wait_ms`` for more when the batch is small), runs *one* ``searcher.search`` over
all of it (one encode, one FAISS search) with the largest requested ``topk`` on a worker
thread, and hands each request its slice. A request with queries left goes to the back
of the queue, behind those that arrived meanwhile: every waiting request is in the next
batch, and a batch's cost is bounded, so a one-query request behind two of 256 long
queries waits for at most the batch in flight and its own.

Slow clients: a connection must send a request's headers within ``header_timeout_s``
(of connecting, or of its previous response) and the body within ``body_timeout_s``, or
it is closed (408 for the body); idle keep-alive connections close after uvicorn's
``timeout_keep_alive`` (5 s).

Shutdown is graceful: on SIGINT/SIGTERM uvicorn stops accepting connections, in-flight
requests finish (up to ``graceful_seconds``), then the batcher drains and the process exits 0.
"""

import asyncio
import contextlib
import math
import signal
import socket
import sys
import threading
import time
from dataclasses import asdict
from typing import Any, Iterator

from retrieval_index.batcher import Batcher, QueryFailed, QueueFull  # noqa: F401  (QueueFull, QueryFailed: public here too)
from retrieval_index.limits import ServerLimits  # noqa: F401  (public here too)
from retrieval_index.protocol import Searcher
from retrieval_index.textclean import JSONRefused, clean_text, clean_value, first_unencodable, loads_bounded


class RequestError(Exception):
    """A bad request: HTTP ``status``, a stable ``code`` and a readable ``detail``."""

    def __init__(self, status: int, code: str, detail: str):
        super().__init__(detail)
        self.status, self.code, self.detail = status, code, detail


_FIELDS = {"queries", "topk", "return_scores"}


def parse_retrieve(body: bytes, limits: ServerLimits) -> tuple[list[str], int, bool]:
    """Validate a ``/retrieve`` body; ``(queries, topk, return_scores)`` or :class:`RequestError`."""
    if len(body) > limits.max_body_bytes:
        raise RequestError(413, "body_too_large", f"request body is {len(body)} bytes; the limit is "
                           f"{limits.max_body_bytes}")
    try:
        payload = loads_bounded(body, max_depth=limits.max_json_depth, max_digits=limits.max_json_digits)
    except JSONRefused as exc:
        raise RequestError(400, "invalid_json", f"the request body {exc}") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "invalid_json", f"request body must be a JSON object, got {type(payload).__name__}")
    unknown = sorted(set(payload) - _FIELDS)
    if unknown:
        raise RequestError(422, "unknown_field", f"unknown field(s) {unknown}; expected {sorted(_FIELDS)}")
    if "queries" not in payload:
        raise RequestError(422, "missing_field", "field 'queries' (a list of strings) is required")
    queries = payload["queries"]
    if not isinstance(queries, list):
        raise RequestError(422, "wrong_type", f"'queries' must be a list of strings, got {_json_type(queries)}")
    if len(queries) > limits.max_queries:
        raise RequestError(422, "too_many_queries", f"{len(queries)} queries; at most {limits.max_queries} per request")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise RequestError(422, "wrong_type", f"queries[{i}] must be a string, got {_json_type(q)}")
        if not q.strip():
            raise RequestError(422, "empty_query", f"queries[{i}] is empty or whitespace only")
        at = first_unencodable(q)
        if at is not None:
            raise RequestError(422, "unencodable_query", f"queries[{i}] holds a lone surrogate U+{ord(q[at]):04X} at "
                               f"character {at}, which UTF-8 cannot encode")
        if len(q) > limits.max_query_chars:
            raise RequestError(422, "query_too_long", f"queries[{i}] has {len(q)} characters; the limit is "
                               f"{limits.max_query_chars}")
    topk = payload.get("topk")
    if topk is None:
        topk = limits.default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise RequestError(422, "wrong_type", f"'topk' must be an integer, got {_json_type(topk)}")
    elif not 1 <= topk <= limits.max_topk:
        raise RequestError(422, "topk_out_of_range", f"'topk' must lie in [1, {limits.max_topk}], got {topk}")
    return_scores = payload.get("return_scores", False)
    if return_scores is None:
        return_scores = False
    if not isinstance(return_scores, bool):
        raise RequestError(422, "wrong_type", f"'return_scores' must be true or false, got {_json_type(return_scores)}")
    return queries, topk, return_scores


def _json_type(value: Any) -> str:
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def create_app(searcher: Searcher, limits: ServerLimits | None = None, info: dict[str, Any] | None = None) -> Any:
    """The ASGI app (FastAPI) serving ``searcher``."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    SafeJSONResponse = _safe_json_response()
    limits = limits or ServerLimits()
    batcher = Batcher(searcher, limits)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="trace_gym retrieval server", lifespan=lifespan, docs_url=None, redoc_url=None,
                  default_response_class=SafeJSONResponse)
    app.state.batcher = batcher

    def error(status: int, code: str, detail: str, **headers: str) -> JSONResponse:
        return SafeJSONResponse({"error": code, "detail": clean_text(detail)[:1000]}, status_code=status,
                                headers=headers or None)

    @app.post("/retrieve")
    async def retrieve(request: Request):
        started = time.monotonic()
        try:
            body = await asyncio.wait_for(_read_body(request, limits), limits.body_timeout_s)
            queries, topk, with_scores = parse_retrieve(body, limits)
        except RequestError as exc:  # a body left unread (413) must not be taken for the next request
            if exc.status == 413 and _declared(request) <= limits.max_drain_bytes:  # else: cut off at once
                await _drain(request, limits.body_timeout_s - (time.monotonic() - started), limits)
            return error(exc.status, exc.code, exc.detail, **({"connection": "close"} if exc.status == 413 else {}))
        except asyncio.TimeoutError:  # a slow client: stop reading and close the connection
            return error(408, "body_timeout", f"the request body was not received within {limits.body_timeout_s} s",
                         connection="close")
        except Exception as exc:  # not reached (parse_retrieve raises RequestError); a net, so never a 500
            return error(400, "bad_request", f"the request could not be read ({type(exc).__name__}: {exc})")
        try:
            results = await batcher.submit(queries, topk) if queries else []
        except QueueFull as exc:
            return error(429, "queue_full", str(exc))
        except QueryFailed as exc:  # this request's own query; the requests batched with it were answered
            return error(422, "unsearchable_query", str(exc))
        except Exception as exc:  # the searcher failed on everything; clients may retry a 503
            return error(503, "search_failed", f"{type(exc).__name__}: {exc}"[:500])
        return SafeJSONResponse({"result": [[hit.to_json(with_scores) for hit in hits] for hits in results]})

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/info")
    async def get_info():
        described = info if info is not None else (searcher.info() if hasattr(searcher, "info") else {})
        return {"index": described, "limits": asdict(limits), "batching": batcher.stats()}

    return app


def _safe_json_response() -> type:
    """A ``JSONResponse`` class that renders any result: text UTF-8 cannot encode (a lone
    surrogate in a corpus line or an error message) is written as ``\\udXXX``, a non-finite
    score as ``null``."""
    from fastapi.responses import JSONResponse

    class SafeJSONResponse(JSONResponse):
        def render(self, content: Any) -> bytes:
            try:
                return super().render(content)
            except ValueError:  # UnicodeEncodeError, or a NaN/inf float
                return super().render(_finite(clean_value(content)))

    return SafeJSONResponse


async def _read_body(request: Any, limits: ServerLimits) -> bytes:
    """The body, or RequestError 413 as soon as it is known to be over the limit (its
    rest unread: :func:`_drain` reads it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and (len(declared) >= 20 or int(declared) > limits.max_body_bytes):
        raise RequestError(413, "body_too_large", f"request body is {declared} bytes; the limit is "
                           f"{limits.max_body_bytes} (max_body_bytes)")
    body = bytearray()
    while True:  # the ASGI messages themselves: _drain() reads on where this stopped
        message = await request.receive()
        if message["type"] != "http.request":  # the client went away
            break
        body += message.get("body", b"")
        if len(body) > limits.max_body_bytes:
            raise RequestError(413, "body_too_large", f"request body exceeds the limit of "
                               f"{limits.max_body_bytes} bytes (max_body_bytes)")
        if not message.get("more_body", False):
            break
    return bytes(body)


async def _drain(request: Any, seconds: float, limits: ServerLimits) -> None:
    """Read and drop the rest of a refused body, at most ``max_drain_bytes`` within
    ``seconds``: the client is still sending, and closing on unread bytes resets the
    connection (the client would lose the 413 and retry)."""
    async def rest() -> None:
        dropped = 0
        while dropped <= limits.max_drain_bytes:
            message = await request.receive()
            if message["type"] != "http.request" or not message.get("more_body", False):
                return
            dropped += len(message.get("body", b""))

    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(rest(), max(seconds, 0.0))


def _declared(request: Any) -> int:
    """A request's declared ``content-length`` (0 when absent or unreadable: chunked)."""
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() and len(declared) < 20 else 0


def _finite(value: Any) -> Any:
    """``value`` (JSON-like) with NaN and infinite floats replaced by ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket (``port=0``: a free port; read it from ``getsockname()``)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def header_deadline_protocol(seconds: float) -> type:
    """uvicorn's HTTP protocol class with a deadline on request headers: a connection that
    has not sent a complete header block ``seconds`` after it opened, or after its
    previous response, is closed. (uvicorn itself times out only idle keep-alive
    connections; one that trickles its headers a byte at a time would stay open for ever.)

    Only the asyncio ``Protocol`` methods and uvicorn's ``on_response_complete`` hook are
    overridden; header blocks are counted by their ``\\r\\n\\r\\n`` ends (a body holding
    that sequence only makes the deadline lenient, never early)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class HeaderDeadlineProtocol(AutoHTTPProtocol):
        def connection_made(self, transport: Any) -> None:
            self._heads = self._answered = 0
            self._tail = b""
            self._deadline: asyncio.TimerHandle | None = None
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = asyncio.get_running_loop().call_later(seconds, self._expire)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expire(self) -> None:
            self._deadline = None
            if self._heads <= self._answered and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            window = self._tail + data
            self._heads += window.count(b"\r\n\r\n")
            self._tail = window[-3:]
            if self._heads > self._answered:
                self._disarm()
            super().data_received(data)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._answered += 1
            if self._heads <= self._answered and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadlineProtocol


def _server(app: Any, limits: ServerLimits, log_level: str) -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=limits.graceful_seconds,
                            access_log=False, lifespan="on", backlog=2048,
                            http=header_deadline_protocol(limits.header_timeout_s))
    return uvicorn.Server(config)


def serve(searcher: Searcher, host: str = "127.0.0.1", port: int = 8000, *, limits: ServerLimits | None = None,
          log_level: str = "warning") -> None:
    """Serve until SIGINT/SIGTERM; prints ``serving on http://host:port`` once listening."""
    limits = limits or ServerLimits()
    if host not in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: serving on {host}, reachable beyond this machine", file=sys.stderr)
    sock = bind(host, port)
    actual = sock.getsockname()[1]
    server = _server(create_app(searcher, limits), limits, log_level)
    # uvicorn re-raises the signal that stopped it once shutdown is done, to the handler
    # that was installed before it ran; a no-op handler there lets a graceful stop exit 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    print(f"serving on http://{host}:{actual}", flush=True)
    server.run(sockets=[sock])
    print("retrieval server stopped", file=sys.stderr, flush=True)


@contextlib.contextmanager
def running_server(searcher: Searcher, *, limits: ServerLimits | None = None, host: str = "127.0.0.1",
                   log_level: str = "warning") -> Iterator[str]:
    """Run the server on a free loopback port in a background thread; yields its base URL."""
    limits = limits or ServerLimits()
    sock = bind(host, 0)
    server = _server(create_app(searcher, limits), limits, log_level)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="retrieval-server")
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the retrieval server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=limits.graceful_seconds + 10)
        sock.close()
