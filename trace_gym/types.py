"""Small frozen value types shared by every part of trace_gym.

Everything here is plain data: JSON-friendly, picklable, immutable. Nothing imports
a backend.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping

#: Roles a :class:`Message` may carry (the OpenAI / HF chat-template vocabulary).
ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Message:
    """One chat message.

    Attributes:
        role: one of :data:`ROLES`.
        content: the text of the message (may be empty, never ``None``).
        name: optional tool / function name for ``role == "tool"`` messages.
        tool_call_id: optional id linking a tool result to the call that produced it.
    """

    role: str
    content: str
    name: str | None = None
    tool_call_id: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"Message.role must be one of {ROLES}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise TypeError(
                f"Message.content must be str, got {type(self.content).__name__}: {self.content!r:.80}"
            )

    def to_dict(self) -> dict[str, Any]:
        """The chat-template dict form (``{"role", "content"}`` plus optional keys)."""
        d: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.name is not None:
            d["name"] = self.name
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Message":
        unknown = set(d) - {"role", "content", "name", "tool_call_id"}
        if unknown:
            raise ValueError(f"Message dict has unknown keys {sorted(unknown)}: {dict(d)!r:.200}")
        return cls(d["role"], d.get("content") or "", d.get("name"), d.get("tool_call_id"))


def _freeze(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class Task:
    """One task (prompt) an environment can be reset to.

    Attributes:
        id: unique, stable identifier within its source (e.g. ``"aime24/7"``,
            ``"multi_turn_base_0"``).
        prompt: the task statement shown to the model (the first user message's
            content before any env-specific framing).
        answer: gold answer(s), JSON-serialisable; its meaning belongs to the env
            family (a LaTeX string, a list of aliases, a ground-truth call list...).
        source: dataset / family name (``"deepscaler"``, ``"hotpotqa"``, ``"bfcl"``).
        metadata: read-only extra fields the env needs (difficulty, initial config...).
    """

    id: str
    prompt: str
    answer: Any = None
    source: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise ValueError(f"Task.id must be a non-empty str, got {self.id!r}")
        if not isinstance(self.prompt, str):
            raise TypeError(f"Task.prompt must be str, got {type(self.prompt).__name__}")
        object.__setattr__(self, "metadata", _freeze(self.metadata))

    def __hash__(self) -> int:  # tasks are keyed by id
        return hash((self.source, self.id))

    def __reduce__(self):  # MappingProxyType does not pickle; rebuild from a dict
        return (_task_from_fields, (self.id, self.prompt, self.answer, self.source, dict(self.metadata)))

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "prompt": self.prompt,
            "answer": self.answer,
            "source": self.source,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Task":
        """Build from ``{"id", "prompt" | "question", "answer", "source", "metadata"}``."""
        if "id" not in d:
            raise ValueError(f"task dict needs an 'id', got keys {sorted(d)}")
        prompt = d.get("prompt", d.get("question"))
        if prompt is None:
            raise ValueError(f"task {d['id']!r} needs a 'prompt' or 'question'")
        return cls(
            id=str(d["id"]),
            prompt=prompt,
            answer=d.get("answer"),
            source=d.get("source", ""),
            metadata=d.get("metadata") or {},
        )


def _task_from_fields(id, prompt, answer, source, metadata) -> Task:  # noqa: A002
    return Task(id=id, prompt=prompt, answer=answer, source=source, metadata=metadata)


@dataclass(frozen=True)
class Completion:
    """One sampled continuation from a rollout engine.

    Attributes:
        token_ids: generated token ids (the prefix is not included).
        logprobs: per-token log-probability under the sampling distribution, in nats,
            same length as ``token_ids``.
        finish_reason: ``"stop"`` (stop token / string), ``"length"`` (hit max tokens)
            or ``"abort"``.
        cached_tokens: how many prefix tokens the backend served from its cache, or
            ``None`` when the backend does not report it.
        text: the decoded text, when the engine decoded it.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    cached_tokens: int | None = None
    text: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(int(t) for t in self.token_ids))
        object.__setattr__(self, "logprobs", tuple(float(x) for x in self.logprobs))
        if len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"Completion has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs"
            )


@dataclass(frozen=True)
class SamplingParams:
    """Backend-neutral sampling settings.

    Attributes:
        max_tokens: generated tokens per completion (upper bound).
        temperature: softmax temperature; 0 means greedy.
        top_p: nucleus mass in (0, 1].
        top_k: keep the k most likely tokens; -1 disables.
        stop: strings that end a completion (kept in the output, like vLLM's
            ``include_stop_str_in_output=True``).
        stop_token_ids: token ids that end a completion (kept in the output).
        seed: optional base seed for reproducible sampling.
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))


def env_seed(base: int, prompt: int, rollout: int) -> int:
    """The env seed of rollout ``rollout`` (from 0) of prompt ``prompt`` (its index in the
    step, the suite or the bank) under base seed ``base``: ``base + 1000 * prompt + rollout``,
    the one rule of training, the bench, evaluation and the bank recorder (a prompt's
    rollouts get distinct seeds while it has fewer than 1000)."""
    return int(base) + 1000 * int(prompt) + int(rollout)
