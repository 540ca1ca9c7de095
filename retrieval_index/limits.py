"""The retrieval server's request limits and batching knobs (:class:`ServerLimits`),
read by the HTTP layer (:mod:`retrieval_index.server`, which exports the name too) and
the batcher (:mod:`retrieval_index.batcher`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServerLimits:
    """Request limits and batching knobs of the retrieval server.

    Attributes:
        max_queries: queries per request.
        max_query_chars: characters per query.
        max_topk: largest ``topk``.
        default_topk: ``topk`` when a request leaves it out (Search-R1's default is 3).
        max_body_bytes: request body size in bytes.
        max_drain_bytes: bytes of a body over ``max_body_bytes`` read and dropped before
            the 413 is sent (a server that closes with unread data resets the connection,
            and a client still sending then loses the answer); a larger body is cut off.
        max_json_depth: deepest nesting of a request body (a valid one is 2 deep).
        max_json_digits: longest number in a request body, in digits.
        max_batch_queries: queries per encode+search batch.
        max_batch_chars: characters per batch (long queries cost the encoder more; a
            batch always takes at least one query).
        request_share: queries one request may put in one batch (the rest wait for
            the next batches, behind the requests that arrived meanwhile).
        max_queued_queries: queries waiting at once; beyond it requests get 429.
        batch_wait_ms: how long a small batch waits for more requests, milliseconds.
        header_timeout_s: seconds a connection has to send a request's headers.
        body_timeout_s: seconds a request has to send its body.
        graceful_seconds: how long shutdown waits for in-flight requests, seconds.
    """

    max_queries: int = 256
    max_query_chars: int = 4096
    max_topk: int = 100
    default_topk: int = 3
    max_body_bytes: int = 1 << 20
    max_drain_bytes: int = 64 << 20
    max_json_depth: int = 8
    max_json_digits: int = 32
    max_batch_queries: int = 512
    max_batch_chars: int = 65536
    request_share: int = 32
    max_queued_queries: int = 16384
    batch_wait_ms: float = 2.0
    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    graceful_seconds: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_queries", "max_query_chars", "max_topk", "default_topk", "max_body_bytes",
                     "max_drain_bytes", "max_json_depth", "max_json_digits", "max_batch_queries", "max_batch_chars", "request_share",
                     "max_queued_queries"):
            if getattr(self, name) < 1:
                raise ValueError(f"ServerLimits.{name} must be >= 1, got {getattr(self, name)!r}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(f"default_topk {self.default_topk} must lie in [1, max_topk={self.max_topk}]")
        if self.batch_wait_ms < 0 or self.graceful_seconds < 0:
            raise ValueError("batch_wait_ms and graceful_seconds must be >= 0")
        if self.header_timeout_s <= 0 or self.body_timeout_s <= 0:
            raise ValueError(f"header_timeout_s and body_timeout_s must be > 0, got {self.header_timeout_s}, "
                             f"{self.body_timeout_s}")
