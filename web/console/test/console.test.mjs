// The web console in a real browser: Debian's chromium driven by
// playwright-core (never a browser download), against a real `moat serve`
// started by test/e2e TestConsoleBrowser, which passes:
//   MOAT_URL      the server (http://127.0.0.1:PORT)
//   MOAT_API_KEY  the server's own key (an admin of the default tenant)
//   MOAT_IMAGE    an image in a loopback registry (busybox)
//   MOAT_SHOTS    where to write a screenshot of each page
//   CHROMIUM      the browser binary (/usr/bin/chromium)
// Tests run in order and share state (the sandbox made by the create test).
import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { mkdtempSync, readFileSync, rmSync, mkdirSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { randomBytes } from 'node:crypto'
import { chromium } from 'playwright-core'

const URL = process.env.MOAT_URL
const KEY = process.env.MOAT_API_KEY
const IMAGE = process.env.MOAT_IMAGE
const SHOTS = process.env.MOAT_SHOTS
for (const [k, v] of Object.entries({ MOAT_URL: URL, MOAT_API_KEY: KEY, MOAT_IMAGE: IMAGE, MOAT_SHOTS: SHOTS })) {
  if (!v) throw new Error(`${k} is not set (run through go test -run TestConsoleBrowser ./test/e2e)`)
}
mkdirSync(SHOTS, { recursive: true })

// Chromium talks to the test server only: no background services, no
// QUIC, and every host name but localhost fails to resolve (the server
// and the registry are IP literals on loopback).
const FLAGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
  '--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1',
]

const contexts = []
const profiles = []

async function browser() {
  const dir = mkdtempSync(join(tmpdir(), 'moat-console-chromium-'))
  const ctx = await chromium.launchPersistentContext(dir, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: FLAGS,
    viewport: { width: 1360, height: 860 },
    acceptDownloads: true,
  })
  contexts.push(ctx)
  profiles.push(dir)
  ctx.setDefaultTimeout(30_000)
  const page = ctx.pages()[0] ?? (await ctx.newPage())
  page.on('dialog', (d) => d.accept()) // confirm() of deletes
  page.on('pageerror', (e) => console.log('page error:', e.message))
  return { ctx, page }
}

async function shot(page, name) {
  await page.waitForTimeout(150) // let the last render settle
  await page.screenshot({ path: join(SHOTS, `${name}.png`) })
}

/** apiCall calls the Lifecycle API directly with a key (setup and checks). */
async function apiCall(method, path, body, key = KEY) {
  const res = await fetch(URL + path, {
    method,
    headers: { 'OPEN-SANDBOX-API-KEY': key, ...(body ? { 'Content-Type': 'application/json' } : {}) },
    body: body ? JSON.stringify(body) : undefined,
  })
  const text = await res.text()
  let json
  try {
    json = text ? JSON.parse(text) : undefined
  } catch {
    json = text
  }
  return { status: res.status, json }
}

