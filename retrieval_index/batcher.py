"""The retrieval server's batcher: a fair queue of search requests, batched for the searcher.

A batch takes one query from each waiting request per round, up to the limits of
:class:`~retrieval_index.limits.ServerLimits` (queries and characters per batch, a
request's share of one batch); a request with queries left goes to the back of the
queue, so one big request cannot starve small ones. A batch the searcher fails on is
bisected until the failing queries stand alone (:class:`QueryFailed` for their own
request; the others are answered); a full queue is :class:`QueueFull` (429). The
searcher runs on one worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import collections
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from retrieval_index.protocol import Hit, Searcher

if TYPE_CHECKING:
    from retrieval_index.limits import ServerLimits


class QueueFull(Exception):
    """More queries are waiting than ``max_queued_queries`` allows (429; the client retries)."""


class QueryFailed(Exception):
    """The searcher fails on this request's own query while it answers others (422)."""

    def __init__(self, index: int, cause: BaseException):
        super().__init__(f"queries[{index}] makes the searcher fail ({type(cause).__name__}: {str(cause)[:300]}) "
                         "while other queries are answered")
        self.index = index


class _Fault(Exception):
    """The searcher failed on this query alone while it answers others."""

    def __init__(self, cause: BaseException):
        super().__init__(str(cause))
        self.cause = cause


@dataclass(eq=False)
class _Request:
    """One queued request: its queries, those answered so far, and who waits for it."""

    queries: list[str]
    topk: int
    future: asyncio.Future
    hits: list[list[Hit]] = field(default_factory=list)

    @property
    def left(self) -> int:
        return len(self.queries) - len(self.hits)


