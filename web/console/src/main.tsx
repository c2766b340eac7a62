import { render } from 'preact'
import { useEffect, useState } from 'preact/hooks'
import '@xterm/xterm/css/xterm.css'
import './style.css'
import type { SessionInfo } from './api'
import { api, currentSession, hasToken, setTenantScope, signOut, whenSignedOut } from './api'
import { SignIn } from './pages/signin'
import { SandboxList } from './pages/sandboxes'
import { CreateSandbox } from './pages/create'
import { SandboxPage } from './pages/sandbox'
import { Pools } from './pages/pools'
import { Snapshots } from './pages/snapshots'
import { Admin } from './pages/admin'
import type { Me } from './ui'
import { MeContext } from './ui'

/** route is the hash route split into its parts: #/sandboxes/abc -> ['sandboxes', 'abc']. */
function useRoute(): string[] {
  const parse = () =>
    location.hash
      .replace(/^#\/?/, '')
      .split('?')[0]
      .split('/')
      .filter(Boolean)
      .map(decodeURIComponent)
  const [route, setRoute] = useState(parse)
  useEffect(() => {
    const on = () => setRoute(parse())
    addEventListener('hashchange', on)
    return () => removeEventListener('hashchange', on)
  }, [])
  return route
}

function meOf(s: SessionInfo): Me {
  const role = s.principal.role
  const platform = role === 'platform'
  return {
    principal: s.principal,
    canMutate: platform || role === 'admin' || role === 'operator',
    isAdmin: platform || role === 'admin',
    isPlatform: platform,
  }
}

/** TenantScope lets a platform key narrow every page to one tenant. */
function TenantScope({ scope, onChange }: { scope: string; onChange: (t: string) => void }) {
  const [names, setNames] = useState<string[]>([])
  const load = () =>
    api<{ items: { name: string }[] }>('GET', '/v1/tenants').then(
      (r) => setNames(r.items.map((t) => t.name)),
      () => setNames([]),
    )
  useEffect(() => {
    load()
  }, [])
  return (
    <label class="scope">
      <span>Tenant</span>
      <select name="scope" value={scope} onFocus={load} onChange={(e) => onChange((e.target as HTMLSelectElement).value)}>
        <option value="">all tenants</option>
        {names.map((n) => (
          <option value={n}>{n}</option>
        ))}
      </select>
    </label>
  )
}

function App() {
  const [session, setSession] = useState<SessionInfo | null | undefined>(hasToken() ? undefined : null)
  const [scope, setScope] = useState('')
  const route = useRoute()

  useEffect(() => {
    whenSignedOut(() => {
      setTenantScope('')
      setScope('')
      setSession(null)
    })
    if (session === undefined) currentSession().then(setSession, () => setSession(null))
  }, [])

  if (session === undefined) return <div class="loading">Loading…</div>
  if (session === null) return <SignIn onSignedIn={setSession} />

  const me = meOf(session)
  const changeScope = (t: string) => {
    setTenantScope(t)
    setScope(t)
  }
  const [page, id] = route
  let body
  switch (page ?? 'sandboxes') {
    case 'sandboxes':
      body = id === 'new' ? <CreateSandbox /> : id ? <SandboxPage id={id} key={id} /> : <SandboxList />
      break
    case 'pools':
      body = <Pools />
      break
    case 'snapshots':
      body = <Snapshots />
      break
    case 'tenants':
    case 'keys':
      body = <Admin tab={page === 'keys' ? 'keys' : 'tenants'} />
      break
    default:
      body = <div class="empty">No page here. Back to <a href="#/sandboxes">sandboxes</a>.</div>
  }
  const nav = (href: string, label: string, name: string) => (
    <a href={href} class={(page ?? 'sandboxes') === name ? 'active' : ''}>
      {label}
    </a>
  )
  return (
    <MeContext.Provider value={me}>
      <div class="shell">
        <aside class="sidebar">
          <div class="brand">
            <img src="/console/favicon.svg" alt="" width="28" height="28" />
            <span>moat</span>
          </div>
          <nav>
            {nav('#/sandboxes', 'Sandboxes', 'sandboxes')}
            {nav('#/pools', 'Pools', 'pools')}
            {nav('#/snapshots', 'Snapshots', 'snapshots')}
            {me.isAdmin && nav('#/tenants', 'Tenants', 'tenants')}
            {me.isAdmin && nav('#/keys', 'API keys', 'keys')}
          </nav>
          {me.isPlatform && <TenantScope scope={scope} onChange={changeScope} />}
          <div class="whoami">
            <div class="who" data-testid="whoami">
              <span class={`role role-${me.principal.role}`}>{me.principal.role}</span>
              {me.principal.tenant && <span class="tenant">{me.principal.tenant}</span>}
            </div>
            {me.principal.keyId && <div class="keyid">key {me.principal.keyId}</div>}
            <button
              class="link"
              onClick={() =>
                signOut().finally(() => {
                  changeScope('')
                  setSession(null)
                })
              }
            >
              Sign out
            </button>
          </div>
        </aside>
        <main class="content" key={scope}>
          {body}
        </main>
      </div>
    </MeContext.Provider>
  )
}

render(<App />, document.getElementById('app')!)
