"""The async client against a real gateway: the same features as test_sync, as coroutines."""

import asyncio
import io
import os

import pytest

import sandgate

pytest_asyncio = pytest.importorskip("pytest_asyncio", reason="python3-pytest-asyncio runs the async tests")

pytestmark = [pytest.mark.gateway, pytest.mark.asyncio]


@pytest_asyncio.fixture
async def aclient():
    async with sandgate.AsyncClient() as c:
        yield c


@pytest_asyncio.fixture
async def amake(aclient, image):
    made = []

    async def make(**fields):
        fields.setdefault("image", image)
        sb = await aclient.create(**fields)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        try:
            await sb.delete()
        except sandgate.NotFoundError:
            pass


async def test_lifecycle_and_leases(aclient, amake, tag, provider):
    sb = await amake(env={"A": "1"}, files={"f.txt": "file\n"}, metadata={"asuite": tag}, ttl_s=600,
                     resources=sandgate.Resources(memory_mib=256))
    r = await sb.exec("echo $A; cat f.txt")
    assert (r.return_code, r.stdout) == (0, "1\nfile\n")
    assert (await aclient.get(sb.id)).provider_name == provider
    assert [i.sandbox_id for i in await aclient.list(label=f"asuite={tag}")] == [sb.id]
    assert (await sb.renew(900)).ttl_s == 900
    assert (await sb.pause()).status == "paused"
    assert await sb.status() == "paused"
    assert (await sb.resume()).status == "running"

    op = await sb.mint_lease("operate")
    other = sandgate.AsyncSandbox.connect(op.serialize())
    async with other:
        assert (await other.exec("echo via-connect")).stdout == "via-connect\n"
        with pytest.raises(sandgate.PermissionDeniedError):
            await other.pause()
        assert (await other.release()).released is True
        with pytest.raises(sandgate.AuthenticationError):
            await other.status()

    # Many at once on one client: the point of the async flavour.
    outs = await asyncio.gather(*(sb.exec(f"echo {i}") for i in range(8)))
    assert [o.stdout for o in outs] == [f"{i}\n" for i in range(8)]

    assert (await sb.delete()).deleted is True
    with pytest.raises(sandgate.NotFoundError):
        await sb.delete()


async def test_commands_stream_and_reattach(amake):
    sb = await amake()
    out = []
    end = await sb.run_command("echo a; sleep 0.2; echo b >&2; exit 2", on_stdout=out.append)
    assert end.exit_code == 2 and b"".join(out) == b"a\n"
    events = [e async for e in sb.stream_command("printf 123; sleep 0.3; printf 456")]
    cid = events[0].command.command_id
    first = next(e for e in events if e.kind == "stdout")
    rest = [e async for e in sb.follow_command(cid, since=first.id)]
    assert first.data + b"".join(e.data for e in rest if e.kind == "stdout") == b"123456"
    c = await sb.start_command("sleep 100")
    await sb.signal_command(c.command_id, "SIGTERM")
    res = await sb.wait_command(c.command_id, timeout_s=30)
    assert isinstance(res, sandgate.ExecResult) and res.return_code == 143


async def test_files_streamed(amake, tmp_path):
    sb = await amake()
    blob = os.urandom(2 << 20)
    w = await sb.write_file("d/blob", io.BytesIO(blob))
    assert w.size == len(blob)
    got = bytearray()
    async for chunk in sb.iter_file("d/blob", chunk_size=32 << 10):
        got += chunk
    assert got == blob
    assert await sb.download_file("d/blob", tmp_path / "b") == len(blob)
    assert (await sb.stat("d/blob")).size == len(blob)
    assert [e.name for e in (await sb.listdir("d")).entries] == ["blob"]
    with pytest.raises(sandgate.NotFoundError):
        await sb.read_file("d/none")


async def test_terminal_reattach_and_takeover(amake):
    sb = await amake()
    n = 200
    sid = await sb.create_terminal("for i in $(seq 1 %d); do echo l$i; sleep 0.005; done" % n)
    got = bytearray()
    async with sb.attach(sid) as t:
        cut = False
        while True:
            b = await t.recv()
            if not b:
                break
            got += b
            if not cut and got.count(b"\n") > n // 2:
                t.interrupt_connection()
                cut = True
        assert t.reconnects >= 1 and t.exit_code == 0 and t.mode == "pty"
    # A PTY turns \n into \r\n.
    assert got.decode() == "".join(f"l{i}\r\n" for i in range(1, n + 1))

    sh = await sb.create_terminal(pty=False, command="cat")
    async with sb.attach(sh) as a:
        await a.send(b"ping\n")
        assert await a.read_until(b"ping\n") == b"ping\n"
        async with sb.attach(sh, takeover=True, since=a.offset) as b:
            with pytest.raises(sandgate.TakenOverError):
                while await a.recv():
                    pass
            await b.send("pong\n")
            await b.eof()
            assert await b.read_until("pong\n") == b"pong\n"
            assert await b.wait() == 0


async def test_fork_batch_and_snapshot(aclient, amake, image):
    src = await amake()
    await src.write_file("s", "v1")
    forks = await src.fork(count=2)
    try:
        await forks[0].write_file("s", "changed")
        assert [await f.read_file("s") for f in forks] == [b"changed", b"v1"]
    finally:
        await asyncio.gather(*(f.delete() for f in forks))
    snap = await src.snapshot()
    batch = await aclient.create_batch(2, snapshot_id=snap.snapshot_id)
    try:
        assert [await s.read_file("s") for s in batch.sandboxes] == [b"v1", b"v1"]
    finally:
        await asyncio.gather(*(s.delete() for s in batch.sandboxes))
    assert (await aclient.delete_snapshot(snap.snapshot_id)).deleted is True


async def test_volumes_network_quota(aclient, amake, tag):
    vol = await aclient.create_volume("a" + tag, 0.0625)
    assert vol.name in [v.name for v in await aclient.volumes()]
    assert (await aclient.get_volume(vol.volume_id)).name == vol.name
    assert (await aclient.delete_volume(vol.name)).deleted is True
    sb = await amake()
    assert (await sb.set_network("none")).sandbox_id == sb.id
    assert (await aclient.quota()).usage.sandboxes >= 1
