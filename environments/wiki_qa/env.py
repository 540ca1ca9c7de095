"""WikiQA: multi-hop question answering with a search engine (Search-R1's setting).

The agent reads a question, searches an encyclopedia index as often as it needs, reads
the passages, and answers. Reward: exact match after SQuAD normalisation, maximised over
the gold aliases (:mod:`environments.wiki_qa.metrics`).

## Action Space
``TextAction``: the model's raw text for one turn, parsed by
:func:`environments.wiki_qa.actions.parse_action`. ``protocol="tags"`` (default,
Search-R1): the first ``<search>q</search>`` or ``<answer>a</answer>``;
``protocol="tool_call"``: the first ``<tool_call>{"name": "search" | "answer",
"arguments": {...}}</tool_call>``.

## Observation Space
``ChatObservation``. ``reset``: ``[system, (few-shot demo), user]`` with the protocol's
instructions and ``prompt_template.format(question=...)``. After a search, one message
(role ``observation_role``; ``tool`` named ``search`` for ``tool_call``) holding the
top ``topk`` passages in Search-R1's format::

    <information>Doc 1(Title: "T1") text 1
    Doc 2(Title: "T2") text 2
    Doc 3(Title: "T3") text 3</information>

(the ``tool_call`` protocol sends the same lines without the ``<information>`` tags;
``No results.`` when nothing matched). Every observation encodes as UTF-8: queries lose
their lone surrogates before searching, and any left in a question or a passage are
written as ``\\udXXX``. After an action without a valid tag: the fixed
:data:`~environments.wiki_qa.actions.INVALID_ACTION` (or ``INVALID_TOOL_ACTION``). A
response over ``max_action_chars``, or an empty / over-long query, gets a message
naming the problem; the episode goes on and the turn counts. After the answer: ``[]``.

## Rewards
0.0 on every step but the answer; then the EM reward (``reward="em"``, default) or the F1
reward (``reward="f1"``: 1.0 when the answer's words are a gold alias's, else half its token
F1, so that a hedge such as "Paris London" stays below the 0.5 success line;
:func:`~environments.wiki_qa.metrics.f1_reward`) of the answer against the task's gold
answers (max over aliases). The reward departs from the official metrics for a gold that
normalises to nothing (module docstring of :mod:`environments.wiki_qa.metrics`).
``info["em"]`` / ``info["f1"]`` are the official HotpotQA EM and F1 (what the evaluator
reports); ``info["reward_components"]`` the reward's EM and F1.

## Episode End
Terminated by the first answer. Truncated (reward 0) after ``max_turns`` actions
without an answer.

## Snapshot
``state``: the task, turn, the finished flag, the query log and the *result cache*
(query -> passages). A query already in the cache is answered from it, never from the
index, so a branch restored from a snapshot sees exactly the passages of its parent
even if the index changed underneath.

If the searcher itself fails (e.g. the retrieval server is down after the client's
retries), ``step`` raises: that is an infrastructure failure, not something the model
did, and it must not be turned into a training signal. A query the searcher refuses
because of its own text (:class:`~retrieval_index.protocol.QueryRejected`, e.g. a
server's shorter length limit) is an invalid search the model reads (``query_refused``).

## Version History
v0: first version.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import gymnasium

from environments.wiki_qa.actions import PROTOCOLS, QUERY_REFUSED, TOOL_SCHEMAS, Action, parse_action
from environments.wiki_qa.metrics import best_exact_match, best_f1, em_reward, f1_reward, reward_f1
from environments.wiki_qa.searchers import resolve_searcher
from retrieval_index.protocol import QueryRejected, split_contents
from trace_gym.utils.textsafe import clean_text
from trace_gym.env.contract import Snapshot, freeze, resolve_task, rng_from_state, rng_state, task_from_options, thaw
from trace_gym.env.spaces import ChatObservation, TextAction
from trace_gym.types import Message, Task

SYSTEM_PROMPT_TAGS = (
    "Answer the question with the help of a search engine. Reason step by step inside <think> </think>. "
    "Whenever you need facts, write <search> query </search>; the best matching passages will come back "
    "between <information> and </information>. You may search as many times as you need. When you know the "
    "answer, write only the answer inside <answer> </answer>, for example <answer> Paris </answer>."
)
SYSTEM_PROMPT_TOOLS = (
    "Answer the question with the help of a search engine. You have two tools:\n"
    '- search: {"query": string} returns the best matching passages.\n'
    '- answer: {"answer": string} gives your final, short answer and ends the conversation.\n'
    'Call a tool by writing <tool_call>{"name": "search", "arguments": {"query": "..."}}</tool_call>. '
    "You may search as many times as you need before answering."
)
PROMPT_TEMPLATE = "Question: {question}"
NO_RESULTS = "No results."
#: A one-shot demonstration of the tag protocol (an invented two-hop question), inserted
#: after the system prompt when ``few_shot=True``; tiny models imitate it.
FEW_SHOT_DEMO = (
    ("user", "Question: In which country was the founder of Orvik Appliances born?"),
    ("assistant", "<search> founder of Orvik Appliances </search>"),
    ("user", '<information>Doc 1(Title: "Orvik Appliances") Orvik Appliances is a company founded in 1961 by '
             "Mara Velt.</information>"),
    ("assistant", "<search> Where was Mara Velt born? </search>"),
    ("user", '<information>Doc 1(Title: "Mara Velt") Mara Velt (born 1930) is an engineer. She was born in '
             "Norland.</information>"),
    ("assistant", "<answer> Norland </answer>"),
)
REWARDS = ("em", "f1")
#: What a question's difficulty depends on, for the no-contrast warning (``DifficultyKnobs``);
#: SmolLM2-135M's measured success rates are in docs/environments/wiki_qa.md.
DIFFICULTY_KNOBS = {
    "single_hop_share": "task kwarg single_hop_share=1.0: only questions whose answer one search returns "
                        "(the easiest tier; 0.0: only two-hop questions)",
    "few_shot": "env kwarg few_shot=true: one demonstrated search-search-answer episode after the system prompt",
    "offline_scale": "env kwarg offline_scale (and task kwarg scale) below 1: a smaller world, fewer distractor "
                     "passages",
    "max_turns": "agent max_turns (and env max_turns): searches allowed before the answer",
}


def format_passages(hits: Sequence[tuple[str, str, float | None]]) -> str:
    """Search-R1's passage lines: ``Doc i(Title: <first line>) <rest>``, one per hit."""
    if not hits:
        return NO_RESULTS
    lines = []
    for i, (_, contents, _) in enumerate(hits, 1):
        title, text = split_contents(contents)
        lines.append(f"Doc {i}(Title: {title}) {text}")
    return clean_text("\n".join(lines))  # a corpus line may hold a lone surrogate escape


