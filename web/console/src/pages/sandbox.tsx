import { useState } from 'preact/hooks'
import type { Sandbox, Snapshot } from '../api'
import { AGENT_PORT, api } from '../api'
import { Files } from '../components/files'
import { MetricsCharts } from '../components/metrics'
import { Terminal } from '../components/terminal'
import { ErrorBox, StateBadge, since, useAction, useMe, usePoll } from '../ui'

type Tab = 'overview' | 'terminal' | 'files' | 'logs' | 'events'

interface Diagnostic {
  content: string
  truncated: boolean
  warnings?: string[]
}

function Diagnostics({ id, kind }: { id: string; kind: 'logs' | 'events' }) {
  const scope = kind === 'logs' ? 'container' : 'lifecycle'
  const d = usePoll(() => api<Diagnostic>('GET', `/v1/sandboxes/${encodeURIComponent(id)}/diagnostics/${kind}?scope=${scope}`), 3000, [id, kind])
  return (
    <div>
      <ErrorBox error={d.error} />
      {d.data?.truncated && <div class="muted small">Older output truncated.</div>}
      <pre class="log" data-testid={`${kind}-content`}>
        {d.data ? d.data.content || (kind === 'logs' ? '(no output yet)' : '(no events)') : 'Loading…'}
      </pre>
    </div>
  )
}

function Endpoints({ id }: { id: string }) {
  const [port, setPort] = useState('8080')
  const [result, setResult] = useState<{ endpoint: string; headers?: Record<string, string>; proxy: string } | null>(null)
  const act = useAction()
  const look = (e: Event) => {
    e.preventDefault()
    act.run(async () => {
      const p = encodeURIComponent(port.trim())
      const direct = await api<{ endpoint: string; headers?: Record<string, string> }>('GET', `/v1/sandboxes/${encodeURIComponent(id)}/endpoints/${p}`)
      const proxy = await api<{ endpoint: string }>('GET', `/v1/sandboxes/${encodeURIComponent(id)}/endpoints/${p}?use_server_proxy=true`)
      setResult({ ...direct, proxy: proxy.endpoint })
    })
  }
  return (
    <div class="card">
      <h3>Endpoints</h3>
      <form class="row" onSubmit={look}>
        <label class="field inline">
          <span class="field-label">Port</span>
          <input name="port" inputMode="numeric" size={6} value={port} onInput={(e) => setPort((e.target as HTMLInputElement).value)} />
        </label>
        <button class="small" type="submit" disabled={act.busy}>
          Resolve
        </button>
        <span class="muted small">{AGENT_PORT} is the agent (execd)</span>
      </form>
      <ErrorBox error={act.error} />
      {result && (
        <dl class="kv" data-testid="endpoint">
          <dt>Address</dt>
          <dd class="mono">{result.endpoint}</dd>
          <dt>Server proxy</dt>
          <dd class="mono">{result.proxy}</dd>
          {Object.keys(result.headers ?? {}).map((h) => (
            <>
              <dt>Header</dt>
              <dd class="mono">
                {h}: <span class="secret">{'•'.repeat(12)}</span>
              </dd>
            </>
          ))}
        </dl>
      )}
      <p class="muted small">
        Pages a sandbox serves through the server proxy share the console's origin; open untrusted content through the ingress gateway
        instead.
      </p>
    </div>
  )
}

function Actions({ sb, refresh }: { sb: Sandbox; refresh: () => void }) {
  const act = useAction()
  const [renewFor, setRenewFor] = useState('3600')
  const [snapName, setSnapName] = useState('')
  const [snapMsg, setSnapMsg] = useState('')
  const path = `/v1/sandboxes/${encodeURIComponent(sb.id)}`
  const st = sb.status.state
  const call = (f: () => Promise<unknown>) =>
    act.run(async () => {
      await f()
      refresh()
    })
  return (
    <div class="card actions-card">
      <div class="row wrap">
        {st === 'Running' && (
          <button onClick={() => call(() => api('POST', `${path}/pause`))} disabled={act.busy}>
            Pause
          </button>
        )}
        {st === 'Paused' && (
          <button onClick={() => call(() => api('POST', `${path}/resume`))} disabled={act.busy}>
            Resume
          </button>
        )}
        <span class="row">
          <select name="renewFor" value={renewFor} onChange={(e) => setRenewFor((e.target as HTMLSelectElement).value)}>
            <option value="600">10 min</option>
            <option value="3600">1 hour</option>
            <option value="21600">6 hours</option>
            <option value="86400">1 day</option>
          </select>
          <button
            disabled={act.busy}
            onClick={() => call(() => api('POST', `${path}/renew-expiration`, { expiresAt: new Date(Date.now() + Number(renewFor) * 1000).toISOString() }))}
          >
            Renew
          </button>
        </span>
        <span class="row">
          <input name="snapshotName" placeholder="snapshot name" size={14} value={snapName} onInput={(e) => setSnapName((e.target as HTMLInputElement).value)} />
          <button
            disabled={act.busy || st !== 'Running'}
            onClick={() =>
              call(async () => {
                const s = await api<Snapshot>('POST', `${path}/snapshots`, snapName ? { name: snapName } : {})
                setSnapMsg(`snapshot ${s.id} ${s.status.state}`)
              })
            }
          >
            Snapshot
          </button>
        </span>
        <span class="grow" />
        <button
          class="danger"
          disabled={act.busy}
          onClick={() =>
            act.run(async () => {
              if (!confirm(`Delete sandbox ${sb.id}?`)) return
              await api('DELETE', path)
              location.hash = '#/sandboxes'
            })
          }
        >
          Delete
        </button>
      </div>
      {snapMsg && (
        <div class="muted small">
          {snapMsg} — <a href="#/snapshots">snapshots</a>
        </div>
      )}
      <ErrorBox error={act.error} />
    </div>
  )
}

