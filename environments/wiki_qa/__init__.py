"""WikiQA: multi-hop question answering with a search engine (Search-R1's setting).

``WikiQAEnv`` (``trace_gym/WikiQA-v0``) in :mod:`.env`; EM/F1 in :mod:`.metrics`; FlashRAG
loaders and the SYNTHETIC offline question set in :mod:`.data`; searcher specs in
:mod:`.searchers`. See ``docs/environments/wiki_qa.md``.
"""

from environments.wiki_qa.data import DATASETS, load_tasks, offline_tasks
from environments.wiki_qa.env import WikiQAEnv
from environments.wiki_qa.metrics import best_exact_match, best_f1, exact_match, f1_score, normalize_answer

__all__ = ["DATASETS", "WikiQAEnv", "best_exact_match", "best_f1", "exact_match", "f1_score", "load_tasks",
           "normalize_answer", "offline_tasks"]
