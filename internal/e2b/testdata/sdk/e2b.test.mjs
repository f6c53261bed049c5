// The E2B JavaScript SDK, unchanged, against a real sandgate gateway
// started with --e2b (cmd/gateway's TestE2BSDK runs this with node --test
// and sets E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY).
import { test, after } from 'node:test'
import assert from 'node:assert/strict'
import fs from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import {
  Sandbox, CommandExitError, AuthenticationError, SandboxNotFoundError, NotFoundError, TimeoutError,
  SandboxError, ALL_TRAFFIC, Volume, InvalidArgumentError, RateLimitError,
} from 'e2b'

for (const v of ['E2B_API_URL', 'E2B_SANDBOX_URL', 'E2B_API_KEY']) {
  assert.ok(process.env[v], `${v} must be set`)
}

// The template to create from ("" = base, the provider's default image).
const template = process.env.E2B_TEST_TEMPLATE || undefined
const create = (opts) => (template ? Sandbox.create(template, opts) : Sandbox.create(opts))

const tag = `e2b-test-${process.pid}-${Date.now()}`
let sbx

// until polls f every 100 ms until it returns a truthy value, for at most
// ms (a bound that catches a hang).
const until = async (what, f, ms = 20_000) => {
  const deadline = Date.now() + ms
  for (;;) {
    const v = await f()
    if (v) return v
    if (Date.now() > deadline) assert.fail(`${what}: not within ${ms} ms`)
    await new Promise((r) => setTimeout(r, 100))
  }
}

after(async () => {
  if (sbx) await Sandbox.kill(sbx.sandboxId).catch(() => {})
})

test('create with env and metadata', async () => {
  sbx = await create({ envs: { GREETING: 'hello from env' }, metadata: { suite: tag }, timeoutMs: 120_000 })
  assert.match(sbx.sandboxId, /^sbx-/)
  const info = await sbx.getInfo()
  assert.equal(info.sandboxId, sbx.sandboxId)
  assert.equal(info.metadata.suite, tag)
  assert.equal(info.state, 'running')
  const r = await sbx.commands.run('echo "$GREETING"')
  assert.equal(r.stdout, 'hello from env\n')
})

test('commands.run: stdout, stderr, exit code, per-command env and cwd', async () => {
  const r = await sbx.commands.run('echo hi; echo oops >&2; echo "$X"; pwd', { envs: { X: 'per-cmd' }, cwd: '/tmp' })
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'hi\nper-cmd\n/tmp\n')
  assert.equal(r.stderr, 'oops\n')
})

test('a non-zero exit raises CommandExitError', async () => {
  await assert.rejects(sbx.commands.run('echo failing >&2; exit 3'), (err) => {
    assert.ok(err instanceof CommandExitError, `got ${err}`)
    assert.equal(err.exitCode, 3)
    assert.equal(err.stderr, 'failing\n')
    return true
  })
})

test('a background command streams, is listed, reconnects by pid and is killed', async () => {
  const seen = []
  let resolveFirst
  const first = new Promise((r) => { resolveFirst = r })
  const h = await sbx.commands.run('echo started; while :; do sleep 0.1; done', {
    background: true,
    onStdout: (d) => { seen.push(d); resolveFirst() },
  })
  assert.ok(h.pid > 0)
  await first
  assert.equal(seen.join(''), 'started\n')
  const list = await sbx.commands.list()
  assert.ok(list.some((p) => p.pid === h.pid), `pid ${h.pid} not in ${JSON.stringify(list)}`)
  await h.disconnect()
  const again = await sbx.commands.connect(h.pid)
  assert.equal(again.pid, h.pid)
  assert.equal(await sbx.commands.kill(h.pid), true)
  await assert.rejects(again.wait(), (err) => {
    assert.ok(err instanceof CommandExitError, `got ${err}`)
    assert.notEqual(err.exitCode, 0)
    return true
  })
  const after = await sbx.commands.list()
  assert.ok(!after.some((p) => p.pid === h.pid), 'a killed command is still listed')
})

