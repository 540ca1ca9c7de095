"""Corpus access, the encoder rule table and pooling, FAISS factory strings, the Hit type."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from retrieval_index.corpus import Corpus, parse_line, scan, write_jsonl
from retrieval_index.encoders import DEFAULT_RULE, Encoder, EncoderRule, pool, rule_for
from retrieval_index.faiss_index import factory_string, pq_subquantizers
from retrieval_index.protocol import Hit, check_queries, check_topk, make_contents, split_contents


def test_scan_offsets_skip_blank_lines_and_handle_crlf_and_unicode(tmp_path):
    lines = [b'{"id": "a", "contents": "\\"A\\"\\nalpha"}\n', b"\n", b'{"id": "b", "contents": "\\"B\\"\\nb\xc3\xa9ta"}\r\n',
             b"   \n", b'{"id": "c", "contents": "\\"C\\"\\ngamma"}']  # no final newline
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"".join(lines))
    stats, offsets = scan(path)
    assert stats.count == 3 and stats.bytes == path.stat().st_size
    assert stats.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    corpus = Corpus(path)
    assert [corpus[i][0] for i in range(3)] == ["a", "b", "c"]
    assert corpus[1][1] == '"B"\nbéta' and corpus.rows(0, 3) == [corpus[i] for i in range(3)]
    with pytest.raises(IndexError, match="row 3 out of range"):
        corpus[3]


def test_offsets_cache_is_reused_until_the_file_changes(tmp_path):
    path = tmp_path / "c.jsonl"
    write_jsonl(path, [(str(i), make_contents(f"T{i}", f"text {i}")) for i in range(5)])
    cache = tmp_path / "offsets.npy"
    first = Corpus(path, offsets_cache=cache)
    assert cache.exists() and json.loads(cache.with_suffix(".json").read_text())["count"] == 5
    np.save(cache, np.zeros(6, dtype=np.int64))  # a stale cache is only trusted while size and mtime match
    assert Corpus(path, offsets_cache=cache).offsets.tolist() == [0] * 6
    write_jsonl(path, [(str(i), make_contents(f"T{i}", f"text {i}")) for i in range(7)])
    again = Corpus(path, offsets_cache=cache)
    assert len(again) == 7 and again.stats.sha256 != first.stats.sha256 and again[6][0] == "6"


@pytest.mark.parametrize("raw,problem", [(b"{not json", "not valid JSON"), (b'{"id": 1}', "needs 'id' and 'contents'"),
                                         (b'["x"]', "needs 'id' and 'contents'"),
                                         (b'{"id": 1, "contents": 5}', "must be a string")])
def test_bad_lines_are_named(raw, problem):
    with pytest.raises(ValueError, match=problem) as err:
        parse_line(raw, "corpus.jsonl:12")
    assert "corpus.jsonl:12" in str(err.value)


def test_rule_table():
    e5 = rule_for("intfloat/e5-base-v2")
    assert (e5.query_prefix, e5.passage_prefix, e5.pooling, e5.normalize) == ("query: ", "passage: ", "mean", True)
    assert rule_for("BAAI/bge-base-en-v1.5").pooling == "cls"
    assert rule_for("BAAI/bge-base-en-v1.5").query_prefix.startswith("Represent this sentence")
    assert rule_for("all-MiniLM-L6-v2") == EncoderRule("", "", "mean", True)
    assert rule_for("facebook/contriever").normalize is False
    assert rule_for("some/unknown-model") is DEFAULT_RULE
    with pytest.raises(ValueError, match="pooling"):
        EncoderRule(pooling="max")


def test_pooling_by_hand():
    hidden = np.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # the third token is padding
    mask = np.array([[1, 1, 0]])
    np.testing.assert_allclose(pool(hidden, mask, "mean"), [[2.0, 3.0]])
    np.testing.assert_allclose(pool(hidden, mask, "cls"), [[1.0, 2.0]])
    np.testing.assert_allclose(pool(hidden, mask, "pooler", pooler=np.array([[7.0, 8.0]])), [[7.0, 8.0]])


@pytest.fixture(scope="module")
def encoder():
    return Encoder(device="cpu", batch_size=4)


def test_encoder_matches_sentence_transformers_and_mean_pooling(encoder):
    from sentence_transformers import SentenceTransformer

    texts = ["Paris is the capital of France.", "x", "A much longer passage about rivers, bridges and markets " * 3]
    reference = SentenceTransformer(encoder.path, device="cpu").encode(texts, normalize_embeddings=True)
    ours = encoder.encode_passages(texts)
    np.testing.assert_allclose(ours, reference, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # pooling computed by hand from the model's token states equals the encoder's
    import torch

    batch = encoder.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = encoder.model(**batch).last_hidden_state.numpy()
    by_hand = pool(hidden, batch["attention_mask"].numpy(), "mean")
    by_hand /= np.linalg.norm(by_hand, axis=1, keepdims=True)
    np.testing.assert_allclose(ours, by_hand, atol=1e-5)


def test_e5_prefixes_are_applied_to_each_side(encoder):
    e5_style = Encoder(encoder.path, rule=rule_for("intfloat/e5-base-v2"), device="cpu")
    np.testing.assert_allclose(e5_style.encode_queries(["capital"]), encoder.encode_passages(["query: capital"]),
                               atol=1e-6)
    np.testing.assert_allclose(e5_style.encode_passages(["capital"]), encoder.encode_passages(["passage: capital"]),
                               atol=1e-6)


def test_unknown_encoder_names_are_refused_offline():
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        Encoder("intfloat/no-such-model-for-tests")
    with pytest.raises(ValueError, match="neither a local folder"):
        Encoder("not a model")


def test_factory_strings():
    assert factory_string("Flat", 384, 1000) == "Flat" and factory_string("flat", 384, 10, fp16=True) == "SQfp16"
    assert factory_string("HNSW", 768, 10**6) == "HNSW32" and factory_string("HNSW", 8, 9, True) == "HNSW32,SQfp16"
    assert factory_string("IVF-PQ", 768, 21_000_000) == "IVF18330,PQ64"
    assert factory_string("IVF-PQ", 384, 240) == "IVF6,PQ64x2"
    assert factory_string("IVF-PQ", 384, 20_000) == "IVF512,PQ64"  # enough data for 8-bit codes
    assert factory_string("IVF1024,Flat", 384, 10**5) == "IVF1024,Flat"
    assert pq_subquantizers(768) == 64 and pq_subquantizers(100) == 25 and pq_subquantizers(7) == 1
    with pytest.raises(ValueError, match="dim"):
        factory_string("Flat", 0, 10)


def test_hit_json_round_trip_and_checks():
    hit = Hit("7", make_contents("Paris", "Paris is a city."), 0.5)
    assert hit.title == '"Paris"' and hit.text == "Paris is a city."
    assert Hit.from_json(hit.to_json()) == hit
    assert Hit.from_json(hit.to_json(with_score=False)) == Hit("7", hit.contents, None)
    assert split_contents("no newline") == ("no newline", "")
    with pytest.raises(ValueError, match="topk"):
        check_topk(0)
    with pytest.raises(ValueError, match="topk"):
        check_topk(True)
    with pytest.raises(ValueError, match=r"queries\[1\]"):
        check_queries(["a", 3])
    with pytest.raises(ValueError, match="list of strings"):
        check_queries("a")


# ---------------------------------------------------------------- a standalone package
PROJECT_PACKAGES = ("trace_gym", "environments", "evaluators", "baselines")


def project_imports(source: str) -> list[str]:
    """Every module of the project that ``source`` imports, at any depth (inside functions
    too), by statement or by ``importlib.import_module`` / ``__import__`` of a literal name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and (getattr(node.func, "attr", None) == "import_module" or getattr(node.func, "id", None) in
                   ("import_module", "__import__"))):
            names = [node.args[0].value]
        else:
            continue
        found += [f"{name} (line {node.lineno})" for name in names if name.split(".")[0] in PROJECT_PACKAGES]
    return found


