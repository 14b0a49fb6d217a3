"""Containers of a `TableState` that can be forked: a fork writes to a layer of its own over its base.

A batch of proposals is decided against forks of the live table states
(`TableState.fork`), so the batch's tentative commits never touch the live
states: the Kafka loop replays them onto the live states once the batch's
transaction commits, and simply drops the forks when it aborts. A fork costs
O(1) to make and O(changes) to fill: nothing of the base is copied, whatever
the table's size. The base must not change while a fork of it is in use;
`commit()` writes a fork's changes into its base, also in O(changes).

* `LayeredDict` -- a mapping with its own writes and deletions over a base mapping;
* `WinnersWindow` / `ForkedWindow` -- the bounded window of recent commits, with an index of its marked
  commits (`Commit.marked`: the ones a blind append's check cannot skip), so that a proposal whose read
  version is far behind the head visits only those;
* `TxnIndex` / `ForkedTxnIndex` -- the bounded proposal-id -> version index.

The live-file set's layer is `deltacoord.coordinator.rules.live_files.LiveFileLayer`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from itertools import islice
from typing import Generic, Protocol, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Commit(Protocol):
    """What the window needs of a commit's summary (`state.C` is one)."""

    @property
    def version(self) -> int: ...

    @property
    def num_file_actions(self) -> int: ...

    @property
    def marked(self) -> bool:
        """Whether the window indexes this commit (`marked_since`)."""
        ...


C = TypeVar("C", bound=Commit)


def _marked_after(marked: deque[C], after: int) -> list[C]:
    """The commits of `marked` (in version order) with a version above `after`, in O(their number)."""
    out: list[C] = []
    for w in reversed(marked):
        if w.version <= after:
            break
        out.append(w)
    out.reverse()
    return out


def _replace_newest(commits: deque[C], marked: deque[C], w: C) -> C:
    """Put `w` in the place of the newest of `commits` (and of `marked`, the marked ones); the commit it replaced."""
    old = commits[-1]
    commits[-1] = w
    if marked and marked[-1] is old:
        marked.pop()
    if w.marked:
        marked.append(w)
    return old


class LayeredDict(MutableMapping[K, V], Generic[K, V]):
    """Writes and deletions kept apart from a base mapping, which is only read."""

    __slots__ = ("_base", "_gone", "_set")

    def __init__(self, base: Mapping[K, V]) -> None:
        self._base = base
        self._set: dict[K, V] = {}
        self._gone: set[K] = set()

    def __getitem__(self, key: K) -> V:
        if key in self._set:
            return self._set[key]
        if key in self._gone:
            raise KeyError(key)
        return self._base[key]

    def __contains__(self, key: object) -> bool:
        if key in self._set:
            return True
        return key not in self._gone and key in self._base

    def __setitem__(self, key: K, value: V) -> None:
        self._set[key] = value
        self._gone.discard(key)

    def __delitem__(self, key: K) -> None:
        if key not in self:
            raise KeyError(key)
        self._set.pop(key, None)
        if key in self._base:
            self._gone.add(key)

    def __iter__(self) -> Iterator[K]:
        for k in self._base:
            if k not in self._gone and k not in self._set:
                yield k
        yield from self._set

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __bool__(self) -> bool:
        return bool(self._set) or (bool(self._base) and (not self._gone or len(self) > 0))

    def commit(self) -> None:
        """Write this layer's changes into its base (which must be a mutable mapping)."""
        base = self._base
        assert isinstance(base, MutableMapping)
        for k in self._gone:
            base.pop(k, None)
        base.update(self._set)


