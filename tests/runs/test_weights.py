"""The weights hash (``trace_gym.runs.weights``): one value per set of weights bytes, memoised in the
cache and never in the folder it names, never stale after an edit, and working without a
usable cache."""

from __future__ import annotations

import hashlib
import json
import os
import time

import pytest

from run_dir_checks import tree_digest
from trace_gym.runs import weights
from trace_gym.runs.weights import memo_path, weights_hash


def expected(files: dict[str, bytes]) -> str:
    """The definition, by hand: SHA-256 over ``name:sha256`` lines of the sorted weights files."""
    lines = "".join(f"{name}:{hashlib.sha256(data).hexdigest()}\n" for name, data in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """Two weights files just written, a cache of this test's own; the racy margin off (files
    written a moment ago count as settled) except where a test puts it back."""
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(weights, "RACY_SECONDS", 0.0)
    model = tmp_path / "model"
    model.mkdir()
    (model / "model-00001.safetensors").write_bytes(b"a" * 100)
    (model / "model-00002.safetensors").write_bytes(b"b" * 50)
    (model / "config.json").write_text("{}")
    return model


def test_the_hash_is_memoised_in_the_cache_and_nothing_is_written_into_the_folder(folder, tmp_path):
    before = tree_digest(folder)
    value = weights_hash(folder)
    assert value == expected({"model-00001.safetensors": b"a" * 100, "model-00002.safetensors": b"b" * 50})
    assert tree_digest(folder) == before  # a checkpoint's policy/ stays as its manifest lists it
    memo = memo_path(folder)
    assert memo.parent == tmp_path / "cache" / "weights_hashes" and memo.is_file()
    saved = json.loads(memo.read_text())
    saved["files"]["model-00001.safetensors"] = "0" * 64  # planted: proves a repeat reads the memo
    memo.write_text(json.dumps(saved))
    assert weights_hash(folder) != value
    assert weights_hash(folder.parent / "model" / ".." / "model") == weights_hash(folder)  # one key per real path


@pytest.mark.parametrize("racy", [0.0, 2.0])
def test_an_edit_that_keeps_size_and_mtime_is_never_served_a_stale_hash(folder, monkeypatch, racy):
    """Memoised (margin 0, the edit a tick later: its ctime differs), or not memoised at all
    (the real margin: the files changed within it, so an edit in the same tick is possible)."""
    monkeypatch.setattr(weights, "RACY_SECONDS", racy)
    weights_hash(folder)
    assert memo_path(folder).exists() == (racy == 0.0)
    time.sleep(0.05 if racy == 0.0 else 0)  # past the kernel's timestamp tick (a few ms)
    target = folder / "model-00001.safetensors"
    st = target.stat()
    target.write_bytes(b"z" * 100)  # same size
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old mtime back (cp -p, rsync -t)
    assert weights_hash(folder) == expected({"model-00001.safetensors": b"z" * 100,
                                             "model-00002.safetensors": b"b" * 50})


@pytest.mark.parametrize("cache", ["a file", "a garbage memo"])
def test_a_cache_that_cannot_be_used_still_gives_the_hash(folder, tmp_path, monkeypatch, cache):
    if cache == "a file":  # the cache path is a regular file: nothing can be created under it
        (tmp_path / "blocked").write_text("")
        monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path / "blocked"))
    else:
        memo_path(folder).parent.mkdir(parents=True)
        memo_path(folder).write_text("[" * 100_000)
    want = expected({"model-00001.safetensors": b"a" * 100, "model-00002.safetensors": b"b" * 50})
    assert weights_hash(folder) == want and weights_hash(folder) == want


def test_known_hashes_are_used_as_given_and_a_pulled_models_manifest_by_size(folder):
    vouched = {"model-00001.safetensors": "1" * 64, "model-00002.safetensors": "2" * 64}
    by_hand = hashlib.sha256("".join(f"{n}:{h}\n" for n, h in sorted(vouched.items())).encode()).hexdigest()
    assert weights_hash(folder, known=vouched) == by_hand
    assert not memo_path(folder).exists()  # every hash was known: nothing read, nothing memoised
    listed = {n: {"sha256": h, "size": (folder / n).stat().st_size} for n, h in vouched.items()}
    (folder / "trace_gym_manifest.json").write_text(json.dumps({"files": listed}))
    assert weights_hash(folder) == by_hand
    listed["model-00002.safetensors"]["size"] = 7  # a size that differs: that file is hashed
    (folder / "trace_gym_manifest.json").write_text(json.dumps({"files": listed}))
    assert weights_hash(folder) != by_hand


def test_a_folder_without_weights_is_one_error(tmp_path):
    with pytest.raises(ValueError, match="no \\*.safetensors weights in"):
        weights_hash(tmp_path)
