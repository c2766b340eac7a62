// A file browser on the sandbox through the agent's files API: list a
// directory, upload into it, download and delete files.
import { useRef, useState } from 'preact/hooks'
import type { FileInfo } from '../api'
import { agent, api, raw } from '../api'
import { Empty, ErrorBox, bytes, saveBlob, since, useAction, useMe, usePoll } from '../ui'

const Folder = () => (
  <svg class="icon" viewBox="0 0 16 16" aria-hidden="true">
    <path d="M1.5 3.5h4.2l1.4 1.6h7.4v7.4h-13z" fill="#f1c45b" stroke="#c99a2e" />
  </svg>
)

const FileIcon = ({ link }: { link?: boolean }) => (
  <svg class="icon" viewBox="0 0 16 16" aria-hidden="true">
    <path d="M3.5 1.5h6l3 3v10h-9z" fill="#fff" stroke="#7d8f98" />
    <path d="M9.5 1.5v3h3" fill="none" stroke="#7d8f98" />
    {link && <path d="M5.5 11.5l4-4m-3 0h3v3" fill="none" stroke="#2b8a9e" stroke-width="1.4" />}
  </svg>
)

function join(dir: string, name: string) {
  return (dir.endsWith('/') ? dir : dir + '/') + name
}

function parent(dir: string) {
  const p = dir.replace(/\/+$/, '')
  const i = p.lastIndexOf('/')
  return i <= 0 ? '/' : p.slice(0, i)
}

function base(p: string) {
  const s = p.replace(/\/+$/, '')
  return s.slice(s.lastIndexOf('/') + 1) || '/'
}

export function Files({ id }: { id: string }) {
  const me = useMe()
  const [dir, setDir] = useState('/tmp')
  const [input, setInput] = useState('/tmp')
  const fileInput = useRef<HTMLInputElement>(null)
  const act = useAction()
  const list = usePoll(
    () => api<FileInfo[]>('GET', agent(id, `/directories/list?${new URLSearchParams({ path: dir, depth: '1' })}`)),
    0,
    [id, dir],
  )
  const go = (d: string) => {
    setDir(d)
    setInput(d)
  }
  const entries = (list.data ?? []).filter((f) => f.path.replace(/\/+$/, '') !== dir.replace(/\/+$/, '')).sort((a, b) => {
    if ((a.type === 'directory') !== (b.type === 'directory')) return a.type === 'directory' ? -1 : 1
    return a.path.localeCompare(b.path)
  })

  const upload = () =>
    act.run(async () => {
      const files = Array.from(fileInput.current?.files ?? [])
      for (const f of files) {
        // The agent reads both parts as files: metadata must carry a filename.
        const fd = new FormData()
        fd.append('metadata', new Blob([JSON.stringify({ path: join(dir, f.name) })], { type: 'application/json' }), 'metadata')
        fd.append('file', f, f.name)
        await raw('/api' + agent(id, '/files/upload'), { method: 'POST', body: fd })
      }
      if (fileInput.current) fileInput.current.value = ''
      await list.refresh()
    })

  const download = (f: FileInfo) =>
    act.run(async () => {
      const res = await raw('/api' + agent(id, `/files/download?${new URLSearchParams({ path: f.path })}`))
      saveBlob(await res.blob(), base(f.path))
    })

  const remove = (f: FileInfo) =>
    act.run(async () => {
      if (!confirm(`Delete ${f.path}?`)) return
      const q = new URLSearchParams({ path: f.path })
      await api('DELETE', agent(id, f.type === 'directory' ? `/directories?${q}` : `/files?${q}`))
      await list.refresh()
    })

  return (
    <div class="files">
      <form
        class="files-bar"
        onSubmit={(e) => {
          e.preventDefault()
          go(input.trim() || '/')
        }}
      >
        <button type="button" class="small" onClick={() => go(parent(dir))} disabled={dir === '/'} title="parent directory">
          ↑
        </button>
        <input name="path" class="mono grow" value={input} onInput={(e) => setInput((e.target as HTMLInputElement).value)} />
        <button type="submit" class="small">
          Open
        </button>
        <button type="button" class="small" onClick={() => list.refresh()}>
          Refresh
        </button>
        {me.canMutate && (
          <label class="button small primary upload">
            Upload
            <input type="file" multiple ref={fileInput} onChange={upload} data-testid="upload-input" />
          </label>
        )}
      </form>
      <ErrorBox error={list.error || act.error} />
      {list.data && entries.length === 0 ? (
        <Empty>Empty directory.</Empty>
      ) : (
        <table class="table compact" data-testid="file-table">
          <thead>
            <tr>
              <th>Name</th>
              <th>Size</th>
              <th>Mode</th>
              <th>Modified</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {entries.map((f) => (
              <tr key={f.path} data-path={f.path}>
                <td class="mono">
                  {f.type === 'directory' ? (
                    <a
                      href="#"
                      onClick={(e) => {
                        e.preventDefault()
                        go(f.path)
                      }}
                    >
                      <Folder /> {base(f.path)}/
                    </a>
                  ) : (
                    <span>
                      <FileIcon link={f.type === 'symlink'} /> {base(f.path)}
                    </span>
                  )}
                </td>
                <td>{f.type === 'directory' ? '—' : bytes(f.size)}</td>
                <td class="mono small">{f.mode}</td>
                <td title={f.modified_at}>{since(f.modified_at)}</td>
                <td class="right nowrap">
                  {f.type === 'file' && (
                    <button class="small" disabled={act.busy} onClick={() => download(f)}>
                      Download
                    </button>
                  )}
                  {me.canMutate && (
                    <button class="small danger" disabled={act.busy} onClick={() => remove(f)}>
                      Delete
                    </button>
                  )}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </div>
  )
}
