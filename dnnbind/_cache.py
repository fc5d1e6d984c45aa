"""A bounded cache whose hit is one dict lookup, for descriptors, algorithm choices and op plans
(cuDNN descriptors and plans, cuBLASLt plans).

Ops look a descriptor (or a plan holding several) up on every call, so the hit must cost no
lock and no reordering. :class:`LRUCache` keeps two generations instead of an exact recency
order (a CLOCK-style approximation of LRU): a hit in the recent generation is a plain
``dict.get``; a hit in the older one moves the entry back (under the lock); an insert into
a full recent generation ages it and drops the older one. An entry used since the last aging
therefore survives the next one, and an entry unused for ``maxsize // 2`` inserts is dropped.

Eviction only forgets an entry. Descriptors are owned objects whose finalizer destroys the C
object when the last reference goes, so an entry evicted while a caller still holds it (the
descriptor, or the plan that holds it) stays valid until that caller lets go.
"""

from __future__ import annotations

import threading
from typing import Any, Hashable

__all__ = ["LRUCache"]


class LRUCache:
    """At most ``maxsize`` entries (values must not be None); ``get`` takes no lock on a recent hit.

    ``maxsize`` may be changed later; it applies from the next insert.
    """

    __slots__ = ("maxsize", "name", "_recent", "_older", "_lock")

    def __init__(self, maxsize: int, name: str = "") -> None:
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 2:
            raise ValueError(f"LRUCache {name!r}: maxsize must be an int >= 2, got {maxsize!r}")
        self.maxsize = maxsize
        self.name = name
        self._recent: dict = {}
        self._older: dict = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value for ``key`` or ``default``. Raises TypeError for an unhashable key."""
        value = self._recent.get(key)
        if value is not None:
            return value
        if not self._older:
            return default
        with self._lock:
            value = self._older.pop(key, None)
            if value is None:
                return default
            self._insert(key, value)
        return value

    def put(self, key: Hashable, value: Any) -> Any:
        """Store ``value`` under ``key`` (replacing what was there) and return it."""
        if value is None:
            raise ValueError(f"LRUCache {self.name!r}: None cannot be cached (it means 'missing')")
        with self._lock:
            self._older.pop(key, None)
            self._insert(key, value)
        return value

    def _insert(self, key: Hashable, value: Any) -> None:
        # Called with the lock held. Readers may still hold the dicts swapped out here: both stay
        # valid dicts, so a concurrent get sees the entry or misses, never a torn state.
        recent = self._recent
        if key not in recent and len(recent) >= max(1, self.maxsize // 2):
            self._older, self._recent = recent, {}
        self._recent[key] = value

    def clear(self) -> None:
        """Forget every entry (owners that still hold one keep it valid)."""
        with self._lock:
            self._recent, self._older = {}, {}

    def items(self) -> "list[tuple[Hashable, Any]]":
        """A snapshot of the entries, the older generation first."""
        with self._lock:
            return [*self._older.items(), *self._recent.items()]

    def __len__(self) -> int:
        return len(self._recent) + len(self._older)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._recent or key in self._older

    def __repr__(self) -> str:
        return f"<LRUCache {self.name!r} {len(self)}/{self.maxsize}>"
