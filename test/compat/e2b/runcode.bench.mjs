// The runCode round trip through E2B's code-interpreter SDK (unchanged),
// from the SDK's call to its resolved Execution, against a moat server on
// loopback: one code-interpreter-v1 sandbox, a warm-up, then
// MOAT_BENCH_N (default 200) sequential runs of `1 + 1` in python and in
// javascript. Prints one JSON line per language. Run by
// `MOAT_E2B_BENCH=1 go test -run TestCompatE2BCodeInterpreter ./test/e2e/`
// (docs/BENCHMARKS.md), not part of the suite.
import assert from 'node:assert/strict'
import { Sandbox } from '@e2b/code-interpreter'

// Domain mode: the SDK reads E2B_DOMAIN and E2B_API_KEY (set by the test).
const opts = {}
const n = Number(process.env.MOAT_BENCH_N || 200)

const pct = (xs, p) => xs[Math.min(xs.length - 1, Math.floor((xs.length * p) / 100))]

const sbx = await Sandbox.create({ ...opts, timeoutMs: 600_000 })
try {
  for (const language of ['python', 'javascript']) {
    for (let i = 0; i < 10; i++) assert.equal((await sbx.runCode('1 + 1', { language })).text, '2')
    const ms = []
    for (let i = 0; i < n; i++) {
      const t0 = performance.now()
      const r = await sbx.runCode('1 + 1', { language })
      ms.push(performance.now() - t0)
      assert.equal(r.text, '2')
    }
    ms.sort((a, b) => a - b)
    console.log(JSON.stringify({ language, n, p50: +pct(ms, 50).toFixed(2), p99: +pct(ms, 99).toFixed(2), max: +ms.at(-1).toFixed(2) }))
  }
} finally {
  await sbx.kill()
}
