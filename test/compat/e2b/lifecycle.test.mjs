// The control plane through E2B's SDK in domain mode: list filters and
// cursor pages, timeouts, pause and connect, and bad input answered in
// E2B's error shape (the SDK's SandboxError with the HTTP status).
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import { Sandbox, SandboxError, NotFoundError } from 'e2b'

const template = process.env.MOAT_E2B_TEMPLATE

// eventually retries check until it passes or ms have gone by.
async function eventually(check, ms = 30_000) {
  const end = Date.now() + ms
  for (;;) {
    try {
      return await check()
    } catch (e) {
      if (Date.now() > end) throw e
      await sleep(200)
    }
  }
}

test('list: metadata and state filters, cursor pages', async () => {
  const tag = `list-${process.pid}-${Date.now()}`
  const sbxs = await Promise.all([0, 1, 2].map(i =>
    Sandbox.create(template, { timeoutMs: 180_000, metadata: { suite: tag, idx: String(i), note: 'free form: a b/c' } })))
  const ids = sbxs.map(s => s.sandboxId)
  try {
    const pages = Sandbox.list({ limit: 2, query: { metadata: { suite: tag } } })
    const first = await pages.nextItems()
    assert.equal(first.length, 2)
    assert.equal(pages.hasNext, true)
    const second = await pages.nextItems()
    assert.equal(second.length, 1)
    assert.equal(pages.hasNext, false)
    assert.deepEqual([...first, ...second].map(s => s.sandboxId).sort(), [...ids].sort())

    const one = await Sandbox.list({ query: { metadata: { suite: tag, idx: '1' } } }).nextItems()
    assert.deepEqual(one.map(s => s.sandboxId), [ids[1]])
    assert.deepEqual(one[0].metadata, { suite: tag, idx: '1', note: 'free form: a b/c' })
    assert.equal(one[0].state, 'running')
    assert.equal(one[0].templateId, template)

    // Paused and running are told apart by the state filter.
    assert.equal(await sbxs[2].pause(), true)
    assert.equal(await sbxs[2].pause(), false, 'a second pause is 409: false')
    const paused = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['paused'] } }).nextItems()
    assert.deepEqual(paused.map(s => s.sandboxId), [ids[2]])
    const running = await Sandbox.list({ query: { metadata: { suite: tag }, state: ['running'] } }).nextItems()
    assert.deepEqual(running.map(s => s.sandboxId).sort(), [ids[0], ids[1]].sort())
    assert.equal((await sbxs[2].getInfo()).state, 'paused')

    // connect resumes a paused sandbox; what it had is still there.
    const back = await Sandbox.connect(ids[2])
    assert.equal((await back.getInfo()).state, 'running')
    const r = await back.commands.run('echo resumed')
    assert.equal(r.stdout, 'resumed\n')
    // connect to a running one is a plain attach.
    const again = await Sandbox.connect(ids[0])
    assert.equal((await again.commands.run('echo attached')).stdout, 'attached\n')
  } finally {
    for (const id of ids) await Sandbox.kill(id)
  }
  const after = await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems()
  assert.deepEqual(after, [])
})

test('timeout: setTimeout shortens the life, an expired sandbox is gone', async () => {
  const sbx = await Sandbox.create(template, { timeoutMs: 120_000 })
  try {
    const before = await sbx.getInfo()
    await sbx.setTimeout(4_000)
    const info = await sbx.getInfo()
    assert.ok(info.endAt < before.endAt, `endAt ${info.endAt.toISOString()} not before ${before.endAt.toISOString()}`)
    assert.ok(info.endAt.getTime() - Date.now() < 6_000, `endAt ${info.endAt.toISOString()} is not ~4 s away`)
    await eventually(async () => assert.equal(await sbx.isRunning(), false), 60_000)
    await assert.rejects(sbx.getInfo(), NotFoundError)
    await assert.rejects(sbx.commands.run('true'), e => e instanceof SandboxError)
  } finally {
    await Sandbox.kill(sbx.sandboxId)
  }
})

test('bad input gets E2B error shapes and leaves nothing behind', async () => {
  const tag = `bad-${process.pid}-${Date.now()}`
  await assert.rejects(Sandbox.create('no-such-template', { metadata: { suite: tag } }),
    e => e instanceof SandboxError && e.statusCode === 404 && /no-such-template/.test(e.message))
  for (const timeoutMs of [-5_000, 0]) {
    await assert.rejects(Sandbox.create(template, { timeoutMs, metadata: { suite: tag } }),
      e => e instanceof SandboxError && e.statusCode === 400, `timeoutMs ${timeoutMs}`)
  }
  assert.deepEqual(await Sandbox.list({ query: { metadata: { suite: tag } } }).nextItems(), [])
  await assert.rejects(Sandbox.connect('nosuchsandbox0000000'), NotFoundError)
  await assert.rejects(Sandbox.getInfo('nosuchsandbox0000000'), NotFoundError)
  assert.equal(await Sandbox.kill('nosuchsandbox0000000'), false)
  await assert.rejects(Sandbox.setTimeout('nosuchsandbox0000000', 10_000), NotFoundError)
})
