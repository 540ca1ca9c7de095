"""The zygote's sweep of dead zygotes' cgroups is best effort and never raises.

A zygote starting while another exits once lost its CPU cgroup: the exiting one's
cmdline was already empty (so it looked dead), the sweep listed its group, the owner
removed the group, and the sweep's listing of it raised ``FileNotFoundError`` out of
the new zygote's set-up (CI: "NOT active ([Errno 2] ... trace_gym_16288)"). Planted
here on plain directories, which the sweep treats like a cgroup tree.
"""

import os

from environments.math_python._kernel import cgroups
from environments.math_python._kernel.cgroups import _sweep

DEAD = 2**22 + 7  # above any pid_max: never a live zygote


def test_a_dead_zygotes_group_and_its_kernels_groups_are_removed(tmp_path):
    group = tmp_path / f"trace_gym_{DEAD}"
    (group / "k1").mkdir(parents=True)
    (group / "k2").mkdir()
    (tmp_path / "other").mkdir()
    _sweep(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["other"]


def test_a_group_removed_by_its_owner_while_it_is_swept_is_skipped(tmp_path, monkeypatch):
    vanishing, kept = tmp_path / f"trace_gym_{DEAD}", tmp_path / f"trace_gym_{DEAD + 1}"
    (vanishing / "k1").mkdir(parents=True)
    (kept / "k1").mkdir(parents=True)
    real_listdir = os.listdir

    def racing_listdir(path):
        names = real_listdir(path)
        if os.fspath(path) == str(tmp_path):  # the owner removes its group right after the listing
            (vanishing / "k1").rmdir()
            vanishing.rmdir()
        return names

    monkeypatch.setattr(cgroups.os, "listdir", racing_listdir)
    _sweep(str(tmp_path))
    assert real_listdir(tmp_path) == []


def test_an_entry_that_is_not_a_directory_is_left_alone(tmp_path):
    (tmp_path / f"trace_gym_{DEAD}").write_text("not a group")
    _sweep(str(tmp_path))
    assert os.listdir(tmp_path) == [f"trace_gym_{DEAD}"]