test('a PTY: input, resize, listed, exit', async () => {
  let out = ''
  const waiters = []
  const seen = (re) => new Promise((resolve) => { waiters.push({ re, resolve }); check() })
  const check = () => {
    for (const w of waiters.splice(0)) {
      if (w.re.test(out)) w.resolve(); else waiters.push(w)
    }
  }
  const dec = new TextDecoder()
  const term = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d); check() } })
  assert.ok(term.pid > 0)
  const enc = new TextEncoder()
  await sbx.pty.sendInput(term.pid, enc.encode('stty size; echo pty-$((6*7))\n'))
  await seen(/24 80[\s\S]*pty-42/)
  assert.ok((await sbx.commands.list()).some((p) => p.pid === term.pid), 'the PTY is not listed')
  await sbx.pty.resize(term.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(term.pid, enc.encode('stty size\n'))
  await seen(/30 100/)
  await sbx.pty.sendInput(term.pid, enc.encode('exit 0\n'))
  const r = await term.wait()
  assert.equal(r.exitCode, 0)

  const other = await sbx.pty.create({ cols: 80, rows: 24, onData: () => {} })
  assert.equal(await sbx.pty.kill(other.pid), true)
  assert.ok(!(await sbx.commands.list()).some((p) => p.pid === other.pid), 'a killed PTY is still listed')
})

test('a command with stdin: sendStdin, closeStdin', async () => {
  const h = await sbx.commands.run('echo ready; cat; echo done >&2', { background: true, stdin: true })
  await sbx.commands.sendStdin(h.pid, 'hello stdin\n')
  await sbx.commands.closeStdin(h.pid)
  const r = await h.wait()
  assert.equal(r.exitCode, 0)
  assert.equal(r.stdout, 'ready\nhello stdin\n')
  assert.equal(r.stderr, 'done\n')
})

test('a 100 MiB file, streamed both ways', async () => {
  const big = new Uint8Array(100 << 20)
  for (let i = 0; i < big.length; i += 4093) big[i] = (i / 4093) & 0xff
  await sbx.files.write('/tmp/big.bin', new Blob([big]).stream())
  assert.equal((await sbx.commands.run('wc -c < /tmp/big.bin')).stdout.trim(), String(100 << 20))
  const back = await sbx.files.read('/tmp/big.bin', { format: 'bytes' })
  assert.equal(back.length, big.length)
  assert.ok(Buffer.from(back).equals(Buffer.from(big)), 'the file read back differs')
  await sbx.files.remove('/tmp/big.bin')
})

test('a command that outlasts timeoutMs raises TimeoutError and runs on', async () => {
  await assert.rejects(sbx.commands.run('echo slow > /tmp/slow.started; sleep 30', { timeoutMs: 1000 }), (err) => {
    assert.ok(err instanceof TimeoutError, `got ${err}`)
    return true
  })
  assert.equal(await sbx.files.read('/tmp/slow.started'), 'slow\n')
  const running = await sbx.commands.list()
  const slow = running.find((p) => p.args.join(' ').includes('sleep 30'))
  assert.ok(slow, `the timed-out command is not listed: ${JSON.stringify(running)}`)
  assert.equal(await sbx.commands.kill(slow.pid), true)
})

