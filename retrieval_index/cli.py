"""``trace-gym index {build,serve,recall,info}``: build, serve and evaluate retrieval indexes.

Examples::

    # the offline default: the SYNTHETIC world, dense + BM25, into the cache, with recall@3
    trace-gym index build --synthetic --kind both --recall 3

    # your own wiki-18 style corpus
    trace-gym index build --corpus wiki-18.jsonl --out indexes/e5 --model intfloat/e5-base-v2 --index-type Flat

    # serve a built folder, Search-R1's published artifacts as they are, or BM25
    trace-gym index serve --index indexes/e5 --port 8000
    trace-gym index serve --faiss e5_Flat.index --corpus wiki-18.jsonl --model intfloat/e5-base-v2
    trace-gym index serve --bm25 indexes/bm25

    trace-gym index recall --synthetic --kind both -k 3

Registered by ``trace_gym.cli.COMMANDS["index"]``; this module imports nothing of the
rest of the project.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from retrieval_index.encoders import DEFAULT_MODEL


def add_index_subcommand(subparsers: argparse._SubParsersAction) -> None:
    """Add ``index`` (with ``build``, ``serve``, ``recall``, ``info``) to ``trace-gym``'s parser."""
    parser = subparsers.add_parser("index", help="build, serve and evaluate retrieval indexes",
                                   description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="index_command", required=True, metavar="{build,serve,recall,info}")

    b = sub.add_parser("build", help="corpus -> dense FAISS index (resumable) and/or BM25 index")
    source = b.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", help="wiki-18 style JSONL: {\"id\", \"contents\"} per line")
    source.add_argument("--synthetic", action="store_true", help="the offline SYNTHETIC world (built into the cache)")
    b.add_argument("--out", help="output folder (required with --corpus; with --kind both: OUT/dense and OUT/bm25)")
    b.add_argument("--kind", choices=("dense", "bm25", "both"), default="dense", help="what to build (default dense)")
    _add_model(b)
    b.add_argument("--index-type", default="Flat", help="Flat | HNSW | IVF-PQ | a FAISS factory string (default Flat)")
    b.add_argument("--fp16", action="store_true", help="fp16 vector storage (Flat/HNSW) and fp16 GPU search")
    b.add_argument("--shard-size", type=int, default=4096, help="passages per embedding shard (memory bound)")
    b.add_argument("--batch-size", type=int, default=64, help="passages per encoder forward pass")
    b.add_argument("--device", default=None, help="encoder device (default: cuda when available)")
    b.add_argument("--bm25-threads", type=int, default=1, help="Lucene indexing threads")
    b.add_argument("--overwrite", action="store_true", help="discard what OUT holds and start over")
    b.add_argument("--drop-embeddings", action="store_true", help="delete embedding shards after indexing")
    _add_world(b)
    b.add_argument("--recall", type=int, metavar="K", help="--synthetic: print recall@K of the gold passages after")
    b.add_argument("--quiet", action="store_true", help="no progress bars")
    b.set_defaults(func=cmd_build)

    s = sub.add_parser("serve", help="serve an index over HTTP with the Search-R1 /retrieve API")
    what = s.add_mutually_exclusive_group(required=True)
    what.add_argument("--index", help="a dense folder made by `index build`")
    what.add_argument("--faiss", help="a FAISS index file, e.g. Search-R1's e5_Flat.index (needs --corpus)")
    what.add_argument("--bm25", help="a BM25 folder made by `index build --kind bm25`")
    what.add_argument("--synthetic", choices=("dense", "bm25"), help="the offline SYNTHETIC world's index")
    s.add_argument("--corpus", help="with --faiss: the JSONL whose line i is index row i (e.g. wiki-18.jsonl)")
    _add_model(s, default=None, help_suffix=" (with --faiss; default intfloat/e5-base-v2)")
    s.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port (0: any free port; the URL is printed)")
    s.add_argument("--topk", type=int, default=3, help="topk when a request omits it")
    s.add_argument("--max-topk", type=int, default=100)
    s.add_argument("--max-queries", type=int, default=256, help="queries per request")
    s.add_argument("--max-query-chars", type=int, default=4096)
    s.add_argument("--max-body-bytes", type=int, default=1 << 20)
    s.add_argument("--max-drain-bytes", type=int, default=64 << 20,
                   help="bytes of a body over --max-body-bytes read and dropped so the client gets its 413")
    s.add_argument("--max-batch-queries", type=int, default=512, help="queries per encode+search batch")
    s.add_argument("--batch-wait-ms", type=float, default=2.0, help="how long a small batch waits for more")
    s.add_argument("--max-batch-chars", type=int, default=65536, help="query characters per batch")
    s.add_argument("--request-share", type=int, default=32, help="queries one request may put in one batch")
    s.add_argument("--max-queued-queries", type=int, default=16384, help="queries waiting at once (then 429)")
    s.add_argument("--header-timeout", type=float, default=10.0, help="seconds a connection has to send headers")
    s.add_argument("--body-timeout", type=float, default=10.0, help="seconds a request has to send its body")
    s.add_argument("--nprobe", type=int, default=64, help="IVF lists searched")
    s.add_argument("--ef-search", type=int, default=128, help="HNSW search breadth")
    s.add_argument("--no-gpu", action="store_true", help="search on CPU even when FAISS sees a GPU")
    s.add_argument("--log-level", default="warning")
    _add_world(s)
    s.set_defaults(func=cmd_serve)

    r = sub.add_parser("recall", help="recall@k of gold passages on multi-hop questions (per hop)")
    r.add_argument("--synthetic", action="store_true", help="the offline SYNTHETIC world's questions and indexes")
    r.add_argument("--questions", help="a JSONL of questions with metadata.gold_ids and metadata.hop_queries")
    r.add_argument("--kind", choices=("dense", "bm25", "both"), default="both", help="--synthetic: which indexes")
    r.add_argument("--index", help="a dense folder to evaluate")
    r.add_argument("--bm25", help="a BM25 folder to evaluate")
    r.add_argument("--server", help="a retrieval server URL to evaluate")
    r.add_argument("-k", type=int, default=3, help="the cut-off (default 3)")
    r.add_argument("--json", help="also write the results here")
    _add_world(r)
    r.set_defaults(func=cmd_recall)

    i = sub.add_parser("info", help="print the manifest of an index folder")
    i.add_argument("folder")
    i.set_defaults(func=cmd_info)


