"""How `CommitsTail` (and `PartitionScan`, a tail with an end) hands over what a fetch returned.

A fetch may hold records, error events and the end-of-partition event in one batch. The tail returns the
matching records up to the end event and the rest with the next poll (the change feed's "latest" start and a
scan whose end was moved depend on that order), reads on after passing errors and ends the read on the others
only after the records before them were returned. (A stand-in consumer serves the batches: the real broker's
behaviour is the change feed's and the scan's integration tests'.)
"""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

import deltacoord.schemas.commits_topic as commits_topic
from deltacoord.schemas.commits_topic import ENDED, CommitsTail, PartitionScan, read_on
from deltacoord.schemas.routing import H_TABLE_ID


class _Msg:
    """A fetched record (`table` set) or an error event (`err` set)."""

    def __init__(self, offset: int, table: bytes | None = None, err: int | None = None) -> None:
        self._offset, self._table, self._err = offset, table, err

    def error(self) -> KafkaError | None:
        return None if self._err is None else KafkaError(self._err)

    def offset(self) -> int:
        return self._offset

    def headers(self) -> list[tuple[str, bytes]]:
        return [] if self._table is None else [(H_TABLE_ID, self._table)]

    def value(self) -> bytes:
        return b"%d" % self._offset


def _eof(offset: int) -> _Msg:
    return _Msg(offset, err=KafkaError._PARTITION_EOF)


class _Consumer:
    """Serves `batches` in order (then nothing); its position is past the last record it served."""

    def __init__(self, end: int, batches: list[list[_Msg]]) -> None:
        self.end, self.batches, self.consumed, self.pos = end, list(batches), 0, 0

    def get_watermark_offsets(self, _tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        return 0, self.end

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.pos = partitions[0].offset

    def consume(self, _n: int, _timeout: float) -> list[_Msg]:
        self.consumed += 1
        batch = self.batches.pop(0) if self.batches else []
        if batch:
            self.pos = max(self.pos, max(m.offset() for m in batch) + 1)
        return batch

    def position(self, tps: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(tps[0].topic, tps[0].partition, self.pos)]

    def close(self) -> None:
        pass


def _serving(monkeypatch: pytest.MonkeyPatch, consumer: _Consumer) -> None:
    monkeypatch.setattr(commits_topic, "Consumer", lambda _config: consumer)


def _offsets(records: list[Any]) -> list[int]:
    return [m.offset() for m in records]


def test_records_after_the_end_event_come_with_the_next_poll(monkeypatch: pytest.MonkeyPatch) -> None:
    c = _Consumer(3, [[_Msg(0, b"A"), _Msg(1, b"B"), _eof(2), _Msg(2, b"A")]])
    _serving(monkeypatch, c)
    seen: list[int] = []
    with CommitsTail({}, "t.commits", 0, headers={H_TABLE_ID: {b"A"}},
                     on_record=lambda m: seen.append(m.offset() or 0)) as tail:
        first = tail.poll(1.0)
        assert _offsets(first.records) == [0] and first.at_end and first.count == 3
        assert seen == [0, 1], "on_record sees every record up to the end event, before the header filter"
        second = tail.poll(1.0)
        assert _offsets(second.records) == [2] and not second.at_end and second.count == 1
        assert c.consumed == 1, "the rest of the batch came without another fetch"
        assert tail.eof_at == 2 and seen == [0, 1, 2]
        empty = tail.poll(0.0)
        assert empty.records == [] and empty.count == 0 and not empty.at_end


def test_a_passing_error_is_read_past_and_an_ending_one_raised_after_the_records_before_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    c = _Consumer(9, [[_Msg(0, b"A"), _Msg(1, err=KafkaError._TRANSPORT), _Msg(2, b"A"),
                       _Msg(3, err=KafkaError.TOPIC_AUTHORIZATION_FAILED), _Msg(4, b"A")]])
    _serving(monkeypatch, c)
    with CommitsTail({}, "t.commits", 0) as tail:
        assert _offsets(tail.poll(1.0).records) == [0, 2]
        for _ in range(2):  # and on every later poll: the read is not whole any more
            with pytest.raises(KafkaException) as ei:
                tail.poll(1.0)
            assert ei.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        assert c.consumed == 1


def test_an_ending_error_with_no_record_before_it_raises_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    _serving(monkeypatch, _Consumer(9, [[_Msg(0, err=KafkaError.UNKNOWN_TOPIC_OR_PART), _Msg(1, b"A")]]))
    with CommitsTail({}, "t.commits", 0) as tail, pytest.raises(KafkaException):
        tail.poll(1.0)


def test_a_scan_whose_end_moved_reads_what_followed_the_end_event(monkeypatch: pytest.MonkeyPatch) -> None:
    # The scan began with end 3, and was moved to 4 (a reader that must not split a transaction). The fetch ran
    # past the end event: the consumer's position already passed the moved end, yet offset 3 is the scan's.
    _serving(monkeypatch, _Consumer(3, [[_Msg(0, b"A"), _Msg(1, b"A"), _eof(2), _Msg(3, b"A"), _Msg(4, b"A")]]))
    with PartitionScan({}, "t.commits", 0, deadline_s=30) as scan:
        scan.end = 4
        assert _offsets(list(scan)) == [0, 1, 3]


@pytest.mark.parametrize("code", sorted(ENDED))
def test_what_ends_a_read(code: int) -> None:
    assert not read_on(KafkaError(code))


@pytest.mark.parametrize("code", [KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN,
                                  KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.REQUEST_TIMED_OUT])
def test_what_a_read_goes_on_after(code: int) -> None:
    assert read_on(KafkaError(code))
    assert not read_on(KafkaError(code, fatal=True)), "a fatal error ends it"
