// Commands through E2B's SDK in domain mode (envd over TLS and HTTP/2 at
// 49983-<id>.<domain>): background processes with real in-sandbox pids,
// stdin, kill, list, reattach after a disconnect, PTYs, the sandbox's
// E2B env, and bad input in E2B's error shapes.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import { Sandbox, CommandExitError, NotFoundError, InvalidArgumentError, TimeoutError } from 'e2b'

const template = process.env.MOAT_E2B_TEMPLATE
let sbx

async function eventually(check, ms = 30_000) {
  const end = Date.now() + ms
  for (;;) {
    try {
      return await check()
    } catch (e) {
      if (Date.now() > end) throw e
      await sleep(100)
    }
  }
}

before(async () => {
  sbx = await Sandbox.create(template, { timeoutMs: 300_000, envs: { FROM_CREATE: 'c1' } })
})
after(async () => {
  if (sbx) assert.equal(await sbx.kill(), true)
})

test('the sandbox env: E2B_SANDBOX, E2B_SANDBOX_ID, E2B_TEMPLATE_ID, create and request envs', async () => {
  const r = await sbx.commands.run('echo "$E2B_SANDBOX|$E2B_SANDBOX_ID|$E2B_TEMPLATE_ID|$FROM_CREATE|$FROM_RUN"', { envs: { FROM_RUN: 'r1' } })
  assert.equal(r.stdout, `true|${sbx.sandboxId}|${template}|c1|r1\n`)
  const env = await sbx.commands.run('env', { envs: { FROM_CREATE: 'overridden' } })
  assert.match(env.stdout, /^FROM_CREATE=overridden$/m, 'request envs override the sandbox env')
})

test('output streams as produced, stdout and stderr apart', async () => {
  const seen = []
  const r = await sbx.commands.run('echo one; echo two >&2; printf "no newline"', {
    onStdout: d => seen.push(['out', d]), onStderr: d => seen.push(['err', d]),
  })
  assert.equal(r.stdout, 'one\nno newline')
  assert.equal(r.stderr, 'two\n')
  assert.ok(seen.some(([k, d]) => k === 'err' && d === 'two\n'))
  await assert.rejects(sbx.commands.run('sleep 10', { timeoutMs: 1_000 }), TimeoutError)
  assert.equal((await sbx.commands.run('pwd', { cwd: '/tmp' })).stdout, '/tmp\n')
  await assert.rejects(sbx.commands.run('pwd', { cwd: '/no/such/dir' }), InvalidArgumentError)
})

test('background: stdin, list, kill with real pids', async () => {
  const cat = await sbx.commands.run('cat', { background: true, stdin: true })
  assert.ok(cat.pid > 1)
  await sbx.commands.sendStdin(cat.pid, 'through stdin\n')
  await sbx.commands.closeStdin(cat.pid)
  const res = await cat.wait()
  assert.equal(res.stdout, 'through stdin\n')
  assert.equal(res.exitCode, 0)

  const sleeper = await sbx.commands.run('sleep 300', { background: true, envs: { TAGGED: '1' }, cwd: '/tmp' })
  // The pid is the process's in the sandbox: kill -0 from inside finds it.
  await sbx.commands.run(`kill -0 ${sleeper.pid}`)
  const listed = (await sbx.commands.list()).find(p => p.pid === sleeper.pid)
  assert.ok(listed, 'the background process is listed')
  assert.equal(listed.cmd, '/bin/bash')
  assert.deepEqual(listed.args, ['-l', '-c', 'sleep 300'])
  assert.equal(listed.envs.TAGGED, '1')
  assert.equal(listed.cwd, '/tmp')
  assert.equal(await sbx.commands.kill(sleeper.pid), true)
  await assert.rejects(sleeper.wait(), e => e instanceof CommandExitError && e.exitCode === -1)
  await eventually(async () => {
    await assert.rejects(sbx.commands.run(`kill -0 ${sleeper.pid}`), CommandExitError)
  })
  assert.ok(!(await sbx.commands.list()).some(p => p.pid === sleeper.pid), 'a killed process is not listed')
})

test('a process outlives its stream and is reattached with connect', async () => {
  const h = await sbx.commands.run('read line; echo "got $line"; sleep 0.5; echo done', { background: true, stdin: true, timeoutMs: 0 })
  await h.disconnect()
  await sleep(300)
  assert.ok((await sbx.commands.list()).some(p => p.pid === h.pid), 'still running after the disconnect')
  const later = []
  const again = await sbx.commands.connect(h.pid, { onStdout: d => later.push(d) })
  await sbx.commands.sendStdin(h.pid, 'late input\n')
  const res = await again.wait()
  assert.equal(res.exitCode, 0)
  assert.equal(res.stdout, 'got late input\ndone\n')
  assert.equal(later.join(''), 'got late input\ndone\n')
})

test('unknown pids are E2B not-found', async () => {
  assert.equal(await sbx.commands.kill(999999), false)
  await assert.rejects(sbx.commands.connect(999999), NotFoundError)
  await assert.rejects(sbx.commands.sendStdin(999999, 'x'), NotFoundError)
  assert.equal(await sbx.pty.kill(999999), false)
})

test('pty: create, sendInput, resize, kill', async () => {
  const dec = new TextDecoder()
  let out = ''
  const pty = await sbx.pty.create({ cols: 80, rows: 24, onData: d => { out += dec.decode(d, { stream: true }) } })
  assert.ok(pty.pid > 1)
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size; echo "tty-$((40+2))"; tty\n'))
  await eventually(() => {
    assert.match(out, /24 80/)
    assert.match(out, /tty-42/)
    assert.match(out, /\/dev\/pts\/\d+/)
  })
  await sbx.pty.resize(pty.pid, { cols: 100, rows: 30 })
  await sbx.pty.sendInput(pty.pid, new TextEncoder().encode('stty size\n'))
  await eventually(() => assert.match(out, /30 100/))
  assert.ok((await sbx.commands.list()).some(p => p.pid === pty.pid), 'the pty is listed')
  assert.equal(await sbx.pty.kill(pty.pid), true)
  await assert.rejects(pty.wait(), e => e instanceof CommandExitError)
})
