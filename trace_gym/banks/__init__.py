"""Rollout banks: dense rollout trees recorded once from a real policy, replayed exactly.

A bank holds, per prompt, R root rollouts and, for each visited prefix of each root
(after each non-final turn, up to a per-root cap), K continuations, with the texts a
predictor reads and the exact costs of every turn. Replaying a bank runs any strategy's
decisions against recorded outcomes, in seconds: the third runner of the one step
driver, beside live rollouts and the simulator (``docs/banks.md``).

- :mod:`trace_gym.banks.format`: the file format (gzip'd JSON lines, versioned,
  checksummed, streamable), :class:`Bank` / :func:`open_bank`, :func:`iter_prompts`,
  :func:`list_banks`, over :mod:`trace_gym.banks.lines` (one line: a gzip member
  inflated and parsed within bounds) and :mod:`trace_gym.banks.schema` (every line
  checked field by field: the checksum catches accidents, not intent);
  :mod:`trace_gym.banks.writer`: :class:`BankWriter` (fsync'd lines, resume, a torn
  header started afresh), :func:`weights_hash`;
- :mod:`trace_gym.banks.record`: :func:`record_bank`, resumable, through the agent loop
  of training;
- :mod:`trace_gym.banks.replay`: :class:`BankBranchRunner` (draws without replacement,
  refuses what was not recorded: ``exhausted``) and :class:`BankOraclePredictor` (the
  bank's empirical rates, an upper bound);
- :mod:`trace_gym.banks.stats`: :func:`bank_stats`, the calibration numbers.

The bench adapter is :mod:`trace_gym.bench.bank` (``bench --bank``).

May import: ``agent``, ``budget``, ``config``, ``config_sections``, ``predictor``,
``report``, ``runs``, ``step``, ``tree``, ``types``, ``utils``.
"""

from trace_gym.banks.format import (FORMAT, VERSION, Bank, BankError, BankPrompt, iter_prompts, list_banks, open_bank,
                                    read_footer, read_header)
from trace_gym.banks.record import record_bank
from trace_gym.banks.writer import BankWriter, close_recording, weights_hash
from trace_gym.banks.replay import (EXHAUSTED, AnchoredContext, BankBranchRunner, BankDraws, BankOraclePredictor,
                                    BankTree)
from trace_gym.banks.stats import bank_stats, format_bank_stats, mixed_without_replacement, predictor_spearman

__all__ = ["FORMAT", "VERSION", "Bank", "BankError", "BankPrompt", "BankWriter", "close_recording", "iter_prompts", "list_banks",
           "open_bank", "read_footer", "read_header", "weights_hash", "record_bank", "EXHAUSTED", "AnchoredContext",
           "BankBranchRunner", "BankDraws", "BankOraclePredictor", "BankTree", "bank_stats", "format_bank_stats",
           "mixed_without_replacement", "predictor_spearman"]