test('gzip: compressed upload and download; a corrupt upload changes nothing', async () => {
  const text = 'compress me '.repeat(50_000)
  const info = await sbx.files.write('/tmp/gz.txt', text, { gzip: true })
  assert.equal(info.path, '/tmp/gz.txt')
  assert.equal(await sbx.files.read('/tmp/gz.txt', { gzip: true }), text)
  assert.equal(await sbx.files.read('/tmp/gz.txt'), text)

  // The raw wire: the download is gzip when asked for gzip alone.
  const url = `${process.env.E2B_SANDBOX_URL}/files?path=${encodeURIComponent('/tmp/gz.txt')}`
  const headers = { 'E2b-Sandbox-Id': sbx.sandboxId, 'X-Access-Token': sbx.envdAccessToken }
  const { request } = await import('node:http')
  const encoding = await new Promise((resolve, reject) => {
    request(url, { headers: { ...headers, 'Accept-Encoding': 'gzip' } }, (res) => {
      res.resume()
      resolve(res.headers['content-encoding'])
    }).on('error', reject).end()
  })
  assert.equal(encoding, 'gzip')

  const { gzipSync } = await import('node:zlib')
  const whole = gzipSync(Buffer.from('never written '.repeat(10_000)))
  const res = await fetch(url, {
    method: 'POST',
    headers: { ...headers, 'Content-Type': 'application/octet-stream', 'Content-Encoding': 'gzip' },
    body: whole.subarray(0, whole.length >> 1),
  })
  assert.equal(res.status, 400)
  assert.match((await res.json()).message, /not valid gzip/)
  assert.equal(await sbx.files.read('/tmp/gz.txt'), text)
  assert.deepEqual((await sbx.files.list('/tmp')).map((e) => e.name).filter((n) => n.startsWith('.sandgate')), [])
})

test('paths with shell metacharacters are paths, not commands', async () => {
  const dir = "/tmp/e2b/it's $(touch /tmp/pwned-mk) `touch /tmp/pwned-bt`; touch /tmp/pwned-semi"
  assert.equal(await sbx.files.makeDir(dir), true)
  await sbx.files.write(dir + '/f', 'x')
  await sbx.files.rename(dir + '/f', dir + '/g $(touch /tmp/pwned-mv)')
  assert.equal(await sbx.files.read(dir + '/g $(touch /tmp/pwned-mv)'), 'x')
  await sbx.files.remove(dir)
  assert.equal(await sbx.files.exists(dir), false)
  const tmp = (await sbx.files.list('/tmp')).map((e) => e.name)
  assert.deepEqual(tmp.filter((n) => n.startsWith('pwned')), [])
})

test('files: write, read, list, exists, makeDir, rename, remove', async () => {
  const info = await sbx.files.write('/tmp/e2b/dir/a.txt', 'alpha\n')
  assert.equal(info.path, '/tmp/e2b/dir/a.txt')
  assert.equal(await sbx.files.read('/tmp/e2b/dir/a.txt'), 'alpha\n')
  const bytes = new Uint8Array(70_000).map((_, i) => i % 251)
  await sbx.files.write('/tmp/e2b/dir/b.bin', bytes)
  const back = await sbx.files.read('/tmp/e2b/dir/b.bin', { format: 'bytes' })
  assert.deepEqual(back, bytes)

  const entries = await sbx.files.list('/tmp/e2b/dir')
  assert.deepEqual(entries.map((e) => e.name).sort(), ['a.txt', 'b.bin'])
  const b = entries.find((e) => e.name === 'b.bin')
  assert.equal(b.type, 'file')
  assert.equal(b.size, 70_000)

  assert.equal(await sbx.files.makeDir('/tmp/e2b/made/deep'), true)
  assert.equal(await sbx.files.makeDir('/tmp/e2b/made/deep'), false)
  const deep = await sbx.files.list('/tmp/e2b/made', { depth: 2 })
  assert.deepEqual(deep.map((e) => [e.path, e.type]), [['/tmp/e2b/made/deep', 'dir']])

  const moved = await sbx.files.rename('/tmp/e2b/dir/a.txt', '/tmp/e2b/made/a2.txt')
  assert.equal(moved.path, '/tmp/e2b/made/a2.txt')
  assert.equal(await sbx.files.exists('/tmp/e2b/dir/a.txt'), false)
  assert.equal(await sbx.files.read('/tmp/e2b/made/a2.txt'), 'alpha\n')

  await sbx.files.remove('/tmp/e2b/made')
  assert.equal(await sbx.files.exists('/tmp/e2b/made'), false)
  await assert.rejects(sbx.files.read('/tmp/e2b/made/a2.txt'), (err) => {
    assert.ok(err instanceof NotFoundError, `got ${err}`)
    return true
  })
})

