"""CPU thread ownership (trace_gym.utils.threads): each component runs on its own count and
gives the previous one back, also past vLLM's no-op ``torch.set_num_threads``."""

from __future__ import annotations

import pytest
import torch

from trace_gym.utils.threads import default_threads, resolve_threads, torch_threads


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield before
    torch._C.set_num_threads(before)


def test_torch_threads_sets_and_restores_even_on_an_exception(restore_threads):
    torch._C.set_num_threads(1)
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1
    with pytest.raises(RuntimeError), torch_threads(2):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 1
    with torch_threads(None):  # None: leave the count alone
        assert torch.get_num_threads() == 1


def test_torch_threads_works_after_vllm_replaced_the_setter(monkeypatch, restore_threads):
    """vLLM's CPU worker replaces torch.set_num_threads with a warning no-op."""
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    torch._C.set_num_threads(1)
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1


def test_default_threads_follow_omp_num_threads_else_the_cores(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert default_threads() == 1 == resolve_threads(0) == resolve_threads(None)
    monkeypatch.delenv("OMP_NUM_THREADS")
    import os

    assert default_threads() == len(os.sched_getaffinity(0))
    assert resolve_threads(3) == 3
    for bad in (-1, 1.5):
        with pytest.raises(ValueError, match="positive integer"):
            resolve_threads(bad, "trainer.cpu_threads")


def test_the_update_runs_on_the_trainers_count_and_gives_the_engines_back(tiny_model_path, restore_threads):  # noqa: F811
    from trace_gym.train.advantages import treerpo
    from trace_gym.train.batches import token_tree
    from trace_gym.train.trainer import PolicyTrainer, TrainerConfig
    from trace_gym.tree import ROOT, RolloutTree

    trainer = PolicyTrainer(tiny_model_path, TrainerConfig(cpu_threads=2), device="cpu")
    seen = []
    inner = trainer._step
    trainer._step = lambda trees: (seen.append(torch.get_num_threads()), inner(trees))[1]
    tree = RolloutTree("t", [5, 6, 7])
    for reward in (0.0, 1.0):
        tree.add_turn(ROOT, branch=tree.start_branch(ROOT), policy_token_ids=[8, 9], observation_token_ids=[],
                      logprobs=[-1.0, -1.0], reward=reward, terminal=True)
    torch._C.set_num_threads(1)  # a 1-thread serving engine's count
    out = trainer.step([token_tree(tree, treerpo(tree))])
    assert seen == [2] and torch.get_num_threads() == 1 and out["trained_tokens"] > 0 and out["seconds"] > 0
    with pytest.raises(ValueError, match="trainer.cpu_threads"):
        TrainerConfig(cpu_threads=-2)


# ------------------------------------------------------------------ the process budget
from trace_gym.utils import threads as T  # noqa: E402


def test_cgroup_quotas_parse_to_cores():
    assert T.parse_cpu_max("max 100000\n") is None
    assert T.parse_cpu_max("150000 100000\n") == 1.5
    assert T.parse_cpu_max("200000") == 2.0  # period defaults to 100 ms
    assert T.parse_cpu_max("") is None and T.parse_cpu_max("junk 1") is None
    assert T.parse_cfs_quota("-1\n", "100000\n") is None
    assert T.parse_cfs_quota("50000", "100000") == 0.5
    assert T.parse_cfs_quota("x", "100000") is None


def test_cpu_quota_reads_v2_then_v1(tmp_path):
    assert T.cpu_quota(str(tmp_path)) is None
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("300000\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert T.cpu_quota(str(tmp_path)) == 3.0
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert T.cpu_quota(str(tmp_path)) == 1.0


def test_budget_follows_cores_quota_and_the_others_load():
    assert T.thread_budget(2, None, 0.0) == 2  # idle box: every core
    assert T.thread_budget(2, None, 0.4) == 2
    assert T.thread_budget(2, None, 0.6) == 1  # a neighbour on about one core
    assert T.thread_budget(2, None, 2.0) == 1  # a busy neighbour on both: still one, never zero
    assert T.thread_budget(2, None, 7.5) == 1
    assert T.thread_budget(16, 4.0, 1.0) == 3  # the quota caps before the load is taken off
    assert T.thread_budget(16, 0.5, 0.0) == 1  # a fractional quota still runs one
    assert T.thread_budget(16, 2.9, 0.0) == 2


def test_own_share_is_taken_off_the_load_and_the_sample_wins_where_there_is_one():
    # a process that ran one busy thread for its whole minute made ~0.63 of the 1-min average
    share = T.own_load_share(cpu_seconds=60.0, age_seconds=60.0)
    assert share == pytest.approx(1 - __import__("math").exp(-1))
    assert T.own_load_share(0.0, 0.0) == 0.0
    assert T.own_load_share(1.0, 1.0) < 0.02  # a fresh process is hardly in the average yet
    assert T.others_load(2.0, share, None, 0.0) == pytest.approx(2.0 - share)
    assert T.others_load(0.1, 0.0, 1.8, 0.0) == pytest.approx(1.8)  # a neighbour that just started
    assert T.others_load(0.1, 0.0, 1.8, 0.9) == pytest.approx(0.9)  # our own busy core is not the others'
    assert T.others_load(None, 0.0, None, 0.0) == 0.0
    # a neighbour that just ended: the load average still counts it, the sample does not
    assert T.others_load(1.5, 0.0, 0.05, 0.0) == pytest.approx(0.05)
    assert T.thread_budget(2, None, T.others_load(1.5, 0.0, 0.05, 0.0)) == 2


def test_busy_cores_from_proc_stat_samples():
    before = [[100, 0, 50, 1000, 10, 0, 0, 0], [0, 0, 0, 1000, 0, 0, 0, 0]]
    after = [[175, 0, 75, 1000, 10, 0, 0, 0], [10, 0, 0, 1090, 0, 0, 0, 0]]  # cpu0 all busy, cpu1 10 %
    assert T.busy_cores(before, after) == pytest.approx(1.1)
    assert T.busy_cores(before, before) == 0.0


def test_overrides_win_and_a_shared_machine_gets_passive_waiting(monkeypatch):
    monkeypatch.setattr(T, "available_cores", lambda: 4)
    env = {"TRACE_GYM_THREADS": "3", "OMP_NUM_THREADS": "1"}
    d = T.apply_thread_policy(env)
    assert (d.threads, d.source) == (3, "TRACE_GYM_THREADS") and env["OMP_NUM_THREADS"] == "3"
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"  # 3 of 4 cores: shared
    env = {"TRACE_GYM_THREADS": "4"}
    T.apply_thread_policy(env)
    assert "OMP_WAIT_POLICY" not in env  # every core ours: OpenMP's default (passive waits slow it idle)
    assert T.wait_policy(1, 2) == "PASSIVE" and T.wait_policy(2, 2) is None
    env = {"OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "ACTIVE"}  # the user's word stays
    d = T.apply_thread_policy(env)
    assert (d.threads, d.source, env["OMP_NUM_THREADS"], env["OMP_WAIT_POLICY"]) == (1, "OMP_NUM_THREADS", "1",
                                                                                     "ACTIVE")
    env = {}
    d = T.apply_thread_policy(env)  # measured on this machine: within [1, cores], and written for OpenMP
    assert d.source == "measured" and 1 <= d.threads <= T.available_cores() and d.others >= 0
    assert env["OMP_NUM_THREADS"] == str(d.threads) and "thread(s) of" in d.describe()


# ------------------------------------------------------------------ issue 44 E: overrides read strictly
#: (the environment, the threads decided, its source, a piece of the one warning or None)
OVERRIDES = {
    "superscript_two": ({"TRACE_GYM_THREADS": "²", "OMP_NUM_THREADS": "1"}, 1, "OMP_NUM_THREADS",
                        "$TRACE_GYM_THREADS='²' is not a whole number of threads >= 1"),
    "superscript_three": ({"OMP_NUM_THREADS": "³"}, None, "measured", "$OMP_NUM_THREADS='³' is not a whole"),
    "arabic_indic_three": ({"TRACE_GYM_THREADS": "٣"}, None, "measured", "$TRACE_GYM_THREADS='٣' is not"),
    "ten_to_the_twenty": ({"TRACE_GYM_THREADS": "1" + "0" * 20}, 1024, "TRACE_GYM_THREADS",
                          "asks for more than 1024 threads; capped at 1024"),
    "five_thousand_digits": ({"OMP_NUM_THREADS": "9" * 5000}, 1024, "OMP_NUM_THREADS", "capped at"),
    "openmp_list": ({"OMP_NUM_THREADS": "2,1"}, 2, "OMP_NUM_THREADS", None),
    "a_list_is_not_ours": ({"TRACE_GYM_THREADS": "2,1", "OMP_NUM_THREADS": "3"}, 3, "OMP_NUM_THREADS",
                           "$TRACE_GYM_THREADS='2,1' is not a whole number"),
}


@pytest.mark.parametrize("case", OVERRIDES)
def test_a_thread_override_is_read_strictly_never_a_crash(monkeypatch, caplog, case):
    """``isdigit`` took ``²`` and ``int`` refused it: every command died at start-up. Now a
    bad value is one warning and passed over, a huge one capped, an OpenMP list kept."""
    given, threads, source, warning = OVERRIDES[case]
    monkeypatch.setattr(T, "available_cores", lambda: 4)
    env = dict(given)
    with caplog.at_level("WARNING", logger="trace_gym.utils.threads"):
        decision = T.apply_thread_policy(env)
    assert decision.source == source and (threads is None or decision.threads == threads)
    assert 1 <= decision.threads <= 1024 == T.MAX_THREADS  # the documented cap
    said = [r.getMessage() for r in caplog.records if r.name == "trace_gym.utils.threads"]
    assert (said == []) if warning is None else (len(said) == 1 and warning in said[0]), said
    if case == "openmp_list":
        assert env["OMP_NUM_THREADS"] == "2,1"  # the user's valid list, not overwritten
    else:  # what OpenMP reads is a count it accepts: the user's, or the decided one
        assert T.thread_override("OMP_NUM_THREADS", env["OMP_NUM_THREADS"]) == (decision.threads, None)


#: planted /proc files: name -> (stat, self/stat, uptime); None leaves the file out
GARBLED_PROC = {
    "letters_in_a_counter": ("cpu  1 2 3 4\ncpu0 12 x 3 4 5 6 7 8\n", None, None),
    "an_empty_and_a_bare_line": ("\n\ncpu0\ncpu\n", None, None),
    "self_stat_cut_short": (None, "123 (python) S 1 2", "100.0 50.0\n"),
    "self_stat_garbage": (None, "garbage", "100.0 50.0\n"),
    "uptime_not_a_number": (None, "1 (p) " + "0 " * 30, "abc def\n"),
    "uptime_nan": (None, "1 (p) " + "0 " * 30, "nan nan\n"),
    "uptime_empty": (None, "1 (p) " + "0 " * 30, ""),
    "not_text": (b"\xff\xfe cpu0 1 2\n", b"\x80\x81", b"\xff"),
}


@pytest.mark.parametrize("case", GARBLED_PROC)
def test_a_garbled_proc_file_means_unknown(tmp_path, case):
    stat, self_stat, uptime = GARBLED_PROC[case]
    (tmp_path / "self").mkdir()
    for name, text in (("stat", stat), ("self/stat", self_stat), ("uptime", uptime)):
        if text is not None:
            (tmp_path / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    cpus = {0, 1}
    if stat is not None:
        assert T.read_cpu_lines(cpus, str(tmp_path)) is None
    if uptime is not None:
        assert T.read_process_age(str(tmp_path)) is None
    decision = T.decide_threads({}, sample_seconds=0.0, proc=str(tmp_path))
    assert decision.source == "measured" and 1 <= decision.threads <= T.available_cores()


def test_well_formed_proc_text_still_parses():
    assert T.parse_cpu_lines("cpu  9 9 9 9\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 1 1 1\nintr 5\n", {0, 1}) == [
        [1, 2, 3, 4, 5, 6, 7, 8], [1, 1, 1, 1, 0, 0, 0, 0]]
    stat = "42 (a) b) S " + " ".join(str(i) for i in range(1, 30))  # a command name holding ") "
    # field 22 (start time) is the 20th after the last ")" (field 3, the state, is the 1st): 19 ticks of 100 a second
    assert T.parse_process_age(stat, "12.5 3.0\n", 100.0) == pytest.approx(12.5 - 0.19)
