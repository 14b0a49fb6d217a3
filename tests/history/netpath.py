"""A network path the fault harness can cut: TCP proxies in front of one route of a local cluster.

Every node of a `LocalCluster` started with a route ``A`` has a listener whose
advertised address is a port this module owns, so a client that bootstraps
through `NetPath.bootstrap` reaches every broker only through these proxies:
metadata sends it back to the advertised (proxy) ports. Cutting the path cuts
exactly those clients off, without root, network namespaces or firewall rules,
while writers and the harness keep the brokers on their own listener.

Two ways to cut:

* ``blackhole``: nothing is forwarded any more, open connections stay open and
  new ones are accepted and held, as when packets are dropped; on `heal` the
  held bytes flow again (a paused network path);
* ``reset``: every open connection is reset and new ones are reset at once,
  as when a firewall rejects.

The proxies run on an asyncio loop in a daemon thread; the listening sockets are
bound when the path is created, before any broker advertises their ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from deltacoord.tooling.broker import LocalCluster

MODES = ("blackhole", "reset")


@dataclass
class PathStats:
    connections: int = 0
    resets: int = 0
    cuts: int = 0


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST (SO_LINGER 0), as a rejecting firewall or a dead peer would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class NetPath:
    """`count` proxies (one per node, in node order) that can be cut and healed together."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self._socks = []
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", 0))
            s.listen(128)
            s.setblocking(False)
            self._socks.append(s)
        self.ports = [int(s.getsockname()[1]) for s in self._socks]
        self.stats = PathStats()
        self.mode: str | None = None
        self._targets: list[int] | None = None
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
        self._open.set()
        self._conns: set[asyncio.StreamWriter] = set()
        self._servers: list[asyncio.Server] = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"netpath-{name}", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError(f"the proxies of path {name} did not start")

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def connect(self, targets: Sequence[int]) -> None:
        """Forward proxy i to 127.0.0.1:targets[i] (the broker's real listener of this route)."""
        if len(targets) != len(self.ports):
            raise ValueError(f"path {self.name} has {len(self.ports)} proxies, got {len(targets)} targets")
        self._targets = list(targets)

    def cut(self, mode: str = "blackhole") -> None:
        if mode not in MODES:
            raise ValueError(f"cut mode {mode!r}: choose one of {', '.join(MODES)}")
        self._call(self._cut(mode))

    def heal(self) -> None:
        self._call(self._heal())

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # -- the loop -------------------------------------------------------------------------------------
    def _call(self, coro: object) -> None:
        asyncio.run_coroutine_threadsafe(coro, self._loop).result(30)  # type: ignore[arg-type]

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)

        async def serve() -> None:
            for i, s in enumerate(self._socks):
                self._servers.append(await asyncio.start_server(functools.partial(self._handle, i), sock=s))

        self._loop.run_until_complete(serve())
        self._ready.set()
        self._loop.run_forever()

    async def _cut(self, mode: str) -> None:
        self.mode = mode
        self.stats.cuts += 1
        self._open.clear()
        if mode == "reset":
            for w in list(self._conns):
                _reset(w)
                self.stats.resets += 1

    async def _heal(self) -> None:
        self.mode = None
        self._open.set()

    async def _shutdown(self) -> None:
        for srv in self._servers:
            srv.close()
        for w in list(self._conns):
            w.transport.abort()

    async def _handle(self, index: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        if self.mode == "reset" or self._targets is None:
            _reset(writer)
            return
        self._conns.add(writer)
        upstream: asyncio.StreamWriter | None = None
        try:
            await self._open.wait()  # a blackholed path holds new connections too
            if self.mode == "reset":
                return
            try:
                up_reader, upstream = await asyncio.open_connection("127.0.0.1", self._targets[index])
            except OSError:  # the broker is down: look like it to the client (a reset, as a refused connect)
                _reset(writer)
                return
            self._conns.add(upstream)
            await asyncio.gather(self._pipe(reader, upstream), self._pipe(up_reader, writer))
        except OSError:
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    self._conns.discard(w)
                    if self.mode == "reset":
                        _reset(w)
                    else:
                        w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                await self._open.wait()
                data = await reader.read(65536)
                if not data:
                    break
                await self._open.wait()
                if self.mode == "reset":
                    break
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        finally:
            writer.transport.abort()  # ends the other direction too


def start_cluster_with_paths(home: Path, brokers: int = 3, names: Sequence[str] = ("A", "B"),
                             timeout_s: float = 240.0, secure: bool = False) -> tuple[LocalCluster, dict[str, NetPath]]:
    """A fresh local cluster on free ports with one cuttable `NetPath` per route name (`secure`: SASL_SSL and
    the authorizer, on the routes too; the proxies carry the TLS bytes as they are)."""
    paths = {name: NetPath(name, brokers) for name in names}
    cluster = LocalCluster(home, brokers, default_port=None)
    try:
        cluster.start(timeout_s=timeout_s, fresh=True, routes={n: p.ports for n, p in paths.items()}, secure=secure)
        connect_paths(cluster, paths)
    except BaseException:
        cluster.stop()
        close_paths(paths)
        raise
    return cluster, paths


def connect_paths(cluster: LocalCluster, paths: Mapping[str, NetPath]) -> None:
    layout = cluster.layout()
    assert layout is not None
    for name, path in paths.items():
        path.connect([n.routes[name][0] for n in layout.nodes])


def close_paths(paths: Mapping[str, NetPath]) -> None:
    for p in paths.values():
        p.close()
