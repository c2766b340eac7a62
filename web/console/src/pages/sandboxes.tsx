import { useState } from 'preact/hooks'
import type { SandboxList as List } from '../api'
import { api, STATES } from '../api'
import { Empty, ErrorBox, StateBadge, parseKV, since, useAction, useMe, usePoll } from '../ui'

const PAGE_SIZE = 50

/** SandboxList is the live list of the tenant's sandboxes, refreshed every 2 s. */
export function SandboxList() {
  const me = useMe()
  const [state, setState] = useState('')
  const [meta, setMeta] = useState('')
  const [page, setPage] = useState(1)
  const [filterError, setFilterError] = useState('')
  const act = useAction()

  const query = () => {
    const q = new URLSearchParams({ page: String(page), pageSize: String(PAGE_SIZE) })
    if (state) q.set('state', state)
    if (meta.trim()) {
      const kv = parseKV(meta)
      q.set('metadata', new URLSearchParams(kv).toString())
    }
    return q.toString()
  }
  const list = usePoll<List>(
    async () => {
      let q: string
      try {
        q = query()
        setFilterError('')
      } catch (e) {
        setFilterError((e as Error).message)
        throw e
      }
      return api<List>('GET', '/v1/sandboxes?' + q)
    },
    2000,
    [state, meta, page],
  )
  const items = list.data?.items ?? []
  const pg = list.data?.pagination

  const remove = (id: string) =>
    act.run(async () => {
      if (!confirm(`Delete sandbox ${id}?`)) return
      await api('DELETE', `/v1/sandboxes/${encodeURIComponent(id)}`)
      await list.refresh()
    })

  return (
    <section>
      <header class="page-head">
        <h1>Sandboxes</h1>
        {me.canMutate && (
          <a class="button primary" href="#/sandboxes/new" data-testid="new-sandbox">
            New sandbox
          </a>
        )}
      </header>
      <div class="filters card">
        <label class="field inline">
          <span class="field-label">State</span>
          <select
            name="state"
            value={state}
            onChange={(e) => {
              setState((e.target as HTMLSelectElement).value)
              setPage(1)
            }}
          >
            <option value="">any</option>
            {STATES.map((s) => (
              <option value={s}>{s}</option>
            ))}
          </select>
        </label>
        <label class="field inline grow">
          <span class="field-label">Metadata</span>
          <input
            name="metadata"
            placeholder="team=ml, env=dev"
            value={meta}
            onInput={(e) => {
              setMeta((e.target as HTMLInputElement).value)
              setPage(1)
            }}
          />
        </label>
        <span class="muted live" title="refreshed every 2 s">
          ● live
        </span>
      </div>
      <ErrorBox error={filterError || list.error || act.error} />
      {list.data && items.length === 0 ? (
        <Empty>No sandboxes{state || meta ? ' match these filters' : ' yet'}.</Empty>
      ) : (
        <table class="table" data-testid="sandbox-table">
          <thead>
            <tr>
              <th>ID</th>
              <th>State</th>
              <th>Metadata</th>
              <th>Created</th>
              <th>Expires</th>
              {me.canMutate && <th />}
            </tr>
          </thead>
          <tbody>
            {items.map((sb) => (
              <tr key={sb.id} data-id={sb.id}>
                <td class="mono">
                  <a href={`#/sandboxes/${encodeURIComponent(sb.id)}`}>{sb.id}</a>
                </td>
                <td>
                  <StateBadge state={sb.status.state} />
                  {sb.status.reason && <span class="muted small"> {sb.status.reason}</span>}
                </td>
                <td>
                  {Object.entries(sb.metadata ?? {}).map(([k, v]) => (
                    <span class="tag">
                      {k}={v}
                    </span>
                  ))}
                </td>
                <td title={sb.createdAt}>{since(sb.createdAt)}</td>
                <td title={sb.expiresAt}>{sb.expiresAt ? since(sb.expiresAt) : 'never'}</td>
                {me.canMutate && (
                  <td class="right">
                    <button class="small danger" disabled={act.busy} onClick={() => remove(sb.id)}>
                      Delete
                    </button>
                  </td>
                )}
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {pg && pg.totalPages > 1 && (
        <div class="pager">
          <button class="small" disabled={page <= 1} onClick={() => setPage(page - 1)}>
            ← Prev
          </button>
          <span class="muted">
            page {pg.page} of {pg.totalPages} ({pg.totalItems} sandboxes)
          </span>
          <button class="small" disabled={!pg.hasNextPage} onClick={() => setPage(page + 1)}>
            Next →
          </button>
        </div>
      )}
      {pg && pg.totalPages <= 1 && <div class="muted small count">{pg.totalItems} sandbox(es)</div>}
    </section>
  )
}
