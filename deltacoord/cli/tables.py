"""`deltacoord table ...` and `deltacoord tail`: table commands for people and scripts.

    deltacoord table create PATH --schema "id BIGINT, date STRING, amount DECIMAL(10,2)" --partition-by date --property k=v
    deltacoord table append PATH --json-rows rows.jsonl        (or --parquet file.parquet)
    deltacoord table delete PATH --where "date = '2024-01-01'"
    deltacoord table truncate PATH [--where "date = '2024-01-01'"]   (TRUNCATE TABLE [PARTITION])
    deltacoord table transact FILE                             (several tables' operations, all or none)
    deltacoord table compact PATH --kind minor|major [--where ...] [--small-file-size BYTES]
    deltacoord writer-key generate NAME --out NAME.key         (a key pair; prints the table property entry)
    deltacoord table history PATH [--limit N]                  (JSON lines, newest first, from _delta_log)
    deltacoord table describe PATH [--version V]               (one JSON object, from _delta_log)
    deltacoord table vacuum PATH [--retention-hours H] [--dry-run]   (delete files no retained version needs)
    deltacoord table resume TABLE                              (lift a halt, once its cause is dealt with)
    deltacoord table adopt PATH                                (put an existing Delta table under the coordinator)
    deltacoord table release PATH                              (hand a table back to uncoordinated writers)
    deltacoord table drop PATH [--delete-files]                (the coordinator forgets the table: DROP TABLE)
    deltacoord table status TABLE                              (coordinated, halted and why, released or dropped)
    deltacoord tail TABLE [--from-version N|latest]            (one JSON line per committed version, from Kafka)

PATH is a local directory or an object-store URI (`s3://bucket/t`, `abfss://...`,
`gs://...`); `--storage-option KEY=VALUE` (repeatable) gives its storage options as
delta-rs names them, else each cloud's environment chain is used.

Writes go through the coordinator (`deltacoord.writer.table.Table`), so they need
`--bootstrap-servers` (or DELTACOORD_BOOTSTRAP_SERVERS) and the deployment's
`--topic-prefix` (or DELTACOORD_TOPIC_PREFIX, default `deltacoord`). Reads of
`history`/`describe` and `vacuum` only need the table's storage. `tail` reads the commits
topic (`deltacoord.reader.stream.CommitStream`), so it shows a version as soon as it is
decided, before it is published to `_delta_log`. Writes sign their proposal with
`--writer-key FILE` (or DELTACOORD_WRITER_KEY) when given.

Every command prints JSON on stdout (progress and notices go to stderr). Exit
codes: 0 success, 1 error (a conflict, a bad argument, a missing table, no
coordinator serving the table), 2 a usage error or an unreachable Kafka, 3 the
outcome of a write is unknown (it may still commit: look it up by proposal id, or
re-run the same command with `--proposal-id ID`, which commits at most once; also
on Ctrl-C after the proposal was sent), 130 interrupted before anything was
proposed (the files staged for it are deleted).

`register(main)` adds the `table` group and the `tail` command to the main
`deltacoord` group.
"""

from __future__ import annotations

import decimal
import itertools
import json
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import click
import pyarrow as pa

from deltacoord.cli.options import (
    F,
    TableLocationParam,
    kafka_options,
    load_settings,
    parse_pairs,
    reach_kafka,
    storage_options,
)
from deltacoord.cli.schema import parse_schema
from deltacoord.reader.snapshot import Snapshot
from deltacoord.schemas import client_settings
from deltacoord.schemas.actions import Protocol, json_lines
from deltacoord.schemas.errors import CommitOutcomeUnknownError, DeltaCoordError
from deltacoord.schemas.routing import Topics
from deltacoord.schemas.signing import WRITER_KEY_ENV
from deltacoord.storage.table import StorageError

EXIT_UNKNOWN_OUTCOME = 3


class UnknownOutcome(click.ClickException):
    exit_code = EXIT_UNKNOWN_OUTCOME


class Interrupted(click.ClickException):
    """Ctrl-C before the proposal was sent: nothing can commit, the staged files are gone."""

    exit_code = 130


def _echo_json(obj: Any) -> None:
    click.echo(json.dumps(obj, separators=(",", ":"), default=str))