def _add_model(p: argparse.ArgumentParser, default: str | None = DEFAULT_MODEL, help_suffix: str = "") -> None:
    p.add_argument("--model", default=default, help=f"encoder: {DEFAULT_MODEL} (offline, packaged), a local folder, "
                   f"or a hub id in the local HF cache{help_suffix}")
    p.add_argument("--allow-download", action="store_true", help="let the encoder be downloaded from the hub")


def _add_world(p: argparse.ArgumentParser) -> None:
    p.add_argument("--seed", type=int, default=0, help="--synthetic: world seed")
    p.add_argument("--scale", type=float, default=1.0, help="--synthetic: world scale (1.0: 20,940 passages)")


def cmd_build(args: argparse.Namespace) -> int:
    kinds = ("dense", "bm25") if args.kind == "both" else (args.kind,)
    dense_kwargs = {"index_type": args.index_type, "fp16": args.fp16, "shard_size": args.shard_size,
                    "batch_size": args.batch_size, "device": args.device, "drop_embeddings": args.drop_embeddings,
                    "allow_download": args.allow_download}
    built: dict[str, str] = {}
    if args.synthetic:
        from retrieval_index.offline import offline_index, world_dir

        for kind in kinds:
            root = None
            if args.out:
                root = Path(args.out)
            kwargs = dense_kwargs if kind == "dense" else {"threads": args.bm25_threads}
            if args.overwrite:
                import shutil

                shutil.rmtree(world_dir(args.seed, args.scale, root) / kind, ignore_errors=True)
            built[kind] = str(offline_index(kind, args.seed, args.scale, model=args.model, root=root,
                                            progress=not args.quiet, **kwargs))
    else:
        if not args.out:
            raise ValueError("--out is required with --corpus")
        for kind in kinds:
            out = Path(args.out) / kind if len(kinds) == 2 else Path(args.out)
            if kind == "dense":
                from retrieval_index.build import build_dense_index

                manifest = build_dense_index(args.corpus, out, model=args.model, overwrite=args.overwrite,
                                             progress=not args.quiet, **dense_kwargs)
                stats = manifest["build"]
                rate = stats["passages_per_second"]
                print(f"dense: {manifest['count']} passages, {manifest['dims']} dims, {manifest['index']['factory']}; "
                      f"{stats['shards_reused']} of {stats['shards_total']} shards reused"
                      + (f"; encoded {rate:.0f} passages/s" if rate else ""))
            else:
                from retrieval_index.bm25 import build_bm25_index

                build_bm25_index(args.corpus, out, threads=args.bm25_threads, overwrite=args.overwrite,
                                 progress=not args.quiet)
            built[kind] = str(out)
    for kind, folder in built.items():
        print(f"{kind}: {folder}")
    if args.recall:
        if not args.synthetic:
            raise ValueError("--recall needs --synthetic (or use `trace-gym index recall --questions ...`)")
        _print_recall(_recall({k: _open(k, f) for k, f in built.items()}, _synthetic_questions(args), args.recall))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from retrieval_index.server import ServerLimits, serve

    limits = ServerLimits(max_queries=args.max_queries, max_query_chars=args.max_query_chars, max_topk=args.max_topk,
                          default_topk=args.topk, max_body_bytes=args.max_body_bytes,
                          max_drain_bytes=args.max_drain_bytes,
                          max_batch_queries=args.max_batch_queries, batch_wait_ms=args.batch_wait_ms,
                          max_batch_chars=args.max_batch_chars, request_share=args.request_share,
                          max_queued_queries=args.max_queued_queries,
                          header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout)
    use_gpu = False if args.no_gpu else "auto"
    if args.faiss:
        if not args.corpus:
            raise ValueError("--faiss needs --corpus (the JSONL whose line i is index row i)")
        from retrieval_index.dense import DenseSearcher

        offsets = Path(args.faiss).with_suffix(".corpus_offsets.npy")
        searcher = DenseSearcher.from_files(args.faiss, args.corpus, args.model or "intfloat/e5-base-v2",
                                            offsets_cache=offsets, allow_download=args.allow_download,
                                            nprobe=args.nprobe, ef_search=args.ef_search, use_gpu=use_gpu)
    elif args.synthetic:
        from retrieval_index.offline import offline_index

        searcher = _open(args.synthetic, offline_index(args.synthetic, args.seed, args.scale), use_gpu=use_gpu)
    elif args.bm25:
        searcher = _open("bm25", args.bm25)
    else:
        searcher = _open("dense", args.index, nprobe=args.nprobe, ef_search=args.ef_search, use_gpu=use_gpu)
    serve(searcher, args.host, args.port, limits=limits, log_level=args.log_level)
    return 0


