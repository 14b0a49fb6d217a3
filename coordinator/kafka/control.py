"""Control records on the commits topic: a table's halt and resumption, adoption and release, persisted like decisions.

A halt must survive restarts, and only the partition's transactional producer
writes the commits topic, in order with the decisions. So a halt is recorded
as a rejected `Decision` of the CommitDecision schema (no schema change: older
readers see one more rejection), marked twice so nobody mistakes it for the
answer to a proposal: header `deltacoord.control` = `halt` or `resume`, and
`error_type` `TableHalted` / `TableResumed`. Its proposal id is
`deltacoord-control:<kind>:<uuid>`, which no writer waits for; change feeds
skip it (it is not COMMITTED). `reason_code` of a halt is `TABLE_HALTED`,
`error_message` says why and `winning_version` is the table's ratified head
when it halted. Recovery folds them: a table whose last control record is a
halt stays halted.

An operator resumes a table with `deltacoord table resume`, which sends a
message with header `deltacoord.control: resume` (and the table id header, no
value) to the table's proposals partition; the coordinator records the
resumption and rebuilds the partition (as at a restart), which republishes
what the halt held back and halts again if the cause is still there.

Adoption and release (`deltacoord table adopt|release`) are requests of the
same kind, sent as proposals without actions (header `deltacoord.control` =
`adopt` or `release`, proposal id `deltacoord-control:<kind>:<uuid>`, so the
writer's reply machinery waits for them like for any proposal). The answer is
a control record with that proposal id: `TableAdopted` with `winning_version`
the adopted version N (recovery reloads the table's published log at N:
`deltacoord.coordinator.delta_log.adoption`), or `TableReleased` with the head the
coordinator hands back; or an ordinary rejection saying why not. A drop (`deltacoord table drop`, Delta's DROP TABLE for a path table) is a request of the same kind
(`drop`): the answer `TableDropped` (with `winning_version` the head the table was dropped at) makes the
coordinator forget the table for good, recovery and state snapshots included, so a table created later at the
same location, even under the same table id, starts from nothing; with the operation parameter
`deleteFiles` = `true` the coordinator deleted the table's files before recording it.
The answer is remembered with the partition's
decided ids (`deltacoord.coordinator.rules.decided`), so a request id that comes again, a resend or a captured request
replayed later, gets it again as a record marked `duplicate_of`, which recovery folds as nothing.
"""

from __future__ import annotations

import uuid

from deltacoord.schemas.messages import Decision, Outcome
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.routing import (
    ADOPTED_ERROR_TYPE,
    CONTROL_ADOPT,
    CONTROL_DROP,
    CONTROL_PREFIX,
    CONTROL_RELEASE,
    DROPPED_ERROR_TYPE,
    RELEASED_ERROR_TYPE,
)

HALT, RESUME, ADOPT, RELEASE, DROP = "halt", "resume", CONTROL_ADOPT, CONTROL_RELEASE, CONTROL_DROP
HALT_ERROR_TYPE, RESUME_ERROR_TYPE = "TableHalted", "TableResumed"
_KINDS = {HALT_ERROR_TYPE: HALT, RESUME_ERROR_TYPE: RESUME, ADOPTED_ERROR_TYPE: ADOPT, RELEASED_ERROR_TYPE: RELEASE,
          DROPPED_ERROR_TYPE: DROP}
#: A halt's reason is cut to this length on the commits topic.
MAX_WHY_CHARS = 4000


def halt_record(table_id: str, table_uri: str, why: str, head: int, now_ms: int) -> Decision:
    """The record that halts `table_id` (ratified up to `head`) for `why`."""
    return Decision(table_id=table_id, table_uri=table_uri, proposal_id=f"{CONTROL_PREFIX}{HALT}:{uuid.uuid4()}",
                    outcome=Outcome.REJECTED, error_type=HALT_ERROR_TYPE, error_message=why[:MAX_WHY_CHARS],
                    reason_code=ReasonCode.TABLE_HALTED.value, winning_version=head, decided_at_ms=now_ms)


