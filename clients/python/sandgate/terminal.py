"""Terminal attachments over the gateway's WebSocket (SPEC section 7).

AsyncTerminal keeps one session attached: after a dropped connection it re-attaches with
``since`` = the absolute offset of the next byte it has not delivered, and drops the part of
the replay it already delivered, so every retained byte comes exactly once and in order
(``lost`` counts bytes the gateway no longer held). Close 4001 (another client took the
session over) raises TakenOverError and is never re-dialled. Terminal is the same for sync
code, run on a private event loop thread.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Optional, Union

import websockets
import websockets.exceptions as wse

from . import _core, errors, models

try:  # websockets >= 14 moved the API this module uses here
    from websockets.legacy.client import connect as _ws_connect
except ImportError:  # pragma: no cover
    _ws_connect = websockets.connect

CHAN_STDIN, CHAN_OUTPUT, CHAN_STDERR, CHAN_REPLAY = 0, 1, 2, 3
CLOSE_TAKEN_OVER = 4001
READ_LIMIT = 64 << 20  # a replay frame carries up to the session's whole ring
BUSY_RETRIES = 5  # 409s tolerated after a drop: the gateway may still hold our old connection


class AsyncTerminal:
    """One attachment to a terminal session; ``async with sandbox.attach(sid) as t``.

    ``recv()`` returns the next output bytes (b"" once the process exited: then
    ``exit_code`` is set); ``offset`` is the absolute offset of the next byte; ``mode`` is
    ``"pty"`` or ``"pipe"``; ``reconnects`` counts re-attaches. With reconnect=False a drop
    raises instead of re-attaching."""

    def __init__(self, sandbox: Any, session_id: str, *, since: int = 0, takeover: bool = False,
                 reconnect: bool = True, retries: int = 8, min_backoff: float = 0.1, max_backoff: float = 5.0):
        self._sb = sandbox
        self.session_id = session_id
        self.offset = since
        self.lost = 0
        self.exit_code: Optional[int] = None
        self.mode: Optional[str] = None
        self.reconnects = 0
        self.notices: list = []
        self._takeover = takeover
        self._reconnect = reconnect
        self._retries = retries
        self._backoff = (min_backoff, max_backoff)
        self._ws: Any = None
        self._gone = False
        self._closed = False
        self._redial = asyncio.Lock()

    async def __aenter__(self) -> "AsyncTerminal":
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def connect(self) -> None:
        """Attaches (the first time: with takeover if asked). Raises ConflictError
        (ALREADY_CONNECTED) when another client holds the session."""
        self._ws = await self._dial(self._takeover)

    async def _dial(self, takeover: bool) -> Any:
        url = self._sb._ws_url(self.session_id, self.offset, takeover)
        try:
            return await _ws_connect(url, extra_headers=self._sb._headers, max_size=READ_LIMIT, compression=None,
                                     open_timeout=30)
        except wse.InvalidStatusCode as e:
            raise _refusal(e.status_code) from None

    async def _reattach(self, seen: Any) -> None:
        """Re-dials after the connection seen dropped (once, however many callers saw it)."""
        async with self._redial:
            if self._ws is not seen:
                return
            fails = busy = 0
            while True:
                try:
                    self._ws = await self._dial(False)
                    self.reconnects += 1
                    return
                except errors.ConflictError:
                    busy += 1
                    if busy > BUSY_RETRIES:
                        raise
                except errors.APIError as e:
                    if e.status < 500:
                        raise
                    fails += 1
                except (OSError, asyncio.TimeoutError, wse.WebSocketException) as e:
                    fails += 1
                    if fails > self._retries:
                        raise errors.StreamError(f"terminal {self.session_id}: re-attach failed {fails - 1} times: {e}")
                await asyncio.sleep(_core.backoff(fails + busy, *self._backoff))

    async def recv_frame(self) -> tuple:
        """(channel, bytes): channel ``"output"`` or ``"stderr"`` (pipe mode); (``"exit"``,
        b"") once the process exited. A replayed stretch is delivered as ``"output"``."""
        while True:
            ws = self._ws
            if ws is None:
                return "exit", b""
            try:
                msg = await ws.recv()
            except wse.ConnectionClosed as e:
                code = e.rcvd.code if e.rcvd is not None else None
                if self.exit_code is not None or self._closed:
                    self._ws = None
                    return "exit", b""
                if code == CLOSE_TAKEN_OVER:
                    raise errors.TakenOverError(f"terminal {self.session_id} was taken over by another client")
                if self._gone:
                    raise errors.NotFoundError(404, models.Problem(status=404, code="SESSION_GONE",
                                                                   detail="the session is gone"))
                if not self._reconnect:
                    raise
                await self._reattach(ws)
                continue
            if isinstance(msg, str):
                self._text(msg)
                continue
            if not msg:
                continue
            ch = msg[0]
            if ch == CHAN_REPLAY:
                off, data = int.from_bytes(msg[1:9], "big"), msg[9:]
            else:
                off, data = self.offset, msg[1:]
            if off > self.offset:
                self.lost += off - self.offset
                self.offset = off
            skip = self.offset - off
            if skip >= len(data):
                continue
            data = data[skip:]
            self.offset += len(data)
            return ("stderr" if ch == CHAN_STDERR else "output"), bytes(data)

    def _text(self, msg: str) -> None:
        try:
            m = json.loads(msg)
        except ValueError:
            return
        t = m.get("type")
        if t == "connected":
            self.mode = m.get("mode")
        elif t == "exit":
            self.exit_code = m.get("exit_code", 0)
        elif t == "error":
            if m.get("code") == "SESSION_GONE":
                self._gone = True
            self.notices.append(m)

    async def recv(self) -> bytes:
        """The next output bytes; b"" once the process exited."""
        return (await self.recv_frame())[1]

    async def read_until(self, marker: Union[bytes, str], timeout: float = 30.0) -> bytes:
        """Output up to and including marker (raises asyncio.TimeoutError, or EOFError at exit)."""
        if isinstance(marker, str):
            marker = marker.encode()
        buf = bytearray()

        async def read() -> bytes:
            while marker not in buf:
                b = await self.recv()
                if not b:
                    raise EOFError(f"the process exited before {marker!r}; output: {bytes(buf)!r}")
                buf.extend(b)
            return bytes(buf)

        return await asyncio.wait_for(read(), timeout)

    async def wait(self, timeout: float = 60.0) -> Optional[int]:
        """Reads (and drops) output until the process exits; its exit code."""

        async def drain() -> None:
            while await self.recv():
                pass

        await asyncio.wait_for(drain(), timeout)
        return self.exit_code

    async def _send(self, msg: Union[bytes, str]) -> None:
        ws = self._ws
        try:
            await ws.send(msg)
        except wse.ConnectionClosed:
            if not self._reconnect or self.exit_code is not None:
                raise
            await self._reattach(ws)
            await self._ws.send(msg)

    async def send(self, data: Union[bytes, str]) -> None:
        """Writes data to the session's stdin."""
        if isinstance(data, str):
            data = data.encode()
        await self._send(bytes([CHAN_STDIN]) + data)

    async def resize(self, cols: int, rows: int) -> None:
        await self._send(json.dumps({"type": "resize", "cols": cols, "rows": rows}))

    async def signal(self, signal: str = "SIGINT") -> None:
        """SIGINT, SIGTERM, SIGKILL, SIGQUIT or SIGHUP (PTY: to the foreground process group)."""
        await self._send(json.dumps({"type": "signal", "signal": signal}))

    async def eof(self) -> None:
        """Closes the session's stdin (pipe mode)."""
        await self._send(json.dumps({"type": "eof"}))

    def interrupt_connection(self) -> None:
        """Cuts the connection as a network failure would (no close frame): the next recv
        re-attaches. For tests and demos of the reattach."""
        if self._ws is not None:
            self._ws.transport.abort()

    async def close(self) -> None:
        """Detaches (the session keeps running)."""
        self._closed = True
        if self._ws is not None:
            await self._ws.close()
            self._ws = None


