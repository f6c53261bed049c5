// The E2B face's overhead (issue 26's benchmark): create → first
// commands.run('true') and commands.run('true') through the E2B SDK, side
// by side with the same operations through sandgate's own API (fetch, the
// same process, the same keep-alive connections). Usage:
//   E2B_API_URL=… E2B_SANDBOX_URL=… E2B_API_KEY=… SANDGATE_URL=http://host:port node bench.mjs [creates] [runs]
import { Sandbox } from 'e2b'

const creates = Number(process.argv[2] || 10)
const runs = Number(process.argv[3] || 50)
const base = process.env.SANDGATE_URL
const key = process.env.E2B_API_KEY

const p50 = (xs) => { const s = [...xs].sort((a, b) => a - b); return s[Math.floor(s.length / 2)] }
const now = () => performance.now()

async function own(method, path, body, hdr = {}) {
  const res = await fetch(base + path, {
    method, headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${key}`, ...hdr },
    body: body === undefined ? undefined : JSON.stringify(body),
  })
  const text = await res.text()
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`)
  return text ? JSON.parse(text) : undefined
}

const e2bCreate = [], e2bRun = [], ownCreate = [], ownRun = [], ownLogin = []
// What the E2B face runs for commands.run('true'): the SDK asks for bash -l -c.
const login = "exec '/bin/bash' '-l' '-c' 'true'"
for (let i = 0; i < creates; i++) {
  let t = now()
  const s = await Sandbox.create()
  await s.commands.run('true')
  e2bCreate.push(now() - t)
  if (i === 0) {
    for (let j = 0; j < runs; j++) {
      t = now(); await s.commands.run('true'); e2bRun.push(now() - t)
    }
  }
  await s.kill()

  t = now()
  const ref = await own('POST', '/v1/sandboxes', {})
  const lease = { 'X-Sandbox-Lease': ref.lease_token }
  await own('POST', `/v1/sandboxes/${ref.sandbox_id}/exec`, { command: 'true' }, lease)
  ownCreate.push(now() - t)
  if (i === 0) {
    for (let j = 0; j < runs; j++) {
      t = now(); await own('POST', `/v1/sandboxes/${ref.sandbox_id}/exec`, { command: 'true' }, lease); ownRun.push(now() - t)
      t = now(); await own('POST', `/v1/sandboxes/${ref.sandbox_id}/exec`, { command: login }, lease); ownLogin.push(now() - t)
    }
  }
  await own('DELETE', `/v1/sandboxes/${ref.sandbox_id}`)
}
const row = (what, e, o) => console.log(`${what.padEnd(28)} e2b p50 ${p50(e).toFixed(1)} ms   sandgate p50 ${p50(o).toFixed(1)} ms   ratio ${(p50(e) / p50(o)).toFixed(2)}`)
row('create -> first run(true)', e2bCreate, ownCreate)
row("run('true')", e2bRun, ownRun)
row("run('true') vs bash -l -c", e2bRun, ownLogin)
