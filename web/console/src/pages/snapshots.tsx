import { useState } from 'preact/hooks'
import type { Sandbox, SandboxList, Snapshot } from '../api'
import { api } from '../api'
import { Empty, ErrorBox, StateBadge, since, useAction, useMe, usePoll } from '../ui'

function Fork({ snap, onDone }: { snap: Snapshot; onDone: (ids: string[]) => void }) {
  const [count, setCount] = useState('3')
  const [timeout, setTimeoutS] = useState('3600')
  const act = useAction()
  return (
    <form
      class="row"
      onSubmit={(e) => {
        e.preventDefault()
        act.run(async () => {
          const n = Number(count)
          if (!Number.isInteger(n) || n < 1) throw new Error('count must be a whole number ≥ 1')
          const body: Record<string, unknown> = { count: n, snapshotId: snap.id }
          if (timeout.trim()) body.timeout = Number(timeout)
          const out = await api<{ items: Sandbox[] }>('POST', '/v1/sandboxes/batch', body)
          onDone(out.items.map((s) => s.id))
        })
      }}
    >
      <input name="count" inputMode="numeric" size={3} value={count} onInput={(e) => setCount((e.target as HTMLInputElement).value)} title="how many forks" />
      <input name="timeout" inputMode="numeric" size={5} value={timeout} onInput={(e) => setTimeoutS((e.target as HTMLInputElement).value)} title="timeout (s)" />
      <button class="small primary" type="submit" disabled={act.busy}>
        {act.busy ? 'Forking…' : 'Fork'}
      </button>
      {act.error && <span class="error inline">{act.error}</span>}
    </form>
  )
}

export function Snapshots() {
  const me = useMe()
  const snaps = usePoll(() => api<{ items: Snapshot[] }>('GET', '/v1/snapshots?pageSize=200'), 3000)
  const running = usePoll(() => api<SandboxList>('GET', '/v1/sandboxes?state=Running&pageSize=200'), 0)
  const [source, setSource] = useState('')
  const [name, setName] = useState('')
  const [forked, setForked] = useState<string[]>([])
  const act = useAction()
  const items = snaps.data?.items ?? []
  return (
    <section>
      <header class="page-head">
        <h1>Snapshots</h1>
      </header>
      {me.canMutate && (
        <form
          class="card row wrap"
          data-testid="snapshot-form"
          onSubmit={(e) => {
            e.preventDefault()
            act.run(async () => {
              if (!source) throw new Error('choose a running sandbox')
              await api('POST', `/v1/sandboxes/${encodeURIComponent(source)}/snapshots`, name ? { name } : {})
              setName('')
              await snaps.refresh()
            })
          }}
        >
          <label class="field inline">
            <span class="field-label">Sandbox</span>
            <select name="source" value={source} onChange={(e) => setSource((e.target as HTMLSelectElement).value)}>
              <option value="">choose a running sandbox…</option>
              {(running.data?.items ?? []).map((s) => (
                <option value={s.id}>{s.id}</option>
              ))}
            </select>
          </label>
          <label class="field inline">
            <span class="field-label">Name</span>
            <input name="name" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
          </label>
          <button class="primary" type="submit" disabled={act.busy}>
            Take snapshot
          </button>
        </form>
      )}
      <ErrorBox error={snaps.error || act.error} />
      {forked.length > 0 && (
        <div class="card notice" data-testid="forked">
          Forked {forked.length}:{' '}
          {forked.map((id) => (
            <a class="mono tag" href={`#/sandboxes/${encodeURIComponent(id)}`}>
              {id}
            </a>
          ))}
        </div>
      )}
      {snaps.data && items.length === 0 ? (
        <Empty>No snapshots. A snapshot commits a sandbox's filesystem (and, on gVisor, its memory); forks start from it.</Empty>
      ) : (
        <table class="table" data-testid="snapshot-table">
          <thead>
            <tr>
              <th>ID</th>
              <th>Name</th>
              <th>From</th>
              <th>State</th>
              <th>Created</th>
              {me.canMutate && <th>Fork N (count, timeout s)</th>}
              {me.canMutate && <th />}
            </tr>
          </thead>
          <tbody>
            {items.map((s) => (
              <tr key={s.id} data-snapshot={s.id}>
                <td class="mono">{s.id}</td>
                <td>{s.name || '—'}</td>
                <td class="mono">
                  <a href={`#/sandboxes/${encodeURIComponent(s.sandboxId)}`}>{s.sandboxId}</a>
                </td>
                <td>
                  <StateBadge state={s.status.state} />
                  {s.status.message && <div class="muted small">{s.status.message}</div>}
                </td>
                <td title={s.createdAt}>{since(s.createdAt)}</td>
                {me.canMutate && <td>{s.status.state === 'Ready' && <Fork snap={s} onDone={setForked} />}</td>}
                {me.canMutate && (
                  <td class="right">
                    <button
                      class="small danger"
                      disabled={act.busy}
                      onClick={() =>
                        act.run(async () => {
                          if (!confirm(`Delete snapshot ${s.id}?`)) return
                          await api('DELETE', `/v1/snapshots/${encodeURIComponent(s.id)}`)
                          await snaps.refresh()
                        })
                      }
                    >
                      Delete
                    </button>
                  </td>
                )}
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  )
}
