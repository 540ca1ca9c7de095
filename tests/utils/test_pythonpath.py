"""A child process's PYTHONPATH holds this process's source folders, never site-packages or
setuptools' ``_vendor`` folder (which shadowed typing_extensions in an OpenEnv server once a
pytest worker had imported setuptools)."""

from __future__ import annotations

import os
import subprocess
import sys

from trace_gym.utils.pythonpath import source_folders_path


def test_source_folders_are_kept_and_installed_ones_left_out(tmp_path, monkeypatch):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pkg_resources  # noqa: F401  (appends setuptools' _vendor folder to sys.path, as torch may)

    vendor = next((p for p in sys.path if p.endswith(os.path.join("setuptools", "_vendor"))), None)
    assert vendor is not None  # the hazard is present in this process
    monkeypatch.syspath_prepend(str(tmp_path))
    kept = source_folders_path().split(os.pathsep)
    assert os.path.realpath(tmp_path) in kept
    assert not any("site-packages" in p or p.endswith("_vendor") for p in kept), kept


def test_a_child_given_the_path_imports_the_real_typing_extensions(tmp_path):
    # setuptools' _vendor ahead of site-packages, as it stood in the pytest worker that broke
    code = "import warnings; warnings.simplefilter('ignore'); import pkg_resources, subprocess, sys, os\n" \
           "vendor = [p for p in sys.path if p.endswith('_vendor')][0]\n" \
           "sys.path.remove(vendor); sys.path.insert(0, vendor)\n" \
           "from trace_gym.utils.pythonpath import source_folders_path\n" \
           "for path in (source_folders_path(), os.pathsep.join(sys.path)):\n" \
           "    out = subprocess.run([sys.executable, '-c', 'import typing_extensions as t; print(t.__file__)'],\n" \
           "                         env={**os.environ, 'PYTHONPATH': path}, capture_output=True, text=True)\n" \
           "    print(out.stdout.strip())\n"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": root}, timeout=120)
    ours, everything = out.stdout.split()
    assert "_vendor" not in ours
    assert "_vendor" in everything  # the old way (all of sys.path) is what broke the server
