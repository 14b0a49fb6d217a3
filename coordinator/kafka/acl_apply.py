"""Apply an ACL plan (`deltacoord.coordinator.kafka.acls`) to a broker through the admin API (CreateAcls).

Creating an ACL that exists already is a no-op in Kafka, so applying a plan twice is safe.
The admin client's principal needs ALTER on the cluster (a super user does).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from deltacoord.coordinator.kafka.acls import AclEntry
from deltacoord.schemas.errors import DeltaCoordError


class AclApplyError(DeltaCoordError, RuntimeError):
    """The broker refused or could not be asked to create some ACLs; the message names each."""


def _binding(e: AclEntry) -> Any:
    # The admin package re-exports these without declaring them (mypy strict): import them where they live.
    from confluent_kafka.admin._acl import AclBinding, AclOperation, AclPermissionType
    from confluent_kafka.admin._resource import ResourcePatternType, ResourceType

    return AclBinding(ResourceType[e.resource_type], e.name, ResourcePatternType[e.pattern_type], e.principal, e.host,
                      AclOperation[e.operation], AclPermissionType[e.permission])


def apply_acls(entries: Iterable[AclEntry], client_config: Mapping[str, Any], timeout_s: float = 30.0) -> int:
    """Create every entry's ACL on the cluster `client_config` reaches; returns how many were sent."""
    from confluent_kafka.admin import AdminClient

    bindings = [_binding(e) for e in entries]
    if not bindings:
        return 0
    admin = AdminClient(dict(client_config))
    futures = admin.create_acls(bindings, request_timeout=timeout_s)
    failed: list[str] = []
    for binding, fut in futures.items():
        try:
            fut.result(timeout=timeout_s)
        except Exception as e:
            failed.append(f"{binding.principal} {binding.operation} on {binding.restype} {binding.name}: {e}")
    if failed:
        raise AclApplyError(f"the broker did not create {len(failed)} of {len(bindings)} ACLs (the admin principal "
                            "needs ALTER on the cluster):\n  " + "\n  ".join(failed))
    return len(bindings)
