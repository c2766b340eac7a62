// Files through E2B's SDK in domain mode: a user's files (paths relative
// to its home, owned by it), list depths, watchDir, and paths the user
// may not touch, in E2B's error shapes.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { setTimeout as sleep } from 'node:timers/promises'
import { Sandbox, SandboxError, NotFoundError, FileType } from 'e2b'

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
  sbx = await Sandbox.create(template, { timeoutMs: 300_000 })
  // E2B's templates have a `user` account; the test image gets one.
  await sbx.commands.run('{ id -u user >/dev/null 2>&1 || useradd -m -s /bin/bash user; } && chmod 0700 /root && touch /root/.bashrc', { user: 'root' })
})
after(async () => {
  if (sbx) assert.equal(await sbx.kill(), true)
})

test("a user's files: relative to its home, owned by it", async () => {
  const w = await sbx.files.write('notes/hello.txt', 'hello', { user: 'user' })
  assert.equal(w.path, '/home/user/notes/hello.txt')
  const info = await sbx.files.getInfo('notes/hello.txt', { user: 'user' })
  assert.equal(info.owner, 'user')
  assert.equal(info.group, 'user')
  assert.equal(info.mode, 0o644)
  assert.equal(info.permissions, '-rw-r--r--')
  assert.equal(info.type, FileType.FILE)
  assert.equal((await sbx.commands.run('stat -c %U:%G /home/user/notes', { user: 'root' })).stdout, 'user:user\n')
  assert.equal((await sbx.commands.run('whoami; pwd; cat notes/hello.txt', { user: 'user', cwd: '~' })).stdout, 'user\n/home/user\nhello')
})

test('list depth and makeDir', async () => {
  assert.equal(await sbx.files.makeDir('/tmp/tree/a/b'), true)
  assert.equal(await sbx.files.makeDir('/tmp/tree/a/b'), false, 'an existing dir: false')
  await sbx.files.write('/tmp/tree/a/b/leaf.txt', 'x')
  await sbx.files.write('/tmp/tree/top.txt', 'y')
  const one = await sbx.files.list('/tmp/tree')
  assert.deepEqual(one.map(e => [e.name, e.type]), [['a', FileType.DIR], ['top.txt', FileType.FILE]])
  const deep = await sbx.files.list('/tmp/tree', { depth: 3 })
  assert.deepEqual(deep.map(e => e.path).sort(),
    ['/tmp/tree/a', '/tmp/tree/a/b', '/tmp/tree/a/b/leaf.txt', '/tmp/tree/top.txt'])
  await assert.rejects(sbx.files.list('/tmp/nope'), NotFoundError)
})

test('watchDir reports creates, writes and removes, recursively', async () => {
  await sbx.files.makeDir('/tmp/watched/sub')
  const events = []
  const w = await sbx.files.watchDir('/tmp/watched', ev => events.push(ev), { recursive: true })
  try {
    await sbx.files.write('/tmp/watched/new.txt', 'one')
    await sbx.files.write('/tmp/watched/sub/deep.txt', 'two')
    await sbx.files.remove('/tmp/watched/new.txt')
    await eventually(() => {
      const has = (name, type) => events.some(e => e.name === name && e.type === type)
      assert.ok(has('new.txt', 'create') || has('new.txt', 'write'), JSON.stringify(events))
      assert.ok(has('sub/deep.txt', 'create') || has('sub/deep.txt', 'write'), JSON.stringify(events))
      assert.ok(has('new.txt', 'remove'), JSON.stringify(events))
    })
  } finally {
    await w.stop()
  }
  await assert.rejects(sbx.files.watchDir('/tmp/not-there', () => {}), NotFoundError)
})

test('paths the user may not touch are refused and stay untouched', async () => {
  const denied = e => e instanceof SandboxError && !(e instanceof NotFoundError) && /permission/i.test(e.message)
  await assert.rejects(sbx.files.write('/root/owned.txt', 'no', { user: 'user' }), denied)
  await assert.rejects(sbx.files.read('/etc/shadow', { user: 'user' }), denied)
  await assert.rejects(sbx.files.list('/root', { user: 'user' }), denied)
  await assert.rejects(sbx.files.makeDir('/root/made', { user: 'user' }), denied)
  await assert.rejects(sbx.files.remove('/root/.bashrc', { user: 'user' }), denied)
  await assert.rejects(sbx.files.rename('/root/.bashrc', '/home/user/stolen', { user: 'user' }), denied)
  await assert.rejects(sbx.commands.run('cat /root/.bashrc', { user: 'user', cwd: '~' }), e => e.exitCode === 1)
  const left = await sbx.commands.run('ls -A /root; test -e /home/user/stolen && echo stolen || true', { user: 'root' })
  assert.doesNotMatch(left.stdout, /owned\.txt|made|stolen/)
  assert.match(left.stdout, /\.bashrc/)
  await assert.rejects(sbx.files.read('x', { user: 'nosuchuser' }), e => e instanceof Error && !(e instanceof NotFoundError))
})