@contextmanager
def _writing(path: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...], table_id: str | None,
             writer_key: str | None, storage_pairs: tuple[str, ...]) -> Iterator[Any]:
    """The table of a write command, its errors as CLI errors (an unknown outcome names the lookup command)."""
    try:
        with cli_errors(_lookup_args(path, bootstrap_servers, topic_prefix, table_id)), \
                _table(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
            yield t
    except KeyboardInterrupt:
        raise Interrupted("interrupted before anything was proposed: the table is unchanged (the files staged for "
                          "this write were deleted)") from None


def _lookup_args(path: str, bootstrap_servers: str, topic_prefix: str, table_id: str | None) -> list[str]:
    """The arguments of `deltacoord table lookup` that find this command's table."""
    return [path, "--bootstrap-servers", bootstrap_servers, "--topic-prefix", topic_prefix,
            *(["--table-id", table_id] if table_id else [])]


def _lookup_hint(proposal_id: str, lookup: Sequence[str] | None) -> str:
    where = " ".join(shlex.quote(a) for a in lookup) if lookup else "TABLE"
    return (f"Find out with: deltacoord table lookup {where} {proposal_id}\n"
            f"Retry safely: re-run the same command with --proposal-id {proposal_id} (the coordinator decides a proposal "
            "id once, so it cannot commit twice; a plain re-run could leave the rows in the table twice)")


@contextmanager
def cli_errors(lookup: Sequence[str] | None = None) -> Iterator[None]:
    """Project errors as clean CLI errors (no traceback)."""
    from deltacoord.writer.staging import SchemaError

    try:
        yield
    except CommitOutcomeUnknownError as e:
        raise UnknownOutcome(f"{e.summary}\n{_lookup_hint(e.proposal_id, lookup)}") from e
    except KeyboardInterrupt as e:
        pid = getattr(e, "deltacoord_proposal_id", None)
        if pid is None:
            raise  # nothing was proposed (staged files are deleted); commands such as tail stop on it
        raise UnknownOutcome(f"interrupted while waiting for the decision of proposal {pid}: the outcome is unknown "
                             f"(it may still commit).\n{_lookup_hint(pid, lookup)}") from None
    except (DeltaCoordError, SchemaError, FileNotFoundError, StorageError) as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e


def _table(path: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...], table_id: str | None,
           writer_key: str | None, storage_pairs: tuple[str, ...] = ()) -> Any:
    from deltacoord.schemas.signing import WriterKeyError
    from deltacoord.writer.table import Table

    kafka: dict[str, Any] = parse_pairs(kafka_pairs, "--kafka")
    reach_kafka(bootstrap_servers, kafka)
    with cli_errors():
        try:
            ctx = click.get_current_context(silent=True)
            timeout = {} if ctx is None or _TIMEOUT_KEY not in ctx.meta else {"decision_timeout_s": ctx.meta[_TIMEOUT_KEY]}
            return Table(path, bootstrap_servers, table_id=table_id, topic_prefix=topic_prefix,
                         writer_key=writer_key, storage_options=parse_pairs(storage_pairs, "--storage-option"),
                         **timeout, **kafka)
        except WriterKeyError as e:
            raise click.BadParameter(str(e), param_hint="--writer-key / DELTACOORD_WRITER_KEY") from e


def _result_json(r: Any) -> dict[str, Any]:
    return {
        "version": r.version,
        "operation": r.operation,
        "proposalId": r.proposal_id,
        "alreadyCommitted": bool(getattr(r, "already_committed", False)),
        "metrics": dict(getattr(r, "metrics", {}) or {}),
    }


def _table_id_option(f: F) -> F:
    return click.option("--table-id", default=None,
                        help="The table's id on the wire (default: its absolute file:// URI).")(f)


def _writes(f: F) -> F:
    f = click.option("--writer-key", envvar=WRITER_KEY_ENV, default=None, metavar="FILE",
                     help="Writer key file that signs the proposal (or DELTACOORD_WRITER_KEY); tables with "
                          "deltacoord.writerKeys require it. Create one with `deltacoord writer-key generate`.")(f)
    f = click.option("--timeout", type=click.FloatRange(min=0.1), default=None, expose_value=False, is_eager=True,
                     callback=_remember_timeout, envvar=client_settings.TIMEOUT_ENV,
                     help=f"Seconds to wait for the decision (default 60, or {client_settings.TIMEOUT_ENV}); then the outcome "
                          "is unknown (exit 3) and `deltacoord table lookup` tells it later.")(f)
    f = click.option("--proposal-id", default=None, expose_value=False, metavar="ID", callback=_remember_proposal_id,
                     help="Retry a write whose outcome was unknown (exit 3) with the proposal id it printed: the "
                          "coordinator decides a proposal id once, so the retry commits at most once (it reports "
                          "alreadyCommitted when the first attempt had committed).")(f)
    return storage_options(_table_id_option(kafka_options(f)))


def _remember_timeout(ctx: click.Context, _param: click.Parameter, value: float | None) -> None:
    if value is not None:
        ctx.meta[_TIMEOUT_KEY] = value