test('files.watchDir: each kind of event, recursive, stop; bad paths raise the SDK\'s errors', async () => {
  const dir = '/tmp/e2b-watch'
  await sbx.files.makeDir(dir + '/sub')
  const seen = []
  let flat = []
  let exited
  const handle = await sbx.files.watchDir(dir, (e) => seen.push(`${e.type} ${e.name}`), {
    recursive: true, onExit: (err) => { exited = err ?? 'stopped' },
  })
  const shallow = await sbx.files.watchDir(dir, (e) => flat.push(e.name))
  await sbx.files.write(dir + '/a.txt', 'x')
  await sbx.commands.run(`cd ${dir} && chmod 600 a.txt && mv a.txt b.txt && rm b.txt && mkdir sub/new && echo y > sub/new/c.txt`)
  const want = ['create a.txt', 'write a.txt', 'chmod a.txt', 'rename a.txt', 'create b.txt', 'remove b.txt',
    'create sub/new', 'create sub/new/c.txt']
  await until(`events ${want} (seen ${seen})`, () => want.every((e) => seen.includes(e)))
  await until('the shallow watch saw b.txt', () => flat.includes('b.txt'))
  assert.deepEqual(flat.filter((n) => n.startsWith('sub/')), [], 'a watch that is not recursive saw a subdirectory')
  await handle.stop()
  await shallow.stop()
  const count = seen.length
  await sbx.files.write(dir + '/after-stop', 'z')
  // A new watch sees a later write: by then a live one would have seen
  // after-stop.
  const again = []
  const probe = await sbx.files.watchDir(dir, (e) => again.push(e.name))
  await sbx.files.write(dir + '/probe', 'p')
  await until('the probe', () => again.includes('probe'))
  await probe.stop()
  assert.equal(seen.length, count, `a stopped watch got events: ${seen.slice(count)}`)

  await assert.rejects(sbx.files.watchDir('/tmp/e2b-watch-missing', () => {}), (err) => {
    assert.ok(err instanceof NotFoundError, `got ${err}`)
    return true
  })
  await assert.rejects(sbx.files.watchDir(dir + '/after-stop', () => {}), (err) => {
    assert.ok(err instanceof InvalidArgumentError, `got ${err}`)
    return true
  })
  if (!template) {
    // The local provider resolves inside the sandbox's root and refuses
    // the kernel's filesystems, whatever link leads there.
    await sbx.commands.run(`ln -s /proc ${dir}/proc-link`)
    await assert.rejects(sbx.files.watchDir(dir + '/proc-link', () => {}), (err) => {
      assert.ok(err instanceof InvalidArgumentError, `got ${err}`)
      return true
    })
    // A link to a directory of the host (this test's own, outside the
    // sandbox) leads to that path inside the sandbox, where it is not.
    const host = fs.mkdtempSync(path.join(os.tmpdir(), 'e2b-watch-host-'))
    try {
      await sbx.commands.run(`ln -s ${host} ${dir}/host-link && ln -s ../../../../..${host} ${dir}/host-up`)
      for (const link of ['host-link', 'host-up']) {
        await assert.rejects(sbx.files.watchDir(`${dir}/${link}`, () => {}), (err) => {
          assert.ok(err instanceof NotFoundError, `${link}: got ${err}`)
          return true
        })
      }
    } finally {
      fs.rmSync(host, { recursive: true })
    }
  }

  // The watched directory removed: the watch ends and onExit says why.
  let ended
  await sbx.files.makeDir('/tmp/e2b-watch-gone')
  await sbx.files.watchDir('/tmp/e2b-watch-gone', () => {}, { onExit: (err) => { ended = err ?? 'clean' } })
  await sbx.files.remove('/tmp/e2b-watch-gone')
  await until('the watch of a removed directory ended', () => ended)
  assert.ok(ended instanceof NotFoundError, `onExit got ${ended}`)
  assert.ok(exited, 'onExit was not called at stop')
})

