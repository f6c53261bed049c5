// A gateway restart while a background command runs (cmd/gateway's
// TestE2BSDKRestart): phase "start" starts the command and prints
// {"id","pid"}; the gateway is then SIGKILLed and started again on the
// same state dir; phase "follow" reconnects (new URLs in the same
// variables), lets the command finish and reads the rest of its output.
// A watcher (envd's CreateWatcher, which the Python SDK's synchronous
// watch_dir calls: called here as it does, over Connect's JSON) made
// before the restart reports a change made after it.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'

const template = process.env.E2B_TEST_TEMPLATE || undefined
const phase = process.argv[2]

// rpc calls a filesystem RPC of sandbox s with Connect's JSON encoding.
const rpc = async (s, method, body) => {
  const res = await fetch(`${process.env.E2B_SANDBOX_URL}/filesystem.Filesystem/${method}`, {
    method: 'POST',
    headers: {
      'Content-Type': 'application/json', 'Connect-Protocol-Version': '1',
      'E2b-Sandbox-Id': s.sandboxId, 'X-Access-Token': s.envdAccessToken,
    },
    body: JSON.stringify(body),
  })
  const out = await res.json()
  assert.equal(res.status, 200, `${method}: ${JSON.stringify(out)}`)
  return out
}

if (phase === 'start') {
  const opts = { timeoutMs: 300_000 }
  const s = await (template ? Sandbox.create(template, opts) : Sandbox.create(opts))
  let resolveBefore
  const before = new Promise((r) => { resolveBefore = r })
  const h = await s.commands.run('echo before; while [ ! -e /tmp/go ]; do sleep 0.1; done; echo "the rest"; exit 7', {
    background: true,
    onStdout: (d) => { if (d.includes('before')) resolveBefore() },
  })
  await before
  await s.files.makeDir('/tmp/watched')
  const { watcherId } = await rpc(s, 'CreateWatcher', { path: '/tmp/watched' })
  console.log(JSON.stringify({ id: s.sandboxId, pid: h.pid, watcher: watcherId }))
  process.exit(0) // gone without a word, as a client cut off by the restart
} else if (phase === 'follow') {
  const id = process.env.E2B_RESTART_SANDBOX
  const pid = Number(process.env.E2B_RESTART_PID)
  const s = await Sandbox.connect(id)
  assert.ok((await s.commands.list()).some((p) => p.pid === pid), `pid ${pid} is not listed after the restart`)
  let out = ''
  const h = await s.commands.connect(pid, { onStdout: (d) => { out += d } })
  await s.files.write('/tmp/go', '')
  await assert.rejects(h.wait(), (err) => {
    assert.ok(err instanceof CommandExitError, `got ${err}`)
    assert.equal(err.exitCode, 7)
    return true
  })
  assert.equal(out, 'the rest\n')

  const watcherId = process.env.E2B_RESTART_WATCHER
  await s.files.write('/tmp/watched/after-restart', 'x')
  const names = []
  for (const deadline = Date.now() + 20_000; !names.includes('after-restart');) {
    assert.ok(Date.now() < deadline, `the watcher made before the restart saw ${names}`)
    const { events = [] } = await rpc(s, 'GetWatcherEvents', { watcherId })
    names.push(...events.map((e) => e.name))
    if (!names.includes('after-restart')) await new Promise((r) => setTimeout(r, 100))
  }
  await rpc(s, 'RemoveWatcher', { watcherId })
  await s.kill()
  console.log('followed')
} else {
  throw new Error(`unknown phase ${phase}`)
}