async function until(what, f, ms = 30_000) {
  const end = Date.now() + ms
  let last
  for (;;) {
    try {
      last = await f()
      if (last) return last
    } catch (e) {
      last = e
    }
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}: ${last instanceof Error ? last.message : JSON.stringify(last)}`)
    await new Promise((r) => setTimeout(r, 250))
  }
}

async function signIn(page, key) {
  await page.goto(URL + '/console/')
  await page.fill('input[name=apiKey]', key)
  await page.click('button[type=submit]')
  await page.waitForSelector('[data-testid=whoami]')
}

const agentPath = (id, rest) => `/v1/sandboxes/${id}/proxy/44772${rest}`

async function upload(id, path, bytes, key = KEY) {
  const fd = new FormData()
  fd.append('metadata', new Blob([JSON.stringify({ path })], { type: 'application/json' }), 'metadata')
  fd.append('file', new Blob([bytes]), path.split('/').pop())
  const res = await fetch(URL + agentPath(id, '/files/upload'), { method: 'POST', headers: { 'OPEN-SANDBOX-API-KEY': key }, body: fd })
  assert.equal(res.status, 200, `upload ${path}: ${await res.text()}`)
}

async function newSandbox(key, extra = {}) {
  const r = await apiCall('POST', '/v1/sandboxes', { image: { uri: IMAGE }, entrypoint: ['tail', '-f', '/dev/null'], timeout: 900, ...extra }, key)
  assert.equal(r.status, 202, JSON.stringify(r.json))
  return r.json.id
}

let admin // { ctx, page } signed in with the server's key
let sandboxID // made through the create form

before(async () => {
  admin = await browser()
})

after(async () => {
  for (const c of contexts) await c.close().catch(() => {})
  for (const d of profiles) rmSync(d, { recursive: true, force: true, maxRetries: 5, retryDelay: 200 })
})

test('a wrong key is refused; the right key signs in with an HttpOnly, SameSite=Strict session', async () => {
  const { page, ctx } = admin
  await page.goto(URL + '/console/')
  await shot(page, 'signin')
  await page.fill('input[name=apiKey]', 'not-a-key')
  await page.click('button[type=submit]')
  await page.waitForSelector('[role=alert]')
  assert.match(await page.textContent('[role=alert]'), /INVALID_API_KEY/)
  assert.equal((await ctx.cookies()).length, 0, 'a refused sign-in set a cookie')

  await page.fill('input[name=apiKey]', KEY)
  await page.click('button[type=submit]')
  await page.waitForSelector('[data-testid=whoami]')
  assert.match(await page.textContent('[data-testid=whoami]'), /platform/)
  const cookies = await ctx.cookies()
  assert.equal(cookies.length, 1)
  const c = cookies[0]
  assert.equal(c.name, 'moat_console')
  assert.equal(c.httpOnly, true)
  assert.equal(c.sameSite, 'Strict')
  assert.equal(c.path, '/console')
  assert.ok(!c.value.includes(KEY), 'the cookie carries the key')
  // Nothing readable by scripts holds a credential.
  const storage = await page.evaluate(() => ({ local: localStorage.length, session: sessionStorage.length, cookie: document.cookie }))
  assert.deepEqual(storage, { local: 0, session: 0, cookie: '' })
  // A reload (a top-level navigation) keeps the session.
  await page.reload()
  await page.waitForSelector('[data-testid=whoami]')
})

test('create a sandbox with the form', async () => {
  const { page } = admin
  await page.click('[data-testid=new-sandbox]')
  await page.fill('input[name=image]', IMAGE)
  await page.fill('input[name=entrypoint]', `sh -c "echo started-$GREETING; exec tail -f /dev/null"`)
  await page.fill('textarea[name=env]', 'GREETING=hello-console')
  await page.fill('textarea[name=metadata]', 'suite=console\nowner=browser')
  await page.fill('input[name=memory]', '256Mi')
  await page.fill('input[name=timeout]', '900')
  await page.selectOption('select[name=netDefault]', 'deny')
  await page.fill('textarea[name=rules]', 'allow example.test\nallow *.example.test')
  await shot(page, 'create')
  await page.click('button[type=submit]')
  await page.waitForURL(/#\/sandboxes\/[a-z0-9]{20}$/)
  sandboxID = decodeURIComponent(page.url().split('/').pop())
  await page.waitForSelector('.page-head [data-state=Running]')
  const r = await apiCall('GET', `/v1/sandboxes/${sandboxID}`)
  assert.equal(r.status, 200)
  assert.equal(r.json.status.state, 'Running')
  assert.deepEqual(r.json.metadata, { suite: 'console', owner: 'browser' })
  // The network policy reached the sandbox's egress API.
  const ep = await apiCall('GET', `/v1/sandboxes/${sandboxID}/endpoints/18080`)
  assert.equal(ep.status, 200, JSON.stringify(ep.json))
  const pol = await fetch(`${URL}/sandboxes/${sandboxID}/egress/policy`, { headers: ep.json.headers })
  const policy = JSON.stringify(await pol.json())
  assert.equal(pol.status, 200, policy)
  assert.match(policy, /deny/)
  assert.match(policy, /\*\.example\.test/)
})

test('overview: CPU and memory charts fill from the agent, logs and events show', async () => {
  const { page } = admin
  // Some load for the charts: bursts of a busy loop (and of memory).
  const burn = await fetch(URL + agentPath(sandboxID, '/command'), {
    method: 'POST',
    headers: { 'OPEN-SANDBOX-API-KEY': KEY, 'Content-Type': 'application/json' },
    body: JSON.stringify({
      background: true,
      command: "for i in 1 2 3 4 5 6; do timeout 2 sh -c 'x=$(head -c 40000000 /dev/zero | tr \\\\0 a); while :; do :; done'; sleep 1; done",
    }),
  })
  assert.equal(burn.status, 200, await burn.text())
  const points = async () => page.$$eval('[data-testid=cpu-chart], [data-testid=mem-chart]', (els) => els.map((e) => Number(e.dataset.points)))
  // The page has drawn samples since the sandbox was created (on a busy
  // machine, more than enough of them before the loop started): only
  // samples taken while the loop runs (6 bursts of 2 s) count.
  const before = Math.max(0, ...(await points()))
  await until('metric points in each chart while the loop runs', async () => {
    const n = await points()
    return n.length === 2 && n.every((x) => x >= before + 8)
  })
  const cpuMax = await page.$eval('[data-testid=cpu-chart] polyline', (el) =>
    Math.min(...el.getAttribute('points').split(' ').map((p) => Number(p.split(',')[1]))),
  )
  // Any CPU at all: on a busy machine the loop may get little of it.
  assert.ok(cpuMax < 139, `the CPU chart never rose above zero (highest point at y=${cpuMax})`)
  assert.match(await page.textContent('[data-testid=mem-chart] .chart-value'), /MiB/)
  await page.fill('input[name=port]', '44772')
  await page.click('text=Resolve')
  await page.waitForSelector('[data-testid=endpoint]')
  assert.match(await page.textContent('[data-testid=endpoint]'), new RegExp(`/sandboxes/${sandboxID}/proxy/44772`))
  await shot(page, 'sandbox')

  await page.click('[data-tab=logs]')
  await until('the entrypoint output in the logs', async () => (await page.textContent('[data-testid=logs-content]')).includes('started-hello-console'))
  await shot(page, 'logs')
  await page.click('[data-tab=events]')
  await until('events', async () => /Started|Created/.test(await page.textContent('[data-testid=events-content]')))
  await shot(page, 'events')
})

test('the terminal runs a command and shows its output', async () => {
  const { page } = admin
  await page.click('[data-tab=terminal]')
  await until('a connected terminal', async () => (await page.textContent('[data-testid=terminal-status]')) === 'connected')
  await page.click('[data-testid=terminal]')
  // The output (hello-console-42) is computed in the sandbox from its env,
  // so seeing it proves the command ran there, not just the local echo.
  await page.keyboard.type('echo "$GREETING-$((6*7))"')
  await page.keyboard.press('Enter')
  await until('the command output in the terminal', async () => (await page.textContent('[data-testid=terminal] .xterm-rows')).includes('hello-console-42'))
  await page.keyboard.type('uname -n; ls /')
  await page.keyboard.press('Enter')
  await page.waitForTimeout(500)
  await shot(page, 'terminal')
})

test('files: upload a file, then download one', async () => {
  const { page } = admin
  await page.click('[data-tab=files]')
  await page.fill('input[name=path]', '/tmp')
  await page.click('form.files-bar button[type=submit]')
  const text = `uploaded from the browser ${randomBytes(8).toString('hex')}\n`
  await page.setInputFiles('[data-testid=upload-input]', { name: 'note.txt', mimeType: 'text/plain', buffer: Buffer.from(text) })
  await page.waitForSelector('tr[data-path="/tmp/note.txt"]')
  const got = await fetch(URL + agentPath(sandboxID, '/files/download?path=/tmp/note.txt'), { headers: { 'OPEN-SANDBOX-API-KEY': KEY } })
  assert.equal(got.status, 200)
  assert.equal(await got.text(), text, 'the sandbox holds what the browser uploaded')

  const bytes = randomBytes(200_000)
  await upload(sandboxID, '/tmp/from-api.bin', bytes)
  await page.click('text=Refresh')
  await page.waitForSelector('tr[data-path="/tmp/from-api.bin"]')
  await shot(page, 'files')
  const [dl] = await Promise.all([page.waitForEvent('download'), page.click('tr[data-path="/tmp/from-api.bin"] >> text=Download')])
  assert.equal(dl.suggestedFilename(), 'from-api.bin')
  assert.ok(readFileSync(await dl.path()).equals(bytes), 'the downloaded file differs from the sandbox file')
})

test('the list updates live and filters by state and metadata', async () => {
  const { page } = admin
  await page.goto(URL + '/console/#/sandboxes')
  await page.waitForSelector(`tr[data-id="${sandboxID}"]`)
  await page.evaluate(() => (window.__noReload = true))
  const other = await newSandbox(KEY, { metadata: { suite: 'live' } })
  await page.waitForSelector(`tr[data-id="${other}"]`) // no reload: the list polls
  await page.fill('input[name=metadata]', 'suite=live')
  await until('the metadata filter', async () => {
    const ids = await page.$$eval('[data-testid=sandbox-table] tbody tr', (rows) => rows.map((r) => r.dataset.id))
    return ids.length === 1 && ids[0] === other
  })
  await page.fill('input[name=metadata]', '')
  await page.selectOption('select[name=state]', 'Paused')
  assert.equal((await apiCall('POST', `/v1/sandboxes/${other}/pause`)).status, 202)
  await page.waitForSelector(`tr[data-id="${other}"] [data-state=Paused]`)
  await page.selectOption('select[name=state]', '')
  assert.equal((await apiCall('DELETE', `/v1/sandboxes/${other}`)).status, 204)
  await page.waitForSelector(`tr[data-id="${other}"]`, { state: 'detached' })
  assert.equal(await page.evaluate(() => window.__noReload), true, 'the page was reloaded')
  await shot(page, 'sandboxes')
})

test('pools: create one, watch it fill, delete it', async () => {
  const { page } = admin
  await page.goto(URL + '/console/#/pools')
  await page.click('text=New pool')
  const form = page.locator('[data-testid=pool-form]')
  await form.locator('input[name=name]').fill('console-pool')
  await form.locator('input[name=image]').fill(IMAGE)
  await form.locator('input[name=bufferMin]').fill('1')
  await form.locator('input[name=bufferMax]').fill('1')
  await form.locator('input[name=poolMax]').fill('3')
  await form.locator('button[type=submit]').click()
  await page.waitForSelector('tr[data-pool="console-pool"]')
  await until('an idle sandbox in the pool', async () => /1 idle/.test(await page.textContent('tr[data-pool="console-pool"]')), 60_000)
  // Raise its buffer: the pool refills to two idle sandboxes.
  await page.click('tr[data-pool="console-pool"] >> text=Capacity')
  const cap = page.locator('[data-testid=capacity-form]')
  await cap.locator('input[name=bufferMin]').fill('2')
  await cap.locator('input[name=bufferMax]').fill('2')
  await cap.locator('button[type=submit]').click()
  await cap.waitFor({ state: 'detached' })
  await until('two idle sandboxes in the pool', async () => /2 idle/.test(await page.textContent('tr[data-pool="console-pool"]')), 60_000)
  const pool = await apiCall('GET', '/v1/pools/console-pool')
  assert.equal(pool.json.capacitySpec.bufferMin, 2)
  assert.equal(pool.json.template.image.uri, IMAGE, 'the template changed with the capacity')
  await shot(page, 'pools')
  await page.click('tr[data-pool="console-pool"] >> text=Delete')
  await page.waitForSelector('tr[data-pool="console-pool"]', { state: 'detached' })
  assert.equal((await apiCall('GET', '/v1/pools/console-pool')).status, 404)
})

test('snapshots: take one from the sandbox, fork it twice', async () => {
  const { page } = admin
  await page.goto(URL + '/console/#/snapshots')
  await until('the sandbox among the sources', async () =>
    (await page.$$eval('select[name=source] option', (os) => os.map((o) => o.value))).includes(sandboxID),
  )
  await page.selectOption('select[name=source]', sandboxID)
  await page.fill('[data-testid=snapshot-form] input[name=name]', 'console-snap')
  await page.click('text=Take snapshot')
  const row = page.locator('[data-testid=snapshot-table] tbody tr', { hasText: 'console-snap' })
  await row.locator('[data-state=Ready]').waitFor()
  await row.locator('input[name=count]').fill('2')
  await row.locator('button:has-text("Fork")').click()
  await page.waitForSelector('[data-testid=forked]')
  const forks = await page.$$eval('[data-testid=forked] a', (as) => as.map((a) => a.textContent.trim()))
  assert.equal(forks.length, 2)
  for (const id of forks) {
    const r = await apiCall('GET', `/v1/sandboxes/${id}`)
    assert.equal(r.json?.status?.state, 'Running', `fork ${id}: ${JSON.stringify(r.json)}`)
    // The fork has the source's files (the upload above).
    const f = await fetch(URL + agentPath(id, '/files/download?path=/tmp/note.txt'), { headers: { 'OPEN-SANDBOX-API-KEY': KEY } })
    assert.equal(f.status, 200, `fork ${id} lacks the source's /tmp/note.txt`)
  }
  await shot(page, 'snapshots')
  for (const id of forks) assert.equal((await apiCall('DELETE', `/v1/sandboxes/${id}`)).status, 204)
})