def _remember_proposal_id(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        if not value.strip():
            raise click.BadParameter("give the proposal id an unknown outcome printed", param_hint="--proposal-id")
        ctx.meta[_PROPOSAL_KEY] = value.strip()


def _proposal_id() -> str | None:
    """The `--proposal-id` of the running write command (None: a new proposal)."""
    ctx = click.get_current_context(silent=True)
    return None if ctx is None else ctx.meta.get(_PROPOSAL_KEY)


_TIMEOUT_KEY = "deltacoord.decision_timeout_s"
_PROPOSAL_KEY = "deltacoord.proposal_id"


@click.group("table")
def table_group() -> None:
    """Create, write and inspect coordinated Delta tables."""


@table_group.command("create")
@click.argument("path", type=TableLocationParam())
@click.option("--schema", "schema_spec", required=True,
              help='Columns as Spark DDL ("id BIGINT NOT NULL, ts TIMESTAMP COMMENT \'when\', ...") or as '
                   '"name:type,..."; Spark\'s and Delta\'s type names (BIGINT/long, INT, DECIMAL(p,s), TIMESTAMP, '
                   'TIMESTAMP_NTZ, ARRAY<...>, MAP<...>, STRUCT<...>), NOT NULL, GENERATED ALWAYS AS (SQL), COMMENT.')
@click.option("--partition-by", "partition_by", multiple=True,
              help="Partition column (repeatable, or comma-separated).")
@click.option("--property", "properties", multiple=True, metavar="KEY=VALUE",
              help="Table property (repeatable); delta.enableChangeDataFeed=true and the like enable their feature.")
@click.option("--constraint", "constraints", multiple=True, metavar="NAME=SQL",
              help="CHECK constraint every written row must satisfy (repeatable).")
@click.option("--feature", "features", multiple=True, metavar="NAME",
              help="Table feature to put in the protocol, e.g. domainMetadata (repeatable).")
@click.option("--min-reader-version", type=click.IntRange(1, 3), default=None, help="Least protocol reader version.")
@click.option("--min-writer-version", type=click.IntRange(1, 7), default=None, help="Least protocol writer version.")
@click.option("--name", default=None, help="Table name recorded in metaData.")
@_writes
def create_cmd(path: str, schema_spec: str, partition_by: tuple[str, ...], properties: tuple[str, ...],
               constraints: tuple[str, ...], features: tuple[str, ...], min_reader_version: int | None,
               min_writer_version: int | None, name: str | None, bootstrap_servers: str, topic_prefix: str,
               kafka_pairs: tuple[str, ...], table_id: str | None, writer_key: str | None,
               storage_pairs: tuple[str, ...]) -> None:
    """CREATE TABLE at PATH (version 0), with the least protocol that has the features asked for and those the
    properties, constraints and schema need; a feature deltacoord cannot honour is refused, naming it.

    \b
    Examples:
      deltacoord table create /data/sales --schema "id BIGINT, date STRING, amount DECIMAL(10,2)" --partition-by date
      deltacoord table create /data/events --schema "id BIGINT NOT NULL, ts TIMESTAMP, day DATE GENERATED ALWAYS AS (CAST(ts AS DATE))" --constraint "id_positive=id > 0" --property delta.enableChangeDataFeed=true --feature domainMetadata
    """
    schema = parse_schema(schema_spec)
    parts = [c.strip() for p in partition_by for c in p.split(",") if c.strip()]
    props = parse_pairs(properties, "--property")
    checks = parse_pairs(constraints, "--constraint")
    protocol = None
    if min_reader_version is not None or min_writer_version is not None:
        protocol = Protocol(min_reader_version or 1, min_writer_version or 2)
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.create(schema, partition_by=parts, properties=props, name=name, features=features,
                                         protocol=protocol, constraints=checks, proposal_id=_proposal_id())))


@table_group.command("adopt")
@click.argument("path", type=TableLocationParam(exists=True))
@_writes
def adopt_cmd(path: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...], table_id: str | None,
              writer_key: str | None, storage_pairs: tuple[str, ...]) -> None:
    """Put the existing Delta table at PATH (written by Spark, delta-rs, ...) under the coordinator.

    The coordinator reads the table's checkpoint and commits itself, records the adoption on the commits
    topic and decides every commit after the table's current version (printed as "version"). Stop the
    table's other writers first: a version written around the coordinator afterwards halts the table.
    The next version adds deltacoord's own writer feature deltacoord-coordinated to the protocol, so
    Delta writers that follow the protocol (Spark, delta-rs) refuse to write the table; readers read it.
    Refused, with the reason, for a location without a Delta table, a table with a writer feature
    deltacoord cannot honour, a location outside the coordinator's table_roots, or a table it already
    coordinates at another version (adopting again at the same version answers alreadyCommitted).

    \b
    Example:
      deltacoord table adopt /data/sales --bootstrap-servers kafka-1:9092
    """
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.adopt()))


@table_group.command("release")
@click.argument("path", type=TableLocationParam(exists=True))
@_writes
def release_cmd(path: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...], table_id: str | None,
                writer_key: str | None, storage_pairs: tuple[str, ...]) -> None:
    """Hand the table at PATH back to uncoordinated writers (the reverse of `adopt`).

    Once every version the coordinator ratified is in _delta_log, it records the release and stops
    deciding the table; proposals that reach it afterwards are refused (TABLE_RELEASED). Stop the
    writers that commit through deltacoord first (docs/operations.md, "Adopt and release a table").
    Just before, a commit removes the deltacoord-coordinated writer feature, so Spark and delta-rs write
    the table again. Prints the last coordinated version.

    \b
    Example:
      deltacoord table release /data/sales --bootstrap-servers kafka-1:9092
    """
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.release()))


@table_group.command("drop")
@click.argument("path", type=TableLocationParam())
@click.option("--delete-files", is_flag=True, default=False,
              help="Delete every file under PATH too (its log, data files and claim), as Delta's DROP TABLE of a "
                   "path table deletes its directory.")
