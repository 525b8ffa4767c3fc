"""Typed settings from flags and the environment: the one loader every process uses (README "Worker runtime").

A settings type is a frozen :class:`msgspec.Struct`; each field that a user may set carries its
flag, environment variable(s) and help text in its annotation::

    class RunnerSetSettings(msgspec.Struct, frozen=True, kw_only=True):
        failed_runner_ttl: Annotated[float, option("--failed-runner-ttl", "RUNNERSCALE_FAILED_RUNNER_TTL",
                                                   "seconds a Failed runner is kept")] = 300.0

        def validate(self) -> None:          # optional: cross-field and range checks
            if self.failed_runner_ttl < 0:
                raise InvalidSetting("failed_runner_ttl", "must be >= 0")

:func:`add_arguments` registers the flags (every default ``None``, so an unset flag falls back to
the environment); :func:`load` builds the struct: defaults < environment < flags. A value that
does not parse, a missing required one, or an :class:`InvalidSetting` from ``validate`` (or from
``__post_init__``) becomes a :class:`SettingsError` naming the environment variable and the flag,
so ``main`` prints one line and exits 2. Fields without an :func:`option` are not user settings
(tuning knobs that tests set by constructing the struct) and are left at their defaults. A field
whose type is itself a settings struct (``WorkerSettings.bus``) is loaded the same way.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, TypeVar

import msgspec
from msgspec import inspect as msgspec_inspect

__all__ = [
    "InvalidSetting",
    "Option",
    "SettingsError",
    "add_arguments",
    "check",
    "load",
    "option",
    "options_of",
]

S = TypeVar("S", bound=msgspec.Struct)

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class SettingsError(ValueError):
    """A setting is missing or invalid; ``setting`` names it (``ENV / --flag``)."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        self.problem = problem
        super().__init__(f"invalid setting {setting}: {problem}")


