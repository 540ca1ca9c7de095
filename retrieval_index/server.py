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
``body_too_large``), a body that is not a JSON object (400 ``invalid_json``), a missing
or mistyped field (422 ``missing_field`` / ``wrong_type``), an unknown field (422
``unknown_field``), an empty or whitespace-only query (422 ``empty_query``), a query over
``max_query_chars`` (422 ``query_too_long``), more than ``max_queries`` queries (422
``too_many_queries``), ``topk`` outside ``[1, max_topk]`` (422 ``topk_out_of_range``).

A search that fails inside the searcher answers 503 ``search_failed`` (the client
retries it).

Batching: requests wait in a queue; one worker takes everything queued (up to
``max_batch_queries`` queries, waiting at most ``batch_wait_ms`` for more when the
batch is small), runs *one* ``searcher.search`` over all of it (one encode, one FAISS
search) with the largest requested ``topk`` on a worker thread, and hands each request
its slice. Under concurrency, many requests share one forward pass.

Shutdown is graceful: on SIGINT/SIGTERM uvicorn stops accepting connections, in-flight
requests finish (up to ``graceful_seconds``), then the batcher drains and the process exits 0.
"""

import asyncio
import contextlib
import json
import signal
import socket
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from retrieval_index.protocol import Hit, Searcher


@dataclass(frozen=True)
class ServerLimits:
    """Request limits and batching knobs of the retrieval server.

    Attributes:
        max_queries: queries per request.
        max_query_chars: characters per query.
        max_topk: largest ``topk``.
        default_topk: ``topk`` when a request leaves it out (Search-R1's default is 3).
        max_body_bytes: request body size in bytes.
        max_batch_queries: queries per encode+search batch.
        batch_wait_ms: how long a small batch waits for more requests, milliseconds.
        graceful_seconds: how long shutdown waits for in-flight requests, seconds.
    """

    max_queries: int = 256
    max_query_chars: int = 4096
    max_topk: int = 100
    default_topk: int = 3
    max_body_bytes: int = 1 << 20
    max_batch_queries: int = 512
    batch_wait_ms: float = 2.0
    graceful_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_queries", "max_query_chars", "max_topk", "default_topk", "max_body_bytes",
                     "max_batch_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be >= 1, got {getattr(self, name)!r}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(f"default_topk {self.default_topk} must lie in [1, max_topk={self.max_topk}]")
        if self.batch_wait_ms < 0 or self.graceful_seconds < 0:
            raise ValueError("batch_wait_ms and graceful_seconds must be >= 0")


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
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None
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


class Batcher:
    """Merges concurrent searches into one ``searcher.search`` call (see the module docstring)."""

    def __init__(self, searcher: Searcher, limits: ServerLimits):
        self.searcher, self.limits = searcher, limits
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="retrieval-batch")
        self.batches = 0
        self.requests = 0
        self.queries = 0
        self.largest_batch = 0

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Finish everything queued, then stop the worker."""
        if self._task is not None:
            await self._queue.put(None)
            await self._task
            self._task = None
        self._executor.shutdown(wait=True)

    async def submit(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if self._task is None:
            raise RuntimeError("the batcher is not running")
        future = asyncio.get_running_loop().create_future()
        await self._queue.put((queries, topk, future))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        stopping = False
        while not stopping:
            item = await self._queue.get()
            if item is None:
                break
            batch, size = [item], len(item[0])
            deadline = loop.time() + self.limits.batch_wait_ms / 1e3
            while size < self.limits.max_batch_queries:
                try:
                    nxt = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        nxt = await asyncio.wait_for(self._queue.get(), remaining)
                    except asyncio.TimeoutError:
                        break
                if nxt is None:
                    stopping = True
                    break
                batch.append(nxt)
                size += len(nxt[0])
            await self._search(loop, batch)

    async def _search(self, loop: asyncio.AbstractEventLoop, batch: list) -> None:
        flat = [q for queries, _, _ in batch for q in queries]
        topk = max(k for _, k, _ in batch)
        try:
            results = await loop.run_in_executor(self._executor, self.searcher.search, flat, topk)
        except Exception as exc:  # the searcher failed: every waiting request gets the error
            for _, _, future in batch:
                if not future.done():
                    future.set_exception(exc)
            return
        self.batches += 1
        self.requests += len(batch)
        self.queries += len(flat)
        self.largest_batch = max(self.largest_batch, len(flat))
        pos = 0
        for queries, k, future in batch:
            if not future.done():
                future.set_result([hits[:k] for hits in results[pos: pos + len(queries)]])
            pos += len(queries)

    def stats(self) -> dict[str, Any]:
        return {"batches": self.batches, "requests": self.requests, "queries": self.queries,
                "largest_batch_queries": self.largest_batch,
                "mean_batch_queries": self.queries / self.batches if self.batches else 0.0}


def create_app(searcher: Searcher, limits: ServerLimits | None = None, info: dict[str, Any] | None = None) -> Any:
    """The ASGI app (FastAPI) serving ``searcher``."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse

    limits = limits or ServerLimits()
    batcher = Batcher(searcher, limits)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="trace_gym retrieval server", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.batcher = batcher

    def error(exc: RequestError) -> JSONResponse:
        return JSONResponse({"error": exc.code, "detail": exc.detail}, status_code=exc.status)

    @app.post("/retrieve")
    async def retrieve(request: Request):
        try:
            declared = request.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
                raise RequestError(413, "body_too_large", f"request body is {declared} bytes; the limit is "
                                   f"{limits.max_body_bytes}")
            body = bytearray()
            async for chunk in request.stream():
                body += chunk
                if len(body) > limits.max_body_bytes:
                    raise RequestError(413, "body_too_large", f"request body exceeds the limit of "
                                       f"{limits.max_body_bytes} bytes")
            queries, topk, with_scores = parse_retrieve(bytes(body), limits)
        except RequestError as exc:
            return error(exc)
        try:
            results = await batcher.submit(queries, topk) if queries else []
        except Exception as exc:  # the searcher failed; clients may retry a 503
            return JSONResponse({"error": "search_failed", "detail": f"{type(exc).__name__}: {exc}"[:500]},
                                status_code=503)
        return JSONResponse({"result": [[hit.to_json(with_scores) for hit in hits] for hits in results]})

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/info")
    async def get_info():
        described = info if info is not None else (searcher.info() if hasattr(searcher, "info") else {})
        return {"index": described, "limits": asdict(limits), "batching": batcher.stats()}

    return app


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket (``port=0``: a free port; read it from ``getsockname()``)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _server(app: Any, limits: ServerLimits, log_level: str) -> Any:
    import uvicorn

    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=limits.graceful_seconds,
                            access_log=False, lifespan="on", backlog=2048)
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
