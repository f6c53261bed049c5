"""What the sync and async clients share: each REST call is built once as a Req, which the
sync classes send with httpx.Client and the async ones with httpx.AsyncClient (the shared
methods return ``self._call(req)``: a value in the sync classes, a coroutine in the async
ones). Streams (command output, files, terminals) have one implementation per flavour."""

from __future__ import annotations

import base64
import json
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Optional
from urllib.parse import quote

import httpx

from . import errors, models

API_KEY_ENV = "SANDGATE_API_KEY"
URL_ENV = "SANDGATE_URL"
DEFAULT_URL = "http://127.0.0.1:8080"

# Reads have no tight bound: exec, wait and the event streams send heartbeats every few
# seconds, so a read that stays silent for minutes is a dead connection.
DEFAULT_TIMEOUT = httpx.Timeout(30.0, read=300.0)
# A create may wait in the gateway's queue (create_queue_timeout_s, default 600 s).
CREATE_TIMEOUT = httpx.Timeout(30.0, read=None)
CHUNK = 256 << 10


def gateway_root(url: str) -> str:
    """The gateway's root URL from a base or server URL (``…/v1`` and a trailing slash cut)."""
    url = url.rstrip("/")
    if url.endswith("/v1"):
        url = url[: -len("/v1")]
    return url


def q(s: str) -> str:
    return quote(s, safe="")


def backoff(n: int, lo: float, hi: float) -> float:
    """The delay before try n+1: lo·2^n capped at hi, less up to half of it as jitter."""
    d = min(hi, lo * (2 ** min(n, 30)))
    return d / 2 + random.uniform(0, d / 2)


@dataclass
class Req:
    """One REST call: where, what, and how to turn a success into a value."""

    method: str
    path: str
    params: Optional[dict] = None
    json: Any = None
    content: Any = None  # bytes, or a binary file object streamed in chunks
    headers: dict = field(default_factory=dict)
    parse: Callable[[httpx.Response], Any] = lambda r: r.json()
    timeout: Any = None


def check(resp: httpx.Response) -> httpx.Response:
    """resp, or the APIError of its problem+json (the body must have been read)."""
    if resp.status_code >= 400:
        raise errors.from_response(resp.status_code, resp.content, resp.headers)
    return resp


def model(cls) -> Callable[[httpx.Response], Any]:
    return lambda r: cls.from_dict(r.json())


def items(cls, key: str) -> Callable[[httpx.Response], Any]:
    return lambda r: [cls.from_dict(x) for x in r.json()[key]]


def body(cls, **fields) -> dict:
    """The JSON of request model cls from keyword fields (unknown ones are a TypeError)."""
    return cls(**fields).to_dict()


def wait_result(r: httpx.Response) -> Any:
    """A wait's answer: the ExecResult once the command ended, else its Command (running)."""
    data = r.json()
    if data.get("running") is True:
        return models.Command.from_dict(data)
    return models.ExecResult.from_dict(data)


@dataclass
class CommandEvent:
    """One event of a durable command's stream: ``kind`` is ``start`` (``command`` set),
    ``stdout`` or ``stderr`` (``data``, the bytes) or ``exit`` (``command``, its end).
    ``id`` is ``"O,E"``, the stdout and stderr offsets after it (give it as ``since`` to
    resume exactly there)."""

    kind: str
    id: str = ""
    data: bytes = b""
    command: Optional[models.Command] = None


class SSEParser:
    """Turns the lines of a command's event stream into CommandEvents."""

    def __init__(self) -> None:
        self.event = ""
        self.id = ""
        self.data: list[str] = []

    def line(self, line: str) -> Optional[CommandEvent]:
        line = line.rstrip("\r\n")
        if line:
            if line.startswith(":"):
                return None  # a keepalive comment
            name, _, value = line.partition(":")
            if value.startswith(" "):
                value = value[1:]
            if name == "event":
                self.event = value
            elif name == "id":
                self.id = value
            elif name == "data":
                self.data.append(value)
            return None
        event, eid, data = self.event, self.id, "\n".join(self.data)
        self.event, self.id, self.data = "", "", []
        if event in ("stdout", "stderr"):
            return CommandEvent(event, eid, base64.b64decode(data))
        if event in ("start", "exit"):
            return CommandEvent(event, eid, command=models.Command.from_dict(json.loads(data)))
        return None


