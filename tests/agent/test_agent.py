"""The token-in-token-out agent loop on a real model and real envs.

The policy is the real SmolLM2-135M (HF engine, in the dtype `auto` picks: fp32 on an AVX2-only
CPU, where bf16 has no fast kernel). Episodes are sampled with fixed
seeds; the assertions are about the harness (token bookkeeping, template deltas,
branch replay), which must hold whatever the model writes.
"""

from __future__ import annotations

import pickle
import time

import gymnasium
import pytest
from planted_env import SLOW, PlantedEnv, planted_tasks

import trace_gym  # noqa: F401
from environments.bfcl.data import sample_tasks
from environments.math_python.generated import generate_digit_sums
from trace_gym.agent.loop import AgentConfig, AgentRunner
from trace_gym.agent.chat import ChatRenderer, TemplateError
from trace_gym.types import Message, SamplingParams


@pytest.fixture(scope="module")
def engine(smollm2_path):  # noqa: F811
    from trace_gym.engines.hf import HFEngine

    eng = HFEngine(smollm2_path, dtype="auto")
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def long_engine(tiny_model_path):  # noqa: F811
    """A tiny random model with a 16k context: BFCL prompts (function docs) are ~9k tokens."""
    from trace_gym.engines.hf import HFEngine

    eng = HFEngine(tiny_model_path, dtype="float32", max_model_len=16384)
    yield eng
    eng.close()


def _math_env():
    return gymnasium.make("trace_gym/MathPython-v0", disable_env_checker=True, few_shot=True,
                          answer_extraction="boxed_or_last_number")


def _bfcl_env():
    return gymnasium.make("trace_gym/BFCL-v0", disable_env_checker=True)


def _runner(engine, make_env, max_turns=3):
    return AgentRunner(engine, engine.tokenizer, make_env, SamplingParams(temperature=1.0, seed=3),
                       AgentConfig(max_turn_tokens=64, max_episode_tokens=min(16384, engine.max_model_len),
                                   max_turns=max_turns))


def test_renderer_deltas_are_exactly_the_template_suffix(engine):
    r = ChatRenderer(engine.tokenizer)
    history = [Message("system", "s"), Message("user", "q"), Message("assistant", "a")]
    delta = r.observation(history, [Message("user", "obs")])
    full = r.render([m.to_dict() for m in (*history, Message("user", "obs"))], generation_prompt=True)
    before = r.render([m.to_dict() for m in history], generation_prompt=False)
    assert before + delta == full
    assert engine.tokenizer.decode(delta) == "<|im_start|>user\nobs<|im_end|>\n<|im_start|>assistant\n"
    assert r.closing([5, r.end_of_turn_id]) == list(r.closing_ids[1:])
    assert r.closing([5, 6]) == list(r.closing_ids)  # stopped without end-of-turn: close it