@_writes
def drop_cmd(path: str, delete_files: bool, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...],
             table_id: str | None, writer_key: str | None, storage_pairs: tuple[str, ...]) -> None:
    """Drop the table at PATH: the coordinator forgets it for good (DROP TABLE).

    The drop is recorded on the commits topic, so neither a restart nor recovery brings the table back, and
    `deltacoord table create PATH` then makes a new table there. With --delete-files the coordinator deletes
    the table's files first; without, they stay as a Delta table no coordinator decides (its
    deltacoord-coordinated writer feature is removed first, as `release` does; `adopt` takes it back). Also
    the way out for a coordinated table whose directory was deleted (`rm -rf`): the coordinator halts such a
    table instead of republishing its history, and `create` on the path is refused until it is dropped.
    Stop the table's writers first. Prints the version the table was dropped at.

    \b
    Examples:
      deltacoord table drop /data/sales --delete-files --bootstrap-servers kafka-1:9092
      deltacoord table drop /data/sales --bootstrap-servers kafka-1:9092
    """
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.drop(delete_files=delete_files)))


#: JSON rows converted to Arrow per chunk: memory stays bounded by one chunk, whatever the input's size.
JSON_CHUNK_ROWS = 200_000


def _json_lines_of(source: str) -> Iterator[str]:
    """The non-blank lines of JSON-lines input: inline text, a file or stdin (`-`), read lazily."""
    if source == "-":
        yield from (line for line in sys.stdin if line.strip())
        return
    if source.lstrip().startswith(("[", "{")):
        yield from (line for line in json_lines(source) if line.strip())
        return
    try:
        f = open(source, encoding="utf-8")  # noqa: SIM115 - closed below, after the generator is drained
    except OSError as e:
        raise click.BadParameter(f"cannot read {source!r}: {e}", param_hint="--json-rows") from e
    with f:
        yield from (line for line in f if line.strip())


def _rows_table(rows: list[Any], first_row: int) -> pa.Table:
    if not all(isinstance(r, dict) for r in rows):
        raise click.BadParameter("every row must be a JSON object", param_hint="--json-rows")
    try:
        return pa.Table.from_pylist(rows)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
        raise click.BadParameter(f"rows {first_row}..{first_row + len(rows) - 1} cannot be converted to a table: {e}",
                                 param_hint="--json-rows") from e


def _json_row_tables(source: str) -> Iterator[pa.Table]:
    """A JSON array, or JSON lines (one object per line), as Arrow tables of at most JSON_CHUNK_ROWS rows.

    Numbers with a point or an exponent are read as decimals, so a decimal column gets the very digits the
    input wrote (a float would have rounded them already); float and double columns cast them."""
    lines = _json_lines_of(source)
    first = next(lines, None)
    if first is None:
        raise click.UsageError("no rows to append")
    if first.lstrip().startswith("["):  # a JSON array is parsed whole
        text = first + "".join(lines)
        try:
            rows = json.loads(text, parse_float=decimal.Decimal)
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"not JSON rows: {e}", param_hint="--json-rows") from e
        if not rows:
            raise click.UsageError("no rows to append")
        yield _rows_table(rows, 1)
        return
    chunk: list[Any] = []
    n = 0
    for line in itertools.chain([first], lines):
        n += 1
        try:
            chunk.append(json.loads(line, parse_float=decimal.Decimal))
        except json.JSONDecodeError as e:
            raise click.BadParameter(f"line {n} is not JSON: {e}", param_hint="--json-rows") from e
        if len(chunk) >= JSON_CHUNK_ROWS:
            yield _rows_table(chunk, n - len(chunk) + 1)
            chunk = []
    if chunk:
        yield _rows_table(chunk, n - len(chunk) + 1)


def _progress_line() -> Callable[[int, int, int], None] | None:
    """On a terminal, a line on stderr rewritten as chunks are staged; None (silent) otherwise."""
    if not sys.stderr.isatty():
        return None

    def show(rows: int, files: int, size: int) -> None:
        click.echo(f"\rstaged {rows:,} rows in {files} file(s), {size / 1e6:,.1f} MB", err=True, nl=False)

    return show


@table_group.command("append")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--json-rows", "json_rows", default=None, metavar="FILE|-|JSON",
              help="Rows as a JSON array or JSON lines: a file, '-' for stdin, or inline text.")
@click.option("--parquet", "parquet_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="A Parquet file whose rows to append.")
@click.option("--app-id", default=None, help="Idempotent writes: the application id (with --app-version).")
@click.option("--app-version", type=int, default=None, help="Idempotent writes: the application's version.")
@_writes
def append_cmd(path: str, json_rows: str | None, parquet_file: Path | None, app_id: str | None, app_version: int | None,
               bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...], table_id: str | None,
               writer_key: str | None, storage_pairs: tuple[str, ...]) -> None:
    """Append rows (a blind INSERT) to the table at PATH.

    \b
    Example:
      deltacoord table append /data/sales --json-rows rows.jsonl
      deltacoord table append s3://lake/sales --parquet batch.parquet --storage-option AWS_REGION=eu-west-1
    """
    if (json_rows is None) == (parquet_file is None):
        raise click.UsageError("give exactly one of --json-rows and --parquet")
    if (app_id is None) != (app_version is None):
        raise click.UsageError("give both --app-id and --app-version, or neither")
    data: Any
    if parquet_file is not None:
        data = _parquet_input(parquet_file, "--parquet").iter_batches(batch_size=65_536)  # streamed, a chunk at a time
    else:
        assert json_rows is not None
        data = _json_row_tables(json_rows)
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        if json_rows is not None:
            # The first rows are read now, while the table's client asks Kafka its first questions in the
            # background: converting them imports pandas (pyarrow does), about 200 ms a fresh process need not wait.
            first = next(data)
            data = itertools.chain([first], data)
        show = _progress_line()
        try:
            r = t.append(data, app_id=app_id, app_version=app_version, progress=show, proposal_id=_proposal_id())
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as e:
            raise click.ClickException(f"the rows do not fit the table schema: {e}") from e
        finally:
            if show is not None:
                click.echo("", err=True)
        _echo_json(_result_json(r))