test('sandbox page: pause, resume, renew, then delete', async () => {
  const { page } = admin
  await page.goto(URL + `/console/#/sandboxes/${sandboxID}`)
  await page.click('.actions-card >> text=Pause')
  await page.waitForSelector('.page-head [data-state=Paused]')
  assert.equal((await apiCall('GET', `/v1/sandboxes/${sandboxID}`)).json.status.state, 'Paused')
  await page.click('.actions-card >> text=Resume')
  await page.waitForSelector('.page-head [data-state=Running]')
  await page.selectOption('select[name=renewFor]', '86400')
  await page.click('.actions-card >> text=Renew')
  await until('the renewed expiry', async () => {
    const r = await apiCall('GET', `/v1/sandboxes/${sandboxID}`)
    return Date.parse(r.json.expiresAt) > Date.now() + 23 * 3600 * 1000
  })
})

let keys = {} // role/tenant -> key made on the keys page

test('keys and tenants pages (admin): create keys, set a quota', async () => {
  const { page } = admin
  await page.goto(URL + '/console/#/keys')
  const make = async (tenant, role) => {
    const form = page.locator('[data-testid=key-form]')
    await form.locator('input[name=tenant]').fill(tenant)
    await form.locator('select[name=role]').selectOption(role)
    await form.locator('input[name=name]').fill(`${tenant} ${role} (browser test)`)
    await form.locator('button[type=submit]').click()
    await page.waitForSelector('[data-testid=new-key] pre')
    const key = (await page.textContent('[data-testid=new-key] pre')).trim()
    await page.click('[data-testid=new-key] >> text=Done')
    return key
  }
  keys.viewer = await make('default', 'viewer')
  keys.alpha = await make('alpha', 'operator')
  keys.beta = await make('beta', 'operator')
  assert.match(keys.viewer, /^moat_/)
  await page.waitForSelector('[data-testid=key-table] tr >> text=beta operator (browser test)')
  await shot(page, 'keys')

  await page.goto(URL + '/console/#/tenants')
  await page.fill('[data-testid=tenant-form] input[name=tenant]', 'beta')
  await page.fill('[data-testid=tenant-form] input[name=sandboxes]', '5')
  await page.click('[data-testid=tenant-form] button[type=submit]')
  await until('the quota of beta', async () => /0 \/ 5/.test(await page.textContent('tr[data-tenant="beta"]')))
  await shot(page, 'tenants')
  const t = await apiCall('GET', '/v1/tenants/beta')
  assert.equal(t.json.quota.sandboxes, 5)
})

