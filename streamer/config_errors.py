"""Validation errors as a config's user reads them: one ``<key>: <problem>`` line each.

Pydantic names a key by its location (``models.0.batch.max_size``) and, for a setting that
takes one of several types (``uri``: a string or a list of strings), reports every type it
tried under a member tag of its own (``uri.str``, ``uri.tuple[str, ...][1]``). The lines here
name the key as it is written in the file (``models[0] ('face').batch.max_size``, ``uri[1]``)
and say once what a union setting takes.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError

__all__ = ["error_lines", "key_text", "table_index"]

_INPUT_SHOULD_BE = "Input should be "


@dataclass(frozen=True)
class _Problem:
    """One error to report: where (``loc``, union member tags removed), what, its type."""

    loc: tuple[int | str, ...]
    message: str
    type: str


def error_lines(
    exc: ValidationError,
    model: type[BaseModel],
    prefix: str = "",
    data: Mapping[str, Any] | None = None,
) -> list[str]:
    """One ``<prefix>.<key>: <problem>`` line per error of validating ``model``.

    An unknown key's line lists the keys its table takes, and the closest one (a likely
    typo). A setting of several types has one line, ``uri: Input should be a valid string or
    a valid array``, or the lines of the type its value went furthest into (``uri[1]: Input
    should be a valid string`` for a list holding a number). A list's ``too_short`` error is
    left out when an error under the same key is reported: pydantic adds one (``models:
    Tuple should have at least 1 item after validation, not 0``) whenever the list's only
    tables fail, and it only misleads. ``data`` is the table validated, to name the tables of
    a list in the key (:func:`key_text`).
    """
    problems = _problems(exc, model)
    lines = []
    for problem in problems:
        if problem.type == "too_short" and any(
            len(other.loc) > len(problem.loc) and other.loc[: len(problem.loc)] == problem.loc
            for other in problems
        ):
            continue
        key = key_text(problem.loc, data, prefix)
        lines.append(f"{key or '(top level)'}: {problem.message}")
    return lines


def key_text(loc: Sequence[int | str], data: Any = None, prefix: str = "") -> str:
    """The key at ``loc`` as a user finds it in the file: ``models[0] ('face').batch.max_size``
    (pydantic's ``models.0.batch.max_size``), a list's index in brackets and, for a table of
    ``data`` (the table validated) with a string ``name``, that name. A key with a line
    break or another unprintable character (TOML's quoted keys take any) is quoted, as a
    name is, so that it forges no line of the message nor writes to the terminal."""
    text = prefix
    for part in loc:
        if isinstance(part, int):
            data = data[part] if isinstance(data, list) and 0 <= part < len(data) else None
            name = data.get("name") if isinstance(data, dict) else None
            text += table_index(part, name)
        else:
            data = data.get(part) if isinstance(data, dict) else None
            key = str(part) if str(part).isprintable() else repr(part)
            text += f".{key}" if text else key
    return text


def table_index(index: int, name: object) -> str:
    """A table of a list as messages name it: ``[0] ('face')``, or ``[0]`` without a
    string ``name``."""
    return f"[{index}]" + (f" ({name!r})" if isinstance(name, str) else "")


def _problems(exc: ValidationError, model: type[BaseModel]) -> list[_Problem]:
    """The errors of ``exc`` with union member tags removed, each union setting's merged
    (see :func:`error_lines`), in pydantic's order."""
    entries: list[_Problem | tuple[int | str, ...]] = []
    unions: dict[tuple[int | str, ...], dict[str, list[_Problem]]] = {}
    for err in exc.errors():
        where = _where(model, err["loc"])
        problem = _problem(model, where, err)
        if where.union is None:
            entries.append(problem)
            continue
        if where.union not in unions:
            unions[where.union] = {}
            entries.append(where.union)
        unions[where.union].setdefault(where.member, []).append(problem)
    problems: list[_Problem] = []
    for entry in entries:
        problems += [entry] if isinstance(entry, _Problem) else _merged(entry, unions[entry])
    return list(dict.fromkeys(problems))


def _merged(loc: tuple[int | str, ...], members: dict[str, list[_Problem]]) -> list[_Problem]:
    """A union setting's problems: those of the members of its value's type (a list's
    items, its length), or else one line saying what type each member takes."""
    matched = [
        p
        for problems in members.values()
        if not all(p.loc == loc and p.type.endswith("_type") for p in problems)
        for p in problems
    ]
    if matched:
        return matched
    messages = list(dict.fromkeys(p.message for problems in members.values() for p in problems))
    if all(m.startswith(_INPUT_SHOULD_BE) for m in messages):
        text = _INPUT_SHOULD_BE + " or ".join(m.removeprefix(_INPUT_SHOULD_BE) for m in messages)
    else:
        text = "; or ".join(messages)
    return [_Problem(loc, text, "union")]


def _problem(model: type[BaseModel], where: _Where, err: Any) -> _Problem:
    """The problem of one error: an unknown key lists the known ones; a missing item of a
    tuple of fixed length is the tuple's length (pydantic says ``mean[2]: Field required``
    of ``mean = [0.5, 0.5]``)."""
    loc = where.loc
    if err["type"] == "extra_forbidden" and (table := _model_at(model, loc[:-1])):
        known = sorted(n for n, f in table.model_fields.items() if not f.exclude)
        return _Problem(loc, _unknown_key(str(loc[-1]), known), err["type"])
    items = get_args(where.parent) if get_origin(where.parent) is tuple else ()
    if err["type"] == "missing" and items and Ellipsis not in items and isinstance(loc[-1], int):
        given = len(err["input"]) if isinstance(err["input"], list) else "fewer"
        text = f"Tuple should have {len(items)} items, not {given}"
        return _Problem(loc[:-1], text, "tuple_length")
    return _Problem(loc, str(err["msg"]), err["type"])


def _unknown_key(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key (known: {', '.join(known)}){hint}"


@dataclass(frozen=True)
class _Where:
    """Where an error is: its ``loc`` without pydantic's union member tags (``uri.str`` is
    ``uri``); the plain loc of the first union setting on the way (None if there is none)
    and the tag of its member; the type of the value holding the last part of ``loc``
    (None where it is not known)."""

    loc: tuple[int | str, ...]
    union: tuple[int | str, ...] | None
    member: str
    parent: Any


def _where(model: type[BaseModel], loc: Sequence[int | str]) -> _Where:
    annotation: Any = model
    parent: Any = None
    plain: list[int | str] = []
    union: tuple[int | str, ...] | None = None
    member = ""
    for part in loc:
        annotation = _unwrapped(annotation)
        if members := _union_members(annotation):
            if union is None:
                union, member = tuple(plain), str(part)
            annotation = next((m for m in members if part in (_type_name(m), str(m))), None)
            continue
        plain.append(part)
        parent, annotation = annotation, _inner(annotation, part)
    return _Where(tuple(plain), union, member, parent)


def _type_name(annotation: Any) -> str | None:
    return annotation.__name__ if isinstance(annotation, type) else None


def _unwrapped(annotation: Any) -> Any:
    """The type under ``Annotated[...]`` and an Optional's ``None`` (no member tag of its
    own in pydantic's errors)."""
    while get_origin(annotation) is Annotated:
        annotation = get_args(annotation)[0]
    if _is_union(annotation):
        members = [a for a in get_args(annotation) if a is not type(None)]
        if len(members) == 1:
            return _unwrapped(members[0])
    return annotation


def _union_members(annotation: Any) -> list[Any]:
    """The members of a union of several types other than None; [] for another type."""
    if not _is_union(annotation):
        return []
    return [_unwrapped(a) for a in get_args(annotation) if a is not type(None)]


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (Union, types.UnionType)


def _inner(annotation: Any, part: int | str) -> Any:
    """The type at ``part`` of a value of type ``annotation``: a model's field, a tuple's
    or a list's item, a mapping's value; None where it is not known."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(str(part))
        return field.annotation if field is not None else None
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is tuple and args:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        return args[part] if isinstance(part, int) and 0 <= part < len(args) else None
    if origin in (list, set, frozenset) or _is_abc(origin, Sequence):
        return args[0] if args else None
    if origin is dict or _is_abc(origin, Mapping):
        return args[1] if len(args) == 2 else None
    return None


def _is_abc(origin: Any, abc: type) -> bool:
    return isinstance(origin, type) and issubclass(origin, abc)


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model of the table at ``loc`` (list indices skipped); None if not a plain one."""
    current: type[BaseModel] | None = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = current.model_fields.get(part) if current is not None else None
        current = _model_in(field.annotation) if field is not None else None
    return current


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The model an annotation holds: itself, or inside an Optional, a tuple or a list."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in get_args(annotation) if (m := _model_in(a)) is not None), None)
