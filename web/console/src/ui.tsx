// Small shared pieces: hooks, formatting and widgets.
import type { ComponentChildren } from 'preact'
import { createContext } from 'preact'
import { useCallback, useContext, useEffect, useRef, useState } from 'preact/hooks'
import type { Principal } from './api'
import { errText } from './api'

/** Who is signed in; canMutate is false for viewers (the API refuses them anyway). */
export interface Me {
  principal: Principal
  canMutate: boolean
  /** isAdmin: manages keys (a tenant admin its own tenant's, platform every tenant's). */
  isAdmin: boolean
  /** isPlatform: acts across tenants (tenant scope, quotas, guardrails). */
  isPlatform: boolean
}

export const MeContext = createContext<Me>({ principal: { role: 'viewer' }, canMutate: false, isAdmin: false, isPlatform: false })

export function useMe() {
  return useContext(MeContext)
}

/** usePoll runs load now and every ms milliseconds while mounted (and the tab is visible). */
export function usePoll<T>(load: () => Promise<T>, ms: number, deps: unknown[] = []) {
  const [data, setData] = useState<T | undefined>(undefined)
  const [error, setError] = useState<string>('')
  const gen = useRef(0)
  const refresh = useCallback(async () => {
    const g = ++gen.current
    try {
      const d = await load()
      if (g === gen.current) {
        setData(d)
        setError('')
      }
    } catch (e) {
      if (g === gen.current) setError(errText(e))
    }
  }, deps)
  useEffect(() => {
    refresh()
    if (ms <= 0) return
    const t = setInterval(() => {
      if (document.visibilityState !== 'hidden') refresh()
    }, ms)
    return () => {
      clearInterval(t)
      gen.current++
    }
  }, [refresh, ms])
  return { data, error, refresh }
}

/** useAction wraps an async operation with busy and error state. */
export function useAction() {
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState('')
  const run = useCallback(async (f: () => Promise<unknown>) => {
    setBusy(true)
    setError('')
    try {
      await f()
      return true
    } catch (e) {
      setError(errText(e))
      return false
    } finally {
      setBusy(false)
    }
  }, [])
  return { busy, error, setError, run }
}

export function StateBadge({ state }: { state: string }) {
  return (
    <span class={`badge state-${state.toLowerCase()}`} data-state={state}>
      {state}
    </span>
  )
}

export function ErrorBox({ error }: { error?: string }) {
  if (!error) return null
  return (
    <div class="error" role="alert">
      {error}
    </div>
  )
}

export function Empty({ children }: { children: ComponentChildren }) {
  return <div class="empty">{children}</div>
}

export function Field(props: { label: string; hint?: string; children: ComponentChildren }) {
  return (
    <label class="field">
      <span class="field-label">{props.label}</span>
      {props.children}
      {props.hint && <span class="field-hint">{props.hint}</span>}
    </label>
  )
}

export function since(iso?: string): string {
  if (!iso) return '—'
  const t = Date.parse(iso)
  if (Number.isNaN(t)) return iso
  const s = Math.round((Date.now() - t) / 1000)
  const abs = Math.abs(s)
  const unit = abs < 60 ? `${abs}s` : abs < 3600 ? `${Math.floor(abs / 60)}m` : abs < 86400 ? `${Math.floor(abs / 3600)}h` : `${Math.floor(abs / 86400)}d`
  return s >= 0 ? `${unit} ago` : `in ${unit}`
}

export function bytes(n: number): string {
  if (n < 1024) return `${n} B`
  const u = ['KiB', 'MiB', 'GiB', 'TiB']
  let v = n / 1024
  let i = 0
  while (v >= 1024 && i < u.length - 1) {
    v /= 1024
    i++
  }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${u[i]}`
}

/** kv parses "a=1, b=2" or one pair per line into a map. */
export function parseKV(text: string): Record<string, string> {
  const out: Record<string, string> = {}
  for (const part of text.split(/[\n,]/)) {
    const p = part.trim()
    if (!p) continue
    const i = p.indexOf('=')
    if (i <= 0) throw new Error(`"${p}" is not KEY=VALUE`)
    out[p.slice(0, i).trim()] = p.slice(i + 1).trim()
  }
  return out
}

/** splitArgs splits a command line into words, honouring single and double quotes. */
export function splitArgs(s: string): string[] {
  const out: string[] = []
  let cur = ''
  let quote = ''
  let has = false
  for (const ch of s) {
    if (quote) {
      if (ch === quote) quote = ''
      else cur += ch
    } else if (ch === '"' || ch === "'") {
      quote = ch
      has = true
    } else if (/\s/.test(ch)) {
      if (has || cur) out.push(cur)
      cur = ''
      has = false
    } else {
      cur += ch
    }
  }
  if (quote) throw new Error('unterminated quote in the entrypoint')
  if (has || cur) out.push(cur)
  return out
}

/** saveBlob offers a blob to the user as a download. */
export function saveBlob(blob: Blob, name: string) {
  const url = URL.createObjectURL(blob)
  const a = document.createElement('a')
  a.href = url
  a.download = name
  document.body.appendChild(a)
  a.click()
  a.remove()
  setTimeout(() => URL.revokeObjectURL(url), 30_000)
}