def cmd_recall(args: argparse.Namespace) -> int:
    searchers: dict[str, Any] = {}
    if args.synthetic:
        from retrieval_index.offline import offline_index

        for kind in (("dense", "bm25") if args.kind == "both" else (args.kind,)):
            searchers[kind] = _open(kind, offline_index(kind, args.seed, args.scale))
        questions = _synthetic_questions(args)
    else:
        if not args.questions:
            raise ValueError("give --synthetic or --questions FILE")
        from retrieval_index.synthetic import read_questions

        questions = read_questions(args.questions)
    if args.index:
        searchers["dense"] = _open("dense", args.index)
    if args.bm25:
        searchers["bm25"] = _open("bm25", args.bm25)
    if args.server:
        from retrieval_index.client import RetrievalClient

        searchers["server"] = RetrievalClient(args.server)
    if not searchers:
        raise ValueError("nothing to evaluate: give --synthetic, --index, --bm25 or --server")
    results = _recall(searchers, questions, args.k)
    _print_recall(results)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2))
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    path = Path(args.folder) / "manifest.json"
    if not path.exists():
        raise ValueError(f"{args.folder!r} has no manifest.json")
    print(path.read_text())
    return 0


def _open(kind: str, folder: str | Path, **kwargs: Any) -> Any:
    if kind == "bm25":
        from retrieval_index.bm25 import BM25Searcher

        return BM25Searcher(folder)
    from retrieval_index.dense import DenseSearcher

    return DenseSearcher.load(folder, **kwargs)


def _synthetic_questions(args: argparse.Namespace) -> list[dict]:
    from retrieval_index.offline import offline_questions

    root = Path(args.out) if getattr(args, "out", None) else None
    return offline_questions(args.seed, args.scale, root)


def _recall(searchers: dict[str, Any], questions: list[dict], k: int) -> dict[str, Any]:
    from retrieval_index.recall import hop_recall

    return {name: hop_recall(s, questions, k) for name, s in searchers.items()}


def _print_recall(results: dict[str, Any]) -> None:
    from retrieval_index.recall import format_recall

    print(format_recall(results))
    sys.stdout.flush()