class WikiQAEnv(gymnasium.Env):
    """Multi-hop QA with a search tool (spec in the module docstring).

    Args:
        tasks: the pool ``reset()`` draws from: ``Task`` objects, FlashRAG-style dicts
            (``id``, ``question``, ``golden_answers``), or a dataset name for
            :func:`~environments.wiki_qa.data.load_tasks`; default: the SYNTHETIC offline
            world's questions.
        searcher: a spec string (see :mod:`environments.wiki_qa.searchers`) or any
            object with ``search(queries, topk)``; default ``"offline"``.
        topk: passages per search (Search-R1 uses 3).
        max_turns: actions before truncation.
        protocol: ``tags`` (Search-R1) or ``tool_call``.
        reward: ``em`` or ``f1`` (the F1 reward: half F1 below a whole match).
        max_action_chars: longer responses are not parsed.
        max_query_chars: longer queries are refused.
        few_shot: start with :data:`FEW_SHOT_DEMO` (tags protocol).
        observation_role: ``user`` or ``tool`` (the tool_call protocol always uses ``tool``).
        system_prompt, prompt_template: the first observation (``{question}`` field).
        offline_seed, offline_scale: which synthetic world ``"offline"`` means.
    """

    metadata = {"render_modes": []}
    snapshot_mode = "state"
    difficulty_knobs = DIFFICULTY_KNOBS

    #: A turn ends at its first closing tag (``StopStrings``), as in Search-R1: the env
    #: answers a search right away, and the model cannot write its own "results".
    stop_strings = ("</search>", "</answer>", "</tool_call>")

    @classmethod
    def load_tasks(cls, n: int, seed: int = 0, offline_seed: int = 0, offline_scale: float = 1.0) -> list[Task]:
        """The task loader of ``trace_gym/WikiQA-v0``: ``n`` two-hop questions of the SYNTHETIC
        offline world (the env's default pool), drawn with ``seed``; all of them when ``n``
        exceeds the world's (a loader that runs dry returns fewer). ``offline_seed`` and
        ``offline_scale`` name the world, as the env's keyword arguments of the same names do:
        give both the same values (``task_kwargs`` and ``env_kwargs``)."""
        from environments.wiki_qa.data import offline_tasks

        pool = len(offline_tasks(None, seed=None, world_seed=offline_seed, scale=offline_scale))
        return offline_tasks(min(n, pool), seed, world_seed=offline_seed, scale=offline_scale)

    def __init__(self, tasks: Sequence[Task | dict] | str | None = None, *, searcher: Any = "offline", topk: int = 3,
                 max_turns: int = 4, protocol: str = "tags", reward: str = "em", max_action_chars: int = 65536,
                 max_query_chars: int = 512, few_shot: bool = False, observation_role: str = "user",
                 system_prompt: str | None = None, prompt_template: str = PROMPT_TEMPLATE, offline_seed: int = 0,
                 offline_scale: float = 1.0):
        if not 1 <= topk <= 100:
            raise ValueError(f"topk must lie in [1, 100], got {topk!r}")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {PROTOCOLS}, got {protocol!r}")
        if reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
        if observation_role not in ("user", "tool"):
            raise ValueError(f"observation_role must be 'user' or 'tool', got {observation_role!r}")
        if max_action_chars < 1 or max_query_chars < 1:
            raise ValueError(f"max_action_chars and max_query_chars must be >= 1, got {max_action_chars}, "
                             f"{max_query_chars}")
        if "{question}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{question}}', got {prompt_template!r}")
        if tasks is None:
            from environments.wiki_qa.data import offline_tasks

            tasks = offline_tasks(seed=None, world_seed=offline_seed, scale=offline_scale)
        elif isinstance(tasks, str):
            from environments.wiki_qa.data import load_tasks

            tasks = load_tasks(tasks)
        self.tasks = [t if isinstance(t, Task) else _task_from_row(t) for t in tasks]
        if not self.tasks:
            raise ValueError("WikiQAEnv needs at least one task")
        self.searcher_spec = searcher
        self.topk, self.max_turns, self.protocol, self.reward_kind = topk, max_turns, protocol, reward
        self.max_action_chars, self.max_query_chars = max_action_chars, max_query_chars
        self.few_shot = few_shot
        self.observation_role = "tool" if protocol == "tool_call" else observation_role
        self.system_prompt = system_prompt or (SYSTEM_PROMPT_TAGS if protocol == "tags" else SYSTEM_PROMPT_TOOLS)
        self.prompt_template = prompt_template
        self.offline_seed, self.offline_scale = offline_seed, offline_scale
        self.action_space = TextAction(max_length=max_action_chars)
        self.observation_space = ChatObservation()
        self._searcher = None
        self._task: Task | None = None
        self._turn = 0
        self._done = False
        self._cache: dict[str, tuple] = {}
        self._log: list[str] = []

    # -- gymnasium API ------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        raw = (options or {}).get("task")
        if isinstance(raw, Mapping) and "golden_answers" in raw:  # a FlashRAG row
            options = {**options, "task": _task_from_row(raw)}
        self._task = task_from_options(options, self.tasks, self.np_random, self._load, require_answer=True)
        if not self._golds(self._task):
            raise ValueError(f"task {self._task.id!r} has no gold answers (Task.answer = {self._task.answer!r})")
        self._turn, self._done, self._cache, self._log = 0, False, {}, []
        obs = [Message("system", self.system_prompt)]
        if self.few_shot and self.protocol == "tags":
            obs += [Message(role, content) for role, content in FEW_SHOT_DEMO]
        obs.append(Message("user", clean_text(self.prompt_template.format(question=self._task.prompt))))
        info: dict[str, Any] = {"task_id": self._task.id}
        if self.protocol == "tool_call":
            info["tool_schemas"] = [dict(s) for s in TOOL_SCHEMAS]
        return obs, info

    def step(self, action: str):
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            return [], 0.0, True, False, {"error": "episode_over"}
        self._turn += 1
        parsed = parse_action(action, self.protocol, max_action_chars=self.max_action_chars,
                              max_query_chars=self.max_query_chars)
        info: dict[str, Any] = {"turn": self._turn, "action": parsed.kind}
        if parsed.kind == "answer":
            self._done = True
            golds = self._golds(self._task)
            em, f1 = best_exact_match(parsed.text, golds), best_f1(parsed.text, golds)  # the official metrics
            paid = {"em": em_reward(parsed.text, golds), "f1": reward_f1(parsed.text, golds)}  # the reward's
            info.update(prediction=parsed.text, golden_answers=golds, em=em, f1=f1, reward_components=paid,
                        searches=len(self._log))
            return [], paid["em"] if self.reward_kind == "em" else f1_reward(parsed.text, golds), True, False, info
        if parsed.kind == "search":
            info["query"] = parsed.text
            info["cache_hit"] = parsed.text in self._cache
            try:
                hits = self._search(parsed.text)
            except QueryRejected as exc:  # the query's own text, not the searcher: the model reads why
                parsed = Action("invalid", QUERY_REFUSED.format(reason=clean_text(str(exc))[:300]), "query_refused")
                info["action"] = parsed.kind
        if parsed.kind == "search":
            info["doc_ids"] = [h[0] for h in hits]
            text = format_passages(hits)
            message = (Message("tool", text, name="search") if self.protocol == "tool_call"
                       else Message(self.observation_role, f"<information>{text}</information>"))
        else:
            info["error"] = parsed.error
            message = Message(self.observation_role, parsed.text, name="search" if self.protocol == "tool_call" else None)
        truncated = self._turn >= self.max_turns
        self._done = truncated
        return [message], 0.0, False, truncated, info

    def close(self) -> None:
        self._task = None  # the searcher is shared by every env of this process; it is not closed here

    # -- snapshot contract -------------------------------------------------------
    def snapshot(self) -> Snapshot:
        state = (self._task, self._turn, self._done, tuple(self._cache.items()), tuple(self._log),
                 rng_state(self._np_random))
        return Snapshot(type(self).__name__, self.snapshot_mode, self._turn, freeze(state))

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.env_id != type(self).__name__:
            raise ValueError(f"snapshot from {snapshot.env_id!r} cannot restore a {type(self).__name__}")
        self._task, self._turn, self._done, cache, log, rng = thaw(snapshot.state)
        self._cache, self._log = dict(cache), list(log)
        self._np_random = rng_from_state(rng)

    # -- helpers -----------------------------------------------------------------
    @property
    def searcher(self) -> Any:
        """The shared searcher, loaded on the first search."""
        if self._searcher is None:
            self._searcher = resolve_searcher(self.searcher_spec, offline_seed=self.offline_seed,
                                              offline_scale=self.offline_scale)
        return self._searcher

    def _search(self, query: str) -> tuple:
        if query not in self._cache:
            hits = self.searcher.search([query], self.topk)[0]
            self._cache[query] = tuple((h.id, h.contents, h.score) for h in hits)
        self._log.append(query)
        return self._cache[query]

    @staticmethod
    def _golds(task: Task) -> list[str]:
        answer = task.answer
        golds = [answer] if isinstance(answer, str) else list(answer or [])
        return [str(g) for g in golds]

    def reference_actions(self, task: Task) -> list[str]:
        """A scripted trajectory for ``check_env``: search, a malformed turn, search, correct answer."""
        hops = list(task.metadata.get("hop_queries") or [task.prompt])
        gold = self._golds(task)[0]
        if self.protocol == "tool_call":
            def call(name: str, **args: str) -> str:
                import json

                return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"

            searches = [call("search", query=q) for q in hops]
            final = call("answer", answer=gold)
        else:
            searches = [f"<think>I need to look this up.</think><search> {q} </search>" for q in hops]
            final = f"<answer> {gold} </answer>"
        script = [searches[0], "I am not sure what to do.", *searches[1:], final]
        return script[: self.max_turns - 1] + [final] if len(script) > self.max_turns else script

    def _load(self, task_id: str) -> Task:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(f"unknown task id {task_id!r}")


def _task_from_row(row: Any) -> Task:
    from environments.wiki_qa.data import row_to_task

    if isinstance(row, Mapping) and "prompt" in row:  # a trace_gym Task dict
        return resolve_task(dict(row))
    return row_to_task(row, str(row.get("source") or "custom") if isinstance(row, Mapping) else "custom")
