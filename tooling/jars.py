"""Resolve JVM jars (the Kafka broker, Delta Lake for Spark, Hadoop's S3A filesystem) from Maven Central.

The poms live under `deploy/maven/<name>/pom.xml`; Maven copies the resolved
jars into a cache outside the repository (`~/.cache/deltacoord/jars/<name>-<key>/`),
keyed on the pom's content so a version bump resolves afresh.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from deltacoord.schemas.errors import DeltaCoordError

log = logging.getLogger(__name__)

#: What each jar set copies: Kafka needs its whole runtime closure; Delta only
#: its own jars, since Spark (from the pyspark wheel) provides the rest and
#: Delta's transitive Jackson/Hadoop jars would clash with Spark's; S3A its
#: runtime closure (the AWS SDK bundle), Hadoop itself being 'provided'.
_COPY_ARGS: dict[str, list[str]] = {
    "kafka": ["-DincludeScope=runtime"],
    "delta": ["-DincludeScope=runtime", "-DexcludeTransitive=true"],
    "s3a": ["-DincludeScope=runtime"],
}


class JarResolutionError(DeltaCoordError, RuntimeError):
    """Maven could not resolve a jar set."""


def cache_home() -> Path:
    """Root of everything deltacoord caches on this machine (`DELTACOORD_HOME`)."""
    env = os.environ.get("DELTACOORD_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "deltacoord"


def deploy_dir() -> Path:
    """The repository's `deploy/` folder (the project is installed editable)."""
    env = os.environ.get("DELTACOORD_DEPLOY_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[1] / "deploy"
    if not here.is_dir():
        raise JarResolutionError(
            f"cannot find deploy/ next to the installed package ({here}); install the project with "
            "`pip install -e .` from a checkout or set DELTACOORD_DEPLOY_DIR"
        )
    return here


@dataclass(frozen=True)
class JarSet:
    name: str
    pom: Path

    @property
    def key(self) -> str:
        return hashlib.sha256(self.pom.read_bytes()).hexdigest()[:12]

    @property
    def directory(self) -> Path:
        return cache_home() / "jars" / f"{self.name}-{self.key}"

    def jars(self) -> list[Path]:
        return sorted(self.directory.glob("*.jar"))

    def is_complete(self) -> bool:
        return (self.directory / ".complete").exists()


def jar_set(name: str) -> JarSet:
    if name not in _COPY_ARGS:
        raise JarResolutionError(f"unknown jar set {name!r}; known: {', '.join(sorted(_COPY_ARGS))}")
    return JarSet(name, deploy_dir() / "maven" / name / "pom.xml")


def fetch(name: str, *, quiet: bool = False) -> JarSet:
    """Resolve a jar set with Maven unless already cached; returns it."""
    js = jar_set(name)
    if js.is_complete():
        return js
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarResolutionError("Maven (`mvn`) is not on PATH; install Maven 3.8+ to fetch the jars")
    tmp = js.directory.with_name(js.directory.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cmd = [mvn, "-B", "-q", "-f", str(js.pom), "dependency:copy-dependencies", f"-DoutputDirectory={tmp}", *_COPY_ARGS[name]]
    if not quiet:
        print(f"resolving {name} jars from Maven Central into {js.directory} ...", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise JarResolutionError(f"mvn failed for {js.pom} (exit {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    (tmp / ".complete").write_text("ok\n")
    shutil.rmtree(js.directory, ignore_errors=True)
    tmp.rename(js.directory)
    if not quiet:
        print(f"{name}: {len(js.jars())} jars ready", flush=True)
    return js


def classpath(name: str) -> str:
    """`:`-joined classpath of a fetched jar set (fetching it first if needed)."""
    return os.pathsep.join(str(p) for p in fetch(name, quiet=True).jars())