class WinnersWindow(Generic[C]):
    """Summaries of the newest commits, oldest first, bounded in commits and in file actions."""

    __slots__ = ("_files", "_marked", "_next", "_winners")

    def __init__(self, next_version: int = 0) -> None:
        self._winners: deque[C] = deque()
        #: The retained commits that are `marked`, oldest first.
        self._marked: deque[C] = deque()
        self._files = 0
        #: The oldest version the window could hold when it is empty (the version after the head).
        self._next = next_version

    def __len__(self) -> int:
        return len(self._winners)

    @property
    def oldest_version(self) -> int:
        return self._winners[0].version if self._winners else self._next

    def at(self, i: int) -> C:
        """The i-th oldest retained commit."""
        return self._winners[i]

    def tail(self, n: int) -> list[C]:
        """The newest `n` commits (n <= len), in version order."""
        winners = self._winners
        if n <= len(winners) // 2:
            out = list(islice(reversed(winners), n))
            out.reverse()
            return out
        return list(islice(winners, len(winners) - n, None))

    def marked_since(self, after: int) -> list[C]:
        """The retained marked commits with a version above `after`, in version order."""
        return _marked_after(self._marked, after)

    def append(self, w: C, max_commits: int, max_files: int) -> None:
        """Add the newest commit, then drop the oldest ones beyond the bounds (the newest always stays)."""
        self._winners.append(w)
        if w.marked:
            self._marked.append(w)
        self._files += w.num_file_actions
        self._bound(max_commits, max_files)
        self._next = w.version + 1
        self._drop_marked()

    def own_newest(self) -> C | None:
        """The newest commit (`replace_newest` may replace it), or None when empty."""
        return self._winners[-1] if self._winners else None

    def replace_newest(self, w: C, max_commits: int, max_files: int) -> None:
        """Replace the newest commit by `w`, a summary of the same version grown by more actions, then drop the
        oldest ones beyond the bounds: the window `append(w)` would have made instead of appending the newest."""
        self._files += w.num_file_actions - _replace_newest(self._winners, self._marked, w).num_file_actions
        self._bound(max_commits, max_files)
        self._drop_marked()

    def _bound(self, max_commits: int, max_files: int) -> None:
        winners = self._winners
        while len(winners) > 1 and (len(winners) > max_commits or self._files > max_files):
            self._files -= winners.popleft().num_file_actions

    def _drop_marked(self) -> None:
        """Forget marked commits no longer retained."""
        marked, oldest = self._marked, self.oldest_version
        while marked and marked[0].version < oldest:
            marked.popleft()

    def fork(self) -> ForkedWindow[C]:
        return ForkedWindow(self)

    def _take(self, dropped: int, new: deque[C], files: int, marked: deque[C]) -> None:
        winners = self._winners
        for _ in range(dropped):
            winners.popleft()
        winners.extend(new)
        self._files = files
        if new:
            self._next = new[-1].version + 1
        self._drop_marked()
        self._marked.extend(w for w in marked if w.version >= self.oldest_version)


class ForkedWindow(Generic[C]):
    """A window that hides the base's oldest commits it has dropped and holds its own newest ones."""

    __slots__ = ("_base", "_dropped", "_files", "_marked", "_new")

    def __init__(self, base: WinnersWindow[C] | ForkedWindow[C]) -> None:
        self._base = base
        self._dropped = 0
        self._new: deque[C] = deque()
        #: The marked commits of `_new`, oldest first (those `_new` dropped may linger: filtered by version).
        self._marked: deque[C] = deque()
        self._files: int = base._files

    def __len__(self) -> int:
        return len(self._base) - self._dropped + len(self._new)

    @property
    def oldest_version(self) -> int:
        if self._dropped < len(self._base):
            return self._base.at(self._dropped).version
        if self._new:
            return self._new[0].version
        return self._base.oldest_version

    def at(self, i: int) -> C:
        kept = len(self._base) - self._dropped
        return self._base.at(self._dropped + i) if i < kept else self._new[i - kept]

    def tail(self, n: int) -> list[C]:
        new = self._new
        if n <= len(new):
            return list(islice(new, len(new) - n, None))
        return [*self._base.tail(n - len(new)), *new]

    def marked_since(self, after: int) -> list[C]:
        """The retained marked commits with a version above `after`, in version order."""
        after = max(after, self.oldest_version - 1)
        own = _marked_after(self._marked, after)
        if self._new and after >= self._new[0].version - 1:
            return own
        return [*self._base.marked_since(after), *own]

    def append(self, w: C, max_commits: int, max_files: int) -> None:
        self._new.append(w)
        if w.marked:
            self._marked.append(w)
        self._files += w.num_file_actions
        self._bound(max_commits, max_files)

    def own_newest(self) -> C | None:
        """The newest commit when this fork appended it (`replace_newest` may replace it), else None: one of the
        base's, which a fork never changes."""
        return self._new[-1] if self._new else None

    def replace_newest(self, w: C, max_commits: int, max_files: int) -> None:
        """`WinnersWindow.replace_newest` of the newest commit this fork appended."""
        self._files += w.num_file_actions - _replace_newest(self._new, self._marked, w).num_file_actions
        self._bound(max_commits, max_files)

    def _bound(self, max_commits: int, max_files: int) -> None:
        n = len(self)
        while n > 1 and (n > max_commits or self._files > max_files):
            if self._dropped < len(self._base):
                self._files -= self._base.at(self._dropped).num_file_actions
                self._dropped += 1
            else:
                self._files -= self._new.popleft().num_file_actions
            n -= 1

    def fork(self) -> ForkedWindow[C]:
        return ForkedWindow(self)

    def commit(self) -> None:
        """Make the base window this one (its base must be a `WinnersWindow`)."""
        base = self._base
        assert isinstance(base, WinnersWindow)
        base._take(self._dropped, self._new, self._files, self._marked)


