"""Finding verifiers env modules: the installed Environments Hub packages, and the
``load_environment`` of a named module with its keyword arguments checked.

:func:`installed_modules` reads package metadata and sources without importing them;
:func:`_load_function` imports the named module (which imports verifiers) only when asked.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from typing import Any, Mapping

from trace_gym.env.adapter import options_of

from trace_gym.env.boundary import error_text

from trace_gym.env.process_state import process_state_kept

def _near_modules(module: str) -> list[str]:
    """Names ``module`` may have meant: the installed env modules, and the siblings of a
    dotted name inside its (importable) package."""
    names = installed_modules()
    package, dot, _ = module.rpartition(".")
    if dot:
        try:
            with process_state_kept():
                parent = importlib.import_module(package)
        except ImportError:
            return names
        import pkgutil

        names += [f"{package}.{info.name}" for info in pkgutil.iter_modules(getattr(parent, "__path__", []))]
    return names


def _find_spec(module: str) -> Any:
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package that does not exist
        return None


def _load_function(module: str, where: str) -> Any:
    if _find_spec(module) is None:
        from trace_gym.utils.suggest import did_you_mean

        names = _near_modules(module)
        raise ValueError(f"{where}: no importable module {module!r}{did_you_mean(module, names)}; install an "
                         "Environments Hub package (prime env install OWNER/NAME) or put the module on sys.path")
    try:
        with process_state_kept():  # the env module imports verifiers
            imported = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001  (the env package's own import failure, in one line)
        raise ValueError(f"{where}: importing module {module!r} failed: {error_text(exc)}") from exc
    load = getattr(imported, "load_environment", None)
    if not callable(load):
        raise ValueError(f"{where}: module {module!r} has no load_environment(**kwargs)")
    return load


def _check_env_args(load: Any, env_args: Mapping[str, Any], where: str) -> None:
    params = inspect.signature(load).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return
    options_of(env_args, [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)],
               f"{where} (load_environment)")



def _defines_load_environment(module: str) -> bool:
    """Whether ``module``'s source (found without importing it) names ``load_environment``."""
    spec = _find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return False
    try:
        with open(spec.origin, encoding="utf-8") as file:
            return "load_environment" in file.read()
    except OSError:
        return False


def installed_modules() -> list[str]:
    """The installed env modules, sorted: top-level modules of distributions that require
    ``verifiers`` and whose source defines ``load_environment`` (Environments Hub packages).
    Found without importing them; may be empty (then name any importable module)."""
    from importlib import metadata

    found: set[str] = set()
    for dist in metadata.distributions():
        if not any(re.match(r"verifiers\b(?![-_.\w])", req) for req in dist.requires or []):
            continue
        tops = (dist.read_text("top_level.txt") or "").split()
        if not tops:
            tops = sorted({str(f).split("/")[0].removesuffix(".py") for f in dist.files or []
                           if not str(f).split("/")[0].endswith((".dist-info", ".pth")) and ".." not in str(f)})
        found |= {top for top in tops if top.isidentifier() and _defines_load_environment(top)}
    return sorted(found)