def test_renderer_fails_loudly_on_a_template_that_rewrites_history(engine):
    import copy

    tok = copy.deepcopy(engine.tokenizer)
    # like templates that strip earlier assistant turns: only the last message is rendered in full
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if loop.last %}{{ m.content }}{% else %}...{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    r = ChatRenderer(tok)
    with pytest.raises(TemplateError, match="not append-only"):
        r.observation([Message("user", "q"), Message("assistant", "a")], [Message("user", "o")])


def _reference_delta(r, history, new, tools=None):
    """The delta by brute force: tokenise both whole conversations, check, slice."""
    before = r.render([m.to_dict() for m in history], generation_prompt=False, tools=tools)
    after = r.render([m.to_dict() for m in (*history, *new)], generation_prompt=True, tools=tools)
    assert after[: len(before)] == before
    return after[len(before):]


def _random_conversations(rng, n):
    """``n`` (history, new messages) pairs drawn with ``rng`` (a ``random.Random``)."""
    pieces = ["", " ", "\n", "\n\n", "  x ", "Output: 45\n", "```python\nprint(1)\n```", "<|im_end|>", "<|im_start|>",
              "naïve café ✓ 数学", "\t", "</search>", "<answer> 42 </answer>", "{\"a\": [1, 2]}", "x" * 300]
    for _ in range(n):
        text = lambda: "".join(rng.choice(pieces) for _ in range(rng.randint(0, 6)))  # noqa: E731
        history = [Message("user", text())]
        if rng.random() < 0.5:
            history.insert(0, Message("system", text()))
        for _ in range(rng.randint(0, 3)):
            history += [Message("assistant", text()), Message(rng.choice(["user", "tool"]), text())]
        history.append(Message("assistant", text()))
        yield history, [Message(rng.choice(["user", "tool"]), text()) for _ in range(rng.randint(1, 2))]


def test_renderer_fast_delta_equals_tokenising_both_conversations_whole(engine):
    """The delta tokenises only the new text (after the history's last end-of-turn token);
    on 300 random conversations (whitespace at every boundary, literal special-token text,
    unicode, long runs) it equals the brute-force delta token for token."""
    import random

    r = ChatRenderer(engine.tokenizer)
    assert r._eot_splits  # SmolLM2: <|im_end|> is an added token, so the fast path runs
    rng = random.Random(0)
    for history, new in _random_conversations(rng, 300):
        assert r.observation(history, new) == _reference_delta(r, history, new), (history, new)


def test_renderer_falls_back_to_whole_tokenisation_where_the_end_of_turn_is_plain_text(engine):
    """Planted: a template whose turns end with a newline, a plain token that the
    pre-tokeniser merges with its neighbours. The fast path must not run there: the
    renderer gives the brute-force delta, or raises where the tokens are not append-only.
    Forced onto the fast path, the same renderer misses such changes (so the guard matters)."""
    import copy
    import random

    tok = copy.deepcopy(engine.tokenizer)
    tok.chat_template = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant:{% endif %}")
    r = ChatRenderer(tok, end_of_turn="Ċ")
    forced = ChatRenderer(tok, end_of_turn="Ċ")
    forced._eot_splits, forced._eot_text = True, "\n"
    assert not r._eot_splits
    rng, wrong, raised = random.Random(1), 0, 0
    for history, new in _random_conversations(rng, 200):
        try:
            want = _reference_delta(r, history, new)
        except AssertionError:  # the tokens of the history change: not append-only
            raised += 1
            with pytest.raises(TemplateError, match="not append-only"):
                r.observation(history, new)
            try:
                forced.observation(history, new)
                wrong += 1  # the forced fast path hands out a delta for a history whose tokens changed
            except TemplateError:
                pass
            continue
        assert r.observation(history, new) == want
        wrong += forced.observation(history, new) != want
    assert raised and wrong, (raised, wrong)


def _canon(x):
    """A structural, identity-free view of snapshot state (bytes are unpickled first)."""
    if isinstance(x, (bytes, bytearray)):
        try:
            return _canon(pickle.loads(x))
        except Exception:
            return bytes(x)
    if isinstance(x, dict):
        return {"dict": sorted((repr(k), _canon(v)) for k, v in x.items())}
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, *(_canon(v) for v in x)]
    if isinstance(x, (set, frozenset)):
        return ["set", *sorted(repr(v) for v in x)]
    if hasattr(x, "__dict__") and not isinstance(x, type):
        return [type(x).__name__, _canon(vars(x))]
    return x


def _episodes(engine, make_env, tasks, min_turns=2, tries=3):
    runner = _runner(engine, make_env)
    for attempt in range(tries):
        eps = runner.run([runner.start(t, seed=11 + attempt) for t in tasks])
        multi = [e for e in eps if len(e.turns) >= min_turns and e.turns[min_turns - 2].snapshot is not None]
        if multi:
            return runner, eps, multi
    pytest.fail(f"no episode with {min_turns}+ turns in {tries} tries")


