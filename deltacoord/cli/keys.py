"""`deltacoord writer-key generate|show`: writer key pairs for tables that authenticate their writers.

    deltacoord writer-key generate alice --out alice.key   # writes the private key file (mode 0600)
    deltacoord writer-key show alice.key                   # the public entry again

Both print JSON with `registration`, the `name:base64key` entry to put in the
table property `deltacoord.writerKeys` (comma-separated for several writers).
The key file is what the writer is given (`Table(..., writer_key=path)`, the
CLI's `--writer-key`, the Spark sink's `writerKey` option or
`DELTACOORD_WRITER_KEY`); it never needs to reach the coordinator.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import click

from deltacoord.schemas.properties import Property
from deltacoord.schemas.signing import WriterKey, WriterKeyError


def _describe(key: WriterKey, path: Path | None) -> str:
    out: dict[str, object] = {"name": key.name, "publicKey": key.public_key_b64, "registration": key.registration,
                              "property": Property.WRITER_KEYS.value}
    if path is not None:
        out["keyFile"] = str(path)
    return json.dumps(out)


def register(main: click.Group) -> None:
    """Add the `writer-key` group to the CLI."""

    @main.group("writer-key")
    def writer_key_group() -> None:
        """Ed25519 writer keys: a table's registered keys are the only writers it accepts."""

    @writer_key_group.command("generate")
    @click.argument("name")
    @click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
                  help="Write the private key file here (refuses to overwrite); default: NAME.key.")
    def generate(name: str, out: Path | None) -> None:
        """Create a key pair named NAME; print its deltacoord.writerKeys entry as JSON.

        \b
        Example:
          deltacoord writer-key generate ingest --out ingest.key
        """
        try:
            key = WriterKey.generate(name)
        except WriterKeyError as e:
            raise click.BadParameter(str(e), param_hint="NAME") from e
        path = out or Path(f"{name}.key")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            raise click.ClickException(f"{path} exists; choose another --out (a key file is never overwritten)") from None
        with os.fdopen(fd, "w", encoding="ascii") as fh:
            fh.write(key.to_text())
        click.echo(_describe(key, path))

    @writer_key_group.command("show")
    @click.argument("key_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
    def show(key_file: Path) -> None:
        """Print the name and public entry of a key file as JSON.

        \b
        Example:
          deltacoord writer-key show ingest.key
        """
        try:
            key = WriterKey.load(key_file)
        except WriterKeyError as e:
            raise click.ClickException(str(e)) from e
        click.echo(_describe(key, key_file))
