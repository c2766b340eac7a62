import { useState } from 'preact/hooks'
import type { Pool } from '../api'
import { api } from '../api'
import { Empty, ErrorBox, Field, since, splitArgs, useAction, useMe, usePoll } from '../ui'

/** Fill draws a pool's sandboxes against its maximum: allocated, idle, and the idle target band. */
function Fill({ p }: { p: Pool }) {
  const max = Math.max(p.capacitySpec.poolMax, p.status.total, 1)
  const pct = (n: number) => `${Math.min(100, (n / max) * 100)}%`
  return (
    <div class="fill" title={`${p.status.allocated} allocated, ${p.status.available} idle, pool max ${p.capacitySpec.poolMax}`}>
      <div class="fill-bar">
        <span class="fill-alloc" style={{ width: pct(p.status.allocated) }} />
        <span class="fill-idle" style={{ width: pct(p.status.available) }} />
      </div>
      <div class="small muted">
        {p.status.allocated} allocated · {p.status.available} idle / buffer {p.capacitySpec.bufferMin}–{p.capacitySpec.bufferMax} · max {p.capacitySpec.poolMax}
      </div>
    </div>
  )
}

/** Capacity edits a pool's capacitySpec (PUT with its template unchanged). */
function Capacity({ p, done }: { p: Pool; done: () => void }) {
  const c = p.capacitySpec
  const [cap, setCap] = useState({ bufferMin: String(c.bufferMin), bufferMax: String(c.bufferMax), poolMin: String(c.poolMin), poolMax: String(c.poolMax) })
  const act = useAction()
  const num = (k: keyof typeof cap) => (
    <label class="field inline">
      <span class="field-label">{k}</span>
      <input name={k} inputMode="numeric" size={4} value={cap[k]} onInput={(e) => setCap({ ...cap, [k]: (e.target as HTMLInputElement).value })} />
    </label>
  )
  return (
    <form
      class="row wrap capacity"
      data-testid="capacity-form"
      onSubmit={(e) => {
        e.preventDefault()
        act.run(async () => {
          const n = (k: keyof typeof cap) => {
            const v = Number(cap[k])
            if (!Number.isInteger(v) || v < 0) throw new Error(`${k} must be a whole number`)
            return v
          }
          await api('PUT', `/v1/pools/${encodeURIComponent(p.name)}`, {
            name: p.name,
            template: p.template,
            capacitySpec: { bufferMin: n('bufferMin'), bufferMax: n('bufferMax'), poolMin: n('poolMin'), poolMax: n('poolMax') },
          })
          done()
        })
      }}
    >
      {num('bufferMin')}
      {num('bufferMax')}
      {num('poolMin')}
      {num('poolMax')}
      <button class="small primary" type="submit" disabled={act.busy}>
        Save
      </button>
      {act.error && <span class="error inline">{act.error}</span>}
    </form>
  )
}

function CreatePool({ done }: { done: () => void }) {
  const [name, setName] = useState('')
  const [image, setImage] = useState('')
  const [entrypoint, setEntrypoint] = useState('tail -f /dev/null')
  const [cap, setCap] = useState({ bufferMin: '1', bufferMax: '2', poolMin: '0', poolMax: '10' })
  const act = useAction()
  const submit = (e: Event) => {
    e.preventDefault()
    act.run(async () => {
      const n = (k: keyof typeof cap) => {
        const v = Number(cap[k])
        if (!Number.isInteger(v) || v < 0) throw new Error(`${k} must be a whole number`)
        return v
      }
      await api('POST', '/v1/pools', {
        name: name.trim(),
        template: { image: { uri: image.trim() }, entrypoint: splitArgs(entrypoint) },
        capacitySpec: { bufferMin: n('bufferMin'), bufferMax: n('bufferMax'), poolMin: n('poolMin'), poolMax: n('poolMax') },
      })
      setName('')
      done()
    })
  }
  const num = (k: keyof typeof cap, label: string) => (
    <Field label={label}>
      <input name={k} inputMode="numeric" size={4} value={cap[k]} onInput={(e) => setCap({ ...cap, [k]: (e.target as HTMLInputElement).value })} />
    </Field>
  )
  return (
    <form class="card form" onSubmit={submit} data-testid="pool-form">
      <h3>New pool</h3>
      <div class="grid3">
        <Field label="Name">
          <input name="name" required value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        </Field>
        <Field label="Image">
          <input name="image" required value={image} onInput={(e) => setImage((e.target as HTMLInputElement).value)} />
        </Field>
        <Field label="Entrypoint">
          <input name="entrypoint" class="mono" value={entrypoint} onInput={(e) => setEntrypoint((e.target as HTMLInputElement).value)} />
        </Field>
      </div>
      <div class="row wrap">
        {num('bufferMin', 'Buffer min')}
        {num('bufferMax', 'Buffer max')}
        {num('poolMin', 'Pool min')}
        {num('poolMax', 'Pool max')}
      </div>
      <ErrorBox error={act.error} />
      <div class="actions">
        <button class="primary" type="submit" disabled={act.busy}>
          Create pool
        </button>
      </div>
    </form>
  )
}

export function Pools() {
  const me = useMe()
  const pools = usePoll(() => api<{ items: Pool[] }>('GET', '/v1/pools'), 3000)
  const act = useAction()
  const [creating, setCreating] = useState(false)
  const [editing, setEditing] = useState('')
  const items = pools.data?.items ?? []
  return (
    <section>
      <header class="page-head">
        <h1>Warm pools</h1>
        {me.canMutate && (
          <button class="primary" onClick={() => setCreating(!creating)}>
            {creating ? 'Close' : 'New pool'}
          </button>
        )}
      </header>
      {creating && (
        <CreatePool
          done={() => {
            setCreating(false)
            pools.refresh()
          }}
        />
      )}
      <ErrorBox error={pools.error || act.error} />
      {pools.data && items.length === 0 ? (
        <Empty>No pools. A pool keeps idle sandboxes running so that a create is a claim, not a container start.</Empty>
      ) : (
        <table class="table" data-testid="pool-table">
          <thead>
            <tr>
              <th>Name</th>
              <th>Template</th>
              <th>Fill</th>
              <th>Created</th>
              {me.canMutate && <th />}
            </tr>
          </thead>
          <tbody>
            {items.map((p) => (
              <tr key={p.name} data-pool={p.name}>
                <td class="mono">{p.name}</td>
                <td class="mono small">
                  {p.template.image?.uri ?? `snapshot ${p.template.snapshotId}`}
                  <div class="muted">{(p.template.entrypoint ?? []).join(' ')}</div>
                </td>
                <td class="wide">
                  <Fill p={p} />
                  {editing === p.name && (
                    <Capacity
                      p={p}
                      done={() => {
                        setEditing('')
                        pools.refresh()
                      }}
                    />
                  )}
                </td>
                <td title={p.createdAt}>{since(p.createdAt)}</td>
                {me.canMutate && (
                  <td class="right nowrap">
                    <button class="small" onClick={() => setEditing(editing === p.name ? '' : p.name)}>
                      {editing === p.name ? 'Close' : 'Capacity'}
                    </button>
                    <button
                      class="small danger"
                      disabled={act.busy}
                      onClick={() =>
                        act.run(async () => {
                          if (!confirm(`Delete pool ${p.name} and its idle sandboxes?`)) return
                          await api('DELETE', `/v1/pools/${encodeURIComponent(p.name)}`)
                          await pools.refresh()
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
