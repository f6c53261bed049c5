// A gateway restart while a background command runs (cmd/gateway's
// TestE2BSDKRestart): phase "start" starts the command and prints
// {"id","pid"}; the gateway is then SIGKILLed and started again on the
// same state dir; phase "follow" reconnects (new URLs in the same
// variables), lets the command finish and reads the rest of its output.
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError } from 'e2b'

const template = process.env.E2B_TEST_TEMPLATE || undefined
const phase = process.argv[2]

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
  console.log(JSON.stringify({ id: s.sandboxId, pid: h.pid }))
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
  await s.kill()
  console.log('followed')
} else {
  throw new Error(`unknown phase ${phase}`)
}