class ClientOps:
    """The API-key routes (create, list, snapshots, volumes, quota). ``_call`` and
    ``_sandbox`` come from the sync or async class."""

    def _parse_ref(self, r: httpx.Response):
        return self._sandbox(models.SandboxRef.from_dict(r.json()))

    def _create_req(self, fields: dict) -> Req:
        return Req("POST", "/v1/sandboxes", json=body(models.CreateSandbox, **fields), timeout=CREATE_TIMEOUT)

    def create(self, **fields):
        """Creates a sandbox and returns its handle (owner lease) once it is ready. Fields are
        CreateSandbox's: image, ttl_s, idle_timeout_s, ready_timeout_s, workdir, env, files,
        metadata, resources (dict or Resources), entrypoint, ports, network, provider_options,
        snapshot_id, shm_size, volumes (dicts or VolumeMount). Use create_batch for count."""
        if "count" in fields or "allow_partial" in fields:
            raise TypeError("create makes one sandbox: use create_batch(count, ...)")
        req = self._create_req(_coerce_create(fields))
        req.parse = self._parse_ref
        return self._call(req)

    def create_batch(self, count: int, allow_partial: Optional[bool] = None, **fields):
        """Creates count sandboxes of one request: a Batch (``sandboxes``, handles; ``failed``,
        BatchFailures). All or nothing unless allow_partial."""
        fields = _coerce_create(fields)
        req = self._create_req(dict(fields, count=count, allow_partial=allow_partial))

        def parse(r: httpx.Response):
            b = models.SandboxBatch.from_dict(r.json())
            return Batch([self._sandbox(ref) for ref in b.sandboxes or []], b.failed or [])

        req.parse = parse
        return self._call(req)

    def list(self, status: Optional[str] = None, label: Any = None):
        """The caller's sandboxes (SandboxInfo), in creation order; label is ``"k=v"`` or (k, v)."""
        params = {}
        if status is not None:
            params["status"] = status
        if label is not None:
            params["label"] = label if isinstance(label, str) else f"{label[0]}={label[1]}"
        return self._call(Req("GET", "/v1/sandboxes", params=params, parse=items(models.SandboxInfo, "sandboxes")))

    def get(self, sandbox_id: str):
        """Describes a sandbox the caller's key created (SandboxInfo)."""
        return self._call(Req("GET", f"/v1/sandboxes/{q(sandbox_id)}", parse=model(models.SandboxInfo)))

    def snapshots(self):
        """The caller's snapshots (Snapshot), oldest first."""
        return self._call(Req("GET", "/v1/snapshots", parse=items(models.Snapshot, "snapshots")))

    def get_snapshot(self, snapshot_id: str):
        return self._call(Req("GET", f"/v1/snapshots/{q(snapshot_id)}", parse=model(models.Snapshot)))

    def delete_snapshot(self, snapshot_id: str):
        """Deletes a snapshot (DeleteResult; ``deleted`` false if the key did not hold it)."""
        return self._call(Req("DELETE", f"/v1/snapshots/{q(snapshot_id)}", parse=model(models.DeleteResult)))

    def images(self):
        """What a create may name in ``image``, and from where (ImageList)."""
        return self._call(Req("GET", "/v1/images", parse=model(models.ImageList)))

    def create_volume(self, name: str, size_gib: float):
        return self._call(Req("POST", "/v1/volumes", json=body(models.CreateVolume, name=name, size_gib=size_gib),
                              parse=model(models.Volume)))

    def volumes(self):
        return self._call(Req("GET", "/v1/volumes", parse=items(models.Volume, "volumes")))

    def get_volume(self, name: str):
        return self._call(Req("GET", f"/v1/volumes/{q(name)}", parse=model(models.Volume)))

    def delete_volume(self, name: str):
        return self._call(Req("DELETE", f"/v1/volumes/{q(name)}", parse=model(models.DeleteResult)))

    def quota(self):
        """The caller's quotas and usage (Quota)."""
        return self._call(Req("GET", "/v1/quota", parse=model(models.Quota)))