class InvalidSetting(ValueError):
    """Raised by a settings struct's checks: ``field`` is the struct field, the loader names its flag."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class Option:
    """Where a user sets one field: a flag and environment variables (the first one is documented;
    later ones are fallbacks, e.g. the names ARC's chart sets)."""

    flag: str
    env: tuple[str, ...]
    help: str
    secret: bool = False
    metavar: str = ""

    @property
    def label(self) -> str:
        return f"{self.env[0]} / {self.flag}" if self.env else self.flag

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def option(flag: str, env: str | Sequence[str] = (), help: str = "", *, secret: bool = False, metavar: str = "") -> Any:
    """The annotation metadata of a user setting: ``Annotated[float, option("--x", "RUNNERSCALE_X", "...")]``."""
    names = (env,) if isinstance(env, str) else tuple(env)
    return msgspec.Meta(extra={"option": Option(flag, names, help, secret, metavar)})


@dataclass(frozen=True)
class _Field:
    name: str
    option: Option | None
    kind: str  # struct | sequence | bool | scalar
    nested: type[msgspec.Struct] | None
    required: bool
    unique: bool = False  # a sequence of names: repeats are dropped


@cache
def _fields(cls: type[msgspec.Struct]) -> tuple[_Field, ...]:
    info = msgspec_inspect.type_info(cls)
    assert isinstance(info, msgspec_inspect.StructType), f"{cls.__name__} is not a msgspec Struct"
    out: list[_Field] = []
    for f in info.fields:
        t = f.type
        found: Option | None = None
        if isinstance(t, msgspec_inspect.Metadata):
            extra = t.extra or {}
            found = extra.get("option")
            t = t.type
        if isinstance(t, msgspec_inspect.StructType):
            out.append(_Field(f.name, None, "struct", t.cls, f.required))
        elif isinstance(t, (msgspec_inspect.VarTupleType, msgspec_inspect.ListType)):
            unique = isinstance(t.item_type, msgspec_inspect.StrType)
            out.append(_Field(f.name, found, "sequence", None, f.required, unique))
        elif isinstance(t, msgspec_inspect.BoolType):
            out.append(_Field(f.name, found, "bool", None, f.required))
        else:
            out.append(_Field(f.name, found, "scalar", None, f.required))
    return tuple(out)


def options_of(cls: type[msgspec.Struct]) -> dict[str, Option]:
    """Field name → its :class:`Option`, nested settings included (for docs and tests)."""
    found: dict[str, Option] = {}
    for f in _fields(cls):
        if f.nested is not None:
            found.update(options_of(f.nested))
        elif f.option is not None:
            found[f.name] = f.option
    return found


def add_arguments(parser: argparse.ArgumentParser, cls: type[msgspec.Struct], *, title: str = "") -> None:
    """Register a flag for every option of ``cls`` (and of its nested settings structs)."""
    group = parser.add_argument_group(title or getattr(cls, "settings_title", cls.__name__))
    for f in _fields(cls):
        o = f.option
        if o is None:
            continue
        text = f"{o.help} [env {' / '.join(o.env)}]" if o.env else o.help
        metavar = o.metavar or (o.env[0] if o.env else "VALUE")
        if f.kind == "bool":
            group.add_argument(o.flag, dest=o.dest, action=argparse.BooleanOptionalAction, default=None, help=text)
        elif f.kind == "sequence":
            group.add_argument(o.flag, dest=o.dest, action="append", default=None, metavar=metavar, help=text)
        else:
            group.add_argument(o.flag, dest=o.dest, default=None, metavar=metavar, help=text)
    for f in _fields(cls):
        if f.nested is not None:
            add_arguments(parser, f.nested)


def _raw(o: Option, args: argparse.Namespace | None, env: Mapping[str, str]) -> Any:
    value = getattr(args, o.dest, None) if args is not None else None
    if value is None:
        value = next((env[n] for n in o.env if env.get(n, "").strip()), None)
    return value


def _items(raw: Any) -> list[str]:
    """A repeatable flag's values (or one env value), each comma-separated: the items, in order."""
    out: list[str] = []
    for item in raw if isinstance(raw, list) else [raw]:
        out.extend(p.strip() for p in str(item).split(",") if p.strip())
    return out


def _problem(exc: msgspec.ValidationError) -> tuple[str | None, str]:
    text = str(exc)
    missing = re.match(r"Object missing required field `(\w+)`", text)
    if missing:
        return missing.group(1), "is required"
    at = re.search(r" - at `\$\.(\w+)", text)
    return (at.group(1) if at else None), text.split(" - at ", maxsplit=1)[0]


def load(
    cls: type[S],
    args: argparse.Namespace | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    defaults: Mapping[str, Any] | None = None,
) -> S:
    """Build ``cls`` from ``defaults`` < environment < flags and validate it. Raises SettingsError."""
    env = os.environ if environ is None else environ
    by_name = {f.name: f for f in _fields(cls)}

    def error(field: str | None, problem: str) -> SettingsError:
        o = by_name[field].option if field in by_name else None
        return SettingsError(o.label if o is not None else (field or cls.__name__), problem)

    values: dict[str, Any] = dict(defaults or {})
    shown: dict[str, Any] = {}
    for f in by_name.values():
        if f.nested is not None:
            values[f.name] = load(f.nested, args, env)
            continue
        if f.option is None:
            continue
        raw = _raw(f.option, args, env)
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            continue
        shown[f.name] = "[redacted]" if f.option.secret else raw
        if f.kind == "sequence":
            items = _items(raw)
            values[f.name] = list(dict.fromkeys(items)) if f.unique else items
        elif f.kind == "bool" and not isinstance(raw, bool):
            word = str(raw).strip().lower()
            if word not in _TRUE | _FALSE:
                raise error(f.name, f"expected true or false, got {shown[f.name]!r}")
            values[f.name] = word in _TRUE
        else:
            values[f.name] = raw.strip() if isinstance(raw, str) else raw
    try:
        settings = msgspec.convert(values, cls, strict=False)
    except msgspec.ValidationError as exc:
        if isinstance(exc.__cause__, InvalidSetting):
            raise error(exc.__cause__.field, exc.__cause__.problem) from None
        field, problem = _problem(exc)
        if field in shown and problem != "is required":
            problem = f"cannot parse {field.replace('_', ' ')} from {shown[field]!r}"
        raise error(field, problem) from None
    check(settings)
    return settings


def check(settings: msgspec.Struct) -> None:
    """Run ``settings.validate()`` (if the type has one); an :class:`InvalidSetting` becomes a
    :class:`SettingsError` naming the flag and environment variable of the field at fault."""
    validate = getattr(settings, "validate", None)
    if validate is None:
        return
    try:
        validate()
    except InvalidSetting as exc:
        found = options_of(type(settings)).get(exc.field)
        raise SettingsError(found.label if found is not None else exc.field, exc.problem) from None
