"""Typed per-run plugin state: a :class:`Stash` keyed by :class:`StashKey` objects.

Modelled on pytest's ``Stash``: a plugin creates its keys once (one per plugin object, so two
instances of a plugin never share state) and reads back exactly the type it stored, checked by
mypy::

    class Counter(Plugin):
        def __init__(self, settings=None):
            super().__init__(settings)
            self.hits = StashKey[int]()

        @hookimpl
        def after_tool(self, run, call, result):
            run.stash[self.hits] = run.stash.get(self.hits, 0) + 1

Every :class:`~loopwarden.Run` has one (``run.stash``); it starts empty with every run.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

__all__ = ["Stash", "StashKey"]

T = TypeVar("T")
D = TypeVar("D")


class StashKey(Generic[T]):
    """A key into a :class:`Stash`; its type parameter is the type of the value stored."""

    __slots__ = ()


class Stash:
    """A mapping from :class:`StashKey` to values of the key's type."""

    __slots__ = ("_data",)

    def __init__(self) -> None:
        # values typed by their key (the methods' signatures); stored untyped so that reads on
        # the hot path are one dict operation, no cast() call
        self._data: dict[StashKey[Any], Any] = {}

    def __setitem__(self, key: StashKey[T], value: T) -> None:
        self._data[key] = value

    def __getitem__(self, key: StashKey[T]) -> T:
        return self._data[key]  # type: ignore[no-any-return]

    def get(self, key: StashKey[T], default: D) -> T | D:
        """The value stored under ``key``, or ``default``."""
        return self._data.get(key, default)  # type: ignore[no-any-return]

    def setdefault(self, key: StashKey[T], default: T) -> T:
        """The value under ``key``; store and return ``default`` when there is none."""
        return self._data.setdefault(key, default)  # type: ignore[no-any-return]

    def __delitem__(self, key: StashKey[T]) -> None:
        del self._data[key]

    def __contains__(self, key: StashKey[T]) -> bool:
        return key in self._data

    def __len__(self) -> int:
        return len(self._data)
