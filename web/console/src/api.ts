// The console's only way to the server. Every call goes to /console/...
// with the session cookie (sent by the browser, HttpOnly) and the CSRF
// token in X-Moat-CSRF. The API key never reaches this code after sign-in:
// the server keeps it in the session.

export interface Principal {
  keyId?: string
  tenant?: string
  role: 'platform' | 'admin' | 'operator' | 'viewer' | string
}

export interface SessionInfo {
  csrfToken?: string
  principal: Principal
  expiresAt: string
}

/** ApiError is a non-2xx answer in the server's {code, message} shape. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message)
  }
}

const CSRF_HEADER = 'X-Moat-CSRF'

// The token arrives in index.html (top-level navigation of a signed-in
// browser) or in the sign-in answer; it lives only in this module's memory.
let csrf = document.querySelector<HTMLMetaElement>('meta[name="moat-csrf"]')?.content ?? ''

// An admin may act in one tenant (X-Moat-Tenant): its resources only, and
// what it creates belongs to it. Empty: every tenant.
let tenantScope = ''

export function setTenantScope(t: string) {
  tenantScope = t
}

let onSignedOut: () => void = () => {}

/** whenSignedOut registers what to do when the server ends the session. */
export function whenSignedOut(f: () => void) {
  onSignedOut = f
}

export function hasToken() {
  return csrf !== ''
}

async function errorOf(res: Response): Promise<ApiError> {
  let code = `HTTP_${res.status}`
  let message = res.statusText || `request failed with status ${res.status}`
  try {
    const body = await res.json()
    if (body && typeof body === 'object') {
      if (typeof body.code === 'string') code = body.code
      if (typeof body.message === 'string') message = body.message
      else if (typeof body.error === 'string') message = body.error
    }
  } catch {
    /* not JSON */
  }
  return new ApiError(res.status, code, message)
}

function signedOut(e: ApiError) {
  return e.status === 401 && (e.code.startsWith('CONSOLE::') || e.code.endsWith('API_KEY'))
}

/** raw sends a request under /console and returns the response, throwing ApiError on non-2xx. */
export async function raw(path: string, init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers)
  if (csrf) headers.set(CSRF_HEADER, csrf)
  if (tenantScope && path.startsWith('/api/')) headers.set('X-Moat-Tenant', tenantScope)
  const res = await fetch('/console' + path, { ...init, headers, credentials: 'same-origin', cache: 'no-store' })
  if (!res.ok) {
    const e = await errorOf(res)
    if (signedOut(e)) {
      csrf = ''
      onSignedOut()
    }
    throw e
  }
  return res
}

/** api calls the Lifecycle API (path like /v1/sandboxes) through the console gateway. */
export async function api<T = unknown>(method: string, path: string, body?: unknown): Promise<T> {
  const init: RequestInit = { method }
  if (body !== undefined) {
    init.body = JSON.stringify(body)
    init.headers = { 'Content-Type': 'application/json' }
  }
  const res = await raw('/api' + path, init)
  const text = await res.text()
  return (text ? JSON.parse(text) : undefined) as T
}

export async function signIn(apiKey: string): Promise<SessionInfo> {
  const res = await fetch('/console/session', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ apiKey }),
    credentials: 'same-origin',
  })
  if (!res.ok) throw await errorOf(res)
  const info = (await res.json()) as SessionInfo
  csrf = info.csrfToken ?? ''
  return info
}

export async function currentSession(): Promise<SessionInfo | null> {
  if (!csrf) return null
  try {
    const res = await raw('/session')
    return (await res.json()) as SessionInfo
  } catch (e) {
    if (e instanceof ApiError && e.status === 401) return null
    throw e
  }
}

export async function signOut() {
  try {
    await raw('/session', { method: 'DELETE' })
  } finally {
    csrf = ''
  }
}

/** wsURL returns a ws(s):// URL for an API path, with a fresh single-use ticket. */
export async function wsURL(path: string): Promise<string> {
  const res = await raw('/session/ticket', { method: 'POST' })
  const { ticket } = (await res.json()) as { ticket: string }
  const u = new URL('/console/api' + path, location.href)
  u.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:'
  u.searchParams.set('ticket', ticket)
  return u.toString()
}

/** AGENT_PORT is the in-sandbox agent (execd) port. */
export const AGENT_PORT = 44772

/** agent is the API path of the sandbox agent through the server proxy. */
export function agent(id: string, rest: string) {
  return `/v1/sandboxes/${encodeURIComponent(id)}/proxy/${AGENT_PORT}${rest}`
}

export function errText(e: unknown): string {
  if (e instanceof ApiError) return `${e.code}: ${e.message}`
  if (e instanceof Error) return e.message
  return String(e)
}

// ---- wire types (the subset the console shows) ----

export interface SandboxStatus {
  state: string
  reason?: string
  message?: string
  lastTransitionAt?: string
}

export interface Sandbox {
  id: string
  status: SandboxStatus
  metadata: Record<string, string>
  expiresAt?: string
  createdAt: string
  entrypoint: string[]
}

export interface Pagination {
  page: number
  pageSize: number
  totalItems: number
  totalPages: number
  hasNextPage: boolean
}

export interface SandboxList {
  items: Sandbox[]
  pagination: Pagination
}

export interface Pool {
  name: string
  template: {
    image?: { uri: string }
    snapshotId?: string
    entrypoint?: string[]
    env?: Record<string, string>
    resourceLimits?: Record<string, string>
    extensions?: Record<string, string>
  }
  capacitySpec: { bufferMin: number; bufferMax: number; poolMin: number; poolMax: number }
  status: { total: number; allocated: number; available: number; revision: string }
  createdAt: string
}

export interface Snapshot {
  id: string
  sandboxId: string
  name?: string
  createdAt: string
  status: { state: string; reason?: string; message?: string }
}

export interface FileInfo {
  path: string
  type: 'file' | 'directory' | 'symlink' | 'other'
  size: number
  modified_at: string
  mode: number
  owner?: string
  group?: string
}

export interface Metrics {
  cpu_count: number
  cpu_used_pct: number
  mem_total_mib: number
  mem_used_mib: number
  timestamp: number
}

export const STATES = ['Pending', 'Running', 'Pausing', 'Paused', 'Resuming', 'Stopping', 'Terminated', 'Failed']
