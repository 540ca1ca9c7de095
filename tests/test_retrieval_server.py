"""The retrieval server: the Search-R1 API contract, every bad request, a loopback load test, shutdown, client."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("faiss")

from retrieval_index.client import RetrievalClient, RetrievalError  # noqa: E402
from retrieval_index.dense import DenseSearcher  # noqa: E402
from retrieval_index.offline import offline_index, offline_questions  # noqa: E402
from retrieval_index.server import ServerLimits, parse_retrieve, running_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SCALE = 0.03  # the small synthetic world (631 passages), built once into the cache
LIMITS = ServerLimits(max_queries=8, max_query_chars=200, max_topk=10, max_body_bytes=4096)


@pytest.fixture(scope="module")
def searcher() -> DenseSearcher:
    return DenseSearcher.load(offline_index("dense", 0, SCALE, progress=False))


@pytest.fixture(scope="module")
def url(searcher):
    with running_server(searcher, limits=LIMITS) as base:
        yield base


def post(url: str, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(url + "/retrieve", content=content, headers={"content-type": "application/json"},
                      timeout=30, **kwargs)


BAD_REQUESTS = [
    ("not json", b"{queries: [", 400, "invalid_json"),
    ("a json array", [], 400, "invalid_json"),
    ("missing queries", {"topk": 3}, 422, "missing_field"),
    ("queries is a string", {"queries": "Paris"}, 422, "wrong_type"),
    ("a query is a number", {"queries": ["ok", 7]}, 422, "wrong_type"),
    ("a query is null", {"queries": [None]}, 422, "wrong_type"),
    ("empty query", {"queries": [""]}, 422, "empty_query"),
    ("whitespace query", {"queries": [" \n\t "]}, 422, "empty_query"),
    ("huge query", {"queries": ["x" * 201]}, 422, "query_too_long"),
    ("too many queries", {"queries": ["q"] * 9}, 422, "too_many_queries"),
    ("topk zero", {"queries": ["q"], "topk": 0}, 422, "topk_out_of_range"),
    ("topk negative", {"queries": ["q"], "topk": -2}, 422, "topk_out_of_range"),
    ("topk over the limit", {"queries": ["q"], "topk": 11}, 422, "topk_out_of_range"),
    ("topk a string", {"queries": ["q"], "topk": "3"}, 422, "wrong_type"),
    ("topk a float", {"queries": ["q"], "topk": 2.5}, 422, "wrong_type"),
    ("topk a boolean", {"queries": ["q"], "topk": True}, 422, "wrong_type"),
    ("return_scores a string", {"queries": ["q"], "return_scores": "yes"}, 422, "wrong_type"),
    ("unknown field", {"queries": ["q"], "top_k": 3}, 422, "unknown_field"),
    ("body over the limit", {"queries": ["q" * 150] * 8, "pad": "x" * 5000}, 413, "body_too_large"),
]


@pytest.mark.parametrize("name,body,status,code", BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_every_bad_request_gets_a_clear_4xx_json_error(url, name, body, status, code):
    r = post(url, body)
    assert r.status_code == status, r.text
    payload = r.json()
    assert payload["error"] == code and isinstance(payload["detail"], str) and payload["detail"]


def test_a_streamed_body_over_the_limit_is_refused_without_a_content_length(url):
    def chunks():
        yield b'{"queries": ["'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"]}'

    r = httpx.post(url + "/retrieve", content=chunks(), timeout=30)  # chunked transfer encoding
    assert r.status_code == 413 and r.json()["error"] == "body_too_large"


def test_error_details_name_the_bad_value(url):
    assert "queries[1]" in post(url, {"queries": ["ok", 7]}).json()["detail"]
    assert "11" in post(url, {"queries": ["q"], "topk": 11}).json()["detail"]
    assert "201" in post(url, {"queries": ["x" * 201]}).json()["detail"]


def test_search_r1_shapes_with_and_without_scores(url, searcher):
    queries = ["Which company was founded first?", "a city on a river"]
    with_scores = post(url, {"queries": queries, "topk": 4, "return_scores": True}).json()["result"]
    without = post(url, {"queries": queries, "topk": 4, "return_scores": False}).json()["result"]
    default = post(url, {"queries": queries}).json()["result"]
    expected = searcher.search(queries, 4)
    assert len(with_scores) == len(without) == 2
    for got, docs, exp in zip(with_scores, without, expected):
        assert [item["document"]["id"] for item in got] == [h.id for h in exp]
        assert [item["document"]["contents"] for item in got] == [h.contents for h in exp]
        assert all(isinstance(item["score"], float) for item in got)
        assert docs == [{"id": h.id, "contents": h.contents} for h in exp]  # documents alone
    assert [len(r) for r in default] == [3, 3] and "score" not in default[0][0]  # topk 3, no scores
    assert post(url, {"queries": []}).json() == {"result": []}


def test_health_and_info(url, searcher):
    assert httpx.get(url + "/health").json() == {"status": "ok"}
    info = httpx.get(url + "/info").json()
    index = info["index"]
    assert index["model"] == "all-MiniLM-L6-v2" and index["dims"] == 384 and index["count"] == len(searcher.corpus)
    assert index["corpus"]["sha256"] == searcher.corpus.stats.sha256
    assert info["limits"]["max_topk"] == 10 and info["limits"]["default_topk"] == 3


def test_parse_retrieve_accepts_the_search_r1_body():
    assert parse_retrieve(b'{"queries": ["a", "b"], "topk": 5, "return_scores": true}', ServerLimits()) == (
        ["a", "b"], 5, True)
    assert parse_retrieve(b'{"queries": ["a"], "topk": null, "return_scores": null}', ServerLimits()) == (
        ["a"], 3, False)


def test_load_50_concurrent_clients_2000_requests_equal_in_process_results(searcher):
    """Loopback only; bounded: 2,000 requests, each with a 60 s timeout, the whole run under 300 s."""
    pool = [q for row in offline_questions(0, SCALE) for q in row["metadata"]["hop_queries"]]
    rng = random.Random(0)
    requests = [rng.choice(pool) for _ in range(2000)]
    expected = {q: [h.id for h in hits] for q, hits in zip(pool, searcher.search(pool, 3))}
    failures: list[str] = []

    async def client(http: httpx.AsyncClient, base: str, mine: list[str]) -> int:
        done = 0
        for q in mine:
            r = await http.post(base + "/retrieve", json={"queries": [q], "topk": 3, "return_scores": True})
            if r.status_code != 200:
                failures.append(f"{r.status_code}: {r.text[:200]}")
                continue
            got = [item["document"]["id"] for item in r.json()["result"][0]]
            if got != expected[q]:
                failures.append(f"{q!r}: {got} != {expected[q]}")
            done += 1
        return done

    async def run(base: str) -> int:
        limits = httpx.Limits(max_connections=50, max_keepalive_connections=50)
        async with httpx.AsyncClient(timeout=60, limits=limits) as http:
            counts = await asyncio.gather(*(client(http, base, requests[c::50]) for c in range(50)))
        return sum(counts)

    with running_server(searcher, limits=ServerLimits()) as base:
        started = time.monotonic()
        done = asyncio.run(asyncio.wait_for(run(base), timeout=300))
        seconds = time.monotonic() - started
        batching = httpx.get(base + "/info").json()["batching"]
    assert not failures, failures[:5]
    assert done == 2000 and batching["requests"] == 2000
    assert batching["batches"] < 2000 and batching["largest_batch_queries"] > 1  # requests were batched
    print(f"\n2000 requests from 50 clients in {seconds:.1f} s; {batching['batches']} batches, "
          f"mean {batching['mean_batch_queries']:.1f} queries")


class FlakySearcher:
    """A real searcher that fails its first ``failures`` calls (a transient backend error)."""

    def __init__(self, inner, failures: int):
        self.inner, self.failures, self.calls = inner, failures, 0

    def search(self, queries, topk):
        self.calls += 1
        if self.calls <= self.failures:
            raise RuntimeError("backend hiccup")
        return self.inner.search(queries, topk)


def test_client_retries_transient_failures_and_stops_on_bad_requests(searcher):
    flaky = FlakySearcher(searcher, failures=2)
    with running_server(flaky) as base:
        client = RetrievalClient(base, retries=3, backoff=0.01)
        hits = client.search(["a public university"], 2)
        assert flaky.calls == 3 and [h.id for h in hits[0]] == [h.id for h in searcher.search(["a public university"], 2)[0]]
        with pytest.raises(RetrievalError, match="refused.*422") as err:
            client._request("POST", "/retrieve", {"queries": ["q"], "topk": 0})
        assert err.value.status == 422
        assert flaky.calls == 3  # a 4xx is not retried
        never = RetrievalClient(base, retries=1, backoff=0.01)
        flaky.failures = 10**9
        with pytest.raises(RetrievalError, match="after 2 attempts.*503"):
            never.search(["q"], 1)


def test_client_gives_up_on_an_unreachable_server_after_bounded_retries():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    client = RetrievalClient(f"http://127.0.0.1:{port}", timeout=2, retries=2, backoff=0.05)
    started = time.monotonic()
    with pytest.raises(RetrievalError, match="after 3 attempts.*ConnectError"):
        client.search(["q"], 1)
    assert time.monotonic() - started < 10


def test_serve_command_shuts_down_gracefully_finishing_in_flight_requests():
    """`trace-gym index serve` in a subprocess: SIGTERM while big requests run; all finish, exit 0."""
    offline_index("dense", 0, SCALE, progress=False)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "trace_gym.cli", "index", "serve", "--synthetic", "dense",
                             "--scale", str(SCALE), "--port", "0", "--max-batch-queries", "64"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        base = line.split()[-1]
        queries = [f"In which city was person number {i} born?" for i in range(200)]
        results: list = []
        finished: list[float] = []

        def call():
            try:
                r = httpx.post(base + "/retrieve", json={"queries": queries, "topk": 2}, timeout=120)
                results.append((r.status_code, len(r.json()["result"])))
                finished.append(time.monotonic())
            except Exception as exc:  # recorded, asserted below
                results.append(repr(exc))

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the requests are in the server's queue / being encoded
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        for t in threads:
            t.join(timeout=180)
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert results == [(200, 200)] * 3
    assert max(finished) > signalled  # at least one request was still running when the signal came