test('getMetrics: CPU, memory and disk from inside the sandbox, a spinning process seen', async () => {
  const first = await sbx.getMetrics()
  assert.ok(first.length >= 1, 'no sample')
  const m = first.at(-1)
  assert.ok(m.timestamp instanceof Date && Math.abs(Date.now() - m.timestamp.getTime()) < 60_000, `timestamp ${m.timestamp}`)
  assert.ok(m.cpuCount >= 1 && m.cpuUsedPct >= 0 && m.cpuUsedPct <= 100, JSON.stringify(m))
  assert.ok(m.memUsed > 0 && m.memUsed <= m.memTotal && m.diskUsed > 0 && m.diskUsed <= m.diskTotal, JSON.stringify(m))
  const h = await sbx.commands.run('while :; do :; done', { background: true })
  try {
    await until('cpuUsedPct shows a spinning process', async () => (await sbx.getMetrics()).at(-1).cpuUsedPct >= 25 / m.cpuCount)
  } finally {
    await h.kill()
  }
  const all = await Sandbox.getMetrics(sbx.sandboxId)
  assert.ok(all.length >= 2 && all.every((x, i) => i === 0 || x.timestamp >= all[i - 1].timestamp), 'a series in time order')
  assert.deepEqual(await Sandbox.getMetrics(sbx.sandboxId, { start: new Date(Date.now() + 3_600_000) }), [])
  await assert.rejects(Sandbox.getMetrics('sbx-doesnotexist0000000'), SandboxNotFoundError)
})

test('setTimeout and list with a metadata filter', async () => {
  const before = (await sbx.getInfo()).endAt.getTime()
  await sbx.setTimeout(600_000)
  const after = (await sbx.getInfo()).endAt.getTime()
  assert.ok(after > before, `endAt did not move: ${before} -> ${after}`)

  const found = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
  assert.deepEqual(found.map((s) => s.sandboxId), [sbx.sandboxId])
  const none = await Sandbox.list({ query: { metadata: { suite: tag + '-other' } } }).nextItems()
  assert.deepEqual(none, [])
})

test('an invalid API key raises AuthenticationError', async () => {
  await assert.rejects(create({ apiKey: 'e2b_not_a_key_of_this_gateway' }), (err) => {
    assert.ok(err instanceof AuthenticationError, `got ${err}`)
    return true
  })
  await assert.rejects(Sandbox.list({ apiKey: 'e2b_not_a_key_of_this_gateway' }).nextItems(), AuthenticationError)
})

test('an unknown sandbox raises SandboxNotFoundError', async () => {
  await assert.rejects(Sandbox.connect('sbx-doesnotexist0000000'), (err) => {
    assert.ok(err instanceof SandboxNotFoundError, `got ${err}`)
    return true
  })
  await assert.rejects(Sandbox.getInfo('sbx-doesnotexist0000000'), SandboxNotFoundError)
  assert.equal(await Sandbox.kill('sbx-doesnotexist0000000'), false)
})

test('snapshots: create, start from, list, delete', async () => {
  await sbx.files.write('/tmp/snap.txt', 'in the snapshot')
  const snap = await sbx.createSnapshot()
  assert.match(snap.snapshotId, /^snp-/)
  const listed = await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems()
  assert.deepEqual(listed.map((x) => x.snapshotId), [snap.snapshotId])
  if (process.env.E2B_TEST_SNAPSHOT_QUOTA) {
    // The gateway keeps one snapshot per API key (--quota-snapshots 1): a
    // second is sandgate's 429, the SDK's RateLimitError.
    await assert.rejects(sbx.createSnapshot(), RateLimitError)
  }
  const child = await Sandbox.create(snap.snapshotId)
  try {
    assert.equal(await child.files.read('/tmp/snap.txt'), 'in the snapshot')
  } finally {
    await child.kill()
  }
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
  assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false)
})

