"""The one seam between retrieval and its users: :class:`Hit` and the :class:`Searcher` Protocol.

Every backend (the in-process dense FAISS searcher, the pyserini BM25 searcher, the HTTP
client of the retrieval server) implements :class:`Searcher`; the QA environment and the
server depend on this Protocol only. This module imports nothing heavy.

A passage's ``contents`` follow the wiki-18 convention of Search-R1 and FlashRAG: the
first line is the (quoted) title, the rest is the text::

    "Paris"
    Paris is the capital and most populous city of France ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

from retrieval_index.textclean import first_unencodable


@dataclass(frozen=True)
class Hit:
    """One retrieved passage.

    Attributes:
        id: the passage's ``id`` in the corpus (a string, as in wiki-18).
        contents: the passage's ``contents``: title line, newline, text.
        score: the retrieval score (inner product for dense indexes, BM25 for Lucene);
            ``None`` when the server was asked for documents only.
    """

    id: str
    contents: str
    score: float | None = None

    @property
    def title(self) -> str:
        """The first line of ``contents``, as stored (wiki-18 keeps the quotes)."""
        return split_contents(self.contents)[0]

    @property
    def text(self) -> str:
        """Everything after the first line of ``contents``."""
        return split_contents(self.contents)[1]

    def to_json(self, with_score: bool = True) -> dict[str, Any]:
        """The Search-R1 result item: ``{"document": {"id", "contents"}, "score"}``
        (``with_score=False``: the document dict alone, as Search-R1 returns it)."""
        doc = {"id": self.id, "contents": self.contents}
        return {"document": doc, "score": self.score} if with_score else doc

    @classmethod
    def from_json(cls, item: Any) -> "Hit":
        """Inverse of :meth:`to_json` (either shape)."""
        if not isinstance(item, dict):
            raise ValueError(f"a result item must be a JSON object, got {item!r:.200}")
        doc, score = (item["document"], item.get("score")) if "document" in item else (item, None)
        if not isinstance(doc, dict) or "contents" not in doc:
            raise ValueError(f"a result document needs 'id' and 'contents', got {doc!r:.200}")
        return cls(str(doc.get("id", "")), str(doc["contents"]), None if score is None else float(score))


def split_contents(contents: str) -> tuple[str, str]:
    """``(title line, text)`` of a wiki-18 ``contents`` string (title kept verbatim)."""
    title, _, text = contents.partition("\n")
    return title, text


def make_contents(title: str, text: str) -> str:
    """A wiki-18 ``contents`` string: the title in double quotes, a newline, the text."""
    if "\n" in title:
        raise ValueError(f"a title must be one line, got {title!r}")
    return f'"{title}"\n{text}'


class QueryRejected(ValueError):
    """A query that cannot be searched because of its own text (a lone surrogate, a
    server's length limit, a query the searcher fails on while it answers others).
    The caller may show the message to whoever wrote the query; ``index`` is the query's
    position in the batch when known."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


@runtime_checkable
class Searcher(Protocol):
    """Top-k passage search for a batch of queries.

    ``search(queries, topk)`` returns one list per query, best first, of at most
    ``topk`` hits. Implementations must be safe to call from several threads. A query
    that cannot be searched because of its own text raises :class:`QueryRejected`; any
    other exception is a failure of the searcher itself.
    """

    def search(self, queries: Sequence[str], topk: int) -> list[list[Hit]]: ...


def check_topk(topk: Any, limit: int | None = None) -> int:
    """``topk`` as an int >= 1 (and <= ``limit``), or a ``ValueError`` naming it."""
    if isinstance(topk, bool) or not isinstance(topk, int) or topk < 1:
        raise ValueError(f"topk must be an integer >= 1, got {topk!r}")
    if limit is not None and topk > limit:
        raise ValueError(f"topk must be <= {limit}, got {topk}")
    return topk


def check_queries(queries: Any) -> list[str]:
    """``queries`` as a list of str, or a ``ValueError`` naming the bad item: a
    :class:`QueryRejected` for a query UTF-8 cannot encode (a lone surrogate makes
    tokenizers, Lucene and HTTP clients raise)."""
    if isinstance(queries, str) or not isinstance(queries, Sequence):
        raise ValueError(f"queries must be a list of strings, got {type(queries).__name__}")
    for i, q in enumerate(queries):
        if not isinstance(q, str):
            raise ValueError(f"queries[{i}] must be a string, got {type(q).__name__}: {q!r:.80}")
        at = first_unencodable(q)
        if at is not None:
            raise QueryRejected(f"queries[{i}] holds a lone surrogate U+{ord(q[at]):04X} at character {at}, which "
                                "UTF-8 cannot encode; remove it (trace_gym.utils.textsafe.drop_unencodable)", i)
    return list(queries)