test('a viewer sees no mutating control, and the server refuses its mutations', async () => {
  const { page } = await browser()
  await signIn(page, keys.viewer)
  assert.match(await page.textContent('[data-testid=whoami]'), /viewer/)
  await page.waitForSelector(`tr[data-id="${sandboxID}"]`) // same tenant: it reads
  assert.equal(await page.locator('[data-testid=new-sandbox]').count(), 0)
  assert.equal(await page.locator('[data-testid=sandbox-table] button:has-text("Delete")').count(), 0)
  await shot(page, 'viewer')
  await page.click(`tr[data-id="${sandboxID}"] a`)
  await page.waitForSelector('.page-head [data-state=Running]')
  assert.equal(await page.locator('.actions-card').count(), 0)
  assert.equal(await page.locator('[data-tab=terminal]').count(), 0)
  await page.click('[data-tab=files]')
  await page.waitForSelector('[data-testid=file-table]')
  assert.equal(await page.locator('[data-testid=upload-input]').count(), 0)
  assert.equal(await page.locator('text=Keys').count() + (await page.locator('a[href="#/keys"]').count()), 0)
  // With the page's own session and token, the server still refuses.
  await page.reload()
  await page.waitForSelector('[data-testid=whoami]')
  const res = await page.evaluate(async (id) => {
    const csrf = document.querySelector('meta[name="moat-csrf"]').content
    const h = { 'X-Moat-CSRF': csrf, 'Content-Type': 'application/json' }
    const del = await fetch(`/console/api/v1/sandboxes/${id}`, { method: 'DELETE', headers: h })
    const pty = await fetch(`/console/api/v1/sandboxes/${id}/proxy/44772/pty`, { method: 'POST', headers: h, body: '{}' })
    return { csrf: csrf.length > 0, del: del.status, code: (await del.json()).code, pty: pty.status }
  }, sandboxID)
  assert.deepEqual(res, { csrf: true, del: 403, code: 'PERMISSION_DENIED', pty: 401 })
  assert.equal((await apiCall('GET', `/v1/sandboxes/${sandboxID}`)).json.status.state, 'Running')
})

