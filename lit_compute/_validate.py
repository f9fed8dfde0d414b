"""One validation mechanism for every public constructor: what an argument accepts is declared next to it.

``Annotated[int | None, Check(ge=1)]`` in the signature says "an integer >= 1, or None". The
:func:`validated` decorator on ``__init__`` checks every argument against its annotation (type, finiteness,
range, choices, refused values) before the constructor body runs, for Python callers and for LightningCLI,
which builds components from the same signature (jsonargparse reads ``Annotated`` as its first argument and
shows the :class:`Check` in ``--help``). Every message names the class, the argument, the value and what is
accepted: ``FlopsLogger(log_every_n_steps='5') must be an integer >= 1 or None``.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import numbers
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Check:
    """What an argument accepts besides its type: bounds, choices, refused values (with the reason), a hint.

    Floats must be finite unless ``finite=False``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple[Any, ...] | None = None
    refuse: tuple[tuple[Any, str], ...] = ()
    finite: bool = True
    hint: str | None = None

    def describe(self) -> str:
        parts = []
        if self.choices is not None:
            parts.append("one of " + ", ".join(repr(c) for c in self.choices))
        bounds = [
            f"{op} {value:g}" if isinstance(value, float) else f"{op} {value}"
            for op, value in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
            if value is not None
        ]
        if bounds:
            parts.append(" and ".join(bounds))
        text = " ".join(parts)
        return f"{text} ({self.hint})" if self.hint and text else (self.hint or text)

    def __repr__(self) -> str:  # shown by jsonargparse's --help: "Annotated[int, >= 1]"
        return self.describe() or "any"


class _Invalid(Exception):
    pass


_PLURAL = {
    "an integer": "integers",
    "a finite number": "finite numbers",
    "a string": "strings",
    "true/false": "true/false values",
}


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "None"
    if tp is bool:
        return "true/false"
    if tp is int:
        return "an integer"
    if tp is float:
        return "a finite number"
    if tp is str:
        return "a string"
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (list, Sequence, tuple):
        inner = get_args(tp)
        if not inner:
            return "a list"
        item = _type_name(inner[0])
        return f"a list of {_PLURAL.get(item, item)}"
    if origin in (dict, Mapping):
        return "a mapping"
    if origin is typing.Annotated:
        base, *meta = get_args(tp)
        checks = [m for m in meta if isinstance(m, Check)]
        optional = get_origin(base) in (Union, types.UnionType) and type(None) in get_args(base)
        if optional:
            base = Union[tuple(a for a in get_args(base) if a is not type(None))]  # noqa: UP007 - a Union built at run time from a tuple: no | form
        if any(c.choices is not None for c in checks):
            text = "; ".join(c.describe() for c in checks if c.describe())
        else:
            text = _type_name(base) + "".join(f" {c.describe()}" for c in checks if c.describe())
        return text + (" or None" if optional else "")
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in get_args(tp))
    name = getattr(tp, "__name__", str(tp))
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _check(value: Any, tp: Any) -> None:
    """Raise :class:`_Invalid` when ``value`` does not fit ``tp``."""
    if tp is Any or tp is inspect.Parameter.empty:
        return
    origin = get_origin(tp)
    if origin is typing.Annotated:
        base, *meta = get_args(tp)
        _check(value, base)
        if value is not None:
            for check in meta:
                if isinstance(check, Check):
                    _apply(value, check)
        return
    if origin in (Union, types.UnionType):
        for option in get_args(tp):
            try:
                _check(value, option)
                return
            except _Invalid:
                continue
        raise _Invalid
    if tp is type(None):
        if value is not None:
            raise _Invalid
        return
    if origin is Literal:
        if value not in get_args(tp):
            raise _Invalid
        return
    if tp is bool:
        if not isinstance(value, bool):
            raise _Invalid
        return
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise _Invalid
        return
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise _Invalid
        return
    if tp is str:
        if not isinstance(value, str):
            raise _Invalid
        return
    if origin in (list, Sequence, tuple):
        if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
            raise _Invalid
        inner = get_args(tp)
        if inner and inner[-1] is not Ellipsis:
            for item in value:
                _check(item, inner[0])
        return
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _Invalid
        return
    if isinstance(tp, type) and not isinstance(value, tp):
        raise _Invalid


def _apply(value: Any, check: Check) -> None:
    if check.choices is not None and value not in check.choices:
        raise _Invalid
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        value = float(value)
        if check.finite and not math.isfinite(value):
            raise _Invalid
        if (check.ge is not None and not value >= check.ge) or (check.gt is not None and not value > check.gt):
            raise _Invalid
        if (check.le is not None and not value <= check.le) or (check.lt is not None and not value < check.lt):
            raise _Invalid


def _finite_numbers(value: Any, tp: Any) -> bool:
    """Numbers must be finite unless a Check says ``finite=False``."""
    if isinstance(value, float) and not math.isfinite(value):
        return any(not c.finite for c in _checks(tp))
    return True


def _refused(value: Any, tp: Any) -> str | None:
    for check in _checks(tp):
        for refused, reason in check.refuse:
            if value == refused:
                return reason
    return None


def _checks(tp: Any) -> list[Check]:
    if get_origin(tp) is typing.Annotated:
        return [m for m in get_args(tp)[1:] if isinstance(m, Check)]
    if get_origin(tp) in (Union, types.UnionType):
        return [c for a in get_args(tp) for c in _checks(a)]
    return []


@functools.cache
def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # noqa: BLE001 - an annotation that cannot be resolved is not checked
        return {}


def check_arguments(owner: str, fn: Callable[..., Any], bound: inspect.BoundArguments) -> None:
    """Check the bound arguments of ``fn`` against its annotations; ValueError naming ``owner`` and the argument."""
    hints = _hints(fn)
    for name, value in bound.arguments.items():
        param = bound.signature.parameters[name]
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or name == "self" or name not in hints:
            continue
        check_value(owner, name, value, hints[name])


def check_value(owner: str, name: str, value: Any, tp: Any) -> None:
    """One argument against its annotation; ValueError ``Owner(name=value) must be ...`` (or its refusal reason)."""
    reason = _refused(value, tp)
    if reason is not None:
        raise ValueError(f"{owner}({name}={value!r}) {reason}")
    try:
        _check(value, tp)
        ok = _finite_numbers(value, tp)
    except _Invalid:
        ok = False
    if not ok:
        raise ValueError(f"{owner}({name}={value!r}) must be {_type_name(tp)}")


def validated(init: F) -> F:
    """Decorate ``__init__``: check every argument against its annotation before the body runs."""
    signature = inspect.signature(init)

    @functools.wraps(init)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError as err:
            raise TypeError(f"{type(self).__name__}: {err}") from None
        check_arguments(type(self).__name__, init, bound)
        init(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def check_dataclass(obj: Any) -> None:
    """The same checks for a dataclass's fields (call from ``__post_init__``)."""
    hints = _hints(cast(Any, type(obj)))
    owner = type(obj).__name__
    for f in dataclasses.fields(obj):
        if f.name in hints:
            check_value(owner, f.name, getattr(obj, f.name), hints[f.name])
