"""The one parser: every command comes from it, and every command takes ``--config FILE``
and ``key=value`` (config fields for config commands, flag names for the others)."""

from __future__ import annotations

import argparse

import pytest

from trace_gym import cli

COMMANDS = {"train", "eval", "compare", "bench", "bank", "check-env", "index", "envs", "strategies", "estimators",
            "predictors", "models"}


def leaf(parser, *path):
    for name in path:
        parser = cli._subparsers(parser).choices[name]
    return parser


def test_every_command_comes_from_one_parser_and_takes_config():
    parser = cli.build_parser()
    assert set(cli._subparsers(parser).choices) == COMMANDS
    for p in cli._leaves(parser):
        assert "--config" in p._option_string_actions, p.prog
    text = parser.format_help()
    assert "evaluators" not in text and "trace_gym." not in text  # no module paths for users


def test_key_value_tokens_are_split_from_option_values():
    parser = cli.build_parser()
    rest, overrides, p = cli.split_overrides(parser, ["train", "--ray", "steps=2", "trainer.lr=1e-5", "--dry-run"])
    assert rest == ["train", "--ray", "--dry-run"] and overrides == {"steps": "2", "trainer.lr": "1e-5"}
    assert p is leaf(parser, "train")
    # the value of an option that takes one stays its value, even when it holds "="
    rest, overrides, p = cli.split_overrides(parser, ["compare", "runs/a", "--out", "x=y", "out_dir=1"])
    assert rest == ["compare", "runs/a", "--out", "x=y"] and overrides == {"out_dir": "1"}


def test_flag_commands_take_yaml_and_key_value_with_the_line_winning(tmp_path):
    parser = cli.build_parser()
    cfg = tmp_path / "compare.yaml"
    cfg.write_text("out: from-yaml\n")
    p = leaf(parser, "compare")
    assert cli.flag_tokens(p, ["compare", "a", "--config", str(cfg)], {}) == ["--out", "from-yaml"]
    assert cli.flag_tokens(p, ["compare", "a", "--config", str(cfg)], {"out": "kv"}) == ["--out", "kv"]
    assert cli.flag_tokens(p, ["compare", "a", "--out", "line", "--config", str(cfg)], {"out": "kv"}) == []
    build = leaf(parser, "index", "build")
    tokens = cli.flag_tokens(build, ["index", "build"], {"synthetic": "true", "overwrite": "false", "recall": "3"})
    args = parser.parse_args(["index", "build", *tokens])
    assert args.synthetic is True and args.overwrite is False and args.recall == 3
    with pytest.raises(ValueError, match=r"unknown key 'ot' for `trace-gym compare`; did you mean out\?"):
        cli.flag_tokens(p, ["compare", "a"], {"ot": "x"})
    with pytest.raises(ValueError, match="synthetic: expected a bool"):
        cli.flag_tokens(build, ["index", "build"], {"synthetic": "maybe"})