def _parquet_input(path: Path, option: str) -> Any:
    """The Parquet file an option names, opened (its footer read); a file that is not Parquet is a usage error
    (exit 2) naming the option and the file, not a traceback."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise click.BadParameter(f"{path} is not a readable Parquet file ({e}); give a Parquet file, or the rows as "
                                 "JSON lines", param_hint=option) from e


@table_group.command("delete")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--where", required=True, help="SQL condition of the rows to delete, e.g. \"date = '2024-01-01'\".")
@_writes
def delete_cmd(path: str, where: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...],
               table_id: str | None, writer_key: str | None, storage_pairs: tuple[str, ...]) -> None:
    """DELETE FROM the table at PATH WHERE a condition.

    \b
    Example:
      deltacoord table delete /data/sales --where "date = '2024-01-01'"
    """
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.delete(where, proposal_id=_proposal_id())))


def _assignments(pairs: tuple[str, ...], option: str) -> dict[str, str] | Literal["*"] | None:
    """`col=SQL` pairs (or a lone `*`: every column from the source) as the writer's assignments."""
    if not pairs:
        return None
    if pairs == ("*",):
        return "*"
    out: dict[str, str] = {}
    for pair in pairs:
        col, eq, sql = pair.partition("=")
        if not eq or not col.strip() or not sql.strip():
            raise click.BadParameter(f"{pair!r}: give COLUMN=SQL, e.g. \"amount=amount * 2\" (or * alone)", param_hint=option)
        out[col.strip()] = sql.strip()
    return out


@table_group.command("update")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--set", "assignments", multiple=True, required=True, metavar="COLUMN=SQL",
              help="A column and its new value as SQL over the row's columns; repeat for several columns.")
@click.option("--where", default=None, help="SQL condition of the rows to update (default: every row).")
@_writes
def update_cmd(path: str, assignments: tuple[str, ...], where: str | None, bootstrap_servers: str, topic_prefix: str,
               kafka_pairs: tuple[str, ...], table_id: str | None, writer_key: str | None,
               storage_pairs: tuple[str, ...]) -> None:
    """UPDATE the table at PATH SET columns [WHERE a condition].

    \b
    Example:
      deltacoord table update /data/sales --set "amount=amount * 2" --set "note='doubled'" --where "date = '2024-01-01'"
    """
    sets = _assignments(assignments, "--set")
    if not isinstance(sets, dict):
        raise click.BadParameter("UPDATE needs COLUMN=SQL pairs, not *", param_hint="--set")
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.update(where, sets, proposal_id=_proposal_id())))


@table_group.command("merge")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--source-json-rows", "json_rows", default=None, metavar="FILE|-|JSON",
              help="The source rows as a JSON array or JSON lines: a file, '-' for stdin, or inline text.")