def resume_record(table_id: str, table_uri: str, head: int, now_ms: int) -> Decision:
    """The record that lifts a halt of `table_id`."""
    return Decision(table_id=table_id, table_uri=table_uri, proposal_id=f"{CONTROL_PREFIX}{RESUME}:{uuid.uuid4()}",
                    outcome=Outcome.REJECTED, error_type=RESUME_ERROR_TYPE,
                    error_message="resumed by an operator", winning_version=head, decided_at_ms=now_ms)


def adoption_record(table_id: str, table_uri: str, request_id: str, version: int, why: str, now_ms: int) -> Decision:
    """The record that puts `table_id` under coordination at `version` (answering the request `request_id`)."""
    return Decision(table_id=table_id, table_uri=table_uri, proposal_id=request_id, outcome=Outcome.REJECTED,
                    error_type=ADOPTED_ERROR_TYPE, error_message=why[:MAX_WHY_CHARS], winning_version=version,
                    decided_at_ms=now_ms)


def release_record(table_id: str, table_uri: str, request_id: str, head: int, now_ms: int) -> Decision:
    """The record that hands `table_id` (coordinated and published up to `head`) back to uncoordinated writers."""
    return Decision(table_id=table_id, table_uri=table_uri, proposal_id=request_id, outcome=Outcome.REJECTED,
                    error_type=RELEASED_ERROR_TYPE, error_message=(
                        f"released at version {head}: the coordinator no longer decides this table's commits"),
                    winning_version=head, decided_at_ms=now_ms)


def drop_record(table_id: str, table_uri: str, request_id: str, head: int, why: str, now_ms: int) -> Decision:
    """The record that makes the coordinator forget `table_id` (ratified up to `head`) for good."""
    return Decision(table_id=table_id, table_uri=table_uri, proposal_id=request_id, outcome=Outcome.REJECTED,
                    error_type=DROPPED_ERROR_TYPE, error_message=why[:MAX_WHY_CHARS], winning_version=head,
                    decided_at_ms=now_ms)


def is_request_id(proposal_id: str, kind: str) -> bool:
    """Whether a control request's proposal id has the form its answer must have (`deltacoord-control:<kind>:...`)."""
    return proposal_id.startswith(f"{CONTROL_PREFIX}{kind}:") and len(proposal_id) > len(CONTROL_PREFIX) + len(kind) + 1


def control_kind(d: Decision) -> str | None:
    """`halt`, `resume`, `adopt`, `release`, `drop`, or None for the decision of a proposal."""
    if d.committed or not d.proposal_id.startswith(CONTROL_PREFIX):
        return None
    return _KINDS.get(d.error_type or "")



def request_resume(settings_client: dict[str, object], proposals_topic: str, table_id: str, timeout_s: float = 30.0) -> int:
    """Ask the coordinator owning `table_id` to resume it: a control message on the table's proposals partition.

    `settings_client` is a Kafka client config (bootstrap servers, security). Returns the partition.
    """
    from confluent_kafka import KafkaException, Producer

    from deltacoord.schemas.routing import H_CONTROL, H_TABLE_ID, partition_for

    producer = Producer({**settings_client, "enable.idempotence": True, "acks": "all"})
    md = producer.list_topics(proposals_topic, timeout=timeout_s)
    topic = md.topics.get(proposals_topic)
    if topic is None or topic.error is not None or not topic.partitions:
        raise ValueError(f"the proposals topic {proposals_topic} was not found: check --bootstrap-servers and --topic-prefix")
    partition = partition_for(table_id, len(topic.partitions))
    errors: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    producer.produce(proposals_topic, value=None, key=table_id.encode(), partition=partition,
                     headers=[(H_CONTROL, RESUME.encode()), (H_TABLE_ID, table_id.encode())], on_delivery=delivered)
    left = producer.flush(timeout_s)
    if left or errors:
        raise KafkaException(f"the resume request was not delivered: {errors or 'timed out'}")
    return partition


__all__ = ["ADOPT", "CONTROL_PREFIX", "DROP", "HALT", "RELEASE", "RESUME", "adoption_record", "control_kind", "drop_record", "halt_record",
           "is_request_id", "release_record", "request_resume", "resume_record"]
