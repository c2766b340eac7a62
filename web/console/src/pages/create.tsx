import { useState } from 'preact/hooks'
import type { Pool, Sandbox, Snapshot } from '../api'
import { api } from '../api'
import { ErrorBox, Field, parseKV, splitArgs, useAction, useMe, usePoll } from '../ui'

/** parseRules reads egress rules, one "allow|deny TARGET" per line. */
function parseRules(text: string) {
  const rules: { action: string; target: string }[] = []
  for (const line of text.split('\n')) {
    const l = line.trim()
    if (!l) continue
    const [action, target, ...rest] = l.split(/\s+/)
    if ((action !== 'allow' && action !== 'deny') || !target || rest.length) {
      throw new Error(`egress rule "${l}": write "allow TARGET" or "deny TARGET"`)
    }
    rules.push({ action, target })
  }
  return rules
}

/** CreateSandbox is the create form: image or pool or snapshot, entrypoint, env, resources, timeout, network policy. */
export function CreateSandbox() {
  const me = useMe()
  const [source, setSource] = useState<'image' | 'pool' | 'snapshot'>('image')
  const [image, setImage] = useState('')
  const [pool, setPool] = useState('')
  const [snapshot, setSnapshot] = useState('')
  const [entrypoint, setEntrypoint] = useState('tail -f /dev/null')
  const [env, setEnv] = useState('')
  const [metadata, setMetadata] = useState('')
  const [cpu, setCpu] = useState('')
  const [memory, setMemory] = useState('')
  const [timeout, setTimeoutS] = useState('3600')
  const [runtime, setRuntime] = useState('')
  const [netDefault, setNetDefault] = useState('')
  const [rules, setRules] = useState('')
  const act = useAction()
  const pools = usePoll(() => api<{ items: Pool[] }>('GET', '/v1/pools'), 0)
  const snaps = usePoll(() => api<{ items: Snapshot[] }>('GET', '/v1/snapshots?pageSize=200'), 0)

  if (!me.canMutate) return <div class="empty">Your role ({me.principal.role}) cannot create sandboxes.</div>

  const submit = (e: Event) => {
    e.preventDefault()
    act.run(async () => {
      const body: Record<string, unknown> = {}
      if (source === 'image') {
        if (!image.trim()) throw new Error('image is required')
        body.image = { uri: image.trim() }
      } else if (source === 'pool') {
        if (!pool) throw new Error('choose a pool')
        body.extensions = { poolRef: pool }
      } else {
        if (!snapshot) throw new Error('choose a snapshot')
        body.snapshotId = snapshot
      }
      const ep = splitArgs(entrypoint)
      if (ep.length) body.entrypoint = ep
      const envMap = parseKV(env)
      if (Object.keys(envMap).length) body.env = envMap
      const md = parseKV(metadata)
      if (Object.keys(md).length) body.metadata = md
      const res: Record<string, string> = {}
      if (cpu.trim()) res.cpu = cpu.trim()
      if (memory.trim()) res.memory = memory.trim()
      if (Object.keys(res).length) body.resourceLimits = res
      if (timeout.trim()) {
        const n = Number(timeout)
        if (!Number.isInteger(n) || n < 60) throw new Error('timeout is whole seconds, at least 60 (empty: no expiry)')
        body.timeout = n
      }
      if (runtime) body.extensions = { ...((body.extensions as object) ?? {}), 'moat.runtime': runtime }
      if (netDefault) body.networkPolicy = { defaultAction: netDefault, egress: parseRules(rules) }
      const sb = await api<Sandbox>('POST', '/v1/sandboxes', body)
      location.hash = `#/sandboxes/${encodeURIComponent(sb.id)}`
    })
  }

  const tab = (v: typeof source, label: string) => (
    <button type="button" class={source === v ? 'seg active' : 'seg'} onClick={() => setSource(v)}>
      {label}
    </button>
  )
  const inp = (set: (v: string) => void) => (e: Event) => set((e.target as HTMLInputElement).value)

  return (
    <section>
      <header class="page-head">
        <h1>New sandbox</h1>
      </header>
      <form class="card form" onSubmit={submit} data-testid="create-form">
        <div class="segmented">
          {tab('image', 'Image')}
          {tab('pool', 'Warm pool')}
          {tab('snapshot', 'Snapshot')}
        </div>
        {source === 'image' && (
          <Field label="Image" hint="an image reference the server can pull or has imported">
            <input name="image" required value={image} onInput={inp(setImage)} placeholder="busybox:latest" />
          </Field>
        )}
        {source === 'pool' && (
          <Field label="Pool" hint="claims an idle, already running sandbox">
            <select name="pool" value={pool} onChange={inp(setPool)}>
              <option value="">choose…</option>
              {(pools.data?.items ?? []).map((p) => (
                <option value={p.name}>
                  {p.name} ({p.status.available} idle)
                </option>
              ))}
            </select>
          </Field>
        )}
        {source === 'snapshot' && (
          <Field label="Snapshot">
            <select name="snapshot" value={snapshot} onChange={inp(setSnapshot)}>
              <option value="">choose…</option>
              {(snaps.data?.items ?? []).map((s) => (
                <option value={s.id}>
                  {s.name || s.id} (from {s.sandboxId})
                </option>
              ))}
            </select>
          </Field>
        )}
        <div class="grid2">
          <Field label="Entrypoint" hint="words split like a shell; quotes group">
            <input name="entrypoint" class="mono" value={entrypoint} onInput={inp(setEntrypoint)} />
          </Field>
          <Field label="Timeout (s)" hint="at least 60; empty: no expiry">
            <input name="timeout" inputMode="numeric" value={timeout} onInput={inp(setTimeoutS)} />
          </Field>
          <Field label="CPU" hint='e.g. "1" or "500m"'>
            <input name="cpu" value={cpu} onInput={inp(setCpu)} />
          </Field>
          <Field label="Memory" hint='e.g. "512Mi"'>
            <input name="memory" value={memory} onInput={inp(setMemory)} />
          </Field>
          <Field label="Environment" hint="KEY=VALUE, one per line">
            <textarea name="env" rows={3} class="mono" value={env} onInput={inp(setEnv)} />
          </Field>
          <Field label="Metadata" hint="KEY=VALUE, one per line">
            <textarea name="metadata" rows={3} class="mono" value={metadata} onInput={inp(setMetadata)} />
          </Field>
          <Field label="Runtime class">
            <select name="runtime" value={runtime} onChange={inp(setRuntime)}>
              <option value="">server default</option>
              <option value="runc">runc</option>
              <option value="crun">crun</option>
              <option value="runsc">runsc (gVisor)</option>
            </select>
          </Field>
          <Field label="Network policy" hint="egress control (DNS + nftables)">
            <select name="netDefault" value={netDefault} onChange={inp(setNetDefault)}>
              <option value="">none (unrestricted)</option>
              <option value="deny">deny by default</option>
              <option value="allow">allow by default</option>
            </select>
          </Field>
        </div>
        {netDefault && (
          <Field label="Egress rules" hint='one per line: "allow pypi.org", "deny 10.0.0.0/8", "allow *.github.com"'>
            <textarea name="rules" rows={4} class="mono" value={rules} onInput={inp(setRules)} />
          </Field>
        )}
        <ErrorBox error={act.error} />
        <div class="actions">
          <a class="button" href="#/sandboxes">
            Cancel
          </a>
          <button class="primary" type="submit" disabled={act.busy}>
            {act.busy ? 'Creating…' : 'Create sandbox'}
          </button>
        </div>
      </form>
    </section>
  )
}
