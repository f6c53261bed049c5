"""The sync client against a real gateway: every feature once."""

import hashlib
import io
import json
import os
import subprocess
import sys
import time
import uuid

import pytest

import sandgate

pytestmark = pytest.mark.gateway

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env():
    """The environment of a child process: finds this package as the tests do (an installed
    package is found without it)."""
    import sandgate as me
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(me.__file__)) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_lifecycle_every_create_field(client, make, tag, provider):
    sb = make(ttl_s=600, idle_timeout_s=300, ready_timeout_s=60, workdir="/tmp/work", env={"GREETING": "hello"},
              files={"notes/a.txt": "from create\n"}, metadata={"suite": tag},
              resources={"cpu": 1, "memory_mib": 512}, entrypoint=None, shm_size="64m")
    assert sb.id.startswith("sbx-") and sb.scope == "owner" and sb.lease_id.startswith("ls-")
    r = sb.exec("echo $GREETING; cat notes/a.txt; pwd")
    assert (r.return_code, r.stdout) == (0, "hello\nfrom create\n/tmp/work\n"), r

    info = client.get(sb.id)
    assert info.sandbox_id == sb.id and info.status == "running" and info.metadata == {"suite": tag}
    assert info.ttl_s == 600 and info.idle_timeout_s == 300 and info.provider_name == provider
    assert sb.info().workdir == "/tmp/work"
    assert sb.status() == "running"
    m = sb.metrics()
    assert m and m[-1].cpu_count >= 1 and 0 < m[-1].mem_used <= m[-1].mem_total, m
    assert 0 < m[-1].disk_used <= m[-1].disk_total and sb.metrics(start="2100-01-01T00:00:00Z") == [], m

    other = make(metadata={"suite": tag + "-other"})
    listed = [i.sandbox_id for i in client.list(label=f"suite={tag}")]
    assert listed == [sb.id]
    assert sb.id in [i.sandbox_id for i in client.list(status="running", label=("suite", tag))]
    assert other.id not in [i.sandbox_id for i in client.list(status="paused")]

    before = info.expires_at
    time.sleep(0.01)  # not a wait for a condition: expiry has a wall-clock resolution to move past
    renewed = sb.renew(ttl_s=1200)
    assert renewed.ttl_s == 1200 and renewed.expires_at > before

    assert sb.pause().status == "paused"
    with pytest.raises(sandgate.ConflictError) as e:
        sb.exec("true")
    assert e.value.status == 409 and e.value.code
    assert sb.resume().status == "running"
    assert sb.exec("echo back").stdout == "back\n"

    assert sb.delete().deleted is True
    with pytest.raises(sandgate.NotFoundError) as e:
        sb.delete()
    assert e.value.status == 404 and e.value.problem.status == 404 and e.value.detail


def test_errors_carry_the_problem(client, make, image):
    with pytest.raises(sandgate.BadRequestError) as e:
        client.create(image=image, workdir="relative", shm_size="nonsense")
    err = e.value
    assert (err.status, err.code, err.title) == (400, "invalid_input", "Bad Request")
    assert {fe.field for fe in err.errors} == {"workdir", "shm_size"}, err.errors
    with pytest.raises(sandgate.BadRequestError) as e:
        client.create(image=image, ports=[0, 70000], ttl_s=-1)
    assert e.value.status == 422 and len(e.value.errors) == 3 and "ttl_s" in str(e.value)

    with pytest.raises(sandgate.AuthenticationError) as e:
        with sandgate.Client(api_key="not-a-key") as bad:
            bad.list()
    assert e.value.status == 401

    sb = make()
    op = sb.mint_lease("operate")
    with pytest.raises(sandgate.PermissionDeniedError) as e:
        op.delete()
    assert e.value.status == 403
    with pytest.raises(sandgate.PermissionDeniedError):
        op.mint_lease("owner")
    with pytest.raises(sandgate.NotFoundError):
        sb.read_file("/no/such/file")
    with pytest.raises(TypeError):
        client.create(imagee="typo")