test("tenant A's session never shows tenant B's sandboxes", async () => {
  const a = await browser()
  const b = await browser()
  await signIn(a.page, keys.alpha)
  await signIn(b.page, keys.beta)
  const aID = await newSandbox(keys.alpha, { metadata: { owner: 'alpha' } })
  const bID = await newSandbox(keys.beta, { metadata: { owner: 'beta' } })
  await a.page.waitForSelector(`tr[data-id="${aID}"]`)
  await b.page.waitForSelector(`tr[data-id="${bID}"]`)
  // Several refreshes later, each list holds its own tenant's only (the
  // default tenant's sandboxes are not there either).
  await a.page.waitForTimeout(4500)
  const ids = async (p) => p.$$eval('[data-testid=sandbox-table] tbody tr', (rows) => rows.map((r) => r.dataset.id))
  assert.deepEqual(await ids(a.page), [aID])
  assert.deepEqual(await ids(b.page), [bID])
  // Straight to the other tenant's sandbox: not found, in the page and
  // through the gateway (API and server proxy).
  await b.page.goto(URL + `/console/#/sandboxes/${aID}`)
  await b.page.reload() // a navigation: the page then carries the CSRF token
  await b.page.waitForSelector('text=This sandbox does not exist')
  const res = await b.page.evaluate(async (id) => {
    const csrf = document.querySelector('meta[name="moat-csrf"]').content
    const get = await fetch(`/console/api/v1/sandboxes/${id}`, { headers: { 'X-Moat-CSRF': csrf } })
    const ping = await fetch(`/console/api/v1/sandboxes/${id}/proxy/44772/ping`, { headers: { 'X-Moat-CSRF': csrf } })
    return [get.status, ping.status]
  }, aID)
  assert.deepEqual(res, [404, 404])
  // The admin sees both.
  await admin.page.goto(URL + '/console/#/sandboxes')
  await admin.page.reload() // the tenant selector lists the tenants made since sign-in
  await admin.page.waitForSelector(`tr[data-id="${aID}"]`)
  await admin.page.waitForSelector(`tr[data-id="${bID}"]`)
  // Narrowed to one tenant (X-Moat-Tenant), the admin sees only its sandboxes.
  await admin.page.selectOption('select[name=scope]', 'alpha')
  await until('the alpha scope', async () => {
    const got = await ids(admin.page)
    return got.length === 1 && got[0] === aID
  })
  await admin.page.selectOption('select[name=scope]', '')
  await admin.page.waitForSelector(`tr[data-id="${bID}"]`)
  for (const [id, key] of [
    [aID, keys.alpha],
    [bID, keys.beta],
  ])
    assert.equal((await apiCall('DELETE', `/v1/sandboxes/${id}`, undefined, key)).status, 204)
})

