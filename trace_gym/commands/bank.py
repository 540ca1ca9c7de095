"""``trace-gym bank record | close | stats | list``: rollout banks (``docs/banks.md``).

``record`` runs a real policy through the agent loop of training and writes a bank
(resumable: rerun the same command after a kill); ``close`` ends an interrupted recording at
the prompts it holds (a bank of fewer prompts than planned); ``stats`` prints a bank's calibration
numbers (prompt success rates, flip probability by depth, the learned predictor's
Spearman); ``list`` shows the shipped banks and any under a folder. ``bench --bank FILE``
replays strategies on a bank.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from trace_gym.commands import add_config_parser, command_config
from trace_gym.banks.config import BankRecordConfig

#: Where the shipped banks live (package data).
SHIPPED = Path(__file__).resolve().parents[1] / "banks" / "data"


class _DataFamily:
    """An env family whose prompts come from a training dataset (``data``)."""

    def __init__(self, family: Any, data: str, path: str | None):
        from environments.train_data import get_train_data

        self.family, self.data, self.path = family, data, path
        self.env_id, self.env_kwargs = family.env_id, family.env_kwargs
        self.loader_kwargs = {"data": get_train_data(data).description, "path": path}

    def make_env(self) -> Any:
        return self.family.make_env()

    def load_tasks(self, n: int, seed: int = 0) -> list:
        from environments.train_data import load_train_data

        return load_train_data(self.data, n, seed, self.path)


def resolve_record(cfg: BankRecordConfig) -> Any:
    """The env family (prompts from ``data`` when set) of a record config; loads no model."""
    from environments.train_data import get_train_data
    from trace_gym.registry import resolve_env

    family = resolve_env(cfg.env, cfg.env_kwargs, cfg.task_kwargs)
    if not cfg.data:
        return family
    get_train_data(cfg.data)  # an unknown name: one line, before anything loads
    return _DataFamily(family, cfg.data, cfg.data_path or None)


def dry_run(cfg: BankRecordConfig, family: Any) -> str:
    """What ``bank record`` would do, loading no model (and no remote data)."""
    from environments.train_data import get_train_data

    cap = cfg.max_prefixes_per_root or cfg.max_turns - 1
    per_prompt = cfg.roots * (1 + min(cfg.max_turns - 1, cap) * cfg.continuations)
    lines = [f"trace-gym bank record --dry-run: {cfg.out}",
             f"  policy: {cfg.policy} (engine {cfg.engine}{' ' + str(cfg.engine_kwargs) if cfg.engine_kwargs else ''}; "
             "not loaded)",
             f"  env: {cfg.env}: {family.env_id} {dict(family.env_kwargs)}",
             f"  prompts: {cfg.prompts} x {cfg.roots} roots, {cfg.continuations} continuations per recorded prefix "
             f"(cap {cfg.max_prefixes_per_root or 'none'} per root): at most {per_prompt} episodes per prompt, "
             f"{cfg.prompts * per_prompt:,} in all",
             f"  limits: {cfg.max_turns} turns x {cfg.max_turn_tokens} tokens, context {cfg.max_episode_tokens}, "
             f"temperature {cfg.temperature:g}, seed {cfg.seed}"]
    offline = not cfg.data or get_train_data(cfg.data).offline or bool(cfg.data_path)
    if offline:
        tasks = family.load_tasks(min(cfg.prompts, 4), seed=cfg.seed)
        lines.append(f"  prompts load: OK (first: {tasks[0].id if tasks else '-'})")
    else:
        lines.append(f"  prompts: {cfg.data} from the hub at record time (not fetched by --dry-run)")
    return "\n".join(lines)


def cmd_record(args: argparse.Namespace) -> int:
    from trace_gym.banks import record_bank
    from trace_gym.banks.writer import lock_bank, lock_path
    from trace_gym.engines import make_engine
    from trace_gym.models import quiet_third_party, resolve_model
    from trace_gym.runs.policies import with_policy
    from trace_gym.runs.files import release_lock
    from trace_gym.types import SamplingParams

    from trace_gym.runs.output_paths import check_config_outputs

    cfg = command_config(BankRecordConfig, args)
    check_config_outputs(cfg)  # out: a file path that can be written, before the policy loads
    cfg = with_policy(cfg)  # a bad policy: one line, before anything is written
    family = resolve_record(cfg)
    if args.dry_run:
        print(dry_run(cfg, family))
        return 0
    lock = lock_bank(cfg.out)  # a second recorder of this file: one line naming the first, before the model loads
    try:
        quiet_third_party()
        policy_path = resolve_model(cfg.policy)
        engine = make_engine(cfg.engine, policy_path, **cfg.engine_kwargs)
    except BaseException:
        release_lock(lock, lock_path(cfg.out), remove=True)
        raise
    try:
        summary = record_bank(
            cfg.out, engine=engine, family=family, prompts=cfg.prompts, roots=cfg.roots,
            continuations=cfg.continuations, max_prefixes_per_root=cfg.max_prefixes_per_root or None,
            sampling=SamplingParams(max_tokens=cfg.max_turn_tokens, temperature=cfg.temperature, seed=cfg.seed),
            agent_config=cfg.agent_config(),
            seed=cfg.seed, batch_prompts=cfg.batch_prompts, policy=cfg.policy, policy_path=str(policy_path),
            progress=cfg.progress, say=_say(cfg.progress), lock=lock)
    finally:
        engine.close()
        release_lock(lock, lock_path(cfg.out), remove=True)  # the writer released it already, unless it never began
    state = "complete" if summary["complete"] else "incomplete"
    rate = f", {summary['prompts_per_minute']:.1f} prompts/min" if summary.get("prompts_per_minute") else ""
    print(f"wrote {summary['path']}: {summary['prompts']} prompts ({summary['recorded']} recorded now, "
          f"{summary['skipped']} already there; {state}; {summary['seconds']:.0f} s{rate})")
    return 0


def _say(progress: bool) -> Any:
    """The recorder's notes on stderr: the resume notes always, the line per prompt written
    (prompts/min, ETA) only without the progress bar (which shows both)."""
    from tqdm.auto import tqdm

    def say(msg: str) -> None:
        if not (progress and msg.startswith("prompt ")):
            tqdm.write(msg, file=sys.stderr)

    return say


def cmd_close(args: argparse.Namespace) -> int:
    from trace_gym.banks import close_recording

    footer = close_recording(args.bank)
    print(f"closed {args.bank}: {footer['prompts']} of {footer.get('tasks', '?')} planned prompts; recorded in "
          f"{footer['seconds'] / 60:.0f} min over {footer['runs']} run(s); it replays now and can no longer be resumed")
    return 0


def cmd_stats(args: argparse.Namespace) -> int:
    from trace_gym.banks import bank_stats, format_bank_stats
    from trace_gym.runs.output_paths import check_output, write_output_text

    if args.json:
        check_output(args.json, "file", key="--json")
    path = bank_path(args.bank)
    stats = bank_stats(path, predictor=_learned_predictor(args.predictor, path))
    print(format_bank_stats(stats))
    if args.json:
        import json

        write_output_text(args.json, json.dumps(stats, indent=2, default=str), key="--json")
    return 0


def _learned_predictor(name: str, path: str) -> Any:
    """A fresh predictor of kind ``name`` for ``bank stats`` (an lm_critic reads the bank's policy)."""
    if not name or name == "none":
        return None
    from trace_gym.banks import read_header
    from trace_gym.bench.bank import policy_folder
    from trace_gym.predictor.kinds import PREDICTORS, check_predictor_name, make_predictor

    check_predictor_name(name, "text", key="--predictor")
    supplied = {"model_path": policy_folder(read_header(path)["manifest"])} if "model_path" in PREDICTORS[name].needs \
        else {}
    return make_predictor(name, seed=0, **supplied)


def bank_path(name: str) -> str:
    """A bank file, or the name of a shipped bank (``trace-gym bank list``)."""
    path = Path(name)
    if path.exists():
        return str(path)
    shipped = SHIPPED / (name if name.endswith(".jsonl.gz") else f"{name}.jsonl.gz")
    if shipped.exists():
        return str(shipped)
    known = sorted(p.name[: -len(".jsonl.gz")] for p in SHIPPED.glob("*.jsonl.gz"))
    raise ValueError(f"no bank file {name!r}, and no shipped bank of that name; shipped: {', '.join(known) or 'none'}")


def cmd_list(args: argparse.Namespace) -> int:
    from trace_gym.banks import list_banks
    from trace_gym.report import markdown_table

    rows, seen = [], set()
    for folder in [SHIPPED, *(Path(f) for f in args.folders)]:
        for b in list_banks(folder) if folder.exists() else []:
            resolved = Path(b["path"]).resolve()
            if resolved in seen:  # the shipped folder named again
                continue
            seen.add(resolved)
            recorded = "-" if b.get("seconds") is None else f"{b['seconds'] / 60:.0f} min ({b['runs']} run(s))"
            rows.append([Path(b["path"]).name, b.get("env_id", "?"), b.get("policy", "?"),
                         b.get("prompts", "?") if b.get("planned") is None else f"{b['prompts']} of {b['planned']}",
                         b.get("roots", "?"), b.get("continuations", "?"), b.get("complete", "?"),
                         f"{b.get('bytes', 0) / 1e6:.1f}", recorded, str(Path(b["path"]).parent)])
    if not rows:
        print("no banks found", file=sys.stderr)
        return 0
    print(markdown_table(["bank", "env", "policy", "prompts", "roots", "cont.", "complete", "MB", "recorded",
                          "folder"], rows))
    return 0


def add(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("bank", help="record, inspect and list rollout banks (bench --bank replays them)")
    sub = p.add_subparsers(dest="bank_command", required=True, metavar="{record,close,stats,list}")
    record = add_config_parser(sub, "record", "record a rollout bank from a real policy (resumable)",
                               BankRecordConfig, flags=True)
    record.add_argument("--dry-run", action="store_true", help="resolve the config, env and prompts; load no model")
    record.set_defaults(func=cmd_record)
    close = sub.add_parser("close", help="end an interrupted recording at the prompts it holds (writes the footer; "
                           "no resume after)")
    close.add_argument("bank", help="the bank file of the interrupted recording")
    close.set_defaults(func=cmd_close)
    stats = sub.add_parser("stats", help="a bank's calibration numbers (success rates, flips by depth, Spearman)")
    stats.add_argument("bank", help="a bank file or a shipped bank's name")
    stats.add_argument("--predictor", default="embedding", help="learned predictor whose Spearman is measured "
                       "(none: skip it)")
    stats.add_argument("--json", help="also write the numbers as JSON here")
    stats.set_defaults(func=cmd_stats)
    listing = sub.add_parser("list", help="the shipped banks (and those under FOLDER...)")
    listing.add_argument("folders", nargs="*", metavar="FOLDER")
    listing.set_defaults(func=cmd_list)
