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
from retrieval_index.protocol import Hit, QueryRejected  # noqa: E402
from retrieval_index.server import ServerLimits, parse_retrieve, running_server  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
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
    # issue 22: each of these was a 500 (RecursionError / ValueError out of json.loads) or a 503
    ("nested 2000 deep", b'{"queries": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400, "invalid_json"),
    ("nested past the bound", {"queries": [[[[[[[[["q"]]]]]]]]]}, 400, "invalid_json"),
    ("unclosed brackets", b'{"queries": ' + b"[" * 3000, 400, "invalid_json"),
    ("a 100-digit topk", b'{"queries": ["q"], "topk": ' + b"9" * 100 + b"}", 400, "invalid_json"),
    ("a 1000-digit query number", b'{"queries": [' + b"7" * 1000 + b"]}", 400, "invalid_json"),
    ("bytes that are not utf-8", b'{"queries": ["\xff\xfe"]}', 400, "invalid_json"),
    ("a lone surrogate escape", b'{"queries": ["Velmora\\ud800 city"]}', 422, "unencodable_query"),
    ("a surrogate in the second query", b'{"queries": ["ok", "\\udfff"]}', 422, "unencodable_query"),
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


@pytest.mark.slow  # ~18 s of load; the batching and fairness tests keep the default suite honest
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


# --- issue 22: hostile bodies, bad queries in a batch, slow clients, big batches ------


def test_the_issues_payloads_in_a_full_size_body_are_400_not_500(searcher):
    with running_server(searcher) as base:  # the default limits: a 1 MiB body
        for body in (b'{"queries": ' + b"[" * 400_000 + b"]" * 400_000 + b"}",
                     b'{"queries": ["q"], "topk": ' + b"9" * 5000 + b"}",
                     b'{"queries": [' + b"1" * 5000 + b"]}"):
            r = post(base, body)
            assert r.status_code == 400 and r.json()["error"] == "invalid_json", r.text[:200]
        assert post(base, {"queries": ["a river"]}).status_code == 200  # the server is fine


async def _post_all(base: str, bodies: list) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        return await asyncio.gather(*(http.post(base + "/retrieve", content=json.dumps(b) if not isinstance(b, bytes)
                                                else b, headers={"content-type": "application/json"})
                                      for b in bodies))


GOOD = [f"In which city was person number {i} born?" for i in range(24)]


def test_one_bad_query_batched_with_good_ones_fails_alone_and_every_good_one_is_answered(searcher):
    """The issue's case: a lone surrogate batched with 24 good requests at batch_wait_ms=100
    (503 for all 25 before); now the bad request is a 422 and the 24 good ones are 200."""
    expected = {q: [h.id for h in hits] for q, hits in zip(GOOD, searcher.search(GOOD, 3))}
    bad = b'{"queries": ["Velmora\\ud800 city"], "topk": 3}'
    with running_server(searcher, limits=ServerLimits(batch_wait_ms=100)) as base:
        good = [{"queries": [q], "topk": 3} for q in GOOD]
        bodies = good[:12] + [bad] + good[12:]
        responses = asyncio.run(_post_all(base, bodies))
        batching = httpx.get(base + "/info").json()["batching"]
    bad_response = responses.pop(12)
    assert bad_response.status_code == 422 and bad_response.json()["error"] == "unencodable_query"
    assert [r.status_code for r in responses] == [200] * 24
    for q, r in zip(GOOD, responses):
        assert [item["id"] for item in r.json()["result"][0]] == expected[q]
    assert batching["requests"] == 24 and batching["batches"] < 24  # they really were batched


class PoisonedSearcher:
    """The real searcher, failing on any query holding ``poison`` (a backend that chokes on
    some input the server's validation lets through)."""

    def __init__(self, inner, poison: str = "POISON"):
        self.inner, self.poison, self.calls = inner, poison, 0

    def search(self, queries, topk):
        self.calls += 1
        if any(self.poison in q for q in queries):
            raise RuntimeError("the encoder choked")
        return self.inner.search(queries, topk)


def test_a_query_the_searcher_fails_on_fails_only_its_own_request(searcher):
    poisoned = PoisonedSearcher(searcher)
    expected = {q: [h.id for h in hits] for q, hits in zip(GOOD, searcher.search(GOOD, 3))}
    with running_server(poisoned, limits=ServerLimits(batch_wait_ms=100)) as base:
        assert post(base, {"queries": ["warm up"]}).status_code == 200  # the searcher has answered once
        bodies = [{"queries": [q]} for q in GOOD[:20]] + [{"queries": ["POISON one"]},
                                                         {"queries": [GOOD[20], "POISON two", GOOD[21]]},
                                                         {"queries": GOOD[22:]}]
        responses = asyncio.run(_post_all(base, bodies))
        for q, r in zip(GOOD[:20], responses[:20]):
            assert r.status_code == 200 and [item["id"] for item in r.json()["result"][0]] == expected[q]
        alone, mixed, last = responses[20:]
        assert alone.status_code == 422 and alone.json()["error"] == "unsearchable_query"
        assert mixed.status_code == 422 and "queries[1]" in mixed.json()["detail"]
        assert last.status_code == 200 and len(last.json()["result"]) == 2
        client = RetrievalClient(base, retries=3, backoff=0.01)
        calls = poisoned.calls
        with pytest.raises(QueryRejected, match="unsearchable_query"):
            client.search(["POISON three"], 2)
        assert poisoned.calls - calls <= 3  # one try, one retry alone, one check of the searcher: no client retry
        assert httpx.get(base + "/info").json()["batching"]["isolations"] >= 1


def test_a_lone_surrogate_in_a_passage_still_gives_a_json_answer(searcher):
    class SurrogateCorpus:  # a corpus line holding a lone surrogate escape, as a JSONL file can
        def search(self, queries, topk):
            return [[Hit(h.id, h.contents + "\ud800", float("nan")) for h in hits]
                    for hits in searcher.search(queries, topk)]

    with running_server(SurrogateCorpus()) as base:
        r = post(base, {"queries": ["a river"], "return_scores": True})
    item = r.json()["result"][0][0]
    assert r.status_code == 200 and item["document"]["contents"].endswith("\\ud800") and item["score"] is None


def _raw(base: str):
    import socket

    host, port = base.removeprefix("http://").split(":")
    conn = socket.create_connection((host, int(port)))
    conn.settimeout(30)
    return conn


def _trickle(conn, data: bytes, every_s: float, until_s: float) -> float:
    """Send ``data`` a byte at a time; the seconds until the server closed the connection."""
    started = time.monotonic()
    try:
        for byte in data:
            conn.sendall(bytes([byte]))
            time.sleep(every_s)
            if time.monotonic() - started > until_s:
                break
        conn.recv(1)
        reply = conn.recv(65536)
        while reply:
            reply = conn.recv(65536)
    except OSError:
        pass
    return time.monotonic() - started


def test_slow_clients_are_cut_off_within_the_timeouts(searcher):
    limits = ServerLimits(header_timeout_s=1.0, body_timeout_s=1.0)
    with running_server(searcher, limits=limits) as base:
        conn = _raw(base)  # headers at once, then a body that never finishes
        conn.sendall(b"POST /retrieve HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100000\r\n\r\n{")
        started = time.monotonic()
        reply = b""
        try:
            for _ in range(100):
                conn.sendall(b" ")
                time.sleep(0.1)
        except OSError:
            pass
        try:
            while chunk := conn.recv(65536):
                reply += chunk
        except OSError:
            pass
        body_seconds = time.monotonic() - started
        assert reply.startswith(b"HTTP/1.1 408") and b'"body_timeout"' in reply, reply[:300]
        assert body_seconds < 6.0  # 1 s timeout, generous margin on shared cores (it would be 10 s)
        header_seconds = _trickle(_raw(base), b"POST /retrieve HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200,
                                  every_s=0.05, until_s=20)
        assert header_seconds < 6.0  # the header block never completed
        idle = _raw(base)
        started = time.monotonic()
        try:
            assert idle.recv(1) == b""  # connected, sent nothing: closed by the server
        except OSError:
            pass
        assert time.monotonic() - started < 6.0
        assert post(base, {"queries": ["a river"]}).status_code == 200  # others are served meanwhile


def test_a_one_query_search_is_not_starved_by_big_requests(searcher):
    """Two big requests (48 long queries each) queued, then one short query: the short one
    finishes well before either big one (first come, first served made it wait for both)."""
    rng = random.Random(0)
    words = "city river company film born founded director university country person".split()
    big = [[" ".join(rng.choice(words) for _ in range(200)) for _ in range(48)] for _ in range(2)]
    limits = ServerLimits(max_batch_chars=4 * 1300, request_share=4)
    with running_server(searcher, limits=limits) as base:
        post(base, {"queries": ["warm up"]})
        finished: dict[str, float] = {}
        status: dict[str, int] = {}

        def call(name, queries):
            r = httpx.post(base + "/retrieve", json={"queries": queries}, timeout=300)
            status[name] = r.status_code
            finished[name] = time.monotonic() - started

        started = time.monotonic()
        threads = [threading.Thread(target=call, args=(f"big{i}", q)) for i, q in enumerate(big)]
        for t in threads:
            t.start()
        time.sleep(0.5)  # both big requests are queued and being searched
        small_started = time.monotonic() - started
        threads.append(threading.Thread(target=call, args=("small", ["Where was the director born?"])))
        threads[-1].start()
        for t in threads:
            t.join(timeout=300)
        batching = httpx.get(base + "/info").json()["batching"]
    assert status == {"big0": 200, "big1": 200, "small": 200}
    small = finished["small"] - small_started
    assert finished["small"] < min(finished["big0"], finished["big1"]), finished
    assert small < 0.5 * (min(finished["big0"], finished["big1"]) - small_started), finished
    assert batching["largest_batch_queries"] <= 2 * 4 + 1
    print(f"\none-query search {small:.1f} s while two 48-query requests took {finished['big0']:.1f} s, "
          f"{finished['big1']:.1f} s")


def test_a_full_queue_answers_429(searcher):
    limits = ServerLimits(max_queued_queries=10, batch_wait_ms=300)
    with running_server(searcher, limits=limits) as base:
        responses = asyncio.run(_post_all(base, [{"queries": GOOD[:8]}, {"queries": GOOD[8:16]}]))
        codes = sorted(r.status_code for r in responses)
        assert codes == [200, 429], [r.text[:200] for r in responses]
        assert next(r for r in responses if r.status_code == 429).json()["error"] == "queue_full"
        assert post(base, {"queries": GOOD[:8]}).status_code == 200  # once drained, room again
