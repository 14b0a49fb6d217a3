"""Holds: an expensive proposal is decided off the deciding thread while its partition's other tables go on.

Loading and deciding a commit of 100,000 files by reference, or conflict checks over huge read predicates, takes
the deciding thread seconds; every other table of the partition would wait that long. Such a proposal (`expensive`)
is *held* instead: a worker thread loads, validates, decides and stages it (the same `BatchChecks.decide`, the rules
pure as ever), while the loop decides the partition's other tables. What comes later for a held table (a proposal,
a multi-table transaction naming it, an adopt, release or drop request) waits behind it in offset order (`waiting`),
and is decided once the hold's decision is recorded, in the partition's order of decision.

Exactly once is kept by the offset each transaction records (`floor`): never past the first proposal not yet
decided, so a restart consumes the held proposal and everything after it again; what was decided meanwhile is
answered from the decided-ids window. The decisions recorded past a held offset are therefore bounded
(`runahead_limit`, below the window): at the bound the loop waits for the hold. One hold at a time per partition: a
second expensive proposal waits behind the first, its table with it.

A hold's fixed cost (a thread, a Kafka transaction of its own) is kept small against its work: read predicates count
only as far as sqlglot would parse them (what the rules refuse unparsed is cheap, decided in the batch), and a hold
takes the messages of its table that directly follow its proposal (`joins`), expensive or not, deciding them in order
and recording them in one transaction, so a flood for one table costs a hold per batch, not per proposal.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Message

from deltacoord.coordinator.kafka.door import Decoded
from deltacoord.coordinator.settings import CoordinatorSettings
from deltacoord.schemas.expressions.syntax import parsed_chars
from deltacoord.schemas.messages import Proposal

#: Why a proposal is held (the `deltacoord_holds_total` metric's label).
ACTIONS, PREDICATES = "actions", "predicates"


def expensive(p: Proposal, settings: CoordinatorSettings) -> str | None:
    """Why deciding `p` would hold the deciding thread long (ACTIONS, PREDICATES), or None."""
    if p.staged is not None and p.staged.count >= settings.hold_min_actions:
        return ACTIONS
    least = settings.hold_predicate_chars
    if least and sum(len(s) for s in p.read_predicates) >= least and parsed_chars(p.read_predicates) >= least:
        return PREDICATES  # only what sqlglot would parse counts: what the rules refuse unparsed is cheap
    return None


def in_thread(work: Callable[[list[Decoded]], Any], xs: list[Decoded], future: Future[Any]) -> None:
    """`work(xs)` into `future` on a daemon thread of its own (a process that stops does not wait for a hold: what it
    decided is decided again by the next owner)."""

    def run() -> None:
        try:
            future.set_result(work(xs))
        except BaseException as e:  # handed to the deciding thread, which raises it
            future.set_exception(e)

    threading.Thread(target=run, name=f"deltacoord-hold-{xs[0].offset}", daemon=True).start()


def tables_of(x: Decoded) -> set[str]:
    """The tables a consumed message names (its proposals', its rejections')."""
    return {s.proposal.table_id for s in x.all_submitted()} | {d.table_id for d in x.all_rejected()}


def joins(x: Decoded, held: set[str]) -> bool:
    """Whether `x`, right after a message that starts a hold of the tables `held`, is decided in that hold: it names
    no other table (a dead letter names none), is no request, and is no large commit (one loaded at a time: memory)."""
    return x.request is None and x.resume is None and x.expensive != ACTIONS and tables_of(x) <= held


@dataclass
class Behind:
    """The tables named by messages that wait (behind a hold, or set aside in the batch being decided) and whether a
    resume request is among them, kept as they are added: a message is checked against thousands waiting at once."""

    tables: set[str] = field(default_factory=set)
    resume: bool = False
    count: int = 0

    def add(self, x: Decoded) -> None:
        self.tables |= tables_of(x)
        self.resume = self.resume or x.resume is not None
        self.count += 1


@dataclass
class Hold:
    """Messages of one table decided together on a worker thread: an expensive proposal and the messages that directly
    follow it (`joins`), so a flood of expensive proposals for one table takes one hold, and one transaction, per
    batch rather than per proposal."""

    items: list[tuple[Message, Decoded]]
    why: str
    future: Future[Any]
    consumed_at: float
    since: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tables: set[str] = set().union(*(tables_of(x) for _m, x in self.items))

    @property
    def offset(self) -> int:
        return self.items[0][1].offset

    @property
    def table_id(self) -> str:
        return next(iter(tables_of(self.items[0][1])), "")


@dataclass
class Holds:
    """A partition's hold, the messages waiting behind it, and the decisions recorded past the first undecided offset."""

    runahead_limit: int
    hold: Hold | None = None
    #: Consumed messages not decided yet, in offset order: each names a held table, or comes after a resume request
    #: that waits. Added to through `wait`, which keeps `behind`.
    waiting: list[tuple[Message, Decoded]] = field(default_factory=list)
    behind: Behind = field(default_factory=Behind)
    #: Decisions recorded since an offset was last left undecided (reset once everything consumed is decided).
    runahead: int = 0
    #: Counts rebuilds of the partition (`reset`), from 1: what waited before one is consumed again, not kept.
    generation: int = 1

    def start(self, items: list[tuple[Message, Decoded]], why: str, work: Callable[[list[Decoded]], Any],
              consumed_at: float) -> Hold:
        self.hold = Hold(items, why, Future(), consumed_at)  # before the worker starts: it may read `describe`
        in_thread(work, [x for _m, x in items], self.hold.future)
        return self.hold

    def open(self) -> bool:
        return self.hold is not None or bool(self.waiting)

    def wait(self, items: Sequence[tuple[Message, Decoded]], first: bool = False) -> None:
        """`items` wait (after those waiting, or before them when `first`: a hold's messages not recorded)."""
        self.waiting = [*items, *self.waiting] if first else [*self.waiting, *items]
        for _m, x in items:
            self.behind.add(x)

    def blocks(self, x: Decoded, aside: Behind | None = None) -> bool:
        """Whether `x` must wait: it names a held or waiting table (or one `aside`, set aside in the batch being
        decided), or it is a resume request, or one waits (a resumption rebuilds the partition: nothing passes it)."""
        aside = aside or Behind()
        if self.hold is None and not self.waiting and not aside.count:
            return False
        if x.resume is not None or self.behind.resume or aside.resume:
            return True
        named = tables_of(x)
        return bool(named & self.behind.tables or named & aside.tables
                    or (self.hold is not None and named & self.hold.tables))

    def floor(self, deferred: Sequence[Decoded] = ()) -> int | None:
        """The first offset not decided: the highest a transaction may record as consumed (None: no limit)."""
        offsets = [x.offset for _m, x in self.waiting] + [x.offset for x in deferred]
        if self.hold is not None:
            offsets.append(self.hold.offset)
        return min(offsets, default=None)

    def recorded(self, decisions: int) -> None:
        """A transaction recorded `decisions` decisions."""
        self.runahead = self.runahead + decisions if self.open() else 0

    def at_limit(self, pending: int = 0) -> bool:
        """Whether no more decisions may pass the first undecided offset, with `pending` about to be (the loop waits
        for the hold)."""
        return self.open() and self.runahead + pending >= self.runahead_limit

    def take_waiting(self) -> list[tuple[Message, Decoded]]:
        out, self.waiting, self.behind = self.waiting, [], Behind()
        return out

    def reset(self) -> None:
        """Forget the hold and what waits (the partition is rebuilt: they are consumed again). A worker still running
        finishes unseen."""
        self.hold, self.waiting, self.behind, self.runahead = None, [], Behind(), 0
        self.generation += 1

    def describe(self, now: float | None = None) -> dict[str, object] | None:
        """What `/healthz` shows of the hold: its table, offset, why, how long, how many wait behind it."""
        h = self.hold
        if h is None and not self.waiting:
            return None
        t = time.monotonic() if now is None else now
        out: dict[str, object] = {"waiting": len(self.waiting), "decided_past": self.runahead}
        if h is not None:
            out.update({"table": h.table_id, "offset": h.offset, "why": h.why, "messages": len(h.items),
                        "seconds": round(t - h.since, 1)})
        return out
