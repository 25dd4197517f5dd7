"""Plugins: a user's module that registers its own parts with :mod:`mae_core.registry`.

A plugin is named by a module (``my_parts``, importable where mae-study runs) or a ``.py`` file
(``examples/plugin/patch_stats.py``); it is loaded by ``--plugin`` (train, run, evaluate,
report), a study file's ``plugins:`` list, or the entry-point group ``mae_study.plugins`` of an
installed package. Loading imports it once; its decorators do the registering.

Ray's trial processes import the same plugins before they build a config: the driver passes the
specs it loaded (:func:`loaded_specs`) to the trainable, and exports them in the environment
variable ``MAE_STUDY_PLUGINS`` (``os.pathsep``-separated) for processes started later, which
:func:`load_from_environment` reads. A plugin that cannot be imported is a :class:`PluginError`:
one line, exit status 2.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterable
from pathlib import Path

from .errors import UserError

ENTRY_POINT_GROUP = "mae_study.plugins"
ENVIRONMENT_VARIABLE = "MAE_STUDY_PLUGINS"

_loaded: dict[str, str] = {}  # spec as given (a file made absolute) -> the module's name
_entry_points: set[str] = set()  # "name=module:attr" of the group's plugins loaded here


class PluginError(UserError):
    """A plugin that cannot be found or imported (one line: the plugin and why)."""


def load_plugins(specs: Iterable[str], relative_to: Path | None = None, entry_points: bool = True) -> list[str]:
    """Import every plugin of ``specs`` (module names, or paths to ``.py`` files, relative to
    ``relative_to`` or the working directory), then those of the entry-point group; each one
    once. Returns the specs as recorded (files absolute) and exports them in
    ``MAE_STUDY_PLUGINS``."""
    recorded = [_load_one(spec, relative_to) for spec in specs]
    if entry_points:
        _load_entry_points()
    os.environ[ENVIRONMENT_VARIABLE] = os.pathsep.join(loaded_specs())
    return recorded


def loaded_specs() -> list[str]:
    """Every plugin :func:`load_plugins` was given in this process, as recorded (files absolute);
    the entry-point group's are not listed: every process loads those itself."""
    return list(_loaded)


def load_from_environment() -> list[str]:
    """A worker's side: load the plugins the driver named in ``MAE_STUDY_PLUGINS``."""
    specs = [spec for spec in os.environ.get(ENVIRONMENT_VARIABLE, "").split(os.pathsep) if spec]
    return load_plugins(specs)


def _is_file(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or (os.altsep is not None and os.altsep in spec)


def _load_one(spec: str, relative_to: Path | None) -> str:
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"plugin {spec!r}: expected a module name or a path to a .py file")
    spec = spec.strip()
    if _is_file(spec):
        path = Path(spec).expanduser()
        path = (relative_to / path if relative_to is not None and not path.is_absolute() else path).resolve()
        spec = str(path)
    if spec in _loaded:
        return spec
    _loaded[spec] = _import_file(path) if _is_file(spec) else _import_module(spec)
    return spec


def _import_module(name: str) -> str:
    try:
        module = importlib.import_module(name)
    except UserError as error:  # a registry refusing the plugin's parts: already one line
        raise PluginError(f"plugin {name}: {error}") from None
    except SystemExit as stop:
        raise PluginError(_exited(name, stop)) from None
    except ModuleNotFoundError as error:
        if error.name is not None and name.startswith(error.name):
            raise PluginError(f"plugin {name}: no such module (give an importable module or a path to a .py file)") from None
        raise PluginError(f"plugin {name} failed to import: {_one_line(error)}") from None
    except Exception as error:  # anything the plugin's own code raises while importing
        raise PluginError(f"plugin {name} failed to import: {_one_line(error)}") from None
    if getattr(module, "__file__", None) is None and hasattr(module, "__path__"):  # a bare folder
        raise PluginError(f"plugin {name}: a directory without __init__.py (a namespace package), which "
                          "registers nothing; give an importable module or a path to a .py file")
    return name


def _import_file(path: Path) -> str:
    if path.is_dir():
        raise PluginError(f"plugin {path} is a directory; give a module name (importable where mae-study "
                          "runs) or a path to a .py file")
    if not path.is_file():
        raise PluginError(f"plugin {path}: no such file")
    # a name of its own per file, so two plugins called parts.py do not collide
    name = f"mae_study_plugin_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise PluginError(f"plugin {path}: not a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while it runs
    try:
        module_spec.loader.exec_module(module)
    except UserError as error:
        del sys.modules[name]
        raise PluginError(f"plugin {path}: {error}") from None
    except SystemExit as stop:
        del sys.modules[name]
        raise PluginError(_exited(str(path), stop)) from None
    except Exception as error:  # SyntaxError, ImportError, the plugin's own errors
        del sys.modules[name]
        raise PluginError(f"plugin {path} failed to import: {_one_line(error)}") from None
    return name


def _load_entry_points() -> None:
    """Load every installed package's plugins of the group ``mae_study.plugins`` (once each)."""
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        key = f"{point.name}={point.value}"
        if key in _entry_points:
            continue
        try:
            point.load()
        except UserError as error:
            raise PluginError(f"plugin {point.value} (entry point {point.name}): {error}") from None
        except SystemExit as stop:
            raise PluginError(_exited(f"{point.value} (entry point {point.name})", stop)) from None
        except Exception as error:
            raise PluginError(f"plugin {point.value} (entry point {point.name}) failed to import: "
                              f"{_one_line(error)}") from None
        _entry_points.add(key)


def _exited(plugin: str, stop: SystemExit) -> str:
    """A plugin that calls ``sys.exit`` while importing: an error, never a quiet exit (status 0
    having done nothing)."""
    return (f"plugin {plugin} called sys.exit({stop.code!r}) while importing; a plugin registers its "
            "parts and must not exit")


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__
