"""The asynchronous client: AsyncClient and AsyncSandbox, the methods of Client and Sandbox
as coroutines (and async iterators for the streams)."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any, AsyncIterator, BinaryIO, Callable, Optional, Union

import httpx

from . import _core, errors, models
from ._core import CommandEvent, Req
from .terminal import AsyncTerminal


class _Async:
    _http: httpx.AsyncClient
    _headers: dict

    async def _call(self, req: Req) -> Any:
        content = req.content
        if content is not None and hasattr(content, "read"):
            content = _core.afile_chunks(content)
        kw = {} if req.timeout is None else {"timeout": req.timeout}
        resp = await self._http.request(req.method, self._root + req.path, params=req.params, json=req.json,
                                        content=content, headers={**self._headers, **req.headers}, **kw)
        return req.parse(_core.check(resp))


class AsyncClient(_core.ClientOps, _Async):
    """A gateway, for asyncio code: ``async with AsyncClient(url, api_key) as c``."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: Any = _core.DEFAULT_TIMEOUT, http: Optional[httpx.AsyncClient] = None):
        self._root = _core.gateway_root(url or os.environ.get(_core.URL_ENV) or _core.DEFAULT_URL)
        self.api_key = api_key if api_key is not None else os.environ.get(_core.API_KEY_ENV)
        self._owns = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._headers = _core.auth_headers(self.api_key, None)

    def _sandbox(self, ref: models.SandboxRef) -> "AsyncSandbox":
        return AsyncSandbox(ref, http=self._http, root=self._root, api_key=self.api_key)

    def sandbox(self, sandbox_id: str, token: Optional[str] = None) -> "AsyncSandbox":
        return AsyncSandbox(models.SandboxRef(sandbox_id=sandbox_id, lease_token=token), http=self._http,
                            root=self._root, api_key=self.api_key)

    def connect(self, serialized: str) -> "AsyncSandbox":
        ref = models.SandboxRef.from_dict(json.loads(serialized))
        return AsyncSandbox(ref, http=self._http, root=_core.gateway_root(ref.server_url or self._root))

    async def close(self) -> None:
        if self._owns:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class AsyncSandbox(_core.SandboxOps, _Async):
    """Sandbox for asyncio code."""

    def __init__(self, ref: models.SandboxRef, *, http: Optional[httpx.AsyncClient] = None,
                 root: Optional[str] = None, api_key: Optional[str] = None, timeout: Any = _core.DEFAULT_TIMEOUT):
        self.ref = ref
        self.id = ref.sandbox_id
        self.token = ref.lease_token
        self._root = _core.gateway_root(root or ref.server_url or _core.DEFAULT_URL)
        self._owns = http is None
        self._http = http or httpx.AsyncClient(timeout=timeout)
        self._headers = _core.auth_headers(api_key, self.token)

    @classmethod
    def connect(cls, serialized: str, **kw: Any) -> "AsyncSandbox":
        ref = models.SandboxRef.from_dict(json.loads(serialized))
        return cls(ref, **kw)

    def _handle(self, ref: models.SandboxRef) -> "AsyncSandbox":
        return AsyncSandbox(ref, http=self._http, root=self._root)

    async def close(self) -> None:
        if self._owns:
            await self._http.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"AsyncSandbox({self.id!r}, scope={self.scope!r})"

    async def iter_file(self, path: str, chunk_size: int = _core.CHUNK) -> AsyncIterator[bytes]:
        async with self._http.stream("GET", self._root + self._p("files"), params={"path": path},
                                     headers=self._headers) as resp:
            if resp.status_code >= 400:
                await resp.aread()
                _core.check(resp)
            async for b in resp.aiter_bytes(chunk_size):
                yield b

    async def download_file(self, path: str, dest: Union[str, os.PathLike, BinaryIO]) -> int:
        n = 0
        f = open(dest, "wb") if isinstance(dest, (str, os.PathLike)) else dest
        try:
            async for b in self.iter_file(path):
                f.write(b)
                n += len(b)
        finally:
            if f is not dest:
                f.close()
        return n

    async def upload_file(self, src: Union[str, os.PathLike], path: str) -> models.FileWritten:
        with open(src, "rb") as f:
            return await self.write_file(path, f)

    def stream_command(self, command: str, *, since: str = "0,0", retries: int = 8, stdin: Optional[bytes] = None,
                       **fields: Any) -> AsyncIterator[CommandEvent]:
        req = Req("POST", self._p("commands"), json=_core._command_body(command, stdin, fields))
        return self._events(req, None, since, retries)

    def follow_command(self, command_id: str, *, since: str = "0,0", retries: int = 8) -> AsyncIterator[CommandEvent]:
        return self._events(None, command_id, since, retries)

    async def run_command(self, command: str, *, on_stdout: Optional[Callable[[bytes], Any]] = None,
                          on_stderr: Optional[Callable[[bytes], Any]] = None, **fields: Any) -> models.Command:
        end = None
        async for ev in self.stream_command(command, **fields):
            if ev.kind == "stdout" and on_stdout:
                on_stdout(ev.data)
            elif ev.kind == "stderr" and on_stderr:
                on_stderr(ev.data)
            elif ev.kind == "exit":
                end = ev.command
        return end

    async def _events(self, start: Optional[Req], cid: Optional[str], since: str,
                      retries: int) -> AsyncIterator[CommandEvent]:
        last, fails = since, 0
        while True:
            before = last
            try:
                if start is not None:
                    method, url, js = "POST", self._root + start.path, start.json
                else:
                    method, url, js = "GET", self._root + self._p("commands", cid, "output"), None
                headers = {**self._headers, "Accept": "text/event-stream", "Last-Event-ID": last}
                async with self._http.stream(method, url, json=js, headers=headers) as resp:
                    if resp.status_code >= 400:
                        await resp.aread()
                        _core.check(resp)
                    start = None
                    cid = cid or resp.headers.get("X-Command-Id")
                    p = _core.SSEParser()
                    async for line in resp.aiter_lines():
                        ev = p.line(line)
                        if ev is None:
                            continue
                        if ev.kind == "start":
                            cid = ev.command.command_id
                        if ev.id:
                            last = ev.id
                        yield ev
                        if ev.kind == "exit":
                            return
                raise httpx.RemoteProtocolError("the event stream ended before the exit event")
            except httpx.TransportError as e:
                if start is not None and cid is None:
                    raise
                if last != before:
                    fails = 0
                fails += 1
                if fails > retries:
                    raise errors.StreamError(f"command {cid}: the event stream failed {fails - 1} times in a row: {e}")
                await asyncio.sleep(_core.backoff(fails - 1, 0.2, 5.0))

    def attach(self, session_id: str, *, since: int = 0, takeover: bool = False, reconnect: bool = True,
               **kw: Any) -> AsyncTerminal:
        """An AsyncTerminal on the session: ``async with sandbox.attach(sid) as t``."""
        return AsyncTerminal(self, session_id, since=since, takeover=takeover, reconnect=reconnect, **kw)