def test_leases_serialize_and_connect_in_another_process(client, make):
    sb = make()
    op = sb.mint_lease("operate", ttl_s=600)
    assert op.scope == "operate" and op.token != sb.token and op.id == sb.id
    s = op.serialize()
    assert json.loads(s)["lease_token"] == op.token

    code = ("import sys, sandgate\n"
            "sb = sandgate.Sandbox.connect(sys.stdin.read())\n"
            "print(sb.exec('echo from-child').stdout.strip(), sb.scope)\n")
    out = subprocess.run([sys.executable, "-c", code], input=s, capture_output=True, text=True, timeout=60,
                         env=child_env(), cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["from-child", "operate"]

    again = client.connect(s)
    assert again.exec("echo ok").stdout == "ok\n"

    leases = {l.lease_id: l for l in sb.leases()}
    assert leases[op.lease_id].scope == "operate" and leases[op.lease_id].parent_id == sb.lease_id
    child = op.mint_lease()
    rel = op.release()
    assert rel.released is True
    for h in (op, child):
        with pytest.raises(sandgate.AuthenticationError):
            h.exec("true")

    owner2 = sb.mint_lease("owner")
    assert owner2.scope == "owner"
    assert sb.revoke_lease(owner2.lease_id).revoked == 1
    with pytest.raises(sandgate.AuthenticationError):
        owner2.status()


def test_exec(make):
    sb = make()
    r = sb.exec("cat; echo err >&2; exit 3", stdin=b"in\n", env={"X": "1"})
    assert (r.stdout, r.stderr, r.return_code, r.error_type) == ("in\n", "err\n", 3, None)
    assert sb.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    r = sb.exec("echo start; sleep 30", timeout_s=1)
    assert (r.return_code, r.error_type, r.stdout) == (125, "timeout", "start\n")


def test_durable_commands(make):
    sb = make()
    out, err = [], []
    end = sb.run_command("for i in 1 2 3; do echo out$i; echo err$i >&2; sleep 0.05; done; exit 4",
                         on_stdout=out.append, on_stderr=err.append)
    assert end.exit_code == 4 and end.running is False
    assert b"".join(out) == b"out1\nout2\nout3\n" and b"".join(err) == b"err1\nerr2\nerr3\n"

    # Reattach by id from the middle: exactly the rest, nothing twice.
    events = list(sb.stream_command("printf 'abc'; sleep 0.3; printf 'def'; sleep 0.3; printf 'ghi'"))
    assert events[0].kind == "start" and events[-1].kind == "exit"
    cid = events[0].command.command_id
    chunks = [e for e in events if e.kind == "stdout"]
    assert b"".join(e.data for e in chunks) == b"abcdefghi"
    rest = list(sb.follow_command(cid, since=chunks[0].id))
    assert b"".join(e.data for e in rest if e.kind == "stdout") == b"abcdefghi"[int(chunks[0].id.split(",")[0]):]
    assert rest[-1].kind == "exit"

    data, nxt, running = sb.read_output(cid, "stdout", since=3)
    assert (data, nxt, running) == (b"defghi", 9, False)

    # Start, wait (still running: the Command), kill, wait (the result).
    c = sb.start_command("echo started; sleep 100")
    assert c.running is True and c.command_id.startswith("cmd-")
    w = sb.wait_command(c.command_id, timeout_s=0.2)
    assert isinstance(w, sandgate.Command) and w.running is True
    assert c.command_id in [x.command_id for x in sb.commands()]
    sb.kill_command(c.command_id)
    res = sb.wait_command(c.command_id, timeout_s=30)
    assert isinstance(res, sandgate.ExecResult) and res.return_code == 137 and res.stdout == "started\n"
    assert sb.get_command(c.command_id).exit_code == 137
    assert sb.delete_command(c.command_id).deleted is True
    with pytest.raises(sandgate.NotFoundError):
        sb.get_command(c.command_id)


def test_files(make, tmp_path):
    sb = make()
    blob = os.urandom(3 << 20) + b"end"
    src = tmp_path / "blob"
    src.write_bytes(blob)
    w = sb.upload_file(src, "big/blob.bin")
    assert w.size == len(blob) and w.path.endswith("/big/blob.bin")
    assert sb.read_file("big/blob.bin") == blob
    chunks = list(sb.iter_file("big/blob.bin", chunk_size=64 << 10))
    assert len(chunks) > 1 and b"".join(chunks) == blob
    dest = tmp_path / "back"
    assert sb.download_file("big/blob.bin", dest) == len(blob)
    assert hashlib.sha256(dest.read_bytes()).digest() == hashlib.sha256(blob).digest()

    sb.write_file("/tmp/t.txt", "text\n")
    sb.write_file("/tmp/f.txt", io.BytesIO(b"from a file object"))
    assert sb.read_file("/tmp/f.txt") == b"from a file object"
    st = sb.stat("/tmp/t.txt")
    assert (st.type, st.size, st.name, st.path) == ("file", 5, "t.txt", "/tmp/t.txt") and len(st.mode) == 4
    ls = sb.listdir("/tmp")
    assert {"t.txt", "f.txt"} <= {e.name for e in ls.entries} and ls.truncated is False
    sb.upload("b64/x", b"\x00\x01binary")
    assert sb.download("b64/x") == b"\x00\x01binary"
    with pytest.raises(sandgate.NotFoundError):
        sb.stat("/tmp/missing")


def test_terminal_reattach_replays_exactly(make):
    sb = make()
    n = 300
    sid = sb.create_terminal("for i in $(seq 1 %d); do echo line$i; sleep 0.005; done; exit 7" % n, pty=False)
    got = bytearray()
    with sb.attach(sid) as t:
        cuts = 0
        while True:
            b = t.recv()
            if not b:
                break
            got += b
            if cuts < 3 and got.count(b"\n") > 50 * (cuts + 1):
                t.interrupt_connection()
                cuts += 1
        assert t.exit_code == 7 and t.reconnects >= 3 and t.lost == 0
        assert t.offset == len(got)
    assert got.decode() == "".join(f"line{i}\n" for i in range(1, n + 1))
    info = sb.get_terminal(sid)
    assert info.running is False and info.exit_code == 7 and info.output_offset == len(got)

    # since: a late attach from an offset gets exactly the rest.
    with sb.attach(sid, since=len(got) - 8) as t:
        assert t.recv() == got[-8:]
        assert t.recv() == b"" and t.exit_code == 7


def test_terminal_interactive_and_takeover(make):
    sb = make()
    sid = sb.create_terminal(rows=24, cols=80)
    assert sid in [s.session_id for s in sb.terminals()]
    with sb.attach(sid) as a:
        a.resize(100, 30)
        a.send("echo $((6*7))\n")
        assert b"42" in a.read_until("42")
        with pytest.raises(sandgate.ConflictError) as e:
            sb.attach(sid)
        assert e.value.status == 409 and e.value.code == "ALREADY_CONNECTED"
        with sb.attach(sid, takeover=True) as b:
            with pytest.raises(sandgate.TakenOverError):
                while a.recv():
                    pass
            b.send("exit 5\n")
            assert b.wait() == 5
    assert sb.delete_terminal(sid).deleted is True


def test_snapshots_fork_batch(client, make, provider):
    src = make()
    src.write_file("state.txt", "step 1\n")
    snap = src.snapshot(name="after-step-1")
    assert snap.snapshot_id.startswith("snp-") and snap.sandbox_id == src.id and snap.name == "after-step-1"
    assert snap.snapshot_id in [s.snapshot_id for s in client.snapshots()]
    assert client.get_snapshot(snap.snapshot_id).name == "after-step-1"
    restored = make(snapshot_id=snap.snapshot_id, image=None)
    assert restored.read_file("state.txt") == b"step 1\n"

    forks = src.fork(count=3)
    try:
        assert len(forks) == 3 and len({f.id for f in forks}) == 3
        for i, f in enumerate(forks):
            f.write_file("state.txt", f"fork {i}\n")
        assert [f.read_file("state.txt") for f in forks] == [f"fork {i}\n".encode() for i in range(3)]
        assert src.read_file("state.txt") == b"step 1\n"
    finally:
        for f in forks:
            f.delete()

    restored.delete()
    d = client.delete_snapshot(snap.snapshot_id)
    assert d.deleted is True
    assert client.delete_snapshot(snap.snapshot_id).deleted is False


def test_batch(client, image, tag):
    batch = client.create_batch(3, image=image, metadata={"batch": tag})
    try:
        assert len(batch.sandboxes) == 3 and batch.failed == []
        assert sorted(i.sandbox_id for i in client.list(label=f"batch={tag}")) == sorted(s.id for s in batch.sandboxes)
        assert [s.exec("echo hi").stdout for s in batch.sandboxes] == ["hi\n"] * 3
    finally:
        for s in batch.sandboxes:
            s.delete()
    with pytest.raises(TypeError):
        client.create(count=2)


def test_volumes(client, make, tag):
    name = "v" + tag
    vol = client.create_volume(name, 0.0625)
    try:
        assert vol.name == name and vol.volume_id.startswith("vol-") and vol.size_gib == 0.0625
        assert name in [v.name for v in client.volumes()]
        sb = make(volumes=[{"volume": name, "mount_path": "/data"}])
        sb.exec("echo kept > /data/f")
        assert client.get_volume(name).mounted_by == [sb.id]
        with pytest.raises(sandgate.ConflictError):
            client.delete_volume(name)
        sb.delete()
        reader = make(volumes=[sandgate.VolumeMount(volume=name, mount_path="/mnt/v", read_only=True)])
        assert reader.read_file("/mnt/v/f") == b"kept\n"
        reader.delete()
    finally:
        client.delete_volume(name)
    with pytest.raises(sandgate.NotFoundError):
        client.get_volume(name)


def test_network_and_quota(client, make, provider):
    sb = make()
    assert sb.set_network("none").sandbox_id == sb.id
    policy = {"allow": ["10.0.0.0/8", "pypi.example"], "deny": ["10.1.0.0/16"]}
    sb.set_network(policy)  # local and docker both enforce policies
    with pytest.raises(sandgate.BadRequestError) as e:
        sb.set_network({"allow": ["not a domain or cidr!"]})
    assert e.value.errors
    q = client.quota()
    assert q.usage.sandboxes >= 1 and q.gateway.max_sandboxes >= 1 and q.limits.sandboxes is not None


def test_groups_hosts_images(client, make, provider, image):
    web = make(group="g-" + uuid.uuid4().hex[:8], hostname="web", aliases=["api"])
    info = web.info()
    assert info.hostname == "web" and info.aliases == ["api"] and info.network_address
    assert web.set_hosts({"db.internal": "10.9.8.7"}).hosts == {"db.internal": "10.9.8.7"}
    assert "db.internal" in web.read_file("/etc/hosts").decode()
    with pytest.raises(sandgate.BadRequestError):
        web.set_hosts({"db.internal": "not an address"})
    il = client.images()
    assert il.complete and isinstance(il.images, list)
    if image:
        assert image in [i.name for i in il.images]


def test_examples_run():
    for ex in ("rollout.py", "grpo_fork.py"):
        out = subprocess.run([sys.executable, os.path.join(PKG_ROOT, "examples", ex)], capture_output=True,
                             text=True, timeout=120, env=child_env())
        assert out.returncode == 0, f"{ex}: {out.stdout}\n{out.stderr}"
        assert "done" in out.stdout, out.stdout


def test_readme_example():
    """The README's Python SDK example runs as written."""
    readme = os.environ.get("SANDGATE_README") or os.path.join(PKG_ROOT, "..", "..", "README.md")
    with open(readme) as f:
        text = f.read()
    section = text.split("\n## Python SDK\n", 1)[1].split("\n## ", 1)[0]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=child_env(), cwd="/")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("hello from ") and lines[1:] == ["1", "2", "3"], out.stdout


