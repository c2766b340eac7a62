import { useState } from 'preact/hooks'
import type { SessionInfo } from '../api'
import { errText, signIn } from '../api'

export function SignIn({ onSignedIn }: { onSignedIn: (s: SessionInfo) => void }) {
  const [key, setKey] = useState('')
  const [error, setError] = useState('')
  const [busy, setBusy] = useState(false)
  const submit = async (e: Event) => {
    e.preventDefault()
    setBusy(true)
    setError('')
    try {
      const s = await signIn(key)
      setKey('')
      onSignedIn(s)
    } catch (err) {
      setError(errText(err))
    } finally {
      setBusy(false)
    }
  }
  return (
    <div class="signin">
      <form class="card signin-card" onSubmit={submit}>
        <div class="brand big">
          <img src="/console/favicon.svg" alt="" width="40" height="40" />
          <span>moat</span>
        </div>
        <p class="muted">Sign in with an API key. The key is sent once and kept on the server; this browser only holds a session cookie.</p>
        <label class="field">
          <span class="field-label">API key</span>
          <input
            type="password"
            name="apiKey"
            autocomplete="off"
            required
            autofocus
            value={key}
            onInput={(e) => setKey((e.target as HTMLInputElement).value)}
          />
        </label>
        {error && (
          <div class="error" role="alert">
            {error}
          </div>
        )}
        <button class="primary" type="submit" disabled={busy || !key}>
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
      </form>
    </div>
  )
}
