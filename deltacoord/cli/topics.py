"""`deltacoord topics create|describe`: provision and inspect the four topics with durable settings.

`create` refuses settings that can lose ratified commits unless `--allow-unsafe`:

* replication factor below 3 (one disk or broker loss can take the only copies),
* min.insync.replicas below 2 (an acks=all write may then live on one broker only),
* min.insync.replicas equal to or above the replication factor (any broker
  outage stops every commit: availability, not durability, but never what you want).

The commits topic is the source of truth: it is never compacted
(cleanup.policy=delete) and keeps its records forever (retention.ms=-1,
retention.bytes=-1). If you ever give it a finite retention, the rule is: the
retention must reach back at least to the newest checkpoint of every table (a
coordinator rebuilds a table from the commits topic; versions that are gone
from Kafka must be covered by a checkpoint in `_delta_log`). Infinite is the
default and the only setting that needs no bookkeeping. Unclean leader election
is disabled on all four topics. The dead-letter topic gets explicit limits
(max.message.bytes 1 MiB, retention.bytes 1 GiB, four weeks); `describe` and
`create` report a dead-letter topic too small for the largest dead letter the
coordinator may send (`dead_letter_max_bytes` plus key and headers).

The pure parts (`check_replication`, `create_specs`, `topic_problems`) carry
the rules; the commands only add the admin client.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from deltacoord.coordinator.kafka.topics import (
    DEFAULT_REPLY_PARTITIONS,
    TopicSpec,
    dead_letter_limit_problem,
    topic_specs,
)
from deltacoord.schemas.routing import Topics

SAFE_REPLICATION_FACTOR = 3
SAFE_MIN_INSYNC_REPLICAS = 2
#: Large enough for a 4 MiB proposal (`CoordinatorSettings.max_proposal_bytes`) and its decision.
DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
#: Configs `describe` always reports (others only when not at their default).
KEY_CONFIGS = (
    "cleanup.policy", "retention.ms", "retention.bytes", "min.insync.replicas", "unclean.leader.election.enable",
    "max.message.bytes",
)


class UnsafeTopicSettingsError(ValueError):
    """The requested replication settings can lose or block commits."""


@dataclass(frozen=True)
class TopicState:
    """What the cluster says about one topic (`exists=False`: the rest is empty)."""

    name: str
    exists: bool
    partitions: int = 0
    replication_factor: int = 0
    configs: Mapping[str, str | None] = field(default_factory=dict)
    error: str | None = None


# -- pure rules --------------------------------------------------------------------
def default_min_insync_replicas(replication_factor: int) -> int:
    """A majority of the replicas: 2 of 3, 3 of 4 or 5."""
    return max(1, replication_factor // 2 + 1)


def invalid_settings(partitions: int, replication_factor: int, min_insync_replicas: int) -> list[str]:
    """Settings no flag can make acceptable."""
    out = []
    if partitions < 1:
        out.append(f"--partitions {partitions}: need at least 1 partition")
    if replication_factor < 1:
        out.append(f"--replication-factor {replication_factor}: need at least 1 replica")
    if min_insync_replicas < 1:
        out.append(f"--min-insync-replicas {min_insync_replicas}: need at least 1")
    if replication_factor >= 1 and min_insync_replicas > replication_factor:
        out.append(
            f"--min-insync-replicas {min_insync_replicas} > --replication-factor {replication_factor}: "
            "every acks=all write would fail with NOT_ENOUGH_REPLICAS"
        )
    return out


def unsafe_settings(replication_factor: int, min_insync_replicas: int) -> list[str]:
    """Why these replication settings are unsafe for a commit log (empty: safe)."""
    out = []
    if replication_factor < SAFE_REPLICATION_FACTOR:
        out.append(
            f"replication factor {replication_factor} < {SAFE_REPLICATION_FACTOR} (--replication-factor): losing "
            f"{replication_factor} broker(s) can lose ratified commits"
        )
    if min_insync_replicas < SAFE_MIN_INSYNC_REPLICAS:
        out.append(
            f"min.insync.replicas {min_insync_replicas} < {SAFE_MIN_INSYNC_REPLICAS} (--min-insync-replicas): an "
            "acknowledged commit may exist on a single broker"
        )
    if min_insync_replicas >= replication_factor:
        out.append(
            f"min.insync.replicas {min_insync_replicas} >= replication factor {replication_factor} "
            "(--min-insync-replicas): one broker down stops every commit"
        )
    return out


def check_replication(partitions: int, replication_factor: int, min_insync_replicas: int, *,
                      allow_unsafe: bool = False) -> list[str]:
    """Raise `UnsafeTopicSettingsError` for invalid settings, and for unsafe ones unless allowed.

    Returns the unsafe settings that `allow_unsafe` let through (to print as warnings).
    """
    invalid = invalid_settings(partitions, replication_factor, min_insync_replicas)
    if invalid:
        raise UnsafeTopicSettingsError("; ".join(invalid))
    unsafe = unsafe_settings(replication_factor, min_insync_replicas)
    if unsafe and not allow_unsafe:
        raise UnsafeTopicSettingsError(
            "refusing unsafe topic settings: " + "; ".join(unsafe) + ". Pass --allow-unsafe for a test cluster."
        )
    return unsafe


def create_specs(topics: Topics, partitions: int, replication_factor: int, min_insync_replicas: int,
                 max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
                 reply_partitions: int = DEFAULT_REPLY_PARTITIONS) -> list[TopicSpec]:
    """`deltacoord.coordinator.kafka.topics.topic_specs` with the chosen min ISR and message size limit."""
    out = []
    for s in topic_specs(topics, partitions, replication_factor, reply_partitions):
        cfg = {**s.config, "min.insync.replicas": str(min_insync_replicas), "unclean.leader.election.enable": "false"}
        if s.name != topics.dead_letters:  # the dead-letter topic keeps its own explicit limit
            cfg["max.message.bytes"] = str(max_message_bytes)
        if s.name == topics.commits:
            # The source of truth: never compacted, never expired (see the module docstring).
            cfg.update({"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"})
        out.append(TopicSpec(s.name, s.partitions, s.replication_factor, cfg))
    return out


def spec_differences(spec: TopicSpec, state: TopicState) -> list[str]:
    """How an existing topic differs from what `create` would have made."""
    if not state.exists:
        return [f"{spec.name} does not exist"]
    out = []
    if state.partitions != spec.partitions:
        out.append(f"{spec.name} has {state.partitions} partitions, not {spec.partitions}")
    if state.replication_factor != spec.replication_factor:
        out.append(f"{spec.name} has replication factor {state.replication_factor}, not {spec.replication_factor}")
    for k, v in spec.config.items():
        if k in state.configs and state.configs[k] != v:
            out.append(f"{spec.name} has {k}={state.configs[k]}, not {v}")
    return out


def topic_problems(topics: Topics, states: Mapping[str, TopicState],
                   dead_letter_bound: int | None = None) -> tuple[list[str], list[str]]:
    """(problems that break the coordinator, durability warnings) for the described topics.

    With `dead_letter_bound` (the largest dead letter the coordinator sends), a dead-letter
    topic whose max.message.bytes is below it is a problem.
    """
    problems: list[str] = []
    per_topic: list[tuple[str, str]] = []  # (topic, warning): one line per warning, naming every topic it is about
    warnings: list[str] = []
    dl = states.get(topics.dead_letters)
    if dead_letter_bound is not None and dl is not None and dl.exists:
        problem = dead_letter_limit_problem(topics.dead_letters, dl.configs, dead_letter_bound)
        if problem:
            problems.append(problem)
    for name in (topics.proposals, topics.commits, topics.dead_letters, topics.replies):
        st = states.get(name)
        if st is None or not st.exists:
            problems.append(f"{name} does not exist" + (f" ({st.error})" if st is not None and st.error else ""))
            continue
        if st.error:
            per_topic.append((name, st.error))
        rf = st.replication_factor
        isr_raw = st.configs.get("min.insync.replicas")
        isr = int(isr_raw) if isr_raw is not None and isr_raw.isdigit() else None
        if isr is not None:
            per_topic.extend((name, u) for u in unsafe_settings(rf, isr))
        elif rf < SAFE_REPLICATION_FACTOR:
            per_topic.append((name, f"replication factor {rf} < {SAFE_REPLICATION_FACTOR}"))
        if st.configs.get("unclean.leader.election.enable") == "true":
            per_topic.append((name, "unclean.leader.election.enable=true can silently drop acknowledged records"))
    for text in dict.fromkeys(w for _, w in per_topic):
        names = [n for n, w in per_topic if w == text]
        warnings.append(f"{', '.join(names)}: {text}")
    p, c = states.get(topics.proposals), states.get(topics.commits)
    if p is not None and c is not None and p.exists and c.exists and p.partitions != c.partitions:
        problems.append(
            f"{topics.proposals} has {p.partitions} partitions but {topics.commits} has {c.partitions}: "
            "a table's proposals and decisions must share a partition index"
        )
    if c is not None and c.exists:
        policy = c.configs.get("cleanup.policy") or ""
        if "compact" in policy:
            problems.append(f"{topics.commits} has cleanup.policy={policy}: the commits topic must never be compacted")
        if c.configs.get("retention.ms") not in (None, "-1"):
            warnings.append(
                f"{topics.commits} has retention.ms={c.configs.get('retention.ms')}: it must reach back to the newest "
                "checkpoint of every table, or coordinators cannot rebuild those tables"
            )
        if c.configs.get("retention.bytes") not in (None, "-1"):
            warnings.append(f"{topics.commits} has retention.bytes={c.configs.get('retention.bytes')}: size-based "
                            "deletion can remove versions no checkpoint covers")
    return problems, warnings


# -- cluster access ------------------------------------------------------------------
def describe_states(admin: Any, names: Sequence[str]) -> dict[str, TopicState]:
    """Partition count, replication factor and configs (key ones plus non-defaults) of each topic."""
    from confluent_kafka.admin import ConfigResource  # type: ignore[attr-defined]

    md = admin.list_topics(timeout=30)
    out: dict[str, TopicState] = {}
    present = []
    for n in names:
        t = md.topics.get(n)
        if t is None or t.error is not None:
            out[n] = TopicState(n, False, error=None if t is None else str(t.error))
            continue
        rfs = {len(p.replicas) for p in t.partitions.values()}
        out[n] = TopicState(n, True, len(t.partitions), min(rfs) if rfs else 0)
        present.append(n)
    if present:
        futures = admin.describe_configs([ConfigResource("topic", n) for n in present])
        for res, fut in futures.items():
            st = out[res.name]
            try:
                entries = fut.result(30)
            except Exception as e:
                out[res.name] = TopicState(st.name, True, st.partitions, st.replication_factor, {}, f"describe_configs: {e}")
                continue
            cfg = {k: e.value for k, e in sorted(entries.items()) if k in KEY_CONFIGS or not e.is_default}
            out[res.name] = TopicState(st.name, True, st.partitions, st.replication_factor, cfg)
    return out


def _wait_visible(admin: Any, names: Sequence[str], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(timeout=10)
        if all(n in md.topics and md.topics[n].partitions and md.topics[n].error is None for n in names):
            return
        if time.monotonic() > deadline:
            raise click.ClickException(f"topics {list(names)} were created but are not visible after {timeout_s:.0f}s")
        time.sleep(0.1)


def _state_json(st: TopicState) -> dict[str, object]:
    d: dict[str, object] = {"exists": st.exists}
    if st.exists:
        d.update(partitions=st.partitions, replication_factor=st.replication_factor, configs=dict(st.configs))
    if st.error:
        d["error"] = st.error
    return d


def _deployment(config_file: Path | None, bootstrap_servers: str | None, topic_prefix: str | None,
                kafka_pairs: tuple[str, ...]) -> tuple[Any, str, Topics, int]:
    """An admin client, the bootstrap servers, the topics and the largest dead letter, as `coordinator run` reads them."""
    from confluent_kafka.admin import AdminClient

    from deltacoord.cli.options import load_settings

    run = load_settings(config_file, {"bootstrap_servers": bootstrap_servers, "topic_prefix": topic_prefix}, kafka_pairs)
    bootstrap = run.coordinator.bootstrap_servers
    if not bootstrap:
        raise click.UsageError("no Kafka bootstrap servers: pass --bootstrap-servers, DELTACOORD_BOOTSTRAP_SERVERS or --config")
    return AdminClient(run.coordinator.client()), bootstrap, run.coordinator.topics, run.coordinator.dead_letter_record_bound()


def _common(f: Any) -> Any:
    for opt in reversed([
        click.option("--config", "config_file", type=click.Path(exists=True, path_type=Path), envvar="DELTACOORD_CONFIG",
                     help="TOML file: bootstrap_servers and topic_prefix from [coordinator], client settings from [kafka]."),
        click.option("--bootstrap-servers", envvar="DELTACOORD_BOOTSTRAP_SERVERS", default=None,
                     help="Kafka bootstrap servers (or DELTACOORD_BOOTSTRAP_SERVERS, or the config file)."),
        click.option("--topic-prefix", envvar="DELTACOORD_TOPIC_PREFIX", default=None,
                     help="Topics are <prefix>.proposals/.commits/.deadletters (default deltacoord)."),
        click.option("--kafka", "kafka_pairs", multiple=True, help="Extra Kafka client setting key=value (repeatable)."),
    ]):
        f = opt(f)
    return f


def register(main: click.Group) -> None:
    """Add the `deltacoord topics` group to the CLI."""

    @main.group("topics")
    def topics_group() -> None:
        """Create and inspect the proposals, commits and dead-letter topics."""

    @topics_group.command("create")
    @_common
    @click.option("--reply-partitions", type=click.IntRange(min=1), default=DEFAULT_REPLY_PARTITIONS, show_default=True,
                  help="Partitions of the replies topic: writer processes up to this many each read a partition of their "
                       "own; more share one (see docs/operations.md).")
    @click.option("--partitions", type=int, required=True,
                  help="Proposals and commits partitions. Changing it later moves tables between partitions: "
                       "see docs/operations.md before choosing.")
    @click.option("--replication-factor", type=int, required=True, help="At least 3 unless --allow-unsafe.")
    @click.option("--min-insync-replicas", type=int, default=None,
                  help="Default: a majority of the replicas (2 of 3). At least 2 and below the replication factor.")
    @click.option("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE_BYTES, show_default=True,
                  help="max.message.bytes of the proposals and commits topics.")
    @click.option("--allow-unsafe", is_flag=True, help="Accept RF < 3, min ISR < 2 or min ISR >= RF (test clusters).")
    def topics_create(config_file: Path | None, bootstrap_servers: str | None, topic_prefix: str | None,
                      kafka_pairs: tuple[str, ...], partitions: int, replication_factor: int,
                      min_insync_replicas: int | None, max_message_bytes: int, allow_unsafe: bool,
                      reply_partitions: int) -> None:
        """Create the missing topics; report how existing ones differ. Prints JSON.

        \b
        Example:
          deltacoord topics create --bootstrap-servers kafka:9092 --partitions 12 --replication-factor 3
        """
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        isr = min_insync_replicas if min_insync_replicas is not None else default_min_insync_replicas(replication_factor)
        try:
            allowed = check_replication(partitions, replication_factor, isr, allow_unsafe=allow_unsafe)
        except UnsafeTopicSettingsError as e:
            raise click.UsageError(str(e)) from e
        for w in allowed:
            click.echo(f"warning: {w} (allowed by --allow-unsafe)", err=True)
        admin, bootstrap, topics, dl_bound = _deployment(config_file, bootstrap_servers, topic_prefix, kafka_pairs)
        md = admin.list_topics(timeout=30)
        if len(md.brokers) < replication_factor:
            raise click.ClickException(
                f"replication factor {replication_factor} but {bootstrap} has {len(md.brokers)} broker(s)"
            )
        specs = create_specs(topics, partitions, replication_factor, isr, max_message_bytes, reply_partitions)
        missing = [s for s in specs if s.name not in md.topics]
        created = []
        if missing:
            futures = admin.create_topics([
                NewTopic(s.name, num_partitions=s.partitions, replication_factor=s.replication_factor, config=s.config)
                for s in missing
            ])
            for name, fut in futures.items():
                try:
                    fut.result(30)
                    created.append(name)
                except Exception as e:
                    if "TOPIC_ALREADY_EXISTS" not in str(e):
                        raise click.ClickException(f"cannot create topic {name}: {e}") from e
            _wait_visible(admin, [s.name for s in specs])
        states = describe_states(admin, [s.name for s in specs])
        differences = {s.name: d for s in specs if s.name not in created and (d := spec_differences(s, states[s.name]))}
        problems, warnings = topic_problems(topics, states, dl_bound)
        click.echo(json.dumps({
            "created": created, "existing": [s.name for s in specs if s.name not in created],
            "differences": differences, "problems": problems, "warnings": warnings,
        }, indent=2))
        if problems:
            sys.exit(1)

    @topics_group.command("describe")
    @_common
    def topics_describe(config_file: Path | None, bootstrap_servers: str | None, topic_prefix: str | None,
                        kafka_pairs: tuple[str, ...]) -> None:
        """Partition counts, replication factors and configs of the four topics as JSON; exit 1 on problems.

        \b
        Example:
          deltacoord topics describe --bootstrap-servers kafka:9092
        """
        admin, _bootstrap, topics, dl_bound = _deployment(config_file, bootstrap_servers, topic_prefix, kafka_pairs)
        names = [topics.proposals, topics.commits, topics.dead_letters, topics.replies]
        states = describe_states(admin, names)
        problems, warnings = topic_problems(topics, states, dl_bound)
        click.echo(json.dumps({
            "topics": {n: _state_json(states[n]) for n in names}, "problems": problems, "warnings": warnings,
        }, indent=2))
        if problems:
            sys.exit(1)