@pytest.fixture(scope="module")
def math_run(engine):
    """One batch of math episodes on SmolLM2 (4 digit-sum tasks, up to 3 turns), shared by the
    tests that read it or branch its episodes (each ran a batch of its own before, ~5 s each):
    the runner, the episodes, those with 2+ turns, and the runner's ledger right after the batch."""
    import copy

    runner, eps, multi = _episodes(engine, _math_env, generate_digit_sums(4, seed=2))
    yield runner, eps, multi, copy.deepcopy(runner.ledger)
    runner.close()


def test_context_is_the_concatenation_of_segments(math_run):
    runner, eps, _, led = math_run
    for ep in eps:
        assert ep.context == ep.prompt_ids + tuple(t for turn in ep.turns for t in (*turn.action_ids, *turn.obs_ids))
        for t in ep.turns:
            assert len(t.action_logprobs) == len(t.action_ids)
            assert all(lp <= 0.0 for lp in t.action_logprobs)
        # the policy's tokens are kept as sampled, never re-tokenised from text
        start = len(ep.prompt_ids)
        assert ep.turns[0].action_ids == ep.context[start:start + len(ep.turns[0].action_ids)]
        assert ep.env_closed and ep.error is None
    # the runner's ledger after the batch (episodes started without a ledger of their own)
    assert led.generated_tokens == sum(len(t.action_ids) for e in eps for t in e.turns)
    assert led.env_steps == sum(len(e.turns) for e in eps)


@pytest.mark.parametrize("family", ["math_python", "bfcl"])
def test_branching_reproduces_recorded_observation_tokens_and_env_state(request, family):
    if family == "math_python":
        runner, _, multi, _ = request.getfixturevalue("math_run")
    else:
        runner, _, multi = _episodes(request.getfixturevalue("long_engine"), _bfcl_env, sample_tasks(2, seed=1))
    try:
        _branch_each_turn(runner, multi[0])
    finally:  # the children branched and driven by hand end here, envs closed
        if family == "math_python":
            runner.cancel()  # math_run's runner is shared: it stays open, with nothing live
        else:
            runner.close()


def _branch_each_turn(runner, ep):
    for t in range(1, len(ep.turns)):
        if ep.turns[t - 1].snapshot is None:
            break
        child = runner.branch(ep, t, k=1)[0]
        assert child.context == ep.prompt_ids + tuple(
            x for turn in ep.turns[:t] for x in (*turn.action_ids, *turn.obs_ids))
        # replay the recorded action of turn t+1 in the restored env
        recorded = ep.turns[t]
        obs, reward, term, trunc, _ = child.env.step(recorded.action_text)
        assert tuple(obs) == recorded.obs_messages
        assert reward == recorded.reward and term == recorded.terminated
        child.messages.append(Message("assistant", recorded.action_text))
        delta = [] if (term or trunc) else runner.renderer.observation(child.messages, obs, child.tools)
        assert tuple(runner.renderer.closing(recorded.action_ids) + delta) == recorded.obs_ids
        if recorded.snapshot is not None:
            assert _canon(child.env.unwrapped.snapshot().state) == _canon(recorded.snapshot.state)
        child.env.close()