class Batcher:
    """Merges concurrent searches into one ``searcher.search`` call per batch, fairly, and
    isolates the queries a searcher fails on (see the module docstring)."""

    def __init__(self, searcher: Searcher, limits: ServerLimits):
        self.searcher, self.limits = searcher, limits
        self._pending: collections.deque[_Request] = collections.deque()
        self._queued = 0  # queries not yet answered, over all pending requests
        self._arrived: asyncio.Event | None = None
        self._stopping = False
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="retrieval-batch")
        self._last_good: str | None = None  # a query the searcher answered (to tell a bad query from a dead searcher)
        self.batches = 0
        self.requests = 0
        self.queries = 0
        self.largest_batch = 0
        self.isolations = 0

    async def start(self) -> None:
        self._arrived = asyncio.Event()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        """Finish everything queued, then stop the worker."""
        if self._task is not None:
            self._stopping = True
            self._arrived.set()
            await self._task
            self._task = None
        self._executor.shutdown(wait=True)

    async def submit(self, queries: list[str], topk: int) -> list[list[Hit]]:
        if self._task is None or self._stopping:
            raise RuntimeError("the batcher is not running")
        if self._queued + len(queries) > self.limits.max_queued_queries:
            raise QueueFull(f"{self._queued} queries are waiting; the limit is {self.limits.max_queued_queries}")
        request = _Request(list(queries), topk, asyncio.get_running_loop().create_future())
        self._pending.append(request)
        self._queued += len(queries)
        self._arrived.set()
        return await request.future

    def _takeable(self) -> int:
        return sum(min(r.left, self.limits.request_share) for r in self._pending)  # queries, not characters

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                if self._stopping:
                    return
                self._arrived.clear()
                await self._arrived.wait()
            deadline = loop.time() + self.limits.batch_wait_ms / 1e3
            while self._takeable() < self.limits.max_batch_queries and not self._stopping:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                self._arrived.clear()
                try:
                    await asyncio.wait_for(self._arrived.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            await self._search(loop, self._take())

    def _take(self) -> list[tuple[_Request, list[str]]]:
        """Deal queries round the queue, one per request per round, until the batch holds
        ``max_batch_queries`` queries or ``max_batch_chars`` characters, or each request
        its ``request_share``: every waiting request gets into the next batch (the first
        query always fits). The requests dealt to leave the queue until answered."""
        live = [r for r in self._pending if not r.future.done()]
        for request in self._pending:
            if request.future.done():  # the client went away
                self._queued -= request.left
        taken = {id(r): 0 for r in live}
        queries = chars = 0
        progress = True
        while progress and queries < self.limits.max_batch_queries:
            progress = False
            for request in live:
                k = taken[id(request)]
                if k == min(request.left, self.limits.request_share):
                    continue
                size = len(request.queries[len(request.hits) + k])
                if queries and chars + size > self.limits.max_batch_chars:
                    progress = False
                    break
                taken[id(request)] = k + 1
                queries, chars, progress = queries + 1, chars + size, True
                if queries == self.limits.max_batch_queries:
                    break
        batch = [(r, r.queries[len(r.hits): len(r.hits) + taken[id(r)]]) for r in live if taken[id(r)]]
        dealt = {id(r) for r, _ in batch}
        self._pending = collections.deque(r for r in live if id(r) not in dealt)
        return batch

    async def _search(self, loop: asyncio.AbstractEventLoop, batch: list[tuple[_Request, list[str]]]) -> None:
        if not batch:  # every request taken had gone away
            return
        flat = [q for _, queries in batch for q in queries]
        topk = max((request.topk for request, _ in batch), default=1)
        outcomes = await self._outcomes(loop, flat, topk)
        self.batches += 1
        self.queries += len(flat)
        self.largest_batch = max(self.largest_batch, len(flat))
        pos = 0
        for request, queries in batch:
            mine, start = outcomes[pos: pos + len(queries)], len(request.hits)
            pos += len(queries)
            failed = next((j for j, o in enumerate(mine) if isinstance(o, BaseException)), None)
            if failed is not None or request.future.done():
                self._queued -= request.left
                if not request.future.done():
                    error = mine[failed]
                    if isinstance(error, _Fault):
                        error = QueryFailed(start + failed, error.cause)
                    request.future.set_exception(error)
                continue
            request.hits.extend(hits[: request.topk] for hits in mine)
            self._queued -= len(queries)
            if request.left:
                self._pending.append(request)  # behind the requests that arrived meanwhile
            else:
                self.requests += 1
                request.future.set_result(request.hits)

    async def _outcomes(self, loop: asyncio.AbstractEventLoop, flat: list[str], topk: int) -> list:
        """One entry per query: its hits, or an exception (a :class:`_Fault` when the
        query itself is to blame)."""
        try:
            results = await self._call(loop, flat, topk)
        except Exception:
            self.isolations += 1
            return await self._isolate(loop, flat, topk)
        if flat:
            self._last_good = flat[0]
        return results

    async def _call(self, loop: asyncio.AbstractEventLoop, queries: list[str], topk: int) -> list:
        return list(await loop.run_in_executor(self._executor, self.searcher.search, queries, topk))

    async def _isolate(self, loop: asyncio.AbstractEventLoop, flat: list[str], topk: int) -> list:
        """The searcher failed on ``flat``: search its halves, recursively, until each
        failing query stands alone (a query that merely met a passing hiccup is answered)."""
        async def run(queries: list[str]) -> list:
            try:
                return await self._call(loop, queries, topk)
            except Exception as exc:
                if len(queries) == 1:
                    return [exc]
                half = len(queries) // 2
                return await run(queries[:half]) + await run(queries[half:])

        half = max(len(flat) // 2, 1)  # a lone query is tried once more
        outcomes = await run(flat[:half]) + (await run(flat[half:]) if flat[half:] else [])
        answered = [q for q, o in zip(flat, outcomes) if not isinstance(o, BaseException)]
        if answered:
            self._last_good = answered[0]
        elif not await self._alive(loop):  # nothing works: the searcher is down, the queries are not to blame
            return outcomes
        return [_Fault(o) if isinstance(o, BaseException) else o for o in outcomes]

    async def _alive(self, loop: asyncio.AbstractEventLoop) -> bool:
        """Whether the searcher still answers a query it answered before."""
        if self._last_good is None:
            return False
        try:
            await loop.run_in_executor(self._executor, self.searcher.search, [self._last_good], 1)
        except Exception:
            return False
        return True

    def stats(self) -> dict[str, Any]:
        return {"batches": self.batches, "requests": self.requests, "queries": self.queries,
                "largest_batch_queries": self.largest_batch, "isolations": self.isolations,
                "queued_queries": self._queued,
                "mean_batch_queries": self.queries / self.batches if self.batches else 0.0}
