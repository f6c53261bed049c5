"""The synchronous client: Client (API key routes) and Sandbox (one sandbox, by lease)."""

from __future__ import annotations

import json
import os
import time
from typing import Any, BinaryIO, Callable, Iterator, Optional, Union

import httpx

from . import _core, errors, models
from ._core import CommandEvent, Req


class _Sync:
    _http: httpx.Client
    _headers: dict

    def _call(self, req: Req) -> Any:
        content = req.content
        if content is not None and hasattr(content, "read"):
            content = _core.file_chunks(content)
        kw = {} if req.timeout is None else {"timeout": req.timeout}
        resp = self._http.request(req.method, self._root + req.path, params=req.params, json=req.json,
                                  content=content, headers={**self._headers, **req.headers}, **kw)
        return req.parse(_core.check(resp))


class Client(_core.ClientOps, _Sync):
    """A gateway: ``Client(url, api_key)``; both default to ``$SANDGATE_URL`` (else
    http://127.0.0.1:8080) and ``$SANDGATE_API_KEY``. Use as a context manager, or close()."""

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: Any = _core.DEFAULT_TIMEOUT, http: Optional[httpx.Client] = None):
        self._root = _core.gateway_root(url or os.environ.get(_core.URL_ENV) or _core.DEFAULT_URL)
        self.api_key = api_key if api_key is not None else os.environ.get(_core.API_KEY_ENV)
        self._owns = http is None
        self._http = http or httpx.Client(timeout=timeout)
        self._headers = _core.auth_headers(self.api_key, None)

    def _sandbox(self, ref: models.SandboxRef) -> "Sandbox":
        return Sandbox(ref, http=self._http, root=self._root, api_key=self.api_key)

    def sandbox(self, sandbox_id: str, token: Optional[str] = None) -> "Sandbox":
        """A handle on an existing sandbox, by its lease token or else this client's API key."""
        return Sandbox(models.SandboxRef(sandbox_id=sandbox_id, lease_token=token), http=self._http,
                       root=self._root, api_key=self.api_key)

    def connect(self, serialized: str) -> "Sandbox":
        """A handle from Sandbox.serialize(), sharing this client's connections."""
        ref = models.SandboxRef.from_dict(json.loads(serialized))
        return Sandbox(ref, http=self._http, root=_core.gateway_root(ref.server_url or self._root))

    def close(self) -> None:
        if self._owns:
            self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Sandbox(_core.SandboxOps, _Sync):
    """One sandbox, reached with one lease (``token``) or the creating API key. Made by
    Client.create, Sandbox.connect(serialized), mint_lease, fork."""

    def __init__(self, ref: models.SandboxRef, *, http: Optional[httpx.Client] = None, root: Optional[str] = None,
                 api_key: Optional[str] = None, timeout: Any = _core.DEFAULT_TIMEOUT):
        self.ref = ref
        self.id = ref.sandbox_id
        self.token = ref.lease_token
        self._root = _core.gateway_root(root or ref.server_url or _core.DEFAULT_URL)
        self._owns = http is None
        self._http = http or httpx.Client(timeout=timeout)
        self._api_key = api_key
        self._headers = _core.auth_headers(api_key, self.token)

    @classmethod
    def connect(cls, serialized: str, **kw: Any) -> "Sandbox":
        """A handle from serialize() (e.g. in another process), with its own connections."""
        ref = models.SandboxRef.from_dict(json.loads(serialized))
        return cls(ref, **kw)

    def _handle(self, ref: models.SandboxRef) -> "Sandbox":
        return Sandbox(ref, http=self._http, root=self._root)

    def close(self) -> None:
        if self._owns:
            self._http.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Sandbox({self.id!r}, scope={self.scope!r})"

    # -- streamed files

    def iter_file(self, path: str, chunk_size: int = _core.CHUNK) -> Iterator[bytes]:
        """The file's bytes in chunks, as they arrive (never the whole file in memory)."""
        with self._http.stream("GET", self._root + self._p("files"), params={"path": path},
                               headers=self._headers) as resp:
            if resp.status_code >= 400:
                resp.read()
                _core.check(resp)
            yield from resp.iter_bytes(chunk_size)

    def download_file(self, path: str, dest: Union[str, os.PathLike, BinaryIO]) -> int:
        """Streams the file at path into dest (a local path or a binary file); its size."""
        n = 0
        f = open(dest, "wb") if isinstance(dest, (str, os.PathLike)) else dest
        try:
            for b in self.iter_file(path):
                f.write(b)
                n += len(b)
        finally:
            if f is not dest:
                f.close()
        return n

    def upload_file(self, src: Union[str, os.PathLike], path: str) -> models.FileWritten:
        """Streams the local file src to path in the sandbox."""
        with open(src, "rb") as f:
            return self.write_file(path, f)

    # -- durable commands, followed

    def stream_command(self, command: str, *, since: str = "0,0", retries: int = 8, stdin: Optional[bytes] = None,
                       **fields: Any) -> Iterator[CommandEvent]:
        """Starts a durable command and yields its events as it runs: ``start`` (the Command,
        its id), ``stdout``/``stderr`` chunks, ``exit`` (the Command at its end). A dropped
        stream is re-opened where it stopped, so every byte comes once."""
        req = Req("POST", self._p("commands"), json=_core._command_body(command, stdin, fields))
        return self._events(req, None, since, retries)

    def follow_command(self, command_id: str, *, since: str = "0,0", retries: int = 8) -> Iterator[CommandEvent]:
        """Yields a command's events from since (``"O,E"``, or a CommandEvent's id), reattaching
        by id after a drop, until its exit event."""
        return self._events(None, command_id, since, retries)

    def run_command(self, command: str, *, on_stdout: Optional[Callable[[bytes], Any]] = None,
                    on_stderr: Optional[Callable[[bytes], Any]] = None, **fields: Any) -> models.Command:
        """stream_command to its end, output to the callbacks; the ended Command."""
        end = None
        for ev in self.stream_command(command, **fields):
            if ev.kind == "stdout" and on_stdout:
                on_stdout(ev.data)
            elif ev.kind == "stderr" and on_stderr:
                on_stderr(ev.data)
            elif ev.kind == "exit":
                end = ev.command
        return end

    def _events(self, start: Optional[Req], cid: Optional[str], since: str, retries: int) -> Iterator[CommandEvent]:
        last, fails = since, 0
        while True:
            before = last
            try:
                if start is not None:
                    method, url, js = "POST", self._root + start.path, start.json
                else:
                    method, url, js = "GET", self._root + self._p("commands", cid, "output"), None
                headers = {**self._headers, "Accept": "text/event-stream", "Last-Event-ID": last}
                with self._http.stream(method, url, json=js, headers=headers) as resp:
                    if resp.status_code >= 400:
                        resp.read()
                        _core.check(resp)
                    start = None  # started: from now on, follow by id
                    cid = cid or resp.headers.get("X-Command-Id")
                    p = _core.SSEParser()
                    for line in resp.iter_lines():
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
            except (httpx.TransportError, httpx.RemoteProtocolError) as e:
                if start is not None and cid is None:
                    raise  # nothing was started that we know of
                if last != before:
                    fails = 0
                fails += 1
                if fails > retries:
                    raise errors.StreamError(f"command {cid}: the event stream failed {fails - 1} times in a row: {e}")
                time.sleep(_core.backoff(fails - 1, 0.2, 5.0))

    # -- terminals

    def attach(self, session_id: str, *, since: int = 0, takeover: bool = False, reconnect: bool = True,
               **kw: Any) -> "Terminal":
        """Attaches to a terminal session (see Terminal). Use as a context manager."""
        from .terminal import Terminal

        return Terminal(self, session_id, since=since, takeover=takeover, reconnect=reconnect, **kw)