class RecordingEngine:
    """A real engine whose ``generate`` calls are recorded (prefix lengths and n)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def generate(self, prefixes, n, sampling):
        self.calls.append([(len(p), k) for p, k in zip(prefixes, n)])
        return self.engine.generate(prefixes, n, sampling)


def test_continuations_with_one_anchor_run_as_one_request(engine, math_run):
    runner, _, multi, _ = math_run
    ep = multi[0]
    runner.engine = RecordingEngine(engine)
    try:
        children = runner.branch(ep, 1, k=3, anchor=("tree", 7))
        loose = runner.branch(ep, 1, k=2)  # no anchor: nothing says they share a prefix
        shared = len(children[0].context)
        before = runner.ledger.prefill_tokens
        done = runner.run(children + loose)
    finally:
        recorder, runner.engine = runner.engine, engine  # the shared runner gets its engine back
    assert len(done) == 5 and all(c.done and c.env_closed for c in done)
    assert all(c.turns[0].action_ids == ep.turns[0].action_ids for c in done)  # inherited turn
    first = recorder.calls[0]
    assert sorted(first) == sorted([(shared, 3), (shared, 1), (shared, 1)])
    # the shared prefix was prefilled once for the three anchored children, not three times
    assert runner.ledger.prefill_tokens - before < 5 * shared


def test_episode_token_limit_truncates_and_reports(engine):
    runner = AgentRunner(engine, engine.tokenizer, _math_env, SamplingParams(temperature=1.0, seed=1),
                         AgentConfig(max_turn_tokens=16, max_episode_tokens=175, max_turns=8))
    eps = runner.run([runner.start(t, seed=0) for t in generate_digit_sums(2, seed=9)])
    assert all(len(ep.prompt_ids) + 16 < 175 < len(ep.prompt_ids) + 32 for ep in eps)  # binds from turn 2 on
    for ep in eps:
        # the engine never saw more than the limit: every turn's prefix + action fits
        seen = len(ep.prompt_ids)
        for turn in ep.turns:
            assert seen + len(turn.action_ids) <= 175
            seen += len(turn.action_ids) + len(turn.obs_ids)
    assert sum(runner.truncations.values()) >= 1
    assert any(t.truncation for e in eps for t in e.turns)
    runner.close()


def test_prompt_longer_than_the_episode_limit_ends_that_episode_with_a_clear_error(engine):
    runner = AgentRunner(engine, engine.tokenizer, _math_env, SamplingParams(),
                         AgentConfig(max_turn_tokens=16, max_episode_tokens=20))
    ep = runner.start(generate_digit_sums(1)[0], seed=0)
    assert ep.done and "max_episode_tokens=20" in ep.error and "tokens, at or over" in ep.error
    assert runner.run() == [ep] and ep.env_closed and not ep.turns
    assert runner.ledger.errors == 1 and runner.ledger.generated_tokens == 0
    runner.close()


# ---------------------------------------------------------------------- planted env failures
@pytest.fixture
def planted(tiny_engine):  # noqa: F811
    PlantedEnv.instances = []
    runner = AgentRunner(tiny_engine, tiny_engine.tokenizer, PlantedEnv, SamplingParams(temperature=1.0, seed=5),
                         AgentConfig(max_turn_tokens=8, max_episode_tokens=1024, max_turns=4, straggler_seconds=0.2))
    yield runner
    runner.close()
    assert PlantedEnv.instances and all(env.closed for env in PlantedEnv.instances)  # no env leaks


def test_an_env_that_raises_in_step_ends_only_its_own_episode(planted):
    eps = planted.start_many([(t, 0) for t in planted_tasks(None, "step", None)])
    done = planted.run(eps)
    assert {e.uid for e in done} == {e.uid for e in eps}
    ok, bad = [eps[0], eps[2]], eps[1]
    assert all(e.error is None and len(e.turns) == 4 for e in ok)  # the env's own truncation at 4 steps
    assert bad.error == "RuntimeError in env.step: planted step failure"
    assert len(bad.turns) == 2 and bad.turns[-1].truncation == "env_error" and bad.turns[-1].truncated
    assert bad.turns[-1].info == {"env_error": bad.error} and bad.turns[-1].reward == 0.0
    assert planted.ledger.errors == 1 and planted.truncations["env_error"] == 1
    assert planted.ledger.env_steps == 4 + 2 + 4


def test_envs_that_raise_in_reset_restore_or_close_end_only_their_episode(planted):
    tasks = planted_tasks(None, "reset", "restore", "close")
    eps = planted.start_many([(t, 0) for t in tasks])
    assert eps[1].done and eps[1].error == "RuntimeError in env.reset: planted reset failure" and not eps[1].turns
    done = planted.run(eps)
    assert len(done) == 4 and done[0] is eps[1]  # the failed start comes back first
    assert eps[3].error == "RuntimeError in env.close: planted close failure" and len(eps[3].turns) == 4
    children = planted.branch(eps[2], 1, 2, anchor=("t", 1))
    assert all(c.done and c.error == "RuntimeError in env.restore: planted restore failure" for c in children)
    assert planted.run(children) == children
    healthy = planted.branch(eps[0], 2, 1)
    assert planted.run(healthy) == healthy and healthy[0].error is None
    assert eps[0].error is None and eps[2].error is None
    assert planted.ledger.errors == 1 + 1 + 2


def test_a_slow_env_step_does_not_hold_up_the_other_episodes(planted):
    """One episode's first step sleeps 3 s; the others play all 4 turns meanwhile."""
    eps = planted.start_many([(t, 0) for t in planted_tasks("slow", None, None)])
    returned = {}
    while planted.live:
        for ep in planted.advance():
            returned[ep.uid] = time.perf_counter()
    slow_env = next(env for env in PlantedEnv.instances if env.mode == "slow")
    for ep in eps[1:]:
        assert len(ep.turns) == 4 and returned[ep.uid] < slow_env.slow_step_ended
    assert len(eps[0].turns) == 4 and returned[eps[0].uid] > slow_env.slow_step_ended
    assert planted.ledger.seconds["environment_busy"] >= SLOW  # the sleep, in the pool's time


