// Tenants and API keys (admins only; the API refuses other roles). A
// tenant admin sees its own tenant and keys; a platform key sees all.
import { useState } from 'preact/hooks'
import { api } from '../api'
import { Empty, ErrorBox, Field, since, useAction, useMe, usePoll } from '../ui'

interface Quota {
  sandboxes?: number
  cpu?: string
  memory?: string
}

interface Tenant {
  name: string
  createdAt?: string
  quota: Quota
  usage: { sandboxes: number; cpu: string; memory: string }
}

interface Key {
  id: string
  tenant: string
  role: string
  active: boolean
  name?: string
  createdAt?: string
  createdBy?: string
  expiresAt?: string
  revokedAt?: string
}

function Tenants() {
  const list = usePoll(() => api<{ items: Tenant[] }>('GET', '/v1/tenants'), 5000)
  const [name, setName] = useState('')
  const [quota, setQuota] = useState({ sandboxes: '', cpu: '', memory: '' })
  const act = useAction()
  const items = list.data?.items ?? []
  return (
    <section>
      <header class="page-head">
        <h1>Tenants</h1>
      </header>
      <form
        class="card row wrap"
        data-testid="tenant-form"
        onSubmit={(e) => {
          e.preventDefault()
          act.run(async () => {
            const q: Quota = {}
            if (quota.sandboxes.trim()) {
              const n = Number(quota.sandboxes)
              if (!Number.isInteger(n) || n < 0) throw new Error('the sandbox quota is a whole number (0: unlimited)')
              q.sandboxes = n
            }
            if (quota.cpu.trim()) q.cpu = quota.cpu.trim()
            if (quota.memory.trim()) q.memory = quota.memory.trim()
            await api('PUT', `/v1/tenants/${encodeURIComponent(name.trim())}`, { quota: q })
            setName('')
            await list.refresh()
          })
        }}
      >
        <Field label="Tenant" hint="created if new; its quota is replaced">
          <input name="tenant" required value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        </Field>
        <Field label="Max sandboxes">
          <input name="sandboxes" size={6} value={quota.sandboxes} onInput={(e) => setQuota({ ...quota, sandboxes: (e.target as HTMLInputElement).value })} />
        </Field>
        <Field label="Max CPU">
          <input name="cpu" size={6} placeholder="8" value={quota.cpu} onInput={(e) => setQuota({ ...quota, cpu: (e.target as HTMLInputElement).value })} />
        </Field>
        <Field label="Max memory">
          <input name="memory" size={8} placeholder="16Gi" value={quota.memory} onInput={(e) => setQuota({ ...quota, memory: (e.target as HTMLInputElement).value })} />
        </Field>
        <button class="primary" type="submit" disabled={act.busy}>
          Save tenant
        </button>
      </form>
      <ErrorBox error={list.error || act.error} />
      {list.data && items.length === 0 ? (
        <Empty>No tenants.</Empty>
      ) : (
        <table class="table" data-testid="tenant-table">
          <thead>
            <tr>
              <th>Name</th>
              <th>Sandboxes</th>
              <th>CPU</th>
              <th>Memory</th>
              <th>Created</th>
            </tr>
          </thead>
          <tbody>
            {items.map((t) => (
              <tr data-tenant={t.name}>
                <td class="mono">{t.name}</td>
                <td>
                  {t.usage?.sandboxes ?? 0} / {t.quota?.sandboxes || '∞'}
                </td>
                <td>
                  {t.usage?.cpu || '0'} / {t.quota?.cpu || '∞'}
                </td>
                <td>
                  {t.usage?.memory || '0'} / {t.quota?.memory || '∞'}
                </td>
                <td>{since(t.createdAt)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  )
}

function Keys() {
  const me = useMe()
  const list = usePoll(() => api<{ items: Key[] }>('GET', '/v1/keys'), 5000)
  const [tenant, setTenant] = useState('')
  const [role, setRole] = useState('operator')
  const [name, setName] = useState('')
  const [created, setCreated] = useState<{ id: string; key: string } | null>(null)
  const act = useAction()
  const items = list.data?.items ?? []
  return (
    <section>
      <header class="page-head">
        <h1>API keys</h1>
      </header>
      <form
        class="card row wrap"
        data-testid="key-form"
        onSubmit={(e) => {
          e.preventDefault()
          act.run(async () => {
            const k = await api<{ id: string; key: string }>('POST', '/v1/keys', { tenant: tenant.trim(), role, name: name.trim() || undefined })
            setCreated(k)
            setName('')
            await list.refresh()
          })
        }}
      >
        <Field label="Tenant">
          <input name="tenant" required value={tenant} onInput={(e) => setTenant((e.target as HTMLInputElement).value)} />
        </Field>
        <Field label="Role">
          <select name="role" value={role} onChange={(e) => setRole((e.target as HTMLSelectElement).value)}>
            <option value="viewer">viewer (read only)</option>
            <option value="operator">operator (its tenant)</option>
            <option value="admin">admin (its tenant, its keys)</option>
            {me.isPlatform && <option value="platform">platform (every tenant; server key only)</option>}
          </select>
        </Field>
        <Field label="Name">
          <input name="name" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        </Field>
        <button class="primary" type="submit" disabled={act.busy}>
          Create key
        </button>
      </form>
      {created && (
        <div class="card notice" data-testid="new-key">
          Key <span class="mono">{created.id}</span> created. Copy it now, it is not shown again:
          <pre class="mono secret-once">{created.key}</pre>
          <button class="small" onClick={() => setCreated(null)}>
            Done
          </button>
        </div>
      )}
      <ErrorBox error={list.error || act.error} />
      {list.data && items.length === 0 ? (
        <Empty>No keys.</Empty>
      ) : (
        <table class="table" data-testid="key-table">
          <thead>
            <tr>
              <th>ID</th>
              <th>Name</th>
              <th>Tenant</th>
              <th>Role</th>
              <th>Created</th>
              <th>State</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {items.map((k) => (
              <tr data-key={k.id}>
                <td class="mono">{k.id}</td>
                <td>{k.name || '—'}</td>
                <td class="mono">{k.tenant}</td>
                <td>
                  <span class={`role role-${k.role}`}>{k.role}</span>
                </td>
                <td>{since(k.createdAt)}</td>
                <td>{k.revokedAt ? `revoked ${since(k.revokedAt)}` : k.active ? 'active' : 'expired'}</td>
                <td class="right">
                  {k.active && k.id !== 'root' && (
                    <button
                      class="small danger"
                      disabled={act.busy}
                      onClick={() =>
                        act.run(async () => {
                          if (!confirm(`Revoke key ${k.id}? Clients using it stop working at once.`)) return
                          await api('DELETE', `/v1/keys/${encodeURIComponent(k.id)}`)
                          await list.refresh()
                        })
                      }
                    >
                      Revoke
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  )
}

export function Admin({ tab }: { tab: 'tenants' | 'keys' }) {
  const me = useMe()
  if (!me.isAdmin) return <div class="empty">Tenants and keys are managed by admins (a tenant admin manages its own tenant).</div>
  return tab === 'tenants' ? <Tenants /> : <Keys />
}
