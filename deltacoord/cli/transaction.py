"""`deltacoord table transact FILE`: the operations of a file committed on several tables together, or not at all.

The file (or `-` for stdin) is one JSON object:

    {"transactionId": "optional: the id to retry with",
     "operations": [
       {"table": "/lake/accounts", "tableId": "bank::accounts", "op": "delete", "where": "id = 7"},
       {"table": "/lake/ledger", "tableId": "bank::ledger", "op": "append", "rows": [{"id": 7, "amount": 5}]},
       {"table": "/lake/totals", "tableId": "bank::totals", "op": "update", "set": {"amount": "amount + 5"},
        "where": "id = 1"}
     ]}

`op` is `append` (`rows`), `delete` (`where`, optional) or `update` (`set`, `where` optional); one operation per
table. Prints `{"transactionId", "versions": {table id: version}}`. A conflict exits 1 naming the table whose part
failed (nothing changed); an unknown outcome exits 3: re-run with the same file and `--transaction-id`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from deltacoord.cli.options import kafka_options, parse_pairs, reach_kafka, storage_options

_OPS = ("append", "delete", "update")


def _load(source: str) -> dict[str, Any]:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as e:
        raise click.BadParameter(f"cannot read {source!r}: {e}", param_hint="FILE") from e
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="FILE") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("operations"), list) or not doc["operations"]:
        raise click.BadParameter('give one JSON object with a non-empty "operations" list, e.g. {"operations": '
                                 '[{"table": "/lake/a", "tableId": "g::a", "op": "append", "rows": [{"id": 1}]}]}',
                                 param_hint="FILE")
    seen: dict[tuple[str, Any], int] = {}
    for i, op in enumerate(doc["operations"], 1):
        if not isinstance(op, dict) or not isinstance(op.get("table"), str) or op.get("op") not in _OPS:
            raise click.BadParameter(f'operation {i}: give "table" (a path or URI) and "op" (one of '
                                     f'{", ".join(_OPS)}), got {json.dumps(op)[:200]}', param_hint="FILE")
        if op["op"] == "append" and (not isinstance(op.get("rows"), list) or not op["rows"]):
            raise click.BadParameter(f'operation {i}: an append needs "rows", a non-empty list of objects',
                                     param_hint="FILE")
        if op["op"] == "update" and (not isinstance(op.get("set"), dict) or not op["set"]):
            raise click.BadParameter(f'operation {i}: an update needs "set", an object of column: SQL',
                                     param_hint="FILE")
        first = seen.setdefault((op["table"], op.get("tableId")), i)
        if first != i:
            raise click.BadParameter(f'operations {first} and {i} are both on {op["table"]}: one operation per table '
                                     "(each part reads its table once); put the second in a transaction of its own",
                                     param_hint="FILE")
    return doc


@click.command("transact")
@click.argument("source", metavar="FILE")
@click.option("--transaction-id", default=None, metavar="ID",
              help="Retry a transaction whose outcome was unknown (exit 3) with the id it printed: it commits at "
                   "most once. Overrides the file's transactionId.")
@click.option("--writer-key", envvar="DELTACOORD_WRITER_KEY", default=None, metavar="FILE",
              help="Writer key file that signs the transaction (or DELTACOORD_WRITER_KEY).")
@storage_options
@kafka_options
def transact_cmd(source: str, transaction_id: str | None, writer_key: str | None, storage_pairs: tuple[str, ...],
                 bootstrap_servers: str, topic_prefix: str, kafka_pairs: tuple[str, ...]) -> None:
    """Commit the operations of FILE (JSON; '-' for stdin) on several tables together, or none of them.

    \b
    Example:
      deltacoord table transact moves.json
    """
    import pyarrow as pa

    from deltacoord.cli.tables import UnknownOutcome, cli_errors
    from deltacoord.schemas.errors import CommitOutcomeUnknownError
    from deltacoord.writer.multi_table import MultiTableTransaction, TransactionSpansPartitionsError

    doc = _load(source)
    kafka: dict[str, Any] = parse_pairs(kafka_pairs, "--kafka")
    reach_kafka(bootstrap_servers, kafka)
    opts = parse_pairs(storage_pairs, "--storage-option")
    txid = transaction_id or doc.get("transactionId")
    try:
        with cli_errors():
            tx = MultiTableTransaction(bootstrap_servers, transaction_id=txid, topic_prefix=topic_prefix,
                                       writer_key=writer_key, **kafka)
            try:
                with tx:
                    for op in doc["operations"]:
                        t = tx.table(op["table"], table_id=op.get("tableId"), storage_options=opts)
                        if op["op"] == "append":
                            try:
                                rows = pa.Table.from_pylist(op["rows"])
                            except (pa.ArrowInvalid, pa.ArrowTypeError) as e:
                                raise click.BadParameter(f"the rows for {op['table']} cannot be converted: {e}",
                                                         param_hint="FILE") from e
                            t.append(rows)
                        elif op["op"] == "delete":
                            t.delete(op.get("where"))
                        else:
                            t.update(op.get("where"), op["set"])
            except TransactionSpansPartitionsError as e:  # a usage error (exit 2), before cli_errors' exit 1
                raise click.BadParameter(f'{e}. In the file, the table id is each operation\'s "tableId" '
                                         f'(e.g. "bank::accounts")', param_hint="FILE") from None
    except UnknownOutcome as e:
        cause = e.__cause__
        if isinstance(cause, CommitOutcomeUnknownError):
            raise UnknownOutcome(f"{cause.summary}\nRetry safely: re-run the same command with --transaction-id "
                                 f"{tx.id} (the transaction commits at most once)") from None
        raise
    result = tx.commit_result
    assert result is not None
    click.echo(json.dumps({"transactionId": tx.id, "versions": result.versions,
                           "alreadyCommitted": any(c.already_committed for c in result.commits.values())},
                          separators=(",", ":")))


__all__ = ["transact_cmd"]