test('pause, list paused, connect resumes with the files kept', async () => {
  await sbx.files.write('/tmp/kept', 'across a pause')
  assert.equal(await sbx.pause(), true)
  assert.equal(await Sandbox.pause(sbx.sandboxId), false) // already paused
  assert.equal((await Sandbox.getInfo(sbx.sandboxId)).state, 'paused')
  const paused = await Sandbox.list({ query: { state: ['paused'], metadata: { suite: tag } } }).nextItems()
  assert.deepEqual(paused.map((s) => s.sandboxId), [sbx.sandboxId])
  const running = await Sandbox.list({ query: { state: ['running'], metadata: { suite: tag } } }).nextItems()
  assert.deepEqual(running, [])
  sbx = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await sbx.getInfo()).state, 'running')
  assert.equal(await sbx.files.read('/tmp/kept'), 'across a pause')
})

test('lifecycle onTimeout pause: paused at its timeout, resumed by connect', async () => {
  // Both wait out their timeouts at once: one pauses, the other (no
  // lifecycle) is killed, as on E2B.
  const [s, k] = await Promise.all([
    create({ lifecycle: { onTimeout: 'pause' }, timeoutMs: 1000, metadata: { suite: tag, of: 'autopause' } }),
    create({ timeoutMs: 1000 }),
  ])
  try {
    assert.equal((await s.getInfo()).lifecycle.onTimeout, 'pause')
    assert.equal((await k.getInfo()).lifecycle.onTimeout, 'kill')
    await s.files.write('/tmp/autopause', 'kept')
    await until('paused at the timeout', async () => (await Sandbox.getInfo(s.sandboxId)).state === 'paused')
    await until('killed at the timeout', async () => !(await k.isRunning()))
    await assert.rejects(Sandbox.getInfo(k.sandboxId), SandboxNotFoundError)
    const again = await Sandbox.connect(s.sandboxId, { timeoutMs: 60_000 })
    assert.equal((await again.getInfo()).state, 'running')
    assert.equal((await again.commands.run('cat /tmp/autopause')).stdout, 'kept')
  } finally {
    await Sandbox.kill(s.sandboxId)
  }
  // autoResume (traffic resumes) is refused by name.
  await assert.rejects(create({ lifecycle: { onTimeout: 'pause', autoResume: true } }), (err) => {
    assert.ok(err instanceof SandboxError, `got ${err}`)
    assert.match(err.message, /autoResume/)
    return true
  })
})

test('volumes: create, mount in two sandboxes, list, destroy', async () => {
  const name = `e2b-${process.pid}-${Date.now()}`
  const vol = await Volume.create(name)
  assert.match(vol.volumeId, /^vol-/)
  assert.equal(vol.name, name)
  const boxes = []
  try {
    const w = await create({ volumeMounts: { '/data': vol } })
    boxes.push(w)
    await w.files.write('/data/shared.txt', 'through the volume')
    const r = await create({ volumeMounts: { '/mnt/v': name } }) // by name
    boxes.push(r)
    assert.equal(await r.files.read('/mnt/v/shared.txt'), 'through the volume')
    assert.equal((await Volume.getInfo(vol.volumeId)).name, name)
    assert.ok((await Volume.list()).some((v) => v.volumeId === vol.volumeId && v.name === name))
    await assert.rejects(Volume.destroy(vol.volumeId), /mount/) // in use: 409
  } finally {
    for (const b of boxes) await b.kill()
  }
  assert.equal(await Volume.destroy(vol.volumeId), true)
  assert.equal(await Volume.destroy(vol.volumeId), false)
  await assert.rejects(create({ volumeMounts: { '/data': name } }), /volume/)
  await assert.rejects(Volume.create('Not A DNS Label'), /name/)
})