@click.option("--source-parquet", "parquet_file", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The source rows as a Parquet file.")
@click.option("--on", "on", required=True, multiple=True,
              help="A key column (repeat for several), or one SQL condition over s. and t. columns, e.g. \"s.id = t.id\".")
@click.option("--when-matched-update", "update_pairs", multiple=True, metavar="COLUMN=SQL|*",
              help="WHEN MATCHED THEN UPDATE SET COLUMN=SQL over s./t. columns (repeat), or * for every source column.")
@click.option("--when-matched-delete", "delete_if", default=None, metavar="SQL|true",
              help="WHEN MATCHED [AND SQL] THEN DELETE, before the update clause; 'true' deletes every matched row.")
@click.option("--when-not-matched-insert", "insert_pairs", multiple=True, metavar="COLUMN=SQL|*",
              help="WHEN NOT MATCHED THEN INSERT COLUMN=SQL over s. columns (repeat), or * for every source column.")
@click.option("--when-not-matched-insert-if", "insert_if", default=None, metavar="SQL",
              help="WHEN NOT MATCHED AND SQL (over s. columns) THEN INSERT.")
@_writes
def merge_cmd(path: str, json_rows: str | None, parquet_file: Path | None, on: tuple[str, ...],
              update_pairs: tuple[str, ...], delete_if: str | None, insert_pairs: tuple[str, ...], insert_if: str | None,
              bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...], table_id: str | None,
              writer_key: str | None, storage_pairs: tuple[str, ...]) -> None:
    """MERGE INTO the table at PATH (alias t) USING source rows (alias s) ON keys or a condition.

    \b
    Example:
      deltacoord table merge /data/sales --source-json-rows changes.jsonl --on id --when-matched-update "*" --when-not-matched-insert "*"
    """
    if (json_rows is None) == (parquet_file is None):
        raise click.UsageError("give exactly one of --source-json-rows and --source-parquet")
    update, insert = _assignments(update_pairs, "--when-matched-update"), _assignments(insert_pairs, "--when-not-matched-insert")
    delete: bool | str = False if delete_if is None else (True if delete_if.strip().lower() == "true" else delete_if)
    if update is None and insert is None and delete is False:
        raise click.UsageError("give at least one of --when-matched-update, --when-matched-delete and --when-not-matched-insert")
    condition: str | list[str] = list(on)
    if len(on) == 1 and not on[0].replace("_", "").isalnum():
        condition = on[0]  # SQL, not a column name
    if parquet_file is not None:
        source = _parquet_input(parquet_file, "--source-parquet").read()
    else:
        assert json_rows is not None
        source = pa.concat_tables(list(_json_row_tables(json_rows)))
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        try:
            r = t.merge(source, condition, when_matched_update=update, when_not_matched_insert=insert,
                        when_matched_delete=delete, when_not_matched_insert_if=insert_if, proposal_id=_proposal_id())
        except ValueError as e:
            raise click.UsageError(str(e)) from e
        _echo_json(_result_json(r))


@table_group.command("optimize")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--where", default=None, help="Only the partitions this condition on partition columns selects.")
@click.option("--target-file-size", type=click.IntRange(min=1), default=128 * 1024 * 1024, show_default=True,
              help="Files smaller than this many bytes are compacted together.")
@click.option("--min-files", type=click.IntRange(min=2), default=2, show_default=True,
              help="A partition is compacted only when it has at least this many small files.")
@click.option("--zorder-by", "zorder_by", multiple=True, metavar="COLUMN",
              help="OPTIMIZE ... ZORDER BY: rewrite every file of each partition clustered by these data columns (repeat).")
@_writes
def optimize_cmd(path: str, where: str | None, target_file_size: int, min_files: int, zorder_by: tuple[str, ...],
                 bootstrap_servers: str,
                 topic_prefix: str, kafka_pairs: tuple[str, ...], table_id: str | None, writer_key: str | None,
                 storage_pairs: tuple[str, ...]) -> None:
    """OPTIMIZE the table at PATH: compact small files (the data does not change).

    \b
    Example:
      deltacoord table optimize /data/sales --where "date = '2024-01-01'" --zorder-by amount
    """
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        try:
            r = t.optimize(where, target_file_size=target_file_size, min_files=min_files, zorder_by=zorder_by,
                           proposal_id=_proposal_id())
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--zorder-by") from e
        _echo_json(_result_json(r))


@table_group.command("purge")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--where", default=None, help="Only the partitions this condition on partition columns selects.")
@_writes
def purge_cmd(path: str, where: str | None, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...],
              table_id: str | None, writer_key: str | None, storage_pairs: tuple[str, ...]) -> None:
    """REORG TABLE ... APPLY (PURGE) at PATH: rewrite every file with a deletion vector without its deleted rows
    (the data does not change; VACUUM then removes the old files and the deleted rows with them).

    \b
    Example:
      deltacoord table purge /data/sales --where "date = '2024-01-01'"
    """
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.purge(where, proposal_id=_proposal_id())))


@table_group.command("truncate")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--where", default=None, help="Only the partitions this condition on partition columns selects.")
@_writes
def truncate_cmd(path: str, where: str | None, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...],
                 table_id: str | None, writer_key: str | None, storage_pairs: tuple[str, ...]) -> None:
    """TRUNCATE the table at PATH (or its partitions WHERE a condition): remove every file.

    \b
    Example:
      deltacoord table truncate /data/sales --where "date = '2024-01-01'"
    """
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.truncate(where, proposal_id=_proposal_id())))


@table_group.command("compact")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--kind", type=click.Choice(["minor", "major"]), default="minor", show_default=True,
              help="minor: merge each partition's small files; major: merge every file of each partition.")
@click.option("--where", default=None, help="Only the partitions this condition on partition columns selects.")
@click.option("--small-file-size", type=click.IntRange(min=1), default=128 * 1024 * 1024, show_default=True,
              help="minor: files smaller than this many bytes are merged.")
@_writes
def compact_cmd(path: str, kind: str, where: str | None, small_file_size: int, bootstrap_servers: str,
                topic_prefix: str, kafka_pairs: tuple[str, ...], table_id: str | None, writer_key: str | None,
                storage_pairs: tuple[str, ...]) -> None:
    """Compact the table at PATH (an OPTIMIZE that changes no data and makes no new time version).

    \b
    Example:
      deltacoord table compact /data/sales --kind major --where "date = '2024-01-01'"
    """
    with _writing(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, writer_key, storage_pairs) as t:
        _echo_json(_result_json(t.compact("major" if kind == "major" else "minor", where,
                                          small_file_size=small_file_size, proposal_id=_proposal_id())))


