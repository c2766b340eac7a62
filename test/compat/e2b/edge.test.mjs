// moat's edge in E2B's domain mode: TLS with the wildcard certificate and
// HTTP/2, getHost(port) to servers in the sandbox (also one that listens
// only on the sandbox's loopback), signed upload and download URLs that
// need no header, and E2B's exact 502 bodies.
import { test, before, after } from 'node:test'
import assert from 'node:assert/strict'
import http2 from 'node:http2'
import { setTimeout as sleep } from 'node:timers/promises'
import { Sandbox } from 'e2b'

const template = process.env.MOAT_E2B_TEMPLATE
const domain = process.env.E2B_DOMAIN
let sbx

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

before(async () => {
  sbx = await Sandbox.create(template, { timeoutMs: 300_000 })
})
after(async () => {
  if (sbx) await sbx.kill()
})

test('TLS with the wildcard certificate negotiates HTTP/2', async () => {
  for (const host of [`api.${domain}`, sbx.getHost(49983)]) {
    const session = http2.connect(`https://${host}`)
    try {
      const status = await new Promise((resolve, reject) => {
        session.on('error', reject)
        const req = session.request({ ':path': '/health' })
        req.on('response', h => { resolve(h[':status']); req.resume() })
        req.on('error', reject)
        req.end()
      })
      assert.equal(session.alpnProtocol, 'h2', host)
      assert.ok(status === 200 || status === 204, `${host}/health: ${status}`)
    } finally {
      session.close()
    }
  }
})

test('getHost reaches servers in the sandbox, loopback-only ones too', async () => {
  assert.equal(sbx.getHost(8000), `8000-${sbx.sandboxId}.${domain}`)
  await sbx.commands.run('mkdir -p /srv/www && echo served > /srv/www/index.html')
  await sbx.commands.run('cd /srv/www && exec python3 -m http.server 8000', { background: true, timeoutMs: 0 })
  // The loopback-only server reads a POST's whole body and answers its
  // length (http.server's 501 to a POST, sent before the body is read,
  // races the proxy's write of it).
  await sbx.files.write('/srv/serve.py', [
    'import http.server',
    'class H(http.server.SimpleHTTPRequestHandler):',
    '    def do_POST(self):',
    "        if self.headers.get('Transfer-Encoding', '').lower() == 'chunked':",
    '            n = 0',
    '            while True:',
    "                size = int(self.rfile.readline().split(b';')[0].strip(), 16)",
    '                if size == 0:',
    '                    self.rfile.readline()',
    '                    break',
    '                n += len(self.rfile.read(size))',
    '                self.rfile.readline()',
    '        else:',
    "            n = len(self.rfile.read(int(self.headers.get('Content-Length', '0'))))",
    '        body = str(n).encode()',
    '        self.send_response(200)',
    "        self.send_header('Content-Length', str(len(body)))",
    '        self.end_headers()',
    '        self.wfile.write(body)',
    "http.server.ThreadingHTTPServer(('127.0.0.1', 8001), H).serve_forever()",
    '',
  ].join('\n'))
  await sbx.commands.run('cd /srv/www && exec python3 /srv/serve.py', { background: true, timeoutMs: 0 })
  for (const port of [8000, 8001]) {
    const body = await eventually(async () => {
      const r = await fetch(`https://${sbx.getHost(port)}/index.html`)
      assert.equal(r.status, 200, `port ${port}`)
      return r.text()
    })
    assert.equal(body, 'served\n', `port ${port}`)
  }
  // A POST's whole body goes through to the loopback-only server too.
  const post = await fetch(`https://${sbx.getHost(8001)}/`, { method: 'POST', body: 'x'.repeat(100_000) })
  assert.equal(post.status, 200)
  assert.equal(await post.text(), '100000')

  const closed = await fetch(`https://${sbx.getHost(8002)}/`)
  assert.equal(closed.status, 502)
  assert.deepEqual(await closed.json(), { sandboxId: sbx.sandboxId, message: 'The sandbox is running but port is not open', port: 8002, code: 502 })
})

test('signed URLs upload and download without headers', async () => {
  const up = await sbx.uploadUrl('/tmp/signed.txt')
  const u = new URL(up)
  assert.equal(u.host, `49983-${sbx.sandboxId}.${domain}`)
  assert.ok(u.searchParams.get('signature'), up)
  const form = new FormData()
  form.append('file', new Blob(['signed body']), 'signed.txt')
  const put = await fetch(up, { method: 'POST', body: form })
  assert.equal(put.status, 200, await put.clone().text())
  assert.deepEqual(await put.json(), [{ name: 'signed.txt', path: '/tmp/signed.txt', type: 'file' }])

  const down = await sbx.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: 60 })
  const got = await fetch(down)
  assert.equal(got.status, 200)
  assert.equal(await got.text(), 'signed body')
  assert.equal(await sbx.files.read('/tmp/signed.txt'), 'signed body')

  const expired = await sbx.downloadUrl('/tmp/signed.txt', { useSignatureExpiration: -10 })
  const e = await fetch(expired)
  assert.equal(e.status, 401)
  assert.deepEqual(await e.json(), { code: 401, message: 'signature is already expired' })

  const forged = new URL(down)
  forged.searchParams.set('path', '/etc/passwd')
  const f = await fetch(forged)
  assert.equal(f.status, 401)
  await f.arrayBuffer()
  const unsigned = new URL(down)
  unsigned.search = '?path=%2Fetc%2Fpasswd'
  const n = await fetch(unsigned)
  assert.equal(n.status, 401)
  await n.arrayBuffer()
})

test('a killed sandbox is E2B 502 not found at the edge', async () => {
  const gone = await Sandbox.create(template, { timeoutMs: 60_000 })
  const host = gone.getHost(49983)
  assert.equal(await gone.kill(), true)
  const r = await fetch(`https://${host}/health`)
  assert.equal(r.status, 502)
  assert.deepEqual(await r.json(), { sandboxId: gone.sandboxId, message: 'The sandbox was not found', code: 502 })
})
