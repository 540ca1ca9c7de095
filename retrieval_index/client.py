"""HTTP client of the retrieval server (or of Search-R1's own server), behind the Searcher Protocol.

Timeouts and bounded retries: a request that fails to connect, times out, or gets a
429/5xx answer is retried up to ``retries`` times with exponential backoff (``backoff``,
``2 backoff``, ``4 backoff`` ... seconds); any other 4xx answer is the caller's fault and
raises at once with the server's explanation: :class:`~retrieval_index.protocol.QueryRejected`
when it blames a query's text (``empty_query``, ``query_too_long``, ``unencodable_query``,
``unsearchable_query``), else :class:`RetrievalError`. Searches are
reads, so retrying them is safe. One client may be shared by many threads (httpx's
connection pool is thread-safe).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from retrieval_index.protocol import Hit, QueryRejected, check_queries, check_topk

_RETRY_STATUS = {429, 500, 502, 503, 504}
#: The server's error codes that blame a query's own text (raised as QueryRejected).
_QUERY_ERRORS = {"empty_query", "query_too_long", "unencodable_query", "unsearchable_query"}


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

    def _request(self, method: str, path: str, payload: Any = None) -> Any:
        import httpx

        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                response = self._http.request(method, self.url + path, json=payload)
            except httpx.TransportError as exc:  # connect error, timeout, dropped connection
                last = f"{type(exc).__name__}: {exc}"
                continue
            if response.status_code in _RETRY_STATUS:
                last = f"HTTP {response.status_code}: {response.text[:300]}"
                continue
            if response.status_code >= 400:
                try:
                    detail = response.json()
                except ValueError:
                    detail = response.text[:300]
                if isinstance(detail, dict) and detail.get("error") in _QUERY_ERRORS:
                    raise QueryRejected(f"the retrieval server refused a query ({detail['error']}): "
                                        f"{str(detail.get('detail', ''))[:300]}")
                raise RetrievalError(f"{method} {self.url}{path} was refused (HTTP {response.status_code}): {detail}",
                                     response.status_code)
            return response.json()
        raise RetrievalError(f"{method} {self.url}{path} failed after {self.retries + 1} attempts; last error: {last}")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "RetrievalClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