class TxnIndex:
    """Proposal id -> committed version for the newest `limit` commits (oldest evicted first)."""

    __slots__ = ("_index", "_order", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._index: dict[str, int] = {}
        self._order: deque[str] = deque()

    def __len__(self) -> int:
        return len(self._order)

    def get(self, txn_id: str) -> int | None:
        return self._index.get(txn_id)

    @classmethod
    def of(cls, pairs: Sequence[tuple[str, int]], limit: int) -> TxnIndex:
        """An index holding the newest `limit` of `pairs` (txn id, version; oldest first), built in bulk."""
        idx = cls(limit)
        kept = pairs[max(0, len(pairs) - limit):] if limit else ()
        idx._index = dict(kept)
        idx._order = deque(t for t, _v in kept)
        return idx

    def order_at(self, i: int) -> str:
        """The i-th oldest id in the index."""
        return self._order[i]

    def remember(self, txn_id: str, version: int) -> None:
        if self.limit == 0:
            return
        if txn_id not in self._index:
            self._order.append(txn_id)
        self._index[txn_id] = version
        while len(self._order) > self.limit:
            self._index.pop(self._order.popleft(), None)

    def fork(self) -> ForkedTxnIndex:
        return ForkedTxnIndex(self)

    def _take(self, evicted: int, order: deque[str], new: dict[str, int]) -> None:
        for _ in range(evicted):
            self._index.pop(self._order.popleft(), None)
        self._order.extend(order)
        self._index.update(new)


class ForkedTxnIndex:
    """An index that hides the base's ids it has evicted and holds the ids remembered since the fork."""

    __slots__ = ("_base", "_evicted", "_n_evicted", "_new", "_order", "limit")

    def __init__(self, base: TxnIndex | ForkedTxnIndex) -> None:
        self._base = base
        self.limit: int = base.limit
        self._new: dict[str, int] = {}
        self._order: deque[str] = deque()  # ids first remembered since the fork, oldest first
        self._evicted: set[str] = set()
        self._n_evicted = 0  # the base's oldest ids hidden here

    def __len__(self) -> int:
        return len(self._base) - self._n_evicted + len(self._order)

    def get(self, txn_id: str) -> int | None:
        v = self._new.get(txn_id)
        if v is not None:
            return v
        if txn_id in self._evicted:
            return None
        return self._base.get(txn_id)

    def order_at(self, i: int) -> str:
        kept = len(self._base) - self._n_evicted
        return self._base.order_at(self._n_evicted + i) if i < kept else self._order[i - kept]

    def remember(self, txn_id: str, version: int) -> None:
        if self.limit == 0:
            return
        if self.get(txn_id) is None:
            self._order.append(txn_id)
        self._new[txn_id] = version
        while len(self._order) > self.limit - (len(self._base) - self._n_evicted):
            if self._n_evicted < len(self._base):
                old = self._base.order_at(self._n_evicted)
                self._n_evicted += 1
                self._evicted.add(old)
            else:
                old = self._order.popleft()
            self._new.pop(old, None)

    def fork(self) -> ForkedTxnIndex:
        return ForkedTxnIndex(self)

    def commit(self) -> None:
        """Make the base index this one (its base must be a `TxnIndex`)."""
        base = self._base
        assert isinstance(base, TxnIndex)
        base._take(self._n_evicted, self._order, self._new)


__all__ = ["ForkedTxnIndex", "ForkedWindow", "LayeredDict", "TxnIndex", "WinnersWindow"]
