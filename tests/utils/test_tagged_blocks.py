"""``textsafe.tagged_blocks`` / ``first_tagged`` find what the lazy regexes they replace
found (a differential test on random text), and stay linear on unclosed openings."""

from __future__ import annotations

import random
import re

import pytest

from environments.bfcl.parsing import decode
from environments.wiki_qa.actions import parse_action
from trace_gym.utils.textsafe import first_tagged, tagged_blocks

PIECES = ["<answer>", "</answer>", "<search>", "</search>", "<tool_call>", "</tool_call>", "\n", "x", " ", "<", ">",
          "/", "</", "answer", "{}"]


def random_texts(n: int, seed: int = 0):
    rng = random.Random(seed)
    for _ in range(n):
        yield "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 25)))


def test_tagged_blocks_find_what_the_lazy_regex_finds():
    for open_tag, close_tag in (("<tool_call>", "</tool_call>"), ("<tool_call>\n", "\n</tool_call>"), ("<a>", "<a>")):
        regex = re.compile(re.escape(open_tag) + "(.*?)" + re.escape(close_tag), re.DOTALL)
        for text in random_texts(3000):
            text = text.replace("<answer>", "<a>")
            assert [(m.start(), m.group(1)) for m in regex.finditer(text)] == list(
                tagged_blocks(text, open_tag, close_tag)), text


def test_first_tagged_finds_what_the_alternation_regex_finds():
    regex = re.compile(r"<(search|answer)>(.*?)</\1>", re.DOTALL)
    for text in random_texts(3000, seed=1):
        m = regex.search(text)
        assert first_tagged(text, ("search", "answer")) == (None if m is None else (m.group(1), m.group(2))), text


@pytest.mark.timeout(30)  # each took 1.5-2.2 s with the regexes; a run of them at the action cap is now linear
def test_unclosed_openings_at_the_action_cap_parse_quickly():
    for _ in range(10):
        assert parse_action("<answer>" * 8192).error == "no_action"
        assert parse_action("<tool_call>" * 5957, "tool_call").error == "no_action"
        assert not decode("<tool_call>\n" * 5461, "tool_call").has_calls