@pytest.fixture
def cutproxy():
    from cutproxy import CutProxy

    p = CutProxy(os.environ["SANDGATE_URL"])
    yield p
    p.close()


def test_reattach_after_network_cuts(make, cutproxy):
    """Cut the network under a command's event stream and a terminal: both come back by
    themselves and deliver every byte once, in order."""
    sb = make()
    far = sandgate.Sandbox.connect(sb.serialize(), root=cutproxy.url)
    with far:
        n, got, cut_at = 40, bytearray(), {5, 15, 30}
        for ev in far.stream_command(f"for i in $(seq 1 {n}); do echo c$i; sleep 0.02; done"):
            if ev.kind == "stdout":
                got += ev.data
                # One event may carry several lines: cut at the first event
                # at or past each mark.
                due = {c for c in cut_at if c <= got.count(b"\n")}
                if due:
                    cut_at -= due
                    assert cutproxy.cut() >= 1
            elif ev.kind == "exit":
                assert ev.command.exit_code == 0
        assert got.decode() == "".join(f"c{i}\n" for i in range(1, n + 1))
        assert not cut_at and cutproxy.accepted >= 4

        accepted = cutproxy.accepted
        sid = far.create_terminal(f"for i in $(seq 1 {n}); do echo t$i; sleep 0.02; done", pty=False)
        out = bytearray()
        with far.attach(sid) as t:
            cuts = 0
            while True:
                b = t.recv()
                if not b:
                    break
                out += b
                if cuts < 2 and out.count(b"\n") > 10 * (cuts + 1):
                    cuts += cutproxy.cut() and 1
            assert t.reconnects >= 2 and t.exit_code == 0
        assert out.decode() == "".join(f"t{i}\n" for i in range(1, n + 1))
        assert cutproxy.accepted >= accepted + 3
