"""HTTP client of the retrieval server (or of Search-R1's own server), behind the Searcher Protocol.

Timeouts and bounded retries: a request that fails to connect, times out, or gets a
429/5xx answer is retried up to ``retries`` times with exponential backoff (``backoff``,
``2 backoff``, ``4 backoff`` ... seconds); any other 4xx answer is the caller's fault and
raises at once with the server's explanation: :class:`~retrieval_index.protocol.QueryRejected`
when it blames a query's text (``empty_query``, ``query_too_long``, ``unencodable_query``,
``unsearchable_query``), else :class:`RetrievalError`. Searches are
reads, so retrying them is safe. One client may be shared by many threads (httpx's
connection pool is thread-safe).

A body over the server's limit is a 413, raised at once (``RetrievalError.status`` 413)
with its size and the limit, never retried. A body over :data:`CHECK_BODY_BYTES` is
first measured against the limit the server advertises (``GET /info``, asked once per
client): over it, the request is not sent at all. This matters because a server that
answers 413 and closes before reading the rest resets the connection, and the client,
still sending, sees a transport error instead of the answer (and retried it, as
transient); the project's server reads and drops such a body first
(``ServerLimits.max_drain_bytes``), other servers may not. A server without ``/info``
(Search-R1's own) gets the body as before.
"""

from __future__ import annotations

import json
import time
from typing import Any, Sequence

from retrieval_index.protocol import Hit, QueryRejected, check_queries, check_topk

_RETRY_STATUS = {429, 500, 502, 503, 504}
#: The server's error codes that blame a query's own text (raised as QueryRejected).
_QUERY_ERRORS = {"empty_query", "query_too_long", "unencodable_query", "unsearchable_query"}
#: Request bodies larger than this (bytes) are checked against the server's advertised limit first.
CHECK_BODY_BYTES = 64 << 10
_UNASKED = object()


class RetrievalError(RuntimeError):
    """The server refused a request, or could not be reached after every retry."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


class RetrievalClient:
    """``search(queries, topk)`` through ``POST {url}/retrieve``.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:8000``.
        timeout: seconds per attempt (connect and read).
        retries: extra attempts after the first on transient failures.
        backoff: seconds before the first retry (doubling after each).
        return_scores: ask for scores (``Hit.score`` is ``None`` without).
    """

    def __init__(self, url: str, *, timeout: float = 30.0, retries: int = 3, backoff: float = 0.25,
                 return_scores: bool = True):
        import httpx

        if not url.startswith(("http://", "https://")):
            raise ValueError(f"retrieval server url must start with http:// or https://, got {url!r}")
        if timeout <= 0 or retries < 0 or backoff < 0:
            raise ValueError(f"need timeout > 0, retries >= 0, backoff >= 0; got {timeout}, {retries}, {backoff}")
        self.url = url.rstrip("/")
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.return_scores = return_scores
        self._http = httpx.Client(timeout=timeout, limits=httpx.Limits(max_connections=256,
                                                                       max_keepalive_connections=64))
        self._max_body: Any = _UNASKED  # the server's max_body_bytes (None: it does not say)

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """One list of at most ``topk`` hits per query, best first."""
        queries = check_queries(queries)
        topk = check_topk(topk)
        if not queries:
            return []
        body = self._request("POST", "/retrieve",
                             {"queries": queries, "topk": topk, "return_scores": self.return_scores})
        result = body.get("result") if isinstance(body, dict) else None
        if not isinstance(result, list) or len(result) != len(queries):
            raise RetrievalError(f"{self.url}/retrieve answered {len(result) if isinstance(result, list) else result!r:.80}"
                                 f" result lists for {len(queries)} queries")
        return [[Hit.from_json(item) for item in hits] for hits in result]

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health")

    def info(self) -> dict[str, Any]:
        return self._request("GET", "/info")

    def max_body_bytes(self) -> int | None:
        """The largest request body the server takes, from its ``GET /info`` (asked once,
        one attempt; ``None`` when it does not say, e.g. Search-R1's own server)."""
        import httpx

        if self._max_body is not _UNASKED:
            return self._max_body
        try:
            response = self._http.get(self.url + "/info")
        except httpx.TransportError:
            return None  # unreachable now: asked again next time
        limit = None
        if response.status_code == 200:
            try:
                limit = response.json()["limits"]["max_body_bytes"]
            except (ValueError, KeyError, TypeError):
                limit = None
        self._max_body = limit if type(limit) is int and limit > 0 else None
        return self._max_body

    def _request(self, method: str, path: str, payload: Any = None) -> Any:
        import httpx

        content = None if payload is None else json.dumps(payload, ensure_ascii=False, separators=(",", ":"),
                                                           allow_nan=False).encode("utf-8")
        headers = None if content is None else {"content-type": "application/json"}
        if content is not None and len(content) > CHECK_BODY_BYTES:
            limit = self.max_body_bytes()
            if limit is not None and len(content) > limit:
                raise RetrievalError(f"{method} {self.url}{path} not sent: the request body is {len(content):,} "
                                     f"bytes, over the server's limit of {limit:,} bytes (max_body_bytes); send "
                                     "fewer or shorter queries", 413)
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._http.request(method, self.url + path, content=content, headers=headers)
            except httpx.TransportError as exc:  # connect error, timeout, dropped connection
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in _RETRY_STATUS:
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code >= 400:
                self._refused(method, path, response, content)
            return response.json()
        raise RetrievalError(f"{method} {self.url}{path} failed after {self.retries + 1} attempts; last error: {last}")

    def _refused(self, method: str, path: str, response: Any, content: bytes | None) -> None:
        """Raise the error a 4xx answer means (never retried)."""
        try:
            detail = response.json()
        except ValueError:
            detail = response.text[:300]
        code = detail.get("error") if isinstance(detail, dict) else None
        if code in _QUERY_ERRORS:
            raise QueryRejected(f"the retrieval server refused a query ({code}): {str(detail.get('detail', ''))[:300]}")
        if response.status_code == 413:
            said = str(detail.get("detail", "")) if isinstance(detail, dict) else str(detail)
            raise RetrievalError(f"{method} {self.url}{path} was refused (HTTP 413): the request body is "
                                 f"{len(content or b''):,} bytes, over the server's limit ({said[:300]})", 413)
        raise RetrievalError(f"{method} {self.url}{path} was refused (HTTP {response.status_code}): {detail}",
                             response.status_code)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RetrievalClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
