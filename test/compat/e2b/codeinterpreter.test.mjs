// E2B's official code-interpreter SDK (@e2b/code-interpreter, pinned in
// package.json), unchanged, against a real `moat serve` in the SDK's
// domain mode: the control plane, envd and the code interpreter
// (port 49999, served by moat's agent over its code contexts) through
// moat's edge on one port. The sandboxes come from the built-in templates
// `base` and `code-interpreter-v1` over the test images of
// scripts/build-test-images.sh. test/e2e/compate2b_code_test.go starts the
// server and sets the environment.
import { test, describe, before, after } from 'node:test'
import assert from 'node:assert/strict'
import { Sandbox as BaseSandbox } from 'e2b'
import { Sandbox, NotFoundError, SandboxError, InvalidArgumentError } from '@e2b/code-interpreter'

// Domain mode: the SDK reads E2B_DOMAIN and E2B_API_KEY (set by the test).
const opts = {}

test('the base template is E2B-like: bash, python3, node, git, sudo, user', async () => {
  const sbx = await BaseSandbox.create({ ...opts, timeoutMs: 120_000 })
  try {
    const r = await sbx.commands.run('whoami; pwd; echo $HOME; python3 -c "print(6*7)"; node -e "console.log(6*7)"; git --version; bash --version | head -1')
    const lines = r.stdout.split('\n')
    assert.deepEqual(lines.slice(0, 5), ['user', '/home/user', '/home/user', '42', '42'])
    assert.match(lines[5], /^git version /)
    assert.match(lines[6], /^GNU bash/)
    // `user` is uid 1000 and in sudoers. (moat's sandboxes run with
    // no_new_privs, so sudo cannot raise privileges in them.)
    const s = await sbx.commands.run('id -u; test -u "$(command -v sudo)" && test -e /etc/sudoers.d/user && echo sudoer')
    assert.equal(s.stdout, '1000\nsudoer\n')
  } finally {
    assert.equal(await sbx.kill(), true)
  }
})

