"""A bounded, thread-safe map that forgets its least recently used entries (the service's
state and context caches, the SQL store's recall candidates)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

V = TypeVar("V")


class Lru(Generic[V]):
    """A bounded map, safe across threads: the least recently used entry leaves first."""

    def __init__(self, size: int) -> None:
        self._items: OrderedDict[str, V] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()

    def get(self, key: str, accept: Callable[[V], bool] | None = None) -> V | None:
        """The entry (None when absent or not ``accept``-ed); a returned entry counts as used."""
        with self._lock:
            value = self._items.get(key)
            if value is None or (accept is not None and not accept(value)):
                return None
            self._items.move_to_end(key)
            return value

    def get_each(self, keys: Iterable[str]) -> list[V | None]:
        """:meth:`get` of each key, under one lock (a search looks up dozens of rows)."""
        with self._lock:
            items, out = self._items, []
            for key in keys:
                value = items.get(key)
                if value is not None:
                    items.move_to_end(key)
                out.append(value)
            return out

    def put(self, key: str, value: V, keep_old: Callable[[V], bool] | None = None) -> None:
        """Store ``value`` (not when ``keep_old`` says the entry there should stay)."""
        if self._size <= 0:
            return
        with self._lock:
            old = self._items.get(key)
            if old is not None and keep_old is not None and keep_old(old):
                return
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._size:
                self._items.popitem(last=False)

    def pop(self, key: str) -> None:
        with self._lock:
            self._items.pop(key, None)

    def drop(self, which: Callable[[str], bool]) -> None:
        """Remove every entry whose key ``which`` accepts."""
        with self._lock:
            for key in [k for k in self._items if which(k)]:
                del self._items[key]