def _load(path: str, version: int | None = None, storage_pairs: tuple[str, ...] = ()) -> Snapshot:
    with cli_errors():
        return Snapshot.load(path, version=version, storage_options=parse_pairs(storage_pairs, "--storage-option"))


@table_group.command("history")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the newest N versions.")
@storage_options
def history_cmd(path: str, limit: int | None, storage_pairs: tuple[str, ...]) -> None:
    """commitInfo of each version as JSON lines, newest first (from _delta_log).

    \b
    Example:
      deltacoord table history /data/sales --limit 5
    """
    with cli_errors():
        for entry in _load(path, None, storage_pairs).history(limit):
            _echo_json(entry)


@table_group.command("lookup")
@click.argument("path", type=TableLocationParam())
@click.argument("proposal_id")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds to scan the commits topic.")
@storage_options
@_table_id_option
@kafka_options
def lookup_cmd(path: str, proposal_id: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...],
               table_id: str | None, storage_pairs: tuple[str, ...], timeout: float) -> None:
    """The decision of PROPOSAL_ID on the table at PATH, from the commits topic (after an unknown outcome).

    Prints the decision as JSON and exits 0 when it was decided; exits 3 when the commits topic has no
    decision for it (yet): it was never received, or no coordinator has decided it so far.

    \b
    Example:
      deltacoord table lookup /data/sales 0b6f5c1e-9a43-4f57-8d0e-2f1a6f0c9b1d
    """
    with cli_errors(), _table(path, bootstrap_servers, topic_prefix, kafka_pairs, table_id, None, storage_pairs) as t:
        d = t.lookup_decision(proposal_id, timeout_s=timeout)
    if d is None:
        _echo_json({"proposalId": proposal_id, "decided": False})
        raise UnknownOutcome(f"no decision for proposal {proposal_id} on the commits topic (yet): it was not received, "
                             "or no coordinator serves the table's partition; run this again once a coordinator runs")
    _echo_json({"proposalId": proposal_id, "decided": True, "committed": d.committed, "version": d.version,
                "duplicateOf": d.duplicate_of, "coalescedInto": d.coalesced_into, "reason": d.reason_code or d.error_type,
                "message": d.error_message})


@table_group.command("describe")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--version", "version", type=click.IntRange(min=0), default=None, help="Describe this version (default latest).")
@storage_options
def describe_cmd(path: str, version: int | None, storage_pairs: tuple[str, ...]) -> None:
    """Version, schema, partition columns, properties and file count (from _delta_log).

    \b
    Example:
      deltacoord table describe /data/sales --version 3
    """
    import pyarrow.compute as pc

    snap = _load(path, version, storage_pairs)
    md, proto = snap.metadata, snap.protocol
    files = snap.add_files_struct()
    size = pc.sum(files.field("size")).as_py() if len(files) else 0
    _echo_json({
        "location": str(snap.root) if snap.storage.is_local else snap.location,
        "version": snap.version,
        "id": md.id,
        "name": md.name,
        "description": md.description,
        "schema": md.schema().get("fields", []),
        "partitionColumns": list(md.partition_columns),
        "properties": dict(md.configuration),
        "numFiles": snap.num_files,
        "sizeInBytes": size or 0,
        "createdTime": md.created_time,
        "protocol": proto.to_json()["protocol"],
    })


@table_group.command("vacuum")
@click.argument("path", type=TableLocationParam(exists=True))
@click.option("--retention-hours", type=click.FloatRange(min=0), default=None,
              help="Delete unreferenced files older than this (default: the table's delta.deletedFileRetentionDuration, 168).")
@click.option("--dry-run", is_flag=True, help="Only list what would be deleted.")
@click.option("--no-retention-check", is_flag=True,
              help="Allow a retention shorter than delta.deletedFileRetentionDuration (only when nothing writes to the "
                   "table or reads older versions).")
@storage_options
def vacuum_cmd(path: str, retention_hours: float | None, dry_run: bool, no_retention_check: bool,
               storage_pairs: tuple[str, ...]) -> None:
    """VACUUM: delete data files no retained version references, older than the retention (Delta's rules).

    \b
    Example:
      deltacoord table vacuum /data/sales --dry-run
    """
    from deltacoord.writer.vacuum import VacuumRetentionError, vacuum

    try:
        with cli_errors():
            result = vacuum(path, retention_hours=retention_hours, dry_run=dry_run, enforce_retention=not no_retention_check,
                            storage_options=parse_pairs(storage_pairs, "--storage-option"))
    except click.ClickException as e:
        if isinstance(e.__cause__, VacuumRetentionError):
            raise click.UsageError(str(e.__cause__)) from e
        raise
    _echo_json(result.to_json())


def _from_version(value: str) -> int | Literal["latest"]:
    if value == "latest":
        return "latest"
    try:
        v = int(value)
    except ValueError:
        raise click.BadParameter(f"expected a version >= 0 or 'latest', got {value!r}", param_hint="--from-version") from None
    if v < 0:
        raise click.BadParameter(f"expected a version >= 0 or 'latest', got {value!r}", param_hint="--from-version")
    return v


