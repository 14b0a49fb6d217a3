"""Rules a proposal must keep because of the table features its protocol declares (or lacks), pure.

PROTOCOL.md makes some actions legal only on tables whose protocol names the feature they belong to;
a commit that writes them anyway is one Delta Spark refuses and other engines may misread. Each rule
is one small function `(protocol in force after the commit, proposal) -> InvalidProposalError | None`,
called by validation (`validate.py`) with the protocol the commit leaves: the table's, or the one
the proposal itself sets, so a commit that adds a feature may use it at once. Which features have such a
rule, and what it refuses, is the table of features' `coordinator` column
(`deltacoord.schemas.table_features.FEATURES`); `RULES` holds one rule per feature named there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from deltacoord.schemas.actions import DomainMetadata, Metadata, Protocol
from deltacoord.schemas.errors import InvalidProposalError
from deltacoord.schemas.messages import Proposal
from deltacoord.schemas.properties import Property, TableProperties
from deltacoord.schemas.reasons import ReasonCode
from deltacoord.schemas.table_features import CONSTRAINT_PREFIX, COORDINATED, FEATURES, coordinated, writer_features

DOMAIN_METADATA = FEATURES["domainMetadata"].name
CHECK_CONSTRAINTS = FEATURES["checkConstraints"].name


def _described(protocol: Protocol | None) -> str:
    if protocol is None:
        return "no protocol"
    return (f"protocol ({protocol.min_reader_version}, {protocol.min_writer_version}) with writer features "
            f"{list(writer_features(protocol))}")


def domain_metadata_error(protocol: Protocol | None, proposal: Proposal) -> InvalidProposalError | None:
    """`domainMetadata` actions need the `domainMetadata` writer feature (PROTOCOL.md, "Domain Metadata";
    Delta Spark's DELTA_DOMAIN_METADATA_NOT_SUPPORTED)."""
    domains = sorted({a.domain for a in proposal.actions if isinstance(a, DomainMetadata)})
    if not domains:
        return None
    if protocol is not None and DOMAIN_METADATA in writer_features(protocol):
        return None
    have = _described(protocol)
    return InvalidProposalError(
        ReasonCode.MISSING_TABLE_FEATURE,
        f"the commit writes domainMetadata for domains {domains}, but the table's {have} lacks the "
        f"{DOMAIN_METADATA} writer feature. Add the feature to the protocol first (or in the same commit: a "
        f"protocol action at writer version 7 listing {DOMAIN_METADATA})")


def check_constraints_error(protocol: Protocol | None, proposal: Proposal) -> InvalidProposalError | None:
    """A metaData action with CHECK constraints (`delta.constraints.*`) needs the `checkConstraints` writer feature
    (PROTOCOL.md, "Check Constraints"): without it other writers do not enforce them (Delta Spark upgrades the
    protocol when a constraint is added)."""
    metadata = [a for a in proposal.actions if isinstance(a, Metadata)]
    names = sorted({k for md in metadata for k in md.configuration if k.lower().startswith(CONSTRAINT_PREFIX)})
    if not names or (protocol is not None and CHECK_CONSTRAINTS in writer_features(protocol)):
        return None
    have = _described(protocol)
    return InvalidProposalError(
        ReasonCode.MISSING_TABLE_FEATURE,
        f"the commit's metaData declares CHECK constraints {names}, but the table's {have} lacks the "
        f"{CHECK_CONSTRAINTS} writer feature. Put it in the protocol in the same commit (writer version 3 or more, or "
        f"writer version 7 listing {CHECK_CONSTRAINTS})")


#: The operation of the one commit that may take the `deltacoord-coordinated` feature out (`Table.release` commits it).
DROP_FEATURE = "DROP FEATURE"


def coordinated_feature_error(before: Protocol | None, after: Protocol | None,
                              proposal: Proposal) -> InvalidProposalError | None:
    """A protocol change that drops the project's own writer feature `deltacoord-coordinated` from a table that has
    it is refused unless it is the DROP FEATURE commit `release` makes just before releasing: without the feature,
    Delta on Spark and delta-rs would write the still-coordinated table around the coordinator (and halt it)."""
    if before is None or after is None or not coordinated(before) or coordinated(after):
        return None
    if proposal.operation == DROP_FEATURE:
        return None
    return InvalidProposalError(
        ReasonCode.MISSING_TABLE_FEATURE,
        f"the commit ({proposal.operation}) sets a protocol without the {COORDINATED} writer feature the coordinated "
        f"table has ({_described(before)}): Delta writers that do not go through deltacoord would then write it. Keep "
        f"the feature in the protocol; it is removed only when the table is released (`deltacoord table release`)")


def append_only_error(metadata: Metadata | None, removes_data: bool) -> InvalidProposalError | None:
    """A commit that removes data (a remove with dataChange=true) from a table with `delta.appendOnly=true`
    (PROTOCOL.md, "Append-only Tables": new log entries must not change or remove data)."""
    if removes_data and TableProperties.of(metadata).append_only:
        return InvalidProposalError(ReasonCode.APPEND_ONLY,
                                    f"the table is append-only ({Property.APPEND_ONLY}=true) and cannot remove data")
    return None


#: The coordinator's rule for each feature whose `coordinator` column names one, keyed by feature.
RULES: Mapping[str, Callable[..., InvalidProposalError | None]] = {
    FEATURES["appendOnly"].name: append_only_error,
    DOMAIN_METADATA: domain_metadata_error,
    CHECK_CONSTRAINTS: check_constraints_error,
    COORDINATED: coordinated_feature_error,
}


__all__ = ["CHECK_CONSTRAINTS", "DOMAIN_METADATA", "DROP_FEATURE", "RULES", "append_only_error", "check_constraints_error",
           "coordinated_feature_error", "domain_metadata_error"]
