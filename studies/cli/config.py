"""``mae-study config``: the config keys with defaults, units and ranges, or as YAML."""

from __future__ import annotations

import argparse
import sys

import yaml

from mae_core.config import EVAL_PREFIX, Config, ConfigKey, as_typed, config_keys

from .common import UsageError


def cmd_config(args: argparse.Namespace) -> int:
    """Every key (or the ones named): default, allowed range and meaning, as a table or as a
    YAML file of defaults that ``mae-study train --config`` reads unchanged."""
    keys = _chosen_keys(args.keys)
    if args.yaml:
        sys.stdout.write(defaults_yaml(keys))
        print("next: save this as config.yaml, edit it, then: mae-study train --config config.yaml",
              file=sys.stderr)
        return 0
    _print_config_table(keys)
    print("next: mae-study train key=value ...  (or mae-study config --yaml > config.yaml)", file=sys.stderr)
    return 0



def _chosen_keys(names: list[str]) -> list[ConfigKey]:
    """The catalogue entries of ``names`` in the order given (all of them when none is given)."""
    import difflib

    catalogue = {key.name: key for key in config_keys()}
    for name in names:
        if name not in catalogue:
            close = difflib.get_close_matches(name, catalogue, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UsageError(f"config: unknown key {name!r}{hint}; `mae-study config` lists every key")
    return [catalogue[name] for name in names] if names else list(catalogue.values())



def _print_config_table(keys: list[ConfigKey]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table("key", "default", "allowed", "unit and meaning",
                  caption="Also checked together: k = int(M·(1-mask_ratio)) in [1, M-1]; "
                          "widths divisible by heads; patch_size divides the image.")
    table.columns[0].no_wrap = True
    table.columns[0].min_width = max(len(key.name) for key in keys)
    for key in keys:
        table.add_row(key.name, as_typed(key.default), key.allowed, key.description)
    console = Console()
    if not console.is_terminal:  # piped or in a file: no terminal width to respect, so read more per line
        console.width = 120
    console.print(table)



def defaults_yaml(keys: list[ConfigKey] | None = None) -> str:
    """A YAML file of ``keys`` (default: every key) at their defaults, each under a comment with
    its meaning and allowed values; the ``eval.*`` keys nest under ``eval:``."""
    keys = config_keys() if keys is None else keys
    top = [key for key in keys if not key.name.startswith(f"{EVAL_PREFIX}.")]
    nested = [key for key in keys if key.name.startswith(f"{EVAL_PREFIX}.")]
    lines = ["# mae-study config: the defaults (`mae-study config` explains each key).",
             "# Use: mae-study train --config THIS_FILE [key=value ...]", ""]
    lines += [line for key in top for line in _yaml_entry(key.name, key)]
    if nested:
        lines.append(f"{EVAL_PREFIX}:  # {Config.model_fields[EVAL_PREFIX].description}")
        lines += ["  " + line for key in nested
                  for line in _yaml_entry(key.name.removeprefix(f"{EVAL_PREFIX}."), key)]
    return "\n".join(lines) + "\n"



def _yaml_entry(name: str, key: ConfigKey) -> list[str]:
    """``# meaning [allowed]`` then ``name: default`` (yaml writes the value, so it reads back exactly)."""
    if isinstance(key.default, (tuple, list)):  # one flow-style line (``[0.01, 0.1]``) in the eval: block
        value = f"{name}: {yaml.safe_dump(list(key.default), default_flow_style=True).strip()}"
    else:
        value = yaml.safe_dump({name: key.default}, allow_unicode=True).strip()
    return [f"# {key.description} [{key.allowed}]", value]
