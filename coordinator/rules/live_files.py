"""The live-file set: one 64-bit key hash per live file, about 8 bytes each.

A Python `set[int]` costs about 76 bytes per member, 76 MB at a million live
files. Here the members sit in a sorted numpy int64 array; the changes since
the last merge sit in two small Python sets (`_added`: not in the array,
`_removed`: in the array but gone). A lookup is a set probe plus one binary
search. The changes are merged into the array, in linear time, once they
outnumber 1/16 of it (at least `MERGE_MIN`), so the sets stay small and the
merge cost per change stays constant.

`fork()` gives a `LiveFileLayer`: the set as seen by a batch's tentative
commits, holding only their changes (see `deltacoord.coordinator.rules.layers`).

The `*_many` forms take a commit's hashes at once (distinct ones, as an int64
array): one vectorised binary search over the array instead of one per file,
and a large change folded into the array in one sorted merge. A commit of
100,000 files costs them milliseconds where the one-by-one forms cost seconds.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

#: Changes kept in Python sets before a merge, whatever the array's size.
MERGE_MIN = 4_096
_NONE = np.zeros(0, dtype=np.int64)
_NONE.flags.writeable = False


def _members(hashes: np.ndarray, among: set[int]) -> np.ndarray:
    """Which of `hashes` are in the (small) set `among`, as a bool array."""
    if not among:
        return np.zeros(hashes.size, dtype=bool)
    return np.isin(hashes, np.fromiter(among, dtype=np.int64, count=len(among)))


class LiveFileSet:
    """A set of 64-bit ints (file key hashes) stored compactly."""

    __slots__ = ("_added", "_base", "_removed")

    def __init__(self, hashes: Iterable[int] | None = None) -> None:
        # An empty set (every layer's two) shares one empty array: no array is ever changed in place.
        self._base: np.ndarray = _NONE if hashes is None else np.unique(np.fromiter(hashes, dtype=np.int64))
        self._added: set[int] = set()
        self._removed: set[int] = set()

    @classmethod
    def of_array(cls, hashes: np.ndarray) -> LiveFileSet:
        """A set holding `hashes`, already sorted and unique int64 (`array()` of another set)."""
        s = cls()
        s._base = np.ascontiguousarray(hashes, dtype=np.int64)
        return s

    def array(self) -> np.ndarray:
        """The members as a sorted int64 array (pending changes merged first)."""
        self.merge()
        return self._base

    def _in_base(self, h: int) -> bool:
        base = self._base
        if not base.size:  # a layer's changes, mostly (no search of an empty array)
            return False
        i = int(base.searchsorted(h))
        return i < base.size and int(base[i]) == h

    def _in_base_many(self, hashes: np.ndarray) -> np.ndarray:
        base = self._base
        if not base.size:
            return np.zeros(hashes.size, dtype=bool)
        i = np.minimum(base.searchsorted(hashes), base.size - 1)
        return np.asarray(base[i] == hashes, dtype=bool)

    def contains_many(self, hashes: np.ndarray) -> np.ndarray:
        """`h in self` of each of `hashes` (int64), as a bool array."""
        found: np.ndarray = (self._in_base_many(hashes) & ~_members(hashes, self._removed)) | _members(hashes, self._added)
        return found

    def add_many(self, hashes: np.ndarray) -> None:
        """`add` of each of `hashes` (distinct int64)."""
        self.add_absent_many(hashes[~self.contains_many(hashes)])

    def discard_many(self, hashes: np.ndarray) -> None:
        """`discard` of each of `hashes` (distinct int64)."""
        self.discard_present_many(hashes[self.contains_many(hashes)])

    def add_absent_many(self, hashes: np.ndarray) -> None:
        """`add_absent` of each of `hashes` (distinct int64, none in the set): merged into the array at once."""
        if hashes.size < MERGE_MIN:
            for h in hashes.tolist():
                self.add_absent(h)
            return
        self.merge()
        new = np.sort(hashes)
        self._base = np.insert(self._base, self._base.searchsorted(new), new)

    def discard_present_many(self, hashes: np.ndarray) -> None:
        """`discard_present` of each of `hashes` (distinct int64, all in the set): taken out of the array at once."""
        if hashes.size < MERGE_MIN:
            for h in hashes.tolist():
                self.discard_present(h)
            return
        self.merge()
        keep = np.ones(self._base.size, dtype=bool)
        keep[self._base.searchsorted(hashes)] = False
        self._base = self._base[keep]

    def __contains__(self, h: object) -> bool:
        if not isinstance(h, int):
            return False
        if h in self._added:
            return True
        return h not in self._removed and self._in_base(h)

    def __len__(self) -> int:
        return int(self._base.size) - len(self._removed) + len(self._added)

    def add(self, h: int) -> None:
        if h in self._removed:
            self._removed.discard(h)
        elif not self._in_base(h):
            self._added.add(h)
            self._maybe_merge()

    def discard(self, h: int) -> None:
        if h in self._added:
            self._added.discard(h)
        elif self._in_base(h):
            self._removed.add(h)
            self._maybe_merge()

    def add_absent(self, h: int) -> None:
        """`add` of a hash known not to be in the set (no lookup in the array)."""
        if h in self._removed:
            self._removed.discard(h)
        else:
            self._added.add(h)
            self._maybe_merge()

    def discard_present(self, h: int) -> None:
        """`discard` of a hash known to be in the set."""
        if h in self._added:
            self._added.discard(h)
        else:
            self._removed.add(h)
            self._maybe_merge()

    def _maybe_merge(self) -> None:
        if len(self._added) + len(self._removed) > max(MERGE_MIN, int(self._base.size) >> 4):
            self.merge()

    def merge(self) -> None:
        """Fold the pending changes into the sorted array."""
        base = self._base
        if self._removed:
            gone = np.fromiter(self._removed, dtype=np.int64, count=len(self._removed))
            keep = np.ones(base.size, dtype=bool)
            keep[base.searchsorted(gone)] = False  # every removed hash is in the array
            base = base[keep]
        if self._added:
            new = np.sort(np.fromiter(self._added, dtype=np.int64, count=len(self._added)))
            base = np.insert(base, base.searchsorted(new), new)
        self._base = base
        self._added = set()
        self._removed = set()

    @property
    def nbytes(self) -> int:
        """Bytes held by the array (the pending sets add about 76 bytes per change)."""
        return int(self._base.nbytes)

    def fork(self) -> LiveFileLayer:
        return LiveFileLayer(self)


class LiveFileLayer:
    """Changes to a live-file set kept apart from it: `_added` are not in the base, `_removed` are. Both are
    `LiveFileSet`s, so a batch's commit of a million files holds its hashes as an array (8 bytes each), not as a
    Python set (about 77 bytes each)."""

    __slots__ = ("_added", "_base", "_removed")

    def __init__(self, base: LiveFileSet | LiveFileLayer) -> None:
        self._base = base
        self._added = LiveFileSet()
        self._removed = LiveFileSet()

    def __contains__(self, h: object) -> bool:
        if h in self._added:
            return True
        return h not in self._removed and h in self._base

    def __len__(self) -> int:
        return len(self._base) - len(self._removed) + len(self._added)

    def add(self, h: int) -> None:
        if h in self._removed:
            self._removed.discard_present(h)
        elif h not in self._base:
            self._added.add(h)

    def discard(self, h: int) -> None:
        if h in self._added:
            self._added.discard_present(h)
        elif h in self._base:
            self._removed.add(h)

    def fork(self) -> LiveFileLayer:
        return LiveFileLayer(self)

    def contains_many(self, hashes: np.ndarray) -> np.ndarray:
        """`h in self` of each of `hashes` (int64), as a bool array."""
        found: np.ndarray = (self._base.contains_many(hashes) & ~self._removed.contains_many(hashes)) \
            | self._added.contains_many(hashes)
        return found

    def add_many(self, hashes: np.ndarray) -> None:
        """`add` of each of `hashes` (distinct int64)."""
        self.add_absent_many(hashes[~self.contains_many(hashes)])

    def discard_many(self, hashes: np.ndarray) -> None:
        """`discard` of each of `hashes` (distinct int64)."""
        self.discard_present_many(hashes[self.contains_many(hashes)])

    def add_absent(self, h: int) -> None:
        if h in self._removed:
            self._removed.discard_present(h)
        else:
            self._added.add_absent(h)

    def add_absent_many(self, hashes: np.ndarray) -> None:
        """`add_absent` of each of `hashes` (distinct int64, none in this layer's view)."""
        back = self._removed.contains_many(hashes)
        if back.any():
            self._removed.discard_present_many(hashes[back])
            hashes = hashes[~back]
        self._added.add_absent_many(hashes)

    def discard_present_many(self, hashes: np.ndarray) -> None:
        """`discard_present` of each of `hashes` (distinct int64, all in this layer's view)."""
        mine = self._added.contains_many(hashes)
        if mine.any():
            self._added.discard_present_many(hashes[mine])
            hashes = hashes[~mine]
        self._removed.add_absent_many(hashes)

    def discard_present(self, h: int) -> None:
        if h in self._added:
            self._added.discard_present(h)
        else:
            self._removed.add_absent(h)

    def commit(self) -> None:
        """Write this layer's changes into its base (`_added` are not in it, `_removed` are)."""
        base = self._base
        if len(self._removed):
            base.discard_present_many(self._removed.array())
        if len(self._added):
            base.add_absent_many(self._added.array())


__all__ = ["MERGE_MIN", "LiveFileLayer", "LiveFileSet"]