describe('code interpreter (runCode, contexts)', () => {
  /** @type {Sandbox} */
  let sbx

  before(async () => {
    sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000 })
  })
  after(async () => {
    if (sbx) assert.equal(await sbx.kill(), true)
  })

  test('python: results, logs, errors and the callbacks', async () => {
    const seen = { stdout: [], stderr: [], results: [], errors: [] }
    const cb = {
      onStdout: m => seen.stdout.push(m.line),
      onStderr: m => seen.stderr.push(m.line),
      onResult: r => seen.results.push(r),
      onError: e => seen.errors.push(e),
    }
    const x = await sbx.runCode('x = 1; x += 1; x', cb)
    assert.equal(x.text, '2')
    assert.equal(x.error, undefined)
    assert.equal(x.results.length, 1)
    assert.equal(x.results[0].isMainResult, true)
    assert.equal(seen.results[0].text, '2')
    assert.equal(typeof x.executionCount, 'number')

    const p = await sbx.runCode('import sys\nprint("hello")\nprint("oops", file=sys.stderr)', cb)
    assert.equal(p.logs.stdout.join(''), 'hello\n')
    assert.equal(p.logs.stderr.join(''), 'oops\n')
    assert.equal(seen.stdout.join(''), 'hello\n')
    assert.equal(seen.stderr.join(''), 'oops\n')
    assert.equal(p.text, undefined)

    const e = await sbx.runCode('1 / 0', cb)
    assert.equal(e.error.name, 'ZeroDivisionError')
    assert.match(e.error.value, /division by zero/)
    assert.equal(typeof e.error.traceback, 'string')
    assert.match(e.error.traceback, /ZeroDivisionError/)
    assert.equal(seen.errors.length, 1)

    // A display is a result that is not the main one.
    const d = await sbx.runCode('from IPython.display import display, HTML\ndisplay(HTML("<b>hi</b>"))\n7')
    assert.deepEqual(d.results.map(r => r.isMainResult), [false, true])
    assert.equal(d.results[0].html, '<b>hi</b>')
    assert.deepEqual(d.results[0].formats(), ['html'])
    assert.equal(d.text, '7')

    // The default context keeps its state; the sandbox's env is there.
    assert.equal((await sbx.runCode('x * 21')).text, '42')
    assert.equal((await sbx.runCode('import os; os.environ["E2B_SANDBOX_ID"]')).text, sbx.sandboxId)
    // Per-run envs hold for that run only.
    assert.equal((await sbx.runCode('os.environ["MOAT_CI"]', { envs: { MOAT_CI: 'on' } })).text, 'on')
    assert.equal((await sbx.runCode('repr(os.environ.get("MOAT_CI"))')).text, 'None')
  })

  test('output streams while the cell runs', async () => {
    let first
    const started = Date.now()
    const r = await sbx.runCode('import time\nprint("early", flush=True)\ntime.sleep(1.5)\nprint("late")', {
      onStdout: () => { first ??= Date.now() },
    })
    const ended = Date.now()
    assert.equal(r.logs.stdout.join(''), 'early\nlate\n')
    assert.ok(first !== undefined && ended - first >= 1000, `first output ${first - started} ms, end ${ended - started} ms`)
  })

  // Every language of the image (python, javascript, typescript and R
  // kernels or drivers, java through jshell, bash), in its default
  // context.
  const LANGS = [
    { language: 'python', code: 'print(6 * 7)' },
    { language: 'javascript', code: 'console.log(6 * 7)' },
    { language: 'js', code: 'console.log(6 * 7)' },
    { language: 'typescript', code: 'const n: number = 6 * 7\nconsole.log(n)' },
    { language: 'r', code: 'cat(6 * 7, "\\n", sep = "")' },
    { language: 'java', code: 'System.out.println(6 * 7);' },
    { language: 'bash', code: 'echo $((6 * 7))' },
  ]
  for (const l of LANGS) {
    test(`runCode in ${l.language}`, async () => {
      const r = await sbx.runCode(l.code, { language: l.language, timeoutMs: 120_000 })
      assert.equal(r.error, undefined, JSON.stringify(r.error))
      assert.equal(r.logs.stdout.join(''), '42\n')
    })
  }

  test('values and errors in javascript and R', async () => {
    assert.equal((await sbx.runCode('[1, 2].map(v => v * 21)[1]', { language: 'javascript' })).text, '42')
    const je = await sbx.runCode('null.f()', { language: 'javascript' })
    assert.equal(je.error.name, 'TypeError')
    // IRkernel shows a value as a display, not as the main result (so
    // on E2B too).
    const rv = await sbx.runCode('6 * 7', { language: 'r' })
    assert.ok(rv.results.some(x => /42/.test(x.text)), JSON.stringify(rv.results))
    assert.ok((await sbx.runCode('stop("no")', { language: 'r' })).error)
  })

  test('contexts: create, list, run, restart, remove', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
    assert.equal(ctx.language, 'python')
    assert.equal(ctx.cwd, '/tmp')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
    const js = await sbx.createCodeContext({ language: 'javascript' })
    assert.equal(js.cwd, '/home/user')
    assert.equal((await sbx.runCode('process.cwd()', { context: js })).text, '/home/user')

    const ids = (await sbx.listCodeContexts()).map(c => c.id)
    assert.ok(ids.includes(ctx.id) && ids.includes(js.id), ids.join(','))

    await sbx.runCode('kept = 41', { context: ctx })
    assert.equal((await sbx.runCode('kept + 1', { context: ctx })).text, '42')
    await sbx.restartCodeContext(ctx)
    const after = await sbx.runCode('kept', { context: ctx })
    assert.equal(after.error.name, 'NameError')
    assert.equal((await sbx.runCode('os.getcwd()', { context: ctx })).error.name, 'NameError')

    await sbx.removeCodeContext(ctx)
    await sbx.removeCodeContext(js.id)
    const left = (await sbx.listCodeContexts()).map(c => c.id)
    assert.ok(!left.includes(ctx.id) && !left.includes(js.id), left.join(','))
    await assert.rejects(sbx.runCode('1', { context: ctx }), NotFoundError)
  })

  test('bad input gets the code interpreter\'s errors', async () => {
    await assert.rejects(sbx.runCode('1', { language: 'cobol' }), e => e instanceof SandboxError && /400/.test(e.message))
    await assert.rejects(sbx.createCodeContext({ language: 'cobol' }), e => e instanceof SandboxError && /400/.test(e.message))
    await assert.rejects(sbx.createCodeContext({ cwd: '/nonexistent/dir' }), e => e instanceof SandboxError && /400/.test(e.message))
    await assert.rejects(sbx.runCode('1', { context: { id: 'nope', language: 'python', cwd: '/' } }),
      e => e instanceof NotFoundError && /Context nope not found/.test(e.message))
    await assert.rejects(sbx.restartCodeContext('nope'), NotFoundError)
    await assert.rejects(sbx.removeCodeContext('nope'), NotFoundError)
    await assert.rejects(sbx.runCode('1', { language: 'python', context: { id: 'x' } }), InvalidArgumentError)
    // The interpreter still works.
    assert.equal((await sbx.runCode('6 * 7')).text, '42')
  })
})