test("sandbox content on the console's origin cannot use the session", async () => {
  // A sandbox serves a page through the server proxy, on the console's own
  // origin. In a browser signed in as admin, the page tries to use the
  // session: read the list, find the CSRF token, sign out, script a
  // console window. Every attempt must fail.
  const page = `<!doctype html><title>probe</title><button id=go>go</button><script>
  document.getElementById('go').onclick = async () => {
    const out = {}
    try { out.list = (await fetch('/console/api/v1/sandboxes')).status } catch (e) { out.list = 'error' }
    try {
      const html = await (await fetch('/console/')).text()
      out.token = /name="moat-csrf" content="([^"]*)"/.exec(html)[1]
    } catch (e) { out.token = 'error' }
    try { out.info = (await fetch('/console/session')).status } catch (e) { out.info = 'error' }
    try { out.signout = (await fetch('/console/session', { method: 'DELETE' })).status } catch (e) { out.signout = 'error' }
    // A service worker that claims the console's path: its script asks for
    // it (Service-Worker-Allowed: /), which the server proxy removes.
    try {
      await navigator.serviceWorker.register('cgi-bin/sw', { scope: '/console/' })
      out.sw = 'registered'
    } catch (e) { out.sw = e.name }
    const w = window.open('/console/')
    await new Promise((r) => setTimeout(r, 2500))
    // The popup opened (a user gesture), but Cross-Origin-Opener-Policy
    // cut it off from this page: its document is out of reach.
    if (!w) out.opened = 'blocked'
    else try { out.opened = w.document ? w.document.querySelector('meta[name=moat-csrf]')?.content ?? 'none' : 'no-access' } catch (e) { out.opened = 'no-access' }
    try { w && w.close() } catch (e) {}
    document.body.dataset.result = JSON.stringify(out)
    document.title = 'done'
  }
  </script>`
  const sw = [
    '#!/bin/sh',
    "echo 'Content-Type: text/javascript'",
    "echo 'Service-Worker-Allowed: /'",
    "echo 'X-Probe: cgi'",
    "echo ''",
    `echo 'self.addEventListener("fetch", () => {})'`,
    '',
  ].join('\n')
  const id = await newSandbox(KEY, {
    entrypoint: [
      'sh',
      '-c',
      'mkdir -p /www/cgi-bin && printf "%s" "$PAGE" > /www/probe.html && printf "%s" "$SW" > /www/cgi-bin/sw && chmod +x /www/cgi-bin/sw && exec httpd -f -p 8080 -h /www',
    ],
    env: { PAGE: page, SW: sw },
  })
  const { page: p } = admin
  await until('the sandbox web server', async () => (await fetch(`${URL}/sandboxes/${id}/proxy/8080/probe.html`)).status === 200)
  const script = await fetch(`${URL}/sandboxes/${id}/proxy/8080/cgi-bin/sw`)
  assert.equal(script.status, 200)
  assert.equal(script.headers.get('x-probe'), 'cgi', 'the sandbox CGI headers do not come through')
  assert.equal(script.headers.get('service-worker-allowed'), null, 'the server proxy passed Service-Worker-Allowed')
  await p.goto(`${URL}/sandboxes/${id}/proxy/8080/probe.html`)
  await p.click('#go') // a user gesture, so that window.open is not blocked
  await p.waitForFunction(() => document.title === 'done', null, { timeout: 30_000 })
  const out = JSON.parse(await p.evaluate(() => document.body.dataset.result))
  assert.deepEqual(out, { list: 403, token: '', info: 403, signout: 403, sw: 'SecurityError', opened: 'no-access' })
  // The admin's session is untouched.
  await p.goto(URL + '/console/#/sandboxes')
  await p.waitForSelector(`tr[data-id="${id}"]`)
  assert.equal((await apiCall('DELETE', `/v1/sandboxes/${id}`)).status, 204)
})

test('delete from the sandbox page, then sign out: the old session is dead on the server', async () => {
  const { page, ctx } = admin
  await page.goto(URL + `/console/#/sandboxes/${sandboxID}`)
  await page.click('.actions-card >> text=Delete')
  await page.waitForURL(/#\/sandboxes$/)
  await until('the sandbox gone', async () => (await apiCall('GET', `/v1/sandboxes/${sandboxID}`)).status === 404)

  await page.reload()
  await page.waitForSelector('[data-testid=whoami]')
  const csrf = await page.getAttribute('meta[name="moat-csrf"]', 'content')
  const cookie = (await ctx.cookies()).find((c) => c.name === 'moat_console').value
  const replay = () => fetch(URL + '/console/api/v1/sandboxes', { headers: { Cookie: `moat_console=${cookie}`, 'X-Moat-CSRF': csrf } })
  assert.equal((await replay()).status, 200)
  await page.click('text=Sign out')
  await page.waitForSelector('input[name=apiKey]')
  assert.equal((await replay()).status, 401, 'the session outlived sign-out')
})