// Egress (allowInternetAccess, network) against the test internet the Go
// test starts (E2B_TEST_EGRESS=1: a.test and b.test, and 203.0.113.5
// without a name).
if (process.env.E2B_TEST_EGRESS) {
  test('allowInternetAccess and network: sandgate egress policies', async () => {
    // -m only catches a hang: refusals answer at once (a reset, NXDOMAIN), and a
    // fresh sandbox's first curl on two loaded cores once took over 3 s.
    const who = async (s, url) => (await s.commands.run(`curl -sS -m 30 ${url}/who || true`)).stdout.trim()
    const boxes = []
    try {
      const open = await create({ allowInternetAccess: true })
      boxes.push(open)
      assert.equal(await who(open, 'http://a.test'), 'a.test 198.51.100.1:80')
      assert.equal(await who(open, 'http://203.0.113.5'), '203.0.113.5 203.0.113.5:80')
      assert.equal((await open.getInfo()).allowInternetAccess, true)

      const closed = await create({ allowInternetAccess: false })
      boxes.push(closed)
      assert.equal(await who(closed, 'http://203.0.113.5'), '')
      assert.equal((await closed.getInfo()).allowInternetAccess, false)

      const listed = await create({ network: { allowOut: ['a.test'], denyOut: [ALL_TRAFFIC] } })
      boxes.push(listed)
      assert.equal(await who(listed, 'http://a.test'), 'a.test 198.51.100.1:80')
      assert.equal(await who(listed, 'http://b.test'), '')
      assert.equal(await who(listed, 'http://203.0.113.5'), '')
      const info = await listed.getInfo()
      assert.deepEqual(info.network.allowOut, ['a.test'])

      const denied = await create({ network: { denyOut: ['203.0.113.0/24'] } })
      boxes.push(denied)
      assert.equal(await who(denied, 'http://a.test'), 'a.test 198.51.100.1:80')
      assert.equal(await who(denied, 'http://203.0.113.5'), '')

      // A domain without everything else denied is refused by name.
      await assert.rejects(create({ network: { allowOut: ['a.test'] } }), (err) => {
        assert.ok(err instanceof SandboxError, `got ${err}`)
        assert.match(err.message, /network\.allowOut\[0\]/)
        return true
      })
    } finally {
      for (const b of boxes) await b.kill()
    }
  })
}

// On a provider that cannot pause (kubernetes; E2B_TEST_NO_PAUSE=1), what
// needs it raises the SDK's SandboxError naming why, and the sandbox runs on.
if (process.env.E2B_TEST_NO_PAUSE) {
  test('no pause: pause, createSnapshot and onTimeout pause raise SandboxError', async () => {
    const refused = (re) => (err) => {
      assert.ok(err instanceof SandboxError && re.test(err.message), `got ${err}`)
      return true
    }
    await assert.rejects(sbx.pause(), refused(/pause and resume are not supported/))
    await assert.rejects(sbx.createSnapshot(), refused(/cannot snapshot/))
    await assert.rejects(create({ lifecycle: { onTimeout: 'pause' } }), refused(/pausing at expiry is not supported/))
    assert.equal((await sbx.getInfo()).state, 'running')
  })
}

test('connect gives a working handle; kill ends the sandbox', async () => {
  const again = await Sandbox.connect(sbx.sandboxId)
  assert.equal((await again.commands.run('echo reconnected')).stdout, 'reconnected\n')
  assert.equal(await sbx.isRunning(), true)
  await sbx.kill()
  assert.equal(await sbx.isRunning(), false)
  await assert.rejects(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError)
  sbx = undefined
})
