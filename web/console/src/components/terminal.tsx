// A terminal on the sandbox: xterm.js over the agent's PTY WebSocket
// (POST /pty, then /pty/{id}/ws), reached through the server proxy route
// under /console/api with a single-use ticket.
import { useEffect, useRef, useState } from 'preact/hooks'
import { Terminal as XTerm } from '@xterm/xterm'
import { FitAddon } from '@xterm/addon-fit'
import { agent, api, errText, wsURL } from '../api'

const STDIN = 0x00
const STDOUT = 0x01
const STDERR = 0x02
const REPLAY = 0x03

type Status = 'connecting' | 'connected' | 'exited' | 'closed' | 'error'

export function Terminal({ id }: { id: string }) {
  const host = useRef<HTMLDivElement>(null)
  const [status, setStatus] = useState<Status>('connecting')
  const [detail, setDetail] = useState('')
  const [gen, setGen] = useState(0) // bump to reconnect

  useEffect(() => {
    const term = new XTerm({
      cursorBlink: true,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace',
      fontSize: 13,
      theme: { background: '#0b1620', foreground: '#d8e6ea', cursor: '#5fd3c4' },
      scrollback: 5000,
    })
    const fit = new FitAddon()
    term.loadAddon(fit)
    term.open(host.current!)
    fit.fit()
    let ws: WebSocket | null = null
    let ptyID = ''
    let disposed = false
    const enc = new TextEncoder()
    setStatus('connecting')
    setDetail('')

    const sendResize = () => {
      if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }))
    }
    const onData = term.onData((d) => {
      if (ws?.readyState !== WebSocket.OPEN) return
      const b = enc.encode(d)
      const frame = new Uint8Array(b.length + 1)
      frame[0] = STDIN
      frame.set(b, 1)
      ws.send(frame)
    })
    const ro = new ResizeObserver(() => {
      fit.fit()
      sendResize()
    })
    ro.observe(host.current!)

    ;(async () => {
      try {
        const s = await api<{ session_id: string }>('POST', agent(id, '/pty'), {})
        ptyID = s.session_id
        if (disposed) return
        const url = await wsURL(agent(id, `/pty/${encodeURIComponent(ptyID)}/ws`))
        if (disposed) return
        ws = new WebSocket(url)
        ws.binaryType = 'arraybuffer'
        ws.onopen = () => sendResize()
        ws.onmessage = (ev) => {
          if (typeof ev.data === 'string') {
            const m = JSON.parse(ev.data)
            if (m.type === 'connected') {
              setStatus('connected')
              sendResize()
              term.focus()
            } else if (m.type === 'exit') {
              setStatus('exited')
              setDetail(`exit code ${m.exit_code}`)
            } else if (m.type === 'error') {
              setStatus('error')
              setDetail(`${m.code ?? 'ERROR'}: ${m.message ?? m.error ?? ''}`)
            }
            return
          }
          const b = new Uint8Array(ev.data as ArrayBuffer)
          if (b.length === 0) return
          if (b[0] === STDOUT || b[0] === STDERR) term.write(b.subarray(1))
          else if (b[0] === REPLAY && b.length > 9) term.write(b.subarray(9))
        }
        ws.onclose = (ev) => {
          if (disposed) return
          setStatus((s) => (s === 'exited' || s === 'error' ? s : 'closed'))
          if (ev.code !== 1000 && ev.code !== 1005) setDetail((d) => d || `connection closed (${ev.code}${ev.reason ? ' ' + ev.reason : ''})`)
        }
      } catch (e) {
        if (!disposed) {
          setStatus('error')
          setDetail(errText(e))
        }
      }
    })()

    return () => {
      disposed = true
      onData.dispose()
      ro.disconnect()
      ws?.close(1000)
      term.dispose()
      if (ptyID) api('DELETE', agent(id, `/pty/${encodeURIComponent(ptyID)}`)).catch(() => {})
    }
  }, [id, gen])

  return (
    <div class="terminal-wrap">
      <div class="terminal-bar">
        <span class={`dot dot-${status}`} />
        <span data-testid="terminal-status">{status}</span>
        {detail && <span class="muted small">{detail}</span>}
        {(status === 'exited' || status === 'closed' || status === 'error') && (
          <button class="small" onClick={() => setGen(gen + 1)}>
            New session
          </button>
        )}
      </div>
      <div class="terminal" ref={host} data-testid="terminal" />
    </div>
  )
}

