"""A config written back to a TOML file (tomllib only reads): :func:`write_config`, over a
TOML writer for plain data, :func:`dumps`, that is enough for a streamer config.

Tables and arrays of tables are written as sections, scalars and arrays of scalars inline;
``None`` values must be left out by the caller (TOML has no null).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from streamer.config import Config, load_config

__all__ = ["dumps", "write_config"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def write_config(config: Config, path: Path) -> Config:
    """Write ``config`` as TOML to ``path`` (settings at their defaults left out), and return
    it as read back from there.

    Raises:
        ConfigError: the written file does not load (a bug in the writer).
    """
    data = config.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    path.write_text(dumps(data), encoding="utf-8")
    return load_config(path)


def dumps(data: Mapping[str, Any]) -> str:
    """``data`` as a TOML document.

    Raises:
        TypeError: a value TOML cannot hold (None, or an object that is not str, bool, int,
            float, a mapping or a sequence).
    """
    lines: list[str] = []
    _emit(lines, (), data)
    return "\n".join(lines).strip() + "\n"


def _emit(lines: list[str], path: tuple[str, ...], data: Mapping[str, Any]) -> None:
    """The key/value lines of one table, then its sub-tables and arrays of tables."""
    for key, value in data.items():
        if not _is_table(value) and not _is_table_array(value):
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in data.items():
        sub = (*path, key)
        if _is_table(value):
            lines.extend(["", f"[{_dotted(sub)}]"])
            _emit(lines, sub, value)
        elif _is_table_array(value):
            for item in value:
                lines.extend(["", f"[[{_dotted(sub)}]]"])
                _emit(lines, sub, item)


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    return _is_array(value) and bool(value) and all(isinstance(v, Mapping) for v in value)


def _is_array(value: Any) -> bool:
    return isinstance(value, Sequence) and not isinstance(value, (str, bytes))


def _key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else json.dumps(key)


def _dotted(path: tuple[str, ...]) -> str:
    return ".".join(_key(part) for part in path)


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # JSON string escapes are valid in a TOML basic string
    if _is_array(value):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    raise TypeError(f"TOML cannot hold {value!r}")
