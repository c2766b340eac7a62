// CPU and memory of a sandbox over time, from the agent's
// GET /metrics/watch stream (one JSON object per line, about every second),
// drawn as SVG. The history is what this page has seen since it opened:
// the chart spans that time, at least a minute and at most WINDOW seconds.
import { useEffect, useState } from 'preact/hooks'
import type { Metrics } from '../api'
import { agent, errText, raw } from '../api'

const WINDOW = 300
const MIN_SPAN = 60

interface Point {
  t: number
  cpu: number
  mem: number
  memTotal: number
}

function Chart(props: { title: string; points: { t: number; v: number }[]; max: number; unit: string; color: string; testid: string }) {
  const W = 600
  const H = 160
  const pad = { l: 44, r: 8, t: 10, b: 20 }
  const now = props.points.length ? props.points[props.points.length - 1].t : Date.now()
  const first = props.points.length ? props.points[0].t : now
  const span = Math.min(WINDOW, Math.max(MIN_SPAN, Math.ceil((now - first) / 1000)))
  const t0 = now - span * 1000
  const max = props.max > 0 ? props.max : 1
  const x = (t: number) => pad.l + ((t - t0) / (span * 1000)) * (W - pad.l - pad.r)
  const y = (v: number) => pad.t + (1 - Math.min(v, max) / max) * (H - pad.t - pad.b)
  const pts = props.points.filter((p) => p.t >= t0)
  const line = pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' ')
  const area = pts.length ? `${x(pts[0].t).toFixed(1)},${y(0)} ${line} ${x(pts[pts.length - 1].t).toFixed(1)},${y(0)}` : ''
  const last = pts.length ? pts[pts.length - 1].v : undefined
  const ticks = [0, 0.5, 1].map((f) => f * max)
  return (
    <div class="chart card" data-testid={props.testid} data-points={pts.length}>
      <div class="chart-head">
        <span>{props.title}</span>
        <span class="chart-value">{last === undefined ? '—' : `${last.toFixed(1)} ${props.unit}`}</span>
      </div>
      <svg viewBox={`0 0 ${W} ${H}`} preserveAspectRatio="none" role="img" aria-label={props.title}>
        {ticks.map((v) => (
          <g>
            <line x1={pad.l} x2={W - pad.r} y1={y(v)} y2={y(v)} class="grid" />
            <text x={pad.l - 6} y={y(v) + 4} text-anchor="end" class="axis">
              {v >= 100 ? v.toFixed(0) : v.toFixed(v >= 10 ? 0 : 1)}
            </text>
          </g>
        ))}
        <text x={pad.l} y={H - 4} class="axis">
          −{span >= 120 ? `${Math.round(span / 60)} min` : `${span} s`}
        </text>
        <text x={W - pad.r} y={H - 4} text-anchor="end" class="axis">
          now
        </text>
        {area && <polygon points={area} fill={props.color} opacity="0.15" />}
        {line && <polyline points={line} fill="none" stroke={props.color} stroke-width="2" vector-effect="non-scaling-stroke" />}
      </svg>
    </div>
  )
}

export function MetricsCharts({ id, active }: { id: string; active: boolean }) {
  const [points, setPoints] = useState<Point[]>([])
  const [error, setError] = useState('')

  useEffect(() => {
    if (!active) return
    const ctl = new AbortController()
    ;(async () => {
      try {
        const res = await raw('/api' + agent(id, '/metrics/watch'), { signal: ctl.signal })
        const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader()
        let buf = ''
        setError('')
        for (;;) {
          const { value, done } = await reader.read()
          if (done) break
          buf += value
          let i
          while ((i = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, i).trim()
            buf = buf.slice(i + 1)
            if (!line) continue
            const m = JSON.parse(line) as Metrics & { error?: string }
            if (m.error) {
              setError(m.error)
              continue
            }
            const p = { t: m.timestamp || Date.now(), cpu: m.cpu_used_pct, mem: m.mem_used_mib, memTotal: m.mem_total_mib }
            setPoints((old) => [...old.filter((o) => o.t >= p.t - WINDOW * 1000), p])
          }
        }
      } catch (e) {
        if (!ctl.signal.aborted) setError(errText(e))
      }
    })()
    return () => ctl.abort()
  }, [id, active])

  const memTotal = points.length ? points[points.length - 1].memTotal : 0
  return (
    <div>
      {error && <div class="muted small">metrics: {error}</div>}
      <div class="charts">
        <Chart title="CPU" unit="%" max={100} color="#2b8a9e" points={points.map((p) => ({ t: p.t, v: p.cpu }))} testid="cpu-chart" />
        <Chart
          title={`Memory${memTotal ? ` (of ${memTotal.toFixed(0)} MiB)` : ''}`}
          unit="MiB"
          max={memTotal}
          color="#7c5cbf"
          points={points.map((p) => ({ t: p.t, v: p.mem }))}
          testid="mem-chart"
        />
      </div>
    </div>
  )
}
