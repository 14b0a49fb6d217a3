"""Local object-storage servers for development and tests, installed and run by the project itself.

- S3: versitygw (Go module, posix backend). It enforces `If-None-Match: *` on PutObject (two racing
  conditional puts of one key: one 200, the rest 412), has tagged releases on the Go module proxy
  and is Apache-2.0; MinIO passes the same race test but publishes only pseudo-versions there.
- Azure Blob / ADLS Gen2: Azurite from the npm registry (blob service only), locked by
  `deploy/npm/azurite/package-lock.json`.
- GCS: fake-gcs-server (Go module) wrapped by `deploy/go/fake-gcs`, which adds the XML-API object
  upload that object_store (obstore, delta-rs) sends and upstream does not serve yet.

Binaries are built once into `~/.cache/deltacoord/storage-servers/` (`DELTACOORD_HOME`), keyed on
the pinned version or the content of the files that pin it. Each server runs from a home directory
holding its data, `server.log` and `server.json` (pid, port, endpoint); `start` picks a free port,
waits until the server answers, and a server started with `die_with_parent=True` gets SIGTERM when
the process that started it dies (pytest sessions use that).

Manual use: `python -m deltacoord.tooling.storage_servers start|stop|status|install s3|azure|gcs|all`.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar

from deltacoord.schemas.errors import DeltaCoordError
from deltacoord.tooling import processes
from deltacoord.tooling.ports import free_port, port_free

VERSITYGW_MODULE = "github.com/versity/versitygw/cmd/versitygw"
VERSITYGW_VERSION = "v1.8.0"

#: Azurite's fixed development account (public, documented by Microsoft; local emulator only).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="

#: Credentials of the local S3 server's root user (local only, never a real secret).
S3_ACCESS_KEY = "deltacoord"
S3_SECRET_KEY = "deltacoord-local-secret"
S3_REGION = "us-east-1"

KINDS = ("s3", "azure", "gcs")


class StorageServerError(DeltaCoordError, RuntimeError):
    """A local storage server could not be installed, started, found or stopped."""


class _PortTaken(Exception):
    """The server exited because its port was taken before it could bind it."""


_PORT_ATTEMPTS = 4


def cache_home() -> Path:
    """Root of everything deltacoord caches on this machine (`DELTACOORD_HOME`)."""
    env = os.environ.get("DELTACOORD_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "deltacoord"


def servers_cache() -> Path:
    return cache_home() / "storage-servers"


def deploy_dir() -> Path:
    """The repository's `deploy/` folder (the project is installed editable)."""
    env = os.environ.get("DELTACOORD_DEPLOY_DIR")
    here = Path(env) if env else Path(__file__).resolve().parents[1] / "deploy"
    if not here.is_dir():
        raise StorageServerError(
            f"cannot find deploy/ ({here}); install the project with `pip install -e .` from a checkout "
            "or set DELTACOORD_DEPLOY_DIR"
        )
    return here


# -- installing ---------------------------------------------------------------------------------