export function SandboxPage({ id }: { id: string }) {
  const me = useMe()
  const [tab, setTab] = useState<Tab>('overview')
  const sb = usePoll(() => api<Sandbox>('GET', `/v1/sandboxes/${encodeURIComponent(id)}`), 2000, [id])
  const gone = sb.error.includes('NOT_FOUND')
  const s = sb.data
  const running = s?.status.state === 'Running'
  const tabs: [Tab, string][] = [
    ['overview', 'Overview'],
    ...(me.canMutate ? ([['terminal', 'Terminal']] as [Tab, string][]) : []),
    ['files', 'Files'],
    ['logs', 'Logs'],
    ['events', 'Events'],
  ]
  return (
    <section>
      <header class="page-head">
        <div>
          <div class="crumbs">
            <a href="#/sandboxes">Sandboxes</a> /
          </div>
          <h1 class="mono">{id}</h1>
        </div>
        {s && <StateBadge state={s.status.state} />}
      </header>
      {gone ? (
        <div class="empty">
          This sandbox does not exist (or was deleted). <a href="#/sandboxes">Back to the list</a>.
        </div>
      ) : (
        <>
          <ErrorBox error={sb.error} />
          {s && me.canMutate && <Actions sb={s} refresh={sb.refresh} />}
          <div class="tabs" role="tablist">
            {tabs.map(([t, label]) => (
              <button role="tab" class={tab === t ? 'tab active' : 'tab'} aria-selected={tab === t} onClick={() => setTab(t)} data-tab={t}>
                {label}
              </button>
            ))}
          </div>
          {tab === 'overview' && s && (
            <div class="overview">
              <div class="card">
                <dl class="kv">
                  <dt>State</dt>
                  <dd>
                    <StateBadge state={s.status.state} /> {s.status.reason} {s.status.message && <span class="muted">{s.status.message}</span>}
                  </dd>
                  <dt>Created</dt>
                  <dd title={s.createdAt}>
                    {new Date(s.createdAt).toLocaleString()} ({since(s.createdAt)})
                  </dd>
                  <dt>Expires</dt>
                  <dd title={s.expiresAt}>{s.expiresAt ? `${new Date(s.expiresAt).toLocaleString()} (${since(s.expiresAt)})` : 'never'}</dd>
                  <dt>Entrypoint</dt>
                  <dd class="mono">{s.entrypoint.join(' ') || '—'}</dd>
                  <dt>Metadata</dt>
                  <dd>
                    {Object.entries(s.metadata ?? {}).map(([k, v]) => (
                      <span class="tag">
                        {k}={v}
                      </span>
                    ))}
                    {Object.keys(s.metadata ?? {}).length === 0 && '—'}
                  </dd>
                </dl>
              </div>
              {running ? <MetricsCharts id={id} active={tab === 'overview'} /> : <div class="muted small">Metrics are shown while the sandbox runs.</div>}
              <Endpoints id={id} />
            </div>
          )}
          {tab === 'terminal' && (running ? <Terminal id={id} /> : <div class="empty">The terminal needs a Running sandbox.</div>)}
          {tab === 'files' && (running ? <Files id={id} /> : <div class="empty">Files need a Running sandbox.</div>)}
          {tab === 'logs' && <Diagnostics id={id} kind="logs" />}
          {tab === 'events' && <Diagnostics id={id} kind="events" />}
        </>
      )}
    </section>
  )
}
