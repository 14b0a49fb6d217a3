"""A TCP proxy that holds every byte for a fixed time each way, so a local storage server answers like a remote
object store (S3: 20-60 ms a request) in benches and tests.

Localhost hides what a store costs: publication that is one PUT after another looks free at 0.1 ms a
request and caps a coordinator at 15 versions/s at 60 ms. The proxy delays each chunk by half the round trip
in each direction, in order, without limiting throughput, so every request/response exchange (one S3 call on
a kept-alive connection, or a connection's handshake) costs `round_trip_ms` more, and calls in flight at once
overlap as they would against a remote store.

    with LatencyProxy(("127.0.0.1", 9000), round_trip_ms=60) as proxy:
        endpoint = proxy.endpoint   # http://127.0.0.1:<port>
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import TracebackType

#: Bytes read at once from either side.
_CHUNK = 256 * 1024


class LatencyProxy:
    """Forward 127.0.0.1:`port` to `target`, adding `round_trip_ms` to every exchange (in a thread of its own)."""

    def __init__(self, target: tuple[str, int], round_trip_ms: float, host: str = "127.0.0.1") -> None:
        if round_trip_ms < 0:
            raise ValueError(f"round_trip_ms must be 0 or more, got {round_trip_ms}")
        self.target = target
        self.round_trip_ms = round_trip_ms
        self.host = host
        self.port = 0
        self._one_way_s = round_trip_ms / 2000.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.Server | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> LatencyProxy:
        self._thread = threading.Thread(target=self._run, name="deltacoord-latency-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(30)
        if self._error is not None or not self.port:
            raise RuntimeError(f"the latency proxy to {self.target[0]}:{self.target[1]} did not start: {self._error}")
        return self

    def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._shutdown(server), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10)
        self._loop = self._server = None

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    # -- the event loop's side --------------------------------------------------------------
    @staticmethod
    async def _shutdown(server: asyncio.Server) -> None:
        """Stop listening and end the connections still open."""
        server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._server = loop.run_until_complete(asyncio.start_server(self._connection, self.host, 0))
            self.port = int(self._server.sockets[0].getsockname()[1])
        except BaseException as e:  # reported by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _connection(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        try:
            server_r, server_w = await asyncio.open_connection(*self.target)
        except OSError:
            client_w.close()
            return
        try:
            await asyncio.gather(self._pipe(client_r, server_w), self._pipe(server_r, client_w))
        finally:
            for w in (server_w, client_w):
                w.close()

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        """Copy `src` to `dst`, each chunk held until `one_way` after it arrived (order kept)."""
        loop = asyncio.get_running_loop()
        held: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def release() -> None:
            while True:
                due, data = await held.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    break
                dst.write(data)
                await dst.drain()

        releasing = asyncio.ensure_future(release())
        try:
            while True:
                data = await src.read(_CHUNK)
                held.put_nowait((loop.time() + self._one_way_s, data))
                if not data:
                    break
            await releasing
        except (OSError, asyncio.IncompleteReadError):
            releasing.cancel()
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                if dst.can_write_eof():
                    dst.write_eof()
                else:
                    dst.close()