@pytest.mark.parametrize("deterministic", [False, True])
def test_in_deterministic_mode_every_round_waits_for_every_env_step(tiny_engine, monkeypatch,  # noqa: F811
                                                                    deterministic):
    """One episode's first env step outlasts ``straggler_seconds`` (it waits for a gate). Without
    the mode the next round generates without it and it joins a later one, so which episodes
    share a batch (and their sampling seeds) follows the env's timing; in deterministic mode
    every round holds all three, whenever the gate opens. The gate opens at the 2nd generate
    call without the mode (so the step is late whatever the machine's speed), after 0.5 s in it."""
    import threading

    import planted_env
    from trace_gym.utils import determinism

    monkeypatch.setattr(determinism, "_ACTIVE", determinism.DeterministicMode(1, "test") if deterministic else None)
    monkeypatch.setattr(planted_env, "GATE", threading.Event())

    class Releasing(RecordingEngine):
        def generate(self, prefixes, n, sampling):
            if len(self.calls) == 1:
                planted_env.GATE.set()
            return super().generate(prefixes, n, sampling)

    runner = AgentRunner(Releasing(tiny_engine), tiny_engine.tokenizer, PlantedEnv,
                         SamplingParams(temperature=1.0, seed=5),
                         AgentConfig(max_turn_tokens=8, max_episode_tokens=1024, max_turns=4, straggler_seconds=0.05))
    timer = threading.Timer(0.5, planted_env.GATE.set) if deterministic else None
    try:
        eps = runner.start_many([(t, 0) for t in planted_tasks("gated", None, None)])
        if timer is not None:
            timer.start()
        runner.run(eps)
    finally:
        if timer is not None:
            timer.cancel()
        planted_env.GATE.set()
        runner.close()
    sizes = [len(call) for call in runner.engine.calls]
    assert all(len(ep.turns) == 4 and ep.error is None for ep in eps)
    assert sizes == [3, 3, 3, 3] if deterministic else sizes[:2] == [3, 2]


def test_an_episode_that_ends_comes_back_before_the_next_generation(planted):
    """The bad episode's env raises on its 2nd step: advance returns it right after that
    step, before a 3rd generation for the others, so a caller can start what depends on
    it (a prompt's continuations) in time to join that generation."""
    planted.engine = RecordingEngine(planted.engine)
    eps = planted.start_many([(t, 0) for t in planted_tasks(None, "step", None)])
    calls_when_back = {}
    while planted.live:
        for ep in planted.advance():
            calls_when_back[ep.uid] = len(planted.engine.calls)
    assert len(eps[1].turns) == 2 and calls_when_back[eps[1].uid] == 2
    assert all(len(e.turns) == 4 and calls_when_back[e.uid] == 4 for e in (eps[0], eps[2]))


