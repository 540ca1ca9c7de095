"""Chat-template token deltas for the token-in-token-out agent loop.

:class:`ChatRenderer` turns env messages into the token ids the loop appends to an
episode: the first prompt, each observation's *delta* after the history, and the
template tokens that close an assistant message. It fails loudly
(:class:`TemplateError`) when a template is not append-only for a turn.
"""

from __future__ import annotations

from typing import Any, Sequence

from trace_gym.types import Message


class TemplateError(RuntimeError):
    """The chat template is not append-only for this turn."""


class ChatRenderer:
    """Renders env messages to token ids with a tokenizer's chat template.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template.
        end_of_turn: the token that ends an assistant message (default: the
            tokenizer's eos token).
    """

    def __init__(self, tokenizer: Any, end_of_turn: str | None = None):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has no chat template")
        self.tokenizer = tokenizer
        eot = end_of_turn or tokenizer.eos_token
        self.end_of_turn_id: int = tokenizer.convert_tokens_to_ids(eot)
        if self.end_of_turn_id is None or self.end_of_turn_id == tokenizer.unk_token_id:
            raise ValueError(f"end-of-turn token {eot!r} is not in the vocabulary")
        self.closing_ids: tuple[int, ...] = self._closing_ids()
        # The fast delta (see observation) needs a tokeniser that splits text at the end-of-turn
        # token: an added token (HF tokenisers match added tokens before the model's own
        # pre-tokenisation and merges), checked on a sample.
        added = getattr(tokenizer, "added_tokens_decoder", None) or {}
        self._eot_text: str = getattr(added.get(self.end_of_turn_id), "content", eot)
        self._eot_splits = self.end_of_turn_id in added and self._encode(f"x{self._eot_text}x") == [
            *self._encode("x"), self.end_of_turn_id, *self._encode("x")]

    def render(self, messages: Sequence[dict], *, generation_prompt: bool, tools: list | None = None) -> list[int]:
        """Token ids of ``messages`` through the chat template (the whole conversation)."""
        return self._encode(self._text(messages, generation_prompt, tools))

    def _text(self, messages: Sequence[dict], generation_prompt: bool, tools: list | None) -> str:
        return self.tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=generation_prompt,
                                                  tokenize=False)

    def _encode(self, text: str) -> list[int]:
        # what apply_chat_template(tokenize=True) does: the rendered text, no special tokens added
        return [int(t) for t in self.tokenizer(text, add_special_tokens=False)["input_ids"]]

    def _closing_ids(self) -> tuple[int, ...]:
        """Template tokens from the end-of-turn token to the end of an assistant message."""
        base = [{"role": "user", "content": "ping"}, {"role": "assistant", "content": "pong"}]
        ids = self.render(base, generation_prompt=False)
        positions = [i for i, t in enumerate(ids) if t == self.end_of_turn_id]
        if not positions:
            raise TemplateError("the chat template does not end assistant messages with the end-of-turn token")
        return tuple(ids[positions[-1]:])

    def prompt(self, messages: Sequence[Message], tools: list | None = None) -> list[int]:
        """Token ids of the first observation plus the generation prompt."""
        return self.render([m.to_dict() for m in messages], generation_prompt=True, tools=tools)

    def observation(self, history: Sequence[Message], new: Sequence[Message], tools: list | None = None) -> list[int]:
        """The template delta that appends ``new`` after ``history`` (which ends with
        the assistant's message) and opens the next assistant turn.

        Both conversations are rendered as text (cheap). When the longer one extends the
        shorter, only the new text is tokenised, together with the history's last
        end-of-turn token: when that token is an added token the tokeniser splits on, the
        text after it tokenises the same alone as in the whole conversation, and the delta
        is exact at O(new text) cost instead of tokenising the history twice per turn.
        Otherwise (text not append-only, or the check on the window fails) both
        conversations are tokenised whole, and tokens of the history that change raise
        :class:`TemplateError`.
        """
        hist = [m.to_dict() for m in history]
        before = self._text(hist, False, tools)
        after = self._text([*hist, *(m.to_dict() for m in new)], True, tools)
        if self._eot_splits and after.startswith(before):
            cut = before.rfind(self._eot_text)
            if cut >= 0:
                window = self._encode(before[cut:])
                joined = self._encode(before[cut:] + after[len(before):])
                if window and window[0] == self.end_of_turn_id and joined[:len(window)] == window:
                    return joined[len(window):]
        full_before, full_after = self._encode(before), self._encode(after)
        if full_after[: len(full_before)] != full_before:
            at = next((i for i, (x, y) in enumerate(zip(full_before, full_after)) if x != y),
                      min(len(full_before), len(full_after)))
            raise TemplateError(
                f"chat template is not append-only: adding {len(new)} message(s) changed token {at} of the history "
                f"({self.tokenizer.decode(full_before[at:at + 8])!r} -> {self.tokenizer.decode(full_after[at:at + 8])!r})")
        return full_after[len(full_before):]

    def closing(self, action_ids: Sequence[int]) -> list[int]:
        """Tokens that close an assistant message after the model's ``action_ids``."""
        if action_ids and action_ids[-1] == self.end_of_turn_id:
            return list(self.closing_ids[1:])
        return list(self.closing_ids)