@dataclass
class Batch:
    """What create_batch returns: the handles made and, with allow_partial, the failures."""

    sandboxes: list
    failed: list


def _coerce_create(fields: dict) -> dict:
    out = dict(fields)
    if isinstance(out.get("resources"), dict):
        out["resources"] = models.Resources(**out["resources"])
    if out.get("volumes") is not None:
        out["volumes"] = [models.VolumeMount(**v) if isinstance(v, dict) else v for v in out["volumes"]]
    if out.get("network") is not None and not isinstance(out["network"], models.Network):
        n = out["network"]
        out["network"] = models.Network(**n) if isinstance(n, dict) and set(n) <= {"egress"} else models.Network(egress=n)
    return out


class SandboxOps:
    """The per-sandbox routes. ``_call``, ``_handle`` come from the sync or async class;
    ``id``, ``token``, ``ref`` from the handle."""

    id: str
    token: Optional[str]
    ref: Optional[models.SandboxRef]

    def _p(self, *parts: str) -> str:
        return "/".join([f"/v1/sandboxes/{q(self.id)}", *[q(p) for p in parts]])

    @property
    def lease_id(self) -> Optional[str]:
        """This handle's lease id (from the SandboxRef's extra), if known."""
        return (self.ref.extra or {}).get("lease_id") if self.ref else None

    @property
    def scope(self) -> Optional[str]:
        return self.ref.scope if self.ref else None

    def serialize(self) -> str:
        """This handle as a string (JSON) that ``connect`` turns back into a handle, in
        another process: the lease token in it is a credential."""
        r = self.ref or models.SandboxRef(sandbox_id=self.id, lease_token=self.token)
        d = r.to_dict()
        d["server_url"] = self._root + "/v1"
        d["sandbox_id"], d["lease_token"] = self.id, self.token
        return json.dumps(d)

    # -- lifecycle

    def info(self):
        """Describes the sandbox (SandboxInfo)."""
        return self._call(Req("GET", self._p(), parse=model(models.SandboxInfo)))

    def status(self) -> Any:
        """The sandbox's state, e.g. ``"running"``."""
        return self._call(Req("GET", self._p("status"), parse=lambda r: r.json()["status"]))

    def metrics(self, start: Optional[str] = None, end: Optional[str] = None):
        """CPU, memory and disk samples taken inside the sandbox (MetricSample, oldest
        first, the last one taken now), optionally between start and end (RFC 3339)."""
        params = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
        return self._call(Req("GET", self._p("metrics"), params=params, parse=items(models.MetricSample, "samples")))

    def renew(self, ttl_s: Optional[float] = None):
        """Sets the expiry to now + ttl_s (owner; None: the sandbox's ttl_s). SandboxInfo."""
        return self._call(Req("POST", self._p("renew"), json=body(models.RenewRequest, ttl_s=ttl_s),
                              parse=model(models.SandboxInfo)))

    def pause(self):
        return self._call(Req("POST", self._p("pause"), parse=model(models.SandboxInfo)))

    def resume(self):
        return self._call(Req("POST", self._p("resume"), parse=model(models.SandboxInfo)))

    def delete(self):
        """Deletes the sandbox (owner). DeleteResult; a second delete raises NotFoundError."""
        return self._call(Req("DELETE", self._p(), parse=model(models.DeleteResult)))

    def set_network(self, egress: Any):
        """Replaces the egress policy (owner): ``"none"``, ``"all"`` or
        ``{"allow": [...], "deny": [...]}``. SandboxInfo."""
        return self._call(Req("PUT", self._p("network"), json=models.Network(egress=egress).to_dict(),
                              parse=model(models.SandboxInfo)))

    def set_hosts(self, hosts: dict):
        """Replaces the sandbox's own /etc/hosts entries, ``{name: address}``
        (owner; NeMo Gym's set_hosts). SandboxInfo."""
        return self._call(Req("PUT", self._p("hosts"), json=dict(hosts), parse=model(models.SandboxInfo)))

    def endpoint(self, port: int):
        """How to reach a port declared at create (EndpointInfo)."""
        return self._call(Req("GET", self._p("endpoints", str(port)), parse=model(models.EndpointInfo)))

    # -- leases

    def mint_lease(self, scope: str = "operate", ttl_s: Optional[float] = None):
        """A new handle on this sandbox with a new lease (a child of this one)."""
        return self._call(Req("POST", self._p("leases"), json=body(models.LeaseRequest, scope=scope, ttl_s=ttl_s),
                              parse=lambda r: self._handle(models.SandboxRef.from_dict(r.json()))))

    def release(self):
        """Revokes this handle's lease and those minted from it (ReleaseResult)."""
        return self._call(Req("DELETE", self._p("leases", "release"), parse=model(models.ReleaseResult)))

    def leases(self):
        """The sandbox's live leases (LeaseInfo; owner)."""
        return self._call(Req("GET", self._p("leases"), parse=items(models.LeaseInfo, "leases")))

    def revoke_lease(self, lease_id: str):
        return self._call(Req("DELETE", self._p("leases", lease_id), parse=model(models.RevokeResult)))

    # -- exec and durable commands

    def exec(self, command: str, *, stdin: Optional[bytes] = None, **fields):
        """Runs command to completion (ExecResult; a non-zero exit is a result, not an error).
        Fields: cwd, env, timeout_s, user, preserve_background_services, kill_on_disconnect."""
        if stdin is not None:
            fields["stdin_b64"] = base64.b64encode(stdin).decode()
        return self._call(Req("POST", self._p("exec"), json=body(models.ExecRequest, command=command, **fields),
                              parse=model(models.ExecResult), timeout=_exec_timeout(fields)))

    def start_command(self, command: str, *, stdin: Optional[bytes] = None, **fields):
        """Starts a durable command and returns it running (Command)."""
        return self._call(Req("POST", self._p("commands"), json=_command_body(command, stdin, fields),
                              parse=model(models.Command)))

    def commands(self):
        return self._call(Req("GET", self._p("commands"), parse=items(models.Command, "commands")))

    def get_command(self, command_id: str):
        return self._call(Req("GET", self._p("commands", command_id), parse=model(models.Command)))

    def wait_command(self, command_id: str, timeout_s: Optional[float] = None):
        """Waits up to timeout_s (default 30, at most 300): the ExecResult once it ended, else
        the Command (``running`` true)."""
        params = {} if timeout_s is None else {"timeout_s": timeout_s}
        t = httpx.Timeout(30.0, read=(timeout_s or 30) + 300)
        return self._call(Req("GET", self._p("commands", command_id, "wait"), params=params, parse=wait_result,
                              timeout=t))

    def signal_command(self, command_id: str, signal: str = "SIGTERM"):
        return self._call(Req("POST", self._p("commands", command_id, "signal"),
                              json=body(models.SignalRequest, signal=signal), parse=lambda r: None))

    def kill_command(self, command_id: str):
        """Sends SIGKILL to the command's process group (it stays readable)."""
        return self.signal_command(command_id, "SIGKILL")

    def delete_command(self, command_id: str):
        """Kills the command's tree if it runs and forgets it and its output."""
        return self._call(Req("DELETE", self._p("commands", command_id), parse=model(models.DeleteResult)))

    def read_output(self, command_id: str, stream: str = "stdout", since: int = 0):
        """The raw bytes of one stream from since to its current end: (data, next_offset,
        running)."""

        def parse(r: httpx.Response):
            return r.content, int(r.headers["X-Next-Offset"]), r.headers.get("X-Command-Running") == "true"

        return self._call(Req("GET", self._p("commands", command_id, "output"),
                              params={"stream": stream, "since": str(since)}, parse=parse))

    # -- files

    def write_file(self, path: str, data: Any):
        """Writes data (bytes, str, or a binary file object, streamed) to path, making parent
        directories. FileWritten."""
        if isinstance(data, str):
            data = data.encode()
        return self._call(Req("PUT", self._p("files"), params={"path": path}, content=data,
                              headers={"Content-Type": "application/octet-stream"}, parse=model(models.FileWritten)))

    def read_file(self, path: str) -> Any:
        """The file's bytes (whole; iter_file streams)."""
        return self._call(Req("GET", self._p("files"), params={"path": path}, parse=lambda r: r.content))

    def stat(self, path: str):
        """Describes path as lstat does (FileInfo)."""
        return self._call(Req("GET", self._p("files", "info"), params={"path": path}, parse=model(models.FileInfo)))

    def listdir(self, path: str = "."):
        """The directory's entries (FileList: ``entries``, ``truncated``)."""
        return self._call(Req("GET", self._p("files", "list"), params={"path": path}, parse=model(models.FileList)))

    def upload(self, path: str, data: bytes):
        """The base64 compatibility route (capped; write_file streams)."""
        return self._call(Req("POST", self._p("upload"), json=body(models.UploadRequest, target_path=path,
                              contents_b64=base64.b64encode(data).decode()), parse=lambda r: None))

    def download(self, path: str) -> Any:
        """The base64 compatibility route (capped; read_file/iter_file stream)."""
        return self._call(Req("GET", self._p("download"), params={"remote_path": path},
                              parse=lambda r: base64.b64decode(r.json()["contents_b64"])))

    # -- snapshots and forks

    def snapshot(self, name: Optional[str] = None):
        """Snapshots the sandbox's filesystem (owner): a Snapshot to create from
        (``snapshot_id=``)."""
        return self._call(Req("POST", self._p("snapshots"), json=body(models.SnapshotRequest, name=name),
                              parse=model(models.Snapshot)))

    def fork(self, count: int = 1):
        """count new sandboxes from a snapshot of this one (owner): their handles."""
        return self._call(Req("POST", self._p("fork"), json=body(models.ForkRequest, count=count),
                              timeout=CREATE_TIMEOUT,
                              parse=lambda r: [self._handle(x) for x in models.ForkResult.from_dict(r.json()).sandboxes]))

    # -- terminals (REST; attach is per flavour)

    def create_terminal(self, command: Optional[str] = None, **fields) -> Any:
        """Starts a terminal session (PTY unless ``pty=False``; started at once) and returns
        its id. Fields: cwd, env, user, rows, cols, pty (default True)."""
        fields.setdefault("pty", True)
        return self._call(Req("POST", self._p("pty"), json=body(models.PtyCreateRequest, command=command, **fields),
                              parse=lambda r: r.json()["session_id"]))

    def terminals(self):
        return self._call(Req("GET", self._p("pty"), parse=items(models.PtySession, "sessions")))

    def get_terminal(self, session_id: str):
        return self._call(Req("GET", self._p("pty", session_id), parse=model(models.PtySession)))

    def delete_terminal(self, session_id: str):
        return self._call(Req("DELETE", self._p("pty", session_id), parse=model(models.DeleteResult)))

    def _ws_url(self, session_id: str, since: int, takeover: bool) -> str:
        url = self._root.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        url += self._p("pty", session_id, "ws") + f"?since={since}"
        return url + ("&takeover=1" if takeover else "")

    def _output_req(self, command_id: str) -> Req:
        return Req("GET", self._p("commands", command_id, "output"))


def _exec_timeout(fields: dict) -> httpx.Timeout:
    return httpx.Timeout(30.0, read=(fields.get("timeout_s") or 180) + 300)


def _command_body(command: str, stdin: Optional[bytes], fields: dict) -> dict:
    if stdin is not None:
        fields["stdin_b64"] = base64.b64encode(stdin).decode()
    return body(models.CommandRequest, command=command, **fields)


def file_chunks(f: Any):
    while True:
        b = f.read(CHUNK)
        if not b:
            return
        yield b


async def afile_chunks(f: Any):
    while True:
        b = f.read(CHUNK)
        if not b:
            return
        yield b


def auth_headers(api_key: Optional[str], token: Optional[str]) -> dict:
    if token:
        return {"X-Sandbox-Lease": token}
    if api_key:
        return {"Authorization": f"Bearer {api_key}"}
    return {}