def _refusal(status: int) -> errors.APIError:
    # websockets does not give us the refusal's body: its code is what the status means here.
    code = {409: "ALREADY_CONNECTED", 404: "CONTEXT_NOT_FOUND"}.get(status, "")
    p = models.Problem(status=status, code=code, title=f"attach refused with {status}")
    return errors._BY_STATUS.get(status, errors.APIError)(status, p)


class _Loop:
    """A private event loop on a daemon thread, for the sync Terminal."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sandgate-terminal", daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class Terminal:
    """AsyncTerminal for sync code (``with sandbox.attach(sid) as t``): the same methods,
    blocking."""

    def __init__(self, sandbox: Any, session_id: str, **kw: Any):
        self._loop = _Loop()
        try:
            self._t: AsyncTerminal = self._loop.run(_make(sandbox, session_id, kw))
        except BaseException:
            self._loop.stop()
            raise

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        if name == "_t":
            raise AttributeError(name)
        return getattr(self._t, name)  # offset, lost, exit_code, mode, reconnects, notices

    def recv(self) -> bytes:
        return self._loop.run(self._t.recv())

    def recv_frame(self) -> tuple:
        return self._loop.run(self._t.recv_frame())

    def read_until(self, marker: Union[bytes, str], timeout: float = 30.0) -> bytes:
        return self._loop.run(self._t.read_until(marker, timeout))

    def wait(self, timeout: float = 60.0) -> Optional[int]:
        return self._loop.run(self._t.wait(timeout))

    def send(self, data: Union[bytes, str]) -> None:
        self._loop.run(self._t.send(data))

    def resize(self, cols: int, rows: int) -> None:
        self._loop.run(self._t.resize(cols, rows))

    def signal(self, signal: str = "SIGINT") -> None:
        self._loop.run(self._t.signal(signal))

    def eof(self) -> None:
        self._loop.run(self._t.eof())

    def interrupt_connection(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._t.interrupt_connection)

    def close(self) -> None:
        if self._loop.thread.is_alive():
            try:
                self._loop.run(self._t.close())
            finally:
                self._loop.stop()


async def _make(sandbox: Any, session_id: str, kw: dict) -> AsyncTerminal:
    t = AsyncTerminal(sandbox, session_id, **kw)
    await t.connect()
    return t