def _content_key(*files: Path) -> str:
    digest = hashlib.sha256()
    for f in files:
        digest.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _tool(name: str, how: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise StorageServerError(f"`{name}` is not on PATH; {how}")
    return found


def _run_install(cmd: Sequence[str], cwd: Path | None, env: dict[str, str], what: str) -> None:
    proc = subprocess.run(list(cmd), cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise StorageServerError(
            f"installing {what} failed (`{' '.join(cmd)}` exited {proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
        )


@dataclass(frozen=True)
class Artifact:
    """One installed program: `directory` holds it once `.complete` exists there."""

    name: str
    key: str
    executable: str
    install: Callable[[Path], None] = field(repr=False, compare=False)

    @property
    def directory(self) -> Path:
        return servers_cache() / f"{self.name}-{self.key}"

    @property
    def path(self) -> Path:
        return self.directory / self.executable

    def is_installed(self) -> bool:
        return (self.directory / ".complete").exists()

    def ensure(self, *, quiet: bool = True) -> Path:
        """Install unless cached; atomic (built in a temp dir, then renamed) and safe across processes."""
        if self.is_installed():
            return self.path
        with processes.file_lock(servers_cache() / f".{self.name}.lock"):
            if self.is_installed():
                return self.path
            if not quiet:
                print(f"installing {self.name} into {self.directory} ...", file=sys.stderr, flush=True)
            started = time.monotonic()
            tmp = Path(tempfile.mkdtemp(prefix=f".{self.name}-", dir=servers_cache()))
            try:
                self.install(tmp)
                if not (tmp / self.executable).exists():
                    raise StorageServerError(f"installing {self.name} produced no {self.executable} in {tmp}")
                (tmp / ".complete").write_text(f"installed in {time.monotonic() - started:.0f}s\n")
                shutil.rmtree(self.directory, ignore_errors=True)
                tmp.rename(self.directory)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            if not quiet:
                print(f"installed {self.name} in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
        return self.path


def _go_env(gobin: Path) -> dict[str, str]:
    env = dict(os.environ, GOBIN=str(gobin), CGO_ENABLED="0")
    env.setdefault("GOFLAGS", "-buildvcs=false")
    return env


_GO_HOW = "install Go (1.26 or newer, the machine's toolchain) so the storage servers can be built"


def versitygw_artifact() -> Artifact:
    def install(target: Path) -> None:
        go = _tool("go", _GO_HOW)
        _run_install([go, "install", f"{VERSITYGW_MODULE}@{VERSITYGW_VERSION}"], None, _go_env(target), "versitygw")

    return Artifact("versitygw", VERSITYGW_VERSION, "versitygw", install)


def fake_gcs_artifact() -> Artifact:
    src = deploy_dir() / "go" / "fake-gcs"
    files = [src / "go.mod", src / "go.sum", src / "main.go"]

    def install(target: Path) -> None:
        go = _tool("go", _GO_HOW)
        _run_install([go, "build", "-mod=readonly", "-o", str(target / "fake-gcs"), "."], src, _go_env(target), "fake-gcs-server")

    return Artifact("fake-gcs", _content_key(*files), "fake-gcs", install)


def azurite_artifact() -> Artifact:
    src = deploy_dir() / "npm" / "azurite"
    files = [src / "package.json", src / "package-lock.json"]
    main_js = "node_modules/azurite/dist/src/blob/main.js"

    def install(target: Path) -> None:
        npm = _tool("npm", "install Node.js 20+ and npm so Azurite can be installed")
        for f in files:
            shutil.copy2(f, target / f.name)
        _run_install([npm, "ci", "--prefix", str(target), "--no-audit", "--no-fund", "--omit=dev"], target, dict(os.environ), "Azurite")

    return Artifact("azurite", _content_key(*files), main_js, install)


def artifacts(kind: str) -> list[Artifact]:
    table = {"s3": [versitygw_artifact], "azure": [azurite_artifact], "gcs": [fake_gcs_artifact]}
    if kind == "all":
        return [make() for k in KINDS for make in table[k]]
    if kind not in table:
        raise StorageServerError(f"unknown storage server {kind!r}; choose one of {', '.join(KINDS)} or all")
    return [make() for make in table[kind]]


def install(kind: str = "all", *, quiet: bool = True) -> list[Path]:
    return [a.ensure(quiet=quiet) for a in artifacts(kind)]


# -- running -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerInfo:
    """A running server: what a client needs to reach it."""

    kind: str
    pid: int
    port: int
    endpoint: str
    home: str
    log_path: str
    data_dir: str
    storage_options: dict[str, str]




def _http_status(url: str, timeout_s: float = 2.0) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except (OSError, ValueError):
        return None


class LocalStorageServer:
    """Base class: one server process rooted at `home`, started and stopped like the Kafka broker."""

    kind: ClassVar[str]
    #: Environment variable naming a default home.
    home_env: ClassVar[str]

    def __init__(self, home: Path | None = None) -> None:
        env = os.environ.get(self.home_env)
        self.home = (home or (Path(env) if env else servers_cache() / "run" / self.kind)).resolve()
        self.state_file = self.home / "server.json"
        self.data_dir = self.home / "data"
        self.log_path = self.home / "server.log"

    # -- to implement ---------------------------------------------------------------------------
    def artifact(self) -> Artifact:
        raise NotImplementedError

    def command(self, executable: Path, port: int) -> list[str]:
        raise NotImplementedError

    def endpoint(self, port: int) -> str:
        return f"http://127.0.0.1:{port}"

    def storage_options(self, endpoint: str) -> dict[str, str]:
        raise NotImplementedError

    def answers(self, endpoint: str) -> bool:
        return _http_status(endpoint + "/") is not None

    def create_bucket(self, name: str) -> None:
        raise NotImplementedError

    # -- state ----------------------------------------------------------------------------------
    def status(self) -> ServerInfo | None:
        """The running server's info, or None when it does not run (its command line names this home's data
        folder)."""
        return processes.running(self.state_file, ServerInfo, self.data_dir)

    def info(self) -> ServerInfo:
        info = self.status()
        if info is None:
            raise StorageServerError(f"the local {self.kind} server in {self.home} is not running; start it first")
        return info

    def _choose_port(self, port: int | None) -> int:
        if port is not None:
            if not port_free(port):
                raise StorageServerError(f"port {port} on 127.0.0.1 is in use; choose another port or stop what holds it")
            return port
        previous = processes.recorded(self.state_file, ServerInfo)
        if previous is not None and port_free(previous.port):
            return previous.port
        return free_port()

    # -- start / stop ---------------------------------------------------------------------------
    def start(self, port: int | None = None, *, timeout_s: float = 120.0, die_with_parent: bool = False) -> ServerInfo:
        """Install if needed and start the server unless it runs already (then return its info).

        A port chosen here may be taken by another process before the server binds it; then
        the server is started again on another free port (a few times at most).
        """
        executable = self.artifact().ensure()
        self.home.mkdir(parents=True, exist_ok=True)
        with processes.file_lock(self.home / ".lock"):
            running = self.status()
            if running is not None:
                return running
            self.data_dir.mkdir(parents=True, exist_ok=True)
            for attempt in range(_PORT_ATTEMPTS):
                chosen = self._choose_port(port) if attempt == 0 else free_port()
                try:
                    return self._start_on(executable, chosen, timeout_s, die_with_parent)
                except _PortTaken:
                    if port is not None:
                        raise StorageServerError(f"port {port} on 127.0.0.1 is in use; choose another port") from None
            raise StorageServerError(f"the local {self.kind} server found no free port in {_PORT_ATTEMPTS} attempts")

    def _start_on(self, executable: Path, port: int, timeout_s: float, die_with_parent: bool) -> ServerInfo:
        log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as out:
            proc = subprocess.Popen(
                self.command(executable, port), cwd=self.home, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=processes.die_with_parent if die_with_parent else None,
            )
        endpoint = self.endpoint(port)
        info = ServerInfo(
            kind=self.kind, pid=proc.pid, port=port, endpoint=endpoint, home=str(self.home),
            log_path=str(self.log_path), data_dir=str(self.data_dir), storage_options=self.storage_options(endpoint),
        )
        processes.record(self.state_file, info)
        try:
            self._wait_ready(info, proc, timeout_s)
        except BaseException as e:
            processes.terminate(proc.pid, 10.0)
            self.state_file.unlink(missing_ok=True)
            if isinstance(e, StorageServerError) and proc.poll() is not None and self._log_says_port_taken(log_start):
                raise _PortTaken from e
            raise
        return info

    def _log_says_port_taken(self, offset: int) -> bool:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(offset)
                text = fh.read().decode(errors="replace").lower()
        except OSError:
            return False
        return "address already in use" in text or "eaddrinuse" in text

    def _wait_ready(self, info: ServerInfo, proc: subprocess.Popen[bytes], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise StorageServerError(
                    f"the local {self.kind} server exited with code {proc.returncode}; last log lines:\n{self.log_tail()}"
                )
            if self.answers(info.endpoint):
                return
            time.sleep(0.2)
        raise StorageServerError(
            f"the local {self.kind} server did not answer on {info.endpoint} within {timeout_s:.0f}s; log:\n{self.log_tail()}"
        )

    def log_tail(self, n: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        return "(no log)"

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stop the server; False if it was not running."""
        self.home.mkdir(parents=True, exist_ok=True)
        with processes.file_lock(self.home / ".lock"):
            info = self.status()
            if info is None:
                return False
            processes.terminate(info.pid, timeout_s)
            return True


class S3Server(LocalStorageServer):
    """versitygw serving the S3 API from plain directories (one per bucket) under `data/`."""

    kind = "s3"
    home_env = "DELTACOORD_S3_SERVER_HOME"

    def artifact(self) -> Artifact:
        return versitygw_artifact()

    def command(self, executable: Path, port: int) -> list[str]:
        return [
            str(executable), "--access", S3_ACCESS_KEY, "--secret", S3_SECRET_KEY, "--region", S3_REGION,
            "--port", f"127.0.0.1:{port}", "--quiet", "posix", str(self.data_dir),
        ]

    def storage_options(self, endpoint: str) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
            "AWS_REGION": S3_REGION,
            "AWS_ALLOW_HTTP": "true",
            "aws_conditional_put": "etag",
        }

    def answers(self, endpoint: str) -> bool:
        # Unsigned requests are refused with 403: the S3 API answers.
        return _http_status(endpoint + "/") in (200, 403)

    def create_bucket(self, name: str) -> None:
        """CreateBucket through the S3 API, signed as a presigned URL by obstore."""
        import obstore
        from obstore.store import S3Store

        info = self.info()
        store = S3Store(
            name,
            config={"endpoint": info.endpoint, "access_key_id": S3_ACCESS_KEY, "secret_access_key": S3_SECRET_KEY,
                    "region": S3_REGION},
            client_options={"allow_http": True},
        )
        url = obstore.sign(store, "PUT", "", datetime.timedelta(minutes=5))
        _expect_ok(urllib.request.Request(url, method="PUT", data=b""), f"creating S3 bucket {name!r}")


class AzuriteServer(LocalStorageServer):
    """Azurite's blob service (Azure Blob Storage and ADLS Gen2 URIs), data under `data/`."""

    kind = "azure"
    home_env = "DELTACOORD_AZURITE_HOME"

    def artifact(self) -> Artifact:
        return azurite_artifact()

    def command(self, executable: Path, port: int) -> list[str]:
        node = _tool("node", "install Node.js 20+ so Azurite can run")
        return [
            node, str(executable), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(self.data_dir),
            "--silent", "--skipApiVersionCheck", "--disableTelemetry", "--loose",
        ]

    def endpoint(self, port: int) -> str:
        return f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"

    def storage_options(self, endpoint: str) -> dict[str, str]:
        return {
            "azure_storage_account_name": AZURITE_ACCOUNT,
            "azure_storage_account_key": AZURITE_KEY,
            "azure_storage_endpoint": endpoint,
            "azure_allow_http": "true",
        }

    def answers(self, endpoint: str) -> bool:
        # An unauthenticated list is refused with 403 by a live blob service.
        return _http_status(endpoint + "?comp=list") in (200, 403)

    def create_bucket(self, name: str) -> None:
        """Create a container (needs the `azure-storage-blob` package, a test dependency)."""
        try:
            from azure.storage.blob import BlobServiceClient
        except ImportError as e:
            raise StorageServerError("creating an Azurite container needs `pip install azure-storage-blob`") from e
        info = self.info()
        conn = (f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
                f"BlobEndpoint={info.endpoint};")
        BlobServiceClient.from_connection_string(conn).create_container(name)


class GcsServer(LocalStorageServer):
    """fake-gcs-server (with the XML upload of `deploy/go/fake-gcs`), buckets under `data/`."""

    kind = "gcs"
    home_env = "DELTACOORD_GCS_SERVER_HOME"

    def artifact(self) -> Artifact:
        return fake_gcs_artifact()

    def command(self, executable: Path, port: int) -> list[str]:
        return [str(executable), "-host", "127.0.0.1", "-port", str(port), "-root", str(self.data_dir)]

    def storage_options(self, endpoint: str) -> dict[str, str]:
        # object_store reads the emulator's address from a service-account document that turns OAuth off.
        account = {"gcs_base_url": endpoint, "disable_oauth": True, "client_email": "", "private_key": "",
                   "private_key_id": ""}
        return {"google_service_account_key": json.dumps(account), "google_allow_http": "true"}

    def answers(self, endpoint: str) -> bool:
        return _http_status(endpoint + "/storage/v1/b") == 200

    def create_bucket(self, name: str) -> None:
        info = self.info()
        req = urllib.request.Request(
            f"{info.endpoint}/storage/v1/b?project=deltacoord", method="POST",
            data=json.dumps({"name": name}).encode(), headers={"Content-Type": "application/json"},
        )
        _expect_ok(req, f"creating GCS bucket {name!r}")


def _expect_ok(req: urllib.request.Request, what: str) -> None:
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            if resp.status // 100 == 2:
                return
            raise StorageServerError(f"{what}: HTTP {resp.status}")
    except urllib.error.HTTPError as e:
        raise StorageServerError(f"{what}: HTTP {e.code}: {e.read()[:500]!r}") from e


SERVERS: dict[str, type[LocalStorageServer]] = {"s3": S3Server, "azure": AzuriteServer, "gcs": GcsServer}


def server(kind: str, home: Path | None = None) -> LocalStorageServer:
    if kind not in SERVERS:
        raise StorageServerError(f"unknown storage server {kind!r}; choose one of {', '.join(KINDS)}")
    return SERVERS[kind](home)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deltacoord.tooling.storage_servers", description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["install", "start", "stop", "status", "create-bucket"])
    parser.add_argument("kind", choices=[*KINDS, "all"])
    parser.add_argument("--home", type=Path, help="the server's home directory (default under the cache)")
    parser.add_argument("--port", type=int, help="port to listen on (default: the previous one, else a free one)")
    parser.add_argument("--bucket", help="bucket/container name for create-bucket")
    args = parser.parse_args(argv)
    kinds = list(KINDS) if args.kind == "all" else [args.kind]
    if args.home is not None and len(kinds) > 1:
        parser.error("--home names one server's home; choose one kind")
    try:
        if args.action == "install":
            for path in install(args.kind, quiet=False):
                print(path)
            return 0
        for kind in kinds:
            srv = server(kind, args.home)
            if args.action == "start":
                srv.artifact().ensure(quiet=False)
                print(json.dumps(asdict(srv.start(args.port)), indent=2))
            elif args.action == "stop":
                print(f"{kind}: {'stopped' if srv.stop() else 'was not running'}")
            elif args.action == "status":
                info = srv.status()
                print(json.dumps(asdict(info), indent=2) if info else f"{kind}: not running")
            else:
                if not args.bucket:
                    parser.error("create-bucket needs --bucket NAME")
                srv.create_bucket(args.bucket)
                print(f"{kind}: created {args.bucket}")
    except StorageServerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
