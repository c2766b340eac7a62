// Time to interactive through E2B's SDK, unchanged: Sandbox.create, then
// the first commands.run, as a user of the SDK sees it.
//
//   node bench.mjs <template> [runs] [burst]
//
// runs sequential create -> first run (default 50), then a burst of
// `burst` concurrent ones (default 0: none). Each sandbox is killed
// after it is measured (not timed). The SDK is configured as usual
// (E2B_API_KEY with E2B_DOMAIN, or E2B_API_URL and E2B_SANDBOX_URL).
// Prints one JSON line: milliseconds, p50/p99/max of each part.
// test/e2e's BenchmarkE2BSDK runs it against a real `moat serve`.
import { Sandbox } from 'e2b'

const [template, runsArg = '50', burstArg = '0'] = process.argv.slice(2)
if (!template) {
  console.error('usage: node bench.mjs <template> [runs] [burst]')
  process.exit(2)
}
const runs = Number(runsArg)
const burst = Number(burstArg)

function quantile(sorted, q) {
  if (sorted.length === 0) return null
  return sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]
}

function summary(samples) {
  const s = [...samples].sort((a, b) => a - b)
  const r = x => (x === null ? null : Math.round(x * 100) / 100)
  return { n: s.length, p50: r(quantile(s, 0.5)), p99: r(quantile(s, 0.99)), max: r(s[s.length - 1] ?? null) }
}

// one creates a sandbox and runs its first command; it returns the
// times (create, first run, both) and the sandbox.
async function one() {
  const t0 = performance.now()
  const sbx = await Sandbox.create(template, { timeoutMs: 120_000 })
  const t1 = performance.now()
  const r = await sbx.commands.run('true')
  const t2 = performance.now()
  if (r.exitCode !== 0) throw new Error(`first run exited ${r.exitCode}`)
  return { create: t1 - t0, run: t2 - t1, total: t2 - t0, sbx }
}

const out = { template, runs, burst }

// A first sandbox outside the figures: connection pools, caches.
await (await one()).sbx.kill()

const seq = { create: [], run: [], total: [] }
for (let i = 0; i < runs; i++) {
  const m = await one()
  for (const k of Object.keys(seq)) seq[k].push(m[k])
  await m.sbx.kill()
}
out.sequential = Object.fromEntries(Object.entries(seq).map(([k, v]) => [k, summary(v)]))

if (burst > 0) {
  const t0 = performance.now()
  const settled = await Promise.allSettled(Array.from({ length: burst }, () => one()))
  const wall = performance.now() - t0
  const ok = settled.filter(s => s.status === 'fulfilled').map(s => s.value)
  const failed = settled.filter(s => s.status === 'rejected').map(s => String(s.reason?.message ?? s.reason))
  out.burst = {
    wallMs: Math.round(wall),
    failed: failed.length,
    errors: [...new Set(failed)].slice(0, 3),
    create: summary(ok.map(m => m.create)),
    run: summary(ok.map(m => m.run)),
    total: summary(ok.map(m => m.total)),
  }
  await Promise.allSettled(ok.map(m => m.sbx.kill()))
}
console.log(JSON.stringify(out))