def test_bad_keys_are_one_line_errors_for_every_kind_of_command(capsys, tmp_path):
    assert cli.main(["strategies", "colour=red"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key 'colour'" in err[0]
    assert cli.main(["bench", "--sim", "sedes=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown key 'sedes'" in err[0] and "did you mean seeds" in err[0]
    assert cli.main(["bench", "--sim", "warmup_budget=4"]) == 2
    assert "warmup_budget= does not apply to --sim (only to --env)" in capsys.readouterr().err
    assert cli.main(["train", "--dry-run", "stpes=3"]) == 2
    err = capsys.readouterr().err
    assert "command line: unknown key(s) ['stpes']" in err and "did you mean steps" in err


def test_config_commands_take_key_value_and_flag_aliases(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert cli.main(["bench", "--sim", "seeds=1", "steps=2", "pool_size=256", "candidates=64", "root_budget=64",
                     "strategies=uniform", "--json", str(out)]) == 0
    import json

    data = json.loads(out.read_text())
    assert data["config"]["seeds"] == 1 and data["config"]["root_budget"] == 64
    assert list(data["strategies"]) == ["uniform"]


def test_every_config_command_takes_each_key_as_a_flag_sections_included():
    """One key space, two spellings: ``--root-budget 6`` = ``root_budget=6``, ``--trainer.lr`` =
    ``trainer.lr=``, for train, eval, bench and bank record alike (generated from the config)."""
    from trace_gym.commands import command_config
    from trace_gym.banks.config import BankRecordConfig
    from trace_gym.train.config import TrainConfig

    parser = cli.build_parser()
    args = parser.parse_args(["train", "--root-budget", "6", "--trainer.lr", "3e-6", "--max-turns", "2"])
    cfg = command_config(TrainConfig, args)
    assert (cfg.root_budget, cfg.trainer.lr, cfg.max_turns) == (6, 3e-6, 2)
    args = parser.parse_args(["bank", "record", "--prompts", "3", "--max-turn-tokens", "12"])
    cfg = command_config(BankRecordConfig, args)
    assert (cfg.prompts, cfg.max_turn_tokens) == (3, 12)
    for command in (["train"], ["eval"], ["bench"], ["bank", "record"]):
        flags = {o for a in leaf(parser, *command)._actions for o in a.option_strings}
        assert {"--seed", "--config"} <= flags, command


def test_listings(capsys):
    assert cli.main(["estimators"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in ("grpo", "treerpo", "tree_grpo"))
    assert cli.main(["predictors"]) == 0
    printed = capsys.readouterr().out
    assert "embedding" in printed and "oracle" in printed and "the simulator" in printed


def test_help_of_config_commands_lists_keys_from_the_dataclasses():
    parser = cli.build_parser()
    train = leaf(parser, "train").format_help()
    assert "trainer.lr (float" in train and "advantage estimators" in train and "treerpo:" in train
    assert "data_dir (str" in leaf(parser, "eval").format_help()
    assert isinstance(leaf(parser, "bench"), argparse.ArgumentParser)
    assert "root_budget (int" in leaf(parser, "bench").format_help()


def _leaf_paths(parser, path):
    """(command path, parser) of every leaf below ``parser``, by each subcommand's own name."""
    sub = cli._subparsers(parser)
    if sub is None:
        return [(path, parser)]
    out = []
    for action in sub._choices_actions:  # one per subcommand (aliases share it)
        out += _leaf_paths(sub.choices[action.dest], [*path, action.dest])
    return out


def test_every_leafs_help_names_its_full_command_path():
    leaves = _leaf_paths(cli.build_parser(), ["trace-gym"])
    assert len(leaves) == len(cli._leaves(cli.build_parser())) >= len(COMMANDS)
    assert ["trace-gym", "bank", "record"] in [p for p, _ in leaves]
    for path, parser in leaves:
        full = " ".join(path)
        assert parser.prog == full
        usage = parser.format_usage()
        assert usage.startswith(f"usage: {full} ") or usage.strip() == f"usage: {full}", (full, usage)
        assert parser.format_help().startswith(f"usage: {full}")


BANK_CONFIGS = sorted((__import__("pathlib").Path(__file__).resolve().parents[2] / "configs" / "banks").glob("*.yaml"))


@pytest.mark.parametrize("path", BANK_CONFIGS, ids=lambda p: p.name)
def test_bank_record_configs_dry_run(path, capsys, tmp_path):
    """The shipped CPU bank configs and the paper-scale GPU ones resolve (env, prompts,
    limits) without loading a model."""
    assert cli.main(["bank", "record", "--config", str(path), "--dry-run", f"out={tmp_path / 'b.jsonl.gz'}"]) == 0
    printed = capsys.readouterr().out
    assert "bank record --dry-run" in printed and "episodes per prompt" in printed


def test_bank_record_refuses_bad_settings(capsys):
    assert cli.main(["bank", "record", "--dry-run", "roots=1"]) == 2
    assert "roots: expected an int in [2, 100000], got 1" in capsys.readouterr().err
    assert cli.main(["bank", "record", "--dry-run", "out=x.json"]) == 2
    assert "must end with .jsonl.gz" in capsys.readouterr().err
    assert cli.main(["bank", "stats", "no-such-bank"]) == 2
    assert "no bank file 'no-such-bank'" in capsys.readouterr().err


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`trace-gym bank list | head -1`: the closed pipe is the reader's choice, not an error
    (exit 141 as `ls | head`, no traceback). The reader is gone before the command writes (it
    waits for its stdin to close), so the order is fixed."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read(); from trace_gym.cli import main; "
                             "sys.exit(main())", "bank", "list"], stdin=subprocess.PIPE, stdout=write,
                            stderr=subprocess.PIPE, text=True)
    os.close(write)
    os.close(read)  # the reader leaves before a byte is written
    _, err = proc.communicate("", timeout=120)
    assert proc.returncode == 141 and "Traceback" not in err, (proc.returncode, err[-2000:])