@table_group.command("resume")
@click.argument("table")
@kafka_options
def resume_cmd(table: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...]) -> None:
    """Lift the halt of TABLE (a path, URI or table id) once its cause is dealt with (see 'Recover a halted table').

    The coordinator owning the table records the resumption on the commits topic and rebuilds the
    table's partition, which publishes what the halt held back, or halts the table again if the
    cause is still there (watch /healthz).

    \b
    Example:
      deltacoord table resume /data/sales --bootstrap-servers kafka-1:9092
    """
    from deltacoord.coordinator.kafka.control import request_resume
    from deltacoord.reader.stream import normalize_table_id

    kafka: dict[str, Any] = parse_pairs(kafka_pairs, "--kafka")
    table_id = normalize_table_id(table)
    topics = Topics.with_prefix(topic_prefix)
    try:
        partition = request_resume({"bootstrap.servers": bootstrap_servers, **kafka}, topics.proposals, table_id)
    except Exception as e:
        raise click.ClickException(f"{type(e).__name__}: {e}") from e
    _echo_json({"tableId": table_id, "partition": partition, "requested": "resume"})


@table_group.command("status")
@click.argument("table")
@kafka_options
def status_cmd(table: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...]) -> None:
    """Print where TABLE (a path, URI or table id) stands with the coordinators, from the commits topic.

    One JSON object: "state" is coordinated, halted (with "halted": why), released, dropped or unknown;
    "version" the newest ratified version (or the one the table was released or dropped at); "drops"
    how many times the table id was dropped. Reads the table's whole commits partition, so it answers
    whether a coordinator runs or not.

    \b
    Example:
      deltacoord table status /data/sales --bootstrap-servers kafka-1:9092
    """
    import dataclasses

    from deltacoord.cli.table_status import table_status
    from deltacoord.cli.verify import proposals_partitions
    from deltacoord.coordinator.kafka.recovery import read_decisions
    from deltacoord.reader.stream import normalize_table_id
    from deltacoord.schemas.routing import partition_for

    reach_kafka(bootstrap_servers, parse_pairs(kafka_pairs, "--kafka"))
    run = load_settings(None, {"bootstrap_servers": bootstrap_servers, "topic_prefix": topic_prefix}, kafka_pairs)
    settings = dataclasses.replace(run.coordinator, group_id=f"{topic_prefix}-status")
    table_id = normalize_table_id(table)
    partition = partition_for(table_id, proposals_partitions(settings))
    try:
        status = table_status(table_id, read_decisions(settings, partition, table_id=table_id))
    except Exception as e:
        raise click.ClickException(f"reading {settings.topics.commits}[{partition}] failed: {type(e).__name__}: {e}") from e
    _echo_json({**status.to_json(), "partition": partition})


@click.command("tail")
@click.argument("table")
@kafka_options
@click.option("--from-version", "from_version", default="latest", show_default=True,
              help="First version to print: a number (0 replays the whole history) or 'latest' (only new versions).")
@click.option("--actions", "with_actions", is_flag=True, help="Include every action of each commit.")
@click.option("--until-version", type=click.IntRange(min=0), default=None, help="Exit after printing this version.")
@click.option("--idle-timeout", type=click.FloatRange(min=0), default=None,
              help="Exit when no version was decided for this many seconds.")
def tail_cmd(table: str, bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...], from_version: str,
             with_actions: bool, until_version: int | None, idle_timeout: float | None) -> None:
    """Print each committed version of TABLE (a path, file:// URI or table id) as one JSON line, as it is decided.

    Reads the commits topic, so a version shows before it is in _delta_log.
    Runs until Ctrl-C (or --until-version / --idle-timeout).

    \b
    Example:
      deltacoord tail /data/sales --from-version latest
    """
    from deltacoord.reader.stream import CommitStream

    start = _from_version(from_version)
    kafka: dict[str, Any] = parse_pairs(kafka_pairs, "--kafka")
    reach_kafka(bootstrap_servers, kafka)
    with cli_errors():
        stream = CommitStream(table, bootstrap_servers, topics=Topics.with_prefix(topic_prefix),
                              starting_version=start,
                              include_all_commits=True, **kafka)
    announced = False
    last_seen = time.monotonic()
    try:
        with cli_errors(), stream:
            while True:
                events = stream.poll(0.5)
                if not announced and stream.position is not None:
                    announced = True
                    click.echo(f"tailing {stream.table_id} on {stream.topics.commits}[{stream.partition}] "
                               f"from version {stream.position}", err=True)
                for e in events:
                    _echo_json(e.to_json(with_actions=with_actions))
                    if until_version is not None and e.version >= until_version:
                        return
                now = time.monotonic()
                if events:
                    last_seen = now
                elif idle_timeout is not None and now - last_seen >= idle_timeout:
                    return
    except KeyboardInterrupt:
        click.echo("stopped", err=True)


def register(main: click.Group) -> None:
    """Add the `table` group and the `tail` command to the `deltacoord` CLI."""
    main.add_command(table_group)
    main.add_command(tail_cmd)


__all__ = ["kafka_options", "parse_schema", "register", "table_group", "tail_cmd"]

