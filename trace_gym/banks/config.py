"""``trace-gym bank record``'s config: :class:`BankRecordConfig`.

Sections (:mod:`trace_gym.config_sections`): agent only (a bank's shape is R roots, K
continuations, not a budget). Each field is a YAML key, a ``key=value`` override and a
``--key`` flag; :mod:`trace_gym.config` loads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trace_gym.config import doc
from trace_gym.config_sections import AgentLimits, check_sections, section_default
from trace_gym.utils.config_fields import SEEDS


@dataclass(frozen=True)
class BankRecordConfig(AgentLimits):
    """``trace-gym bank record``: record a rollout bank from a real policy."""

    out: str = field(default="runs/bank.jsonl.gz", metadata=doc(
        "the bank file (.jsonl.gz); an existing one resumes", output="file"))
    env: str = field(default="math_python", metadata=doc("env family or registered env id (trace-gym envs)"))
    env_kwargs: dict = field(default_factory=dict, metadata=doc("extra env keyword arguments"))
    task_kwargs: dict = field(default_factory=dict, metadata=doc("extra task-loader keyword arguments"))
    data: str = field(default="", metadata=doc("prompts: empty for the env family's own tasks, else a training "
                                               "dataset name (e.g. deepscaler, hotpotqa, bfcl)"))
    data_path: str = field(default="", metadata=doc("local file or folder of `data` (empty: the hub)"))
    policy: str = field(default="smollm2-135m", metadata=doc("model name, local HF folder, hub id or RUN[@STEP]"))
    engine: str = field(default="auto", metadata=doc("rollout engine: auto | hf | vllm"))
    engine_kwargs: dict = field(default_factory=dict, metadata=doc("keyword arguments of the engine"))
    prompts: int = field(default=256, metadata=doc("P: prompts recorded", within="[1, 10000000]"))
    roots: int = field(default=8, metadata=doc(
        "R: root rollouts per prompt (>= 2: a group of one has no contrast)", within="[2, 100000]"))
    continuations: int = field(default=4, metadata=doc("K: continuations per recorded prefix", within="[0, 100000]"))
    max_prefixes_per_root: int = field(default=0, metadata=doc(
        "cap on the prefixes recorded per root, evenly spaced over its turns (0: every prefix)", within="[0, 100000]"))
    max_turn_tokens: int = section_default(AgentLimits, "max_turn_tokens", 96)
    seed: int = field(default=0, metadata=doc("task seed and base of the env and sampling seeds", within=SEEDS))
    batch_prompts: int = field(default=8, metadata=doc(
        "prompts in flight at once (memory: one batch)", within="[1, 100000]"))
    progress: bool = field(default=True, metadata=doc("progress bar with prompts/min and ETA (false: a line per "
                                                        "prompt written)"))

    def __post_init__(self) -> None:
        check_sections(self)
        if not self.out.endswith(".jsonl.gz"):
            raise ValueError(f"out must end with .jsonl.gz (a gzip'd JSON-lines bank), got {self.out!r}")