def test_the_import_checker_finds_planted_imports():
    planted = ("import os\nfrom retrieval_index.corpus import Corpus\n"
               "def f():\n    from trace_gym.utils.textsafe import clean_text\n    import evaluators.run as r\n"
               "    return importlib.import_module('environments.wiki_qa')\n"
               "class C:\n    def g(self):\n        __import__('baselines')\n")
    assert project_imports(planted) == ["trace_gym.utils.textsafe (line 4)", "evaluators.run (line 5)",
                                        "environments.wiki_qa (line 6)", "baselines (line 9)"]


def test_retrieval_index_imports_nothing_of_the_project():
    package = Path(__file__).resolve().parents[2] / "retrieval_index"
    files = sorted(package.rglob("*.py"))
    assert len(files) > 10  # the scan reads the package, not an empty folder
    bad = {str(p.relative_to(package.parent)): found for p in files if (found := project_imports(p.read_text()))}
    assert bad == {}, f"retrieval_index must stay standalone; it imports {bad}"


TEXTS = ["plain", "lone \ud800 surrogate", "\udfff", "", '{"a": [1, 2]}', '[' * 40 + ']' * 40, '{"x": ' + '9' * 200 + '}',
         '{"unclosed": [1, 2', '{"s": "[[[[ in a string"}', "not json", '{"q": ["a", "\\ud800"]}', b'\xff\xfe{}',
         b'{"b": "caf\xc3\xa9"}', '"\\"escaped\\" [" ']


@pytest.mark.parametrize("text", TEXTS)
def test_the_copied_text_cleaning_answers_as_its_source(text):
    from retrieval_index import textclean
    from trace_gym.utils import textsafe

    def outcome(module, **bounds):
        try:
            return ("value", module.loads_bounded(text, **bounds))
        except module.JSONRefused as exc:
            return ("refused", str(exc))

    for bounds in ({}, {"max_depth": 8, "max_digits": 32}):
        assert outcome(textclean, **bounds) == outcome(textsafe, **bounds)
    if isinstance(text, str):
        assert textclean.first_unencodable(text) == textsafe.first_unencodable(text)
        assert textclean.clean_text(text) == textsafe.clean_text(text)
        assert textclean.json_problem(text, 8, 32) == textsafe.json_problem(text, 8, 32)
        value = {text: [text, (text, 1.5)], "n": None}
        assert textclean.clean_value(value) == textsafe.clean_value(value)
    assert issubclass(textclean.JSONRefused, ValueError)
