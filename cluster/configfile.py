"""Reading a configuration file into a :class:`~cluster.config.Config`, checking it, and
the commented examples made from the table.

Usage::

    cfg = load(Path("etc/master.conf"), overrides={"base_port": "9100"})
    cfg.port_for(1)   # -> 9101

Paths in the file are taken relative to the directory of the file; paths given as overrides
relative to the working directory.
"""

from __future__ import annotations

import configparser
import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from cluster import datatypes
from cluster.config import ACCOUNT_NAME, BOTH, DEFAULT_TRANSPORT, MASTER, NODE, TRANSPORTS, Config
from cluster.errors import ConfigError

# ----------------------------------------------------------------------------------------------
# Parsing

def _field_table() -> dict[str, dataclasses.Field[Any]]:
    return {f.name: f for f in dataclasses.fields(Config)}


def _kind(f: dataclasses.Field[Any]) -> str:
    """The type of ``f`` as written in Config: 'int', 'float', 'Path', 'tuple[str, ...]', ..."""
    return f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))


def _convert(f: dataclasses.Field[Any], raw: str, base: Path, source: str) -> Any:
    """``raw`` as a value of field ``f``; ConfigError naming the key and ``source`` if it is
    not one (an int that is no integer, a float that is negative, NaN or infinite, ...)."""
    kind = _kind(f)
    text = raw.strip()
    try:
        if kind == "int":
            return int(text)
        if kind == "float":
            value = float(text)
            if not math.isfinite(value) or value < 0:
                raise ValueError
            return value
        if kind == "bool":
            low = text.lower()
            if low in ("1", "yes", "true", "on"):
                return True
            if low in ("0", "no", "false", "off"):
                return False
            raise ValueError
        if kind == "Path":
            path = Path(os.path.expanduser(text))
            return path if path.is_absolute() else base / path
        if kind.startswith("tuple"):
            return tuple(text.split())
        return text
    except ValueError:
        expected = (_expected_number(f, kind) if kind in ("int", "float")
                    else "yes or no" if kind == "bool" else kind)
        raise ConfigError(f.name, raw, expected, source) from None


def _shown(number: float) -> str:
    """A bound as written in messages and the examples: 3600, not 3600.0."""
    return str(int(number)) if float(number).is_integer() else str(number)


def range_text(f: dataclasses.Field[Any]) -> str:
    """The range of the numeric field ``f`` in words: ``from 0 to 3600``, ``from 1 to 100``
    or ``above 0, up to 86400``."""
    high = _shown(f.metadata["high"])
    if not f.metadata["positive"]:
        return f"from 0 to {high}"
    return f"from 1 to {high}" if _kind(f) == "int" else f"above 0, up to {high}"


def _expected_number(f: dataclasses.Field[Any], kind: str) -> str:
    """What a numeric field takes, for ConfigError: kind, range and unit."""
    noun = "an integer" if kind == "int" else "a number"
    return f"{noun} {range_text(f)} ({f.metadata['unit']})"


def load(path: Path | None = None, overrides: dict[str, str] | None = None) -> Config:
    """Read ``path`` (if given) and apply ``overrides`` (raw strings); return a frozen Config.

    Unknown keys and keys in the wrong section are errors that list what is allowed.

    Paths are expanded (``~``) and made absolute against the file's directory (or the
    current directory for overrides), except ``master_home`` with ``transport = ssh``: that
    path is on ``master_host`` and is kept as written (relative = to the ssh user's home
    there).
    """
    table = _field_table()
    values: dict[str, Any] = {}
    raw_home: str | None = None  # master_home as written, for transport ssh
    if path is not None:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            with open(path, encoding="utf-8") as fh:
                parser.read_file(fh)
        except OSError as exc:
            raise ConfigError("config file", str(path),
                              f"a readable file ({exc.strerror})") from None
        except configparser.Error as exc:
            raise ConfigError("config file", str(path), f"INI syntax ({exc})") from None
        base = path.resolve().parent
        for section in parser.sections():
            if section not in (MASTER, NODE):
                raise ConfigError(f"[{section}]", section, "section [master] or [node]", str(path))
            for key, raw in parser.items(section):
                f = table.get(key)
                if f is None:
                    raise ConfigError(key, raw, "one of " + ", ".join(sorted(table)), str(path))
                values[key] = _convert(f, raw, base, str(path))
                if key == "master_home":
                    raw_home = raw
    for key, raw in (overrides or {}).items():
        f = table.get(key)
        if f is None:
            raise ConfigError(key, raw, "one of " + ", ".join(sorted(table)), "command line")
        values[key] = _convert(f, raw, Path.cwd(), "command line")
        if key == "master_home":
            raw_home = raw
    if values.get("transport", DEFAULT_TRANSPORT) == "ssh" and raw_home is not None:
        values["master_home"] = Path(raw_home.strip())  # a path on master_host: as written
    cfg = Config(**values)
    validate(cfg)
    return cfg