def test_a_step_collected_with_the_closes_never_runs_past_max_turns(tiny_engine, monkeypatch):  # noqa: F811
    """The race a bank recording met under load (a continuation of 4 turns under max_turns = 3): a
    round takes in env results, cuts episodes at their limits, then takes in again for the closes of
    episodes that just ended; a step that landed in that second take reached max_turns after the cut.
    Forced here: the late episode's 2nd step (its max_turns-th) waits until the other episode's close
    runs, and that close outlasts the runner's wait, so the step is collected in the second take with
    no finished episode to hold the generation back."""
    import threading

    import planted_env

    monkeypatch.setattr(planted_env, "GATE", threading.Event())
    monkeypatch.setattr(planted_env, "STEPPED", threading.Event())
    runner = AgentRunner(RecordingEngine(tiny_engine), tiny_engine.tokenizer, PlantedEnv,
                         SamplingParams(temperature=1.0, seed=5),
                         AgentConfig(max_turn_tokens=8, max_episode_tokens=1024, max_turns=2, straggler_seconds=0.5))
    try:
        late, opens = runner.start_many([(t, 0) for t in planted_tasks("late", "opens")])
        runner.run([late, opens])
    finally:
        planted_env.GATE.set()
        runner.close()
    assert planted_env.STEPPED.is_set()  # the order the test means did happen
    assert opens.error == "RuntimeError in env.step: planted step failure"
    assert len(late.turns) == 2 and late.turns[-1].truncation == "max_turns"


def test_cancel_closes_every_live_env(planted):
    eps = planted.start_many([(t, 0) for t in planted_tasks(None, None, None)])
    planted.advance()  # steps are in flight now
    planted.cancel()
    assert planted.live == 0 and all(e.env_closed for e in eps)


def test_the_envs_closing_tags_reach_every_generate_call(engine):
    """wiki_qa declares ``</search>``/``</answer>`` stop strings (``StopStrings``): every
    generate call of its episodes carries them, so a turn ends at its first closing tag
    (the engines' stop-string handling is tested in ``test_engine_hf``/``test_engine_vllm``)."""
    from trace_gym.registry import ENV_FAMILIES

    class StopRecorder(RecordingEngine):
        def generate(self, prefixes, n, sampling):
            self.calls.append(sampling.stop)
            return self.engine.generate(prefixes, n, sampling)

    family = ENV_FAMILIES["wiki_qa"]
    recorder = StopRecorder(engine)
    runner = AgentRunner(recorder, engine.tokenizer, family.make_env, SamplingParams(temperature=1.0, seed=3,
                                                                                     stop=("STOP",)),
                         # 32 tokens a turn: every tagged turn at this seed ends by its 20th token (as
                         # with 96, where the test ran 3x as long), only the untagged 2nd turns are cut
                         AgentConfig(max_turn_tokens=32, max_episode_tokens=2048, max_turns=2))
    try:
        done = runner.run([runner.start(t, seed=i) for i, t in enumerate(family.load_tasks(4, seed=0))])
    finally:
        runner.close()
    assert recorder.calls and all(stop == ("STOP", "</search>", "</answer>", "</tool_call>") for stop in recorder.calls)
    tagged = [t for ep in done for t in ep.turns if "</search>" in t.action_text or "</answer>" in t.action_text]
    assert tagged, "the few-shot prompt should get SmolLM2 to use a tag at this seed"
    for turn in tagged:  # nothing after the first closing tag but what its last token carries
        cut = min(i for i in (turn.action_text.find("</search>"), turn.action_text.find("</answer>")) if i >= 0)
        assert turn.action_text[cut:].rstrip() in ("</search>", "</answer>"), turn.action_text
