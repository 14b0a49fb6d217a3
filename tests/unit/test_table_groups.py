"""Table groups: an id `<group>::<name>` is routed by its group, so every table of a group shares a partition;
any other id (a URI, even one with `::` in an IPv6 host) keeps its own route."""

from __future__ import annotations

import pytest

from deltacoord.schemas.routing import grouped_table_id, murmur2, partition_for, table_group


def _own(table_id: str, n: int) -> int:
    return (murmur2(table_id.encode()) & 0x7FFFFFFF) % n


def test_the_tables_of_a_group_share_the_groups_partition() -> None:
    for n in (1, 3, 16, 64):
        homes = {partition_for(grouped_table_id("ledger", f"t{i}"), n) for i in range(50)}
        assert homes == {_own("ledger", n)}
    assert len({partition_for(grouped_table_id(f"g{i}", "t"), 64) for i in range(50)}) > 1, "groups spread"


@pytest.mark.parametrize("table_id", ["file:///lake/t", "s3://[::1]:9000/bucket/t", "::t", "g::", "a b::t", "tbl-orders"])
def test_ids_that_name_no_group_keep_their_own_route(table_id: str) -> None:
    assert table_group(table_id) is None
    assert partition_for(table_id, 16) == _own(table_id, 16)


@pytest.mark.parametrize(("group", "name"), [("", "t"), ("a::b", "t"), ("s3://x", "t"), ("g", "")])
def test_a_bad_group_or_name_is_refused_with_what_a_group_is(group: str, name: str) -> None:
    with pytest.raises(ValueError, match="letters, digits"):
        grouped_table_id(group, name)
