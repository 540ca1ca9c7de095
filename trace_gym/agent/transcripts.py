"""Transcripts: finished rollout trees written out episode by episode (root to leaf).

The bench (``bench --env ... dump_episodes=N``) and the evaluators (``eval
dump_episodes=N``) both write these records, one JSON object per episode.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["transcripts"]


def transcripts(trees: Sequence[Any], limit: int) -> list[dict[str, Any]]:
    """Up to ``limit`` full episodes (root to leaf): prompt, each turn's action and
    observation messages, the reward, and how the episode ended."""
    out: list[dict[str, Any]] = []
    for tree in trees:
        for leaf in tree.leaves():
            if len(out) >= limit:
                return out
            turns = []
            for node_id in tree.path(leaf.id)[1:]:
                node = tree.nodes[node_id]
                turns.append({"action": node.text, "observation": node.info.get("observation", []),
                              **{k: node.info[k] for k in ("truncation", "error") if k in node.info}})
            out.append({"task_id": tree.task_id, "prompt": tree.nodes[0].text, "leaf": leaf.id,
                        "depth": leaf.depth, "reward": leaf.reward, "turns": turns})
    return out
