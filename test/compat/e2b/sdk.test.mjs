// E2B's official JavaScript SDK (e2b, pinned in package.json), unchanged,
// against a real `moat serve` in the SDK's explicit-URL mode: the control
// plane and envd (through moat's edge, E2b-Sandbox-* headers) on one port.
// test/e2e/compate2b_test.go starts the server and sets the environment.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox, CommandExitError, NotFoundError } from 'e2b'

const opts = {}
const template = process.env.MOAT_E2B_TEMPLATE

test('lifecycle, commands and files through the SDK', async () => {
  const sbx = await Sandbox.create(template, { ...opts, timeoutMs: 120_000, metadata: { suite: 'e2b sdk' } })
  try {
    assert.match(sbx.sandboxId, /^[a-z0-9]{20}$/)
    const info = await sbx.getInfo()
    assert.equal(info.state, 'running')
    assert.equal(info.metadata.suite, 'e2b sdk')
    const listed = await Sandbox.list({ ...opts, query: { metadata: { suite: 'e2b sdk' } } }).nextItems()
    assert.deepEqual(listed.map(s => s.sandboxId), [sbx.sandboxId])

    const r = await sbx.commands.run('echo hello $((6*7)); pwd')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello 42\n/root\n')
    await assert.rejects(sbx.commands.run('echo out; exit 3'), e => e instanceof CommandExitError && e.exitCode === 3)

    const bg = await sbx.commands.run('sleep 60', { background: true })
    assert.ok((await sbx.commands.list()).some(p => p.pid === bg.pid))
    assert.equal(await sbx.commands.kill(bg.pid), true)
    assert.equal(await sbx.commands.kill(999999), false)

    await sbx.files.write('/tmp/sdk.txt', 'file body')
    assert.equal(await sbx.files.read('/tmp/sdk.txt'), 'file body')
    assert.ok((await sbx.files.list('/tmp')).some(e => e.name === 'sdk.txt'))
    await sbx.files.rename('/tmp/sdk.txt', '/tmp/moved.txt')
    assert.equal((await sbx.files.getInfo('/tmp/moved.txt')).size, 9)
    assert.equal(await sbx.files.exists('/tmp/sdk.txt'), false)
    await sbx.files.remove('/tmp/moved.txt')
    assert.equal(await sbx.files.exists('/tmp/moved.txt'), false)
    await assert.rejects(sbx.files.read('/tmp/nope'), NotFoundError)

    assert.equal(await sbx.isRunning(), true)
  } finally {
    assert.equal(await sbx.kill(), true)
  }
  // A killed sandbox's envd is E2B's 502 at the edge: not running.
  assert.equal(await sbx.isRunning(), false)
  assert.equal(await Sandbox.kill(sbx.sandboxId, opts), false)
})