def validate(cfg: Config) -> None:
    """Raise ConfigError, naming the key and what was expected, for values that parse but
    make no sense.

    Besides the checks of single keys: every int and float field must be a finite number
    in its range (>= 0, or > 0 if its field says ``positive``, and at most its ``high``);
    every field whose unit is ``cron schedule`` must be five cron fields or an @special
    (:func:`cluster.datatypes.check_schedule`), so a bad one fails here and not when the
    crontab is installed; the node name and the commit-run keys must follow their grammars
    in :mod:`cluster.datatypes`.
    """
    if cfg.transport not in TRANSPORTS:
        raise ConfigError("transport", cfg.transport, " or ".join(map(repr, TRANSPORTS)))
    if cfg.node_name and not datatypes.valid_node_name(cfg.node_name):
        raise ConfigError("node_name", cfg.node_name, "letters, digits, '.', '_' or '-' (max 64)")
    if cfg.job_user and not ACCOUNT_NAME.fullmatch(cfg.job_user):
        raise ConfigError("job_user", cfg.job_user, "an account name (a lower-case letter or "
                          "'_', then up to 31 of a-z 0-9 _ -), or empty")
    for entry in cfg.reuse_environment:
        if not os.path.isabs(os.path.expanduser(entry)):
            raise ConfigError("reuse_environment", entry, "absolute paths (or ~/...) of "
                              "files or folders, space separated")
    if cfg.slots < 0:
        raise ConfigError("slots", cfg.slots, "0 (CPU count) or a positive integer")
    for f in dataclasses.fields(Config):
        value = getattr(cfg, f.name)
        kind = _kind(f)
        if kind in ("int", "float"):
            _check_number(f, kind, value)
        elif f.metadata["unit"] == "cron schedule":
            datatypes.check_schedule(f.name, value)
    datatypes.parse_repositories(cfg.repositories)
    datatypes.check_branch(cfg.git_branch)
    datatypes.parse_path_products(cfg.path_products)
    datatypes.parse_user_shares(cfg.user_shares)


def _check_number(f: dataclasses.Field[Any], kind: str, value: float) -> None:
    """ConfigError, naming the key, the value and the range, unless ``value`` is finite and
    within the field's range (:func:`_opt`)."""
    high = f.metadata["high"]
    low_ok = value > 0 if f.metadata["positive"] else value >= 0
    if math.isfinite(value) and low_ok and high is not None and value <= high:
        return
    if high is None:  # a field added without its bound: say so rather than accept anything
        raise ConfigError(f.name, value, "a number field with an upper bound (a defect of "
                                         "cluster/config.py: give _opt a high=)")
    raise ConfigError(f.name, value, _expected_number(f, kind))


def parse_overrides(pairs: list[str]) -> dict[str, str]:
    """Turn ``["key=value", ...]`` from ``--set`` options into a dict, naming a bad pair."""
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError("--set", pair, "key=value")
        out[key.strip()] = value
    return out


# ----------------------------------------------------------------------------------------------
# Example files (etc/master.conf, etc/node.conf)

def example(section: str) -> str:
    """A commented INI text listing every key of ``section`` with its default and unit."""
    lines = [f"# Example {section} configuration of the regression cluster.",
             "# Generated from cluster/config.py by `python -m cluster.cli.config_example "
             f"{section}`; every value shown is the default.",
             f"[{section}]"]
    for f in dataclasses.fields(Config):
        if f.metadata["section"] not in (section, BOTH):
            continue
        default = f.default
        if isinstance(default, tuple):
            shown = " ".join(default)
        elif isinstance(default, bool):
            shown = "yes" if default else "no"
        else:
            shown = str(default)
        lines.append("")
        unit = f.metadata["unit"]
        if _kind(f) in ("int", "float"):
            unit += f", {range_text(f)}"
        lines.append(f"# {f.metadata['doc']} [{unit}]")
        lines.append(f"#{f.name} = {shown}")
    return "\n".join(lines) + "\n"
