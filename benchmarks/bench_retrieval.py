"""Retrieval speed in one run: the HTTP server against the in-process searcher, and encode throughput.

Workload: ``--requests`` searches of one query each (topk 3; the hop queries of the
SYNTHETIC offline questions, in a seeded random order), issued by ``--clients``
concurrent clients, which is how rollout workers call retrieval (one query per env step).

Rows (throughput in queries per second; latency per call, milliseconds):

1. ``in-process, per call`` (the baseline of the goal): ``--clients`` threads share one
   ``DenseSearcher`` and call ``search([q], 3)``; each call is its own encode + FAISS search.
   For BM25 the searcher object is the same, and each call is one round trip to its JVM host
   process (``retrieval_index/jvm_host.py``: Lucene never runs in the caller's process).
2. ``server (loopback HTTP)``: ``--clients`` asyncio clients (aiohttp, else httpx) POST ``/retrieve``
   to ``trace-gym index serve`` started in its own process on 127.0.0.1, as deployed;
   the server batches concurrent requests into one encode + search. Latency includes
   HTTP, JSON and queueing; the clients share the machine's cores with the server.
3. ``in-process, batches of 64``: one thread, 64 queries per call: the ceiling of
   batching, no concurrency.

Goal: server throughput >= in-process per-call throughput / 1.5. Also printed: passage
encode throughput of the offline encoder (passages/s, batch 64).

The offline index is built into the cache if missing (minutes, once). Numbers depend
on the machine's load; the table says how many cores torch used.

Usage: ``python benchmarks/bench_retrieval.py [--scale 1.0] [--requests 1000] [--clients 50]
[--bm25] [--json out.json]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from retrieval_index.offline import offline_files, offline_index, offline_questions  # noqa: E402


def percentiles(latencies: list[float]) -> tuple[float, float]:
    arr = 1e3 * np.asarray(latencies)
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def in_process_per_call(searcher, queries: list[str], clients: int) -> dict:
    latencies: list[float] = []
    lock = threading.Lock()

    def worker(mine: list[str]) -> None:
        local = []
        for q in mine:
            t0 = time.perf_counter()
            searcher.search([q], 3)
            local.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(local)

    threads = [threading.Thread(target=worker, args=(queries[c::clients],)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    p50, p99 = percentiles(latencies)
    return {"qps": len(queries) / seconds, "p50_ms": p50, "p99_ms": p99, "seconds": seconds}


def in_process_batched(searcher, queries: list[str], batch: int = 64) -> dict:
    latencies = []
    t0 = time.perf_counter()
    for lo in range(0, len(queries), batch):
        t1 = time.perf_counter()
        searcher.search(queries[lo: lo + batch], 3)
        latencies.append(time.perf_counter() - t1)
    seconds = time.perf_counter() - t0
    p50, p99 = percentiles(latencies)
    return {"qps": len(queries) / seconds, "p50_ms": p50, "p99_ms": p99, "seconds": seconds}


def through_server(kind: str, scale: float, queries: list[str], clients: int) -> dict:
    """Start ``trace-gym index serve`` in its own process (as deployed), load it from here."""
    import httpx

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.Popen([sys.executable, "-m", "trace_gym.cli", "index", "serve", "--synthetic", kind,
                             "--scale", str(scale), "--port", "0"], cwd=root, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    latencies: list[float] = []
    errors: list[str] = []
    body = lambda q: {"queries": [q], "topk": 3, "return_scores": True}  # noqa: E731

    async def client(post, base: str, mine: list[str]) -> None:
        for q in mine:
            t0 = time.perf_counter()
            status, text = await post(base + "/retrieve", body(q))
            latencies.append(time.perf_counter() - t0)
            if status != 200:
                errors.append(text[:200])

    async def run(base: str) -> None:
        async with _http_client(clients) as post:
            warm = queries[: min(len(queries), 200)]  # connections, JIT and caches warm up first
            await asyncio.gather(*(client(post, base, warm[c::clients]) for c in range(clients)))
            latencies.clear()
            t0 = time.perf_counter()
            await asyncio.gather(*(client(post, base, queries[c::clients]) for c in range(clients)))
            timing["seconds"] = time.perf_counter() - t0

    timing: dict = {}
    try:
        line = proc.stdout.readline()
        if not line.startswith("serving on "):
            raise RuntimeError(f"the server did not start: {line!r}")
        base = line.split()[-1]
        asyncio.run(asyncio.wait_for(run(base), timeout=1800))
        batching = httpx.get(base + "/info").json()["batching"]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    if errors:
        raise RuntimeError(f"{len(errors)} server errors, first: {errors[0]}")
    p50, p99 = percentiles(latencies)
    return {"qps": len(queries) / timing["seconds"], "p50_ms": p50, "p99_ms": p99, "seconds": timing["seconds"],
            "mean_batch_queries": batching["mean_batch_queries"]}


@contextlib.asynccontextmanager
async def _http_client(clients: int):
    """``post(url, json) -> (status, text)`` over aiohttp when installed (httpx's async client costs
    several times more CPU per request, and the load generator shares the cores with the server)."""
    try:
        import aiohttp
    except ImportError:
        aiohttp = None
    if aiohttp is not None:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=clients),
                                         timeout=aiohttp.ClientTimeout(total=120)) as session:
            async def post(url, payload):
                async with session.post(url, json=payload) as r:
                    return r.status, await r.text()

            yield post
    else:
        import httpx

        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        async with httpx.AsyncClient(timeout=120, limits=limits) as http:
            async def post(url, payload):
                r = await http.post(url, json=payload)
                return r.status_code, r.text

            yield post


def encode_throughput(encoder, passages: list[str]) -> float:
    encoder.encode_passages(passages[:64])  # warm-up
    t0 = time.perf_counter()
    encoder.encode_passages(passages)
    return len(passages) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="synthetic world scale (1.0: 20,940 passages)")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--encode-passages", type=int, default=1024)
    parser.add_argument("--bm25", action="store_true", help="also run the rows for pyserini BM25")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)

    import torch

    from retrieval_index.dense import DenseSearcher

    searchers = {"dense (MiniLM, FAISS Flat)": ("dense", DenseSearcher.load(offline_index("dense", 0, args.scale)))}
    if args.bm25:
        from retrieval_index.bm25 import BM25Searcher

        searchers["bm25 (pyserini)"] = ("bm25", BM25Searcher(offline_index("bm25", 0, args.scale)))
    pool = [q for row in offline_questions(0, args.scale) for q in row["metadata"]["hop_queries"]]
    rng = random.Random(0)
    queries = [rng.choice(pool) for _ in range(args.requests)]
    count = next(iter(searchers.values()))[1].info()["count"]
    results: dict = {"config": vars(args), "passages": count, "torch_threads": torch.get_num_threads(),
                     "cpus": os.cpu_count(), "rows": {}}
    for name, (kind, searcher) in searchers.items():
        for q in queries[:200]:  # warm-up, as the server gets
            searcher.search([q], 3)
        rows = {"in-process, per call": in_process_per_call(searcher, queries, args.clients),
                "server (loopback HTTP)": through_server(kind, args.scale, queries, args.clients),
                "in-process, batches of 64": in_process_batched(searcher, queries)}
        results["rows"][name] = rows
    dense = next(iter(searchers.values()))[1]
    with open(offline_files(0, args.scale)[0], encoding="utf-8") as f:
        passages = [json.loads(next(f))["contents"] for _ in range(min(args.encode_passages, count))]
    results["encode_passages_per_second"] = encode_throughput(dense.encoder, passages)
    results["encode_queries_per_second"] = len(pool[:512]) / _timed(dense.encoder.encode_queries, pool[:512])

    print(f"## Retrieval benchmark: {count} SYNTHETIC passages, {args.requests} one-query requests from "
          f"{args.clients} concurrent clients, topk 3 ({results['torch_threads']} torch threads, "
          f"{results['cpus']} CPUs)\n")
    print("| retriever | mode | queries/s | p50 ms | p99 ms | vs in-process per call |")
    print("|---|---|---:|---:|---:|---:|")
    checks = []
    for name, rows in results["rows"].items():
        base = rows["in-process, per call"]["qps"]
        for mode, r in rows.items():
            extra = f" (mean batch {r['mean_batch_queries']:.1f})" if "mean_batch_queries" in r else ""
            print(f"| {name} | {mode}{extra} | {r['qps']:.1f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
                  f"{r['qps'] / base:.2f}x |")
        ratio = rows["server (loopback HTTP)"]["qps"] / base
        checks.append(f"{'PASS' if ratio >= 1 / 1.5 else 'FAIL'}: {name}: server throughput >= in-process / 1.5 "
                      f"({ratio:.2f}x of in-process per call)")
    print(f"\nEncode throughput (all-MiniLM-L6-v2, batch 64): {results['encode_passages_per_second']:.0f} passages/s, "
          f"{results['encode_queries_per_second']:.0f} queries/s\n")
    print("\n".join(checks))
    results["checks"] = checks
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


def _timed(fn, arg) -> float:
    t0 = time.perf_counter()
    fn(arg)
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())
