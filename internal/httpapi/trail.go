package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/moat-sandbox/moat/internal/audit/trail"
	"github.com/moat-sandbox/moat/internal/tenant"
	"github.com/moat-sandbox/moat/internal/web"
)

// AuditTrail is the per-sandbox audit trail (internal/audit/trail.Store).
type AuditTrail interface {
	Append(trail.Record) error
	Read(id string, q trail.Query) ([]trail.Record, uint64, error)
	Owner(id string) (string, bool)
	// Active links the sandbox's egress and credential records to a
	// trace while a command runs (see trail.Store.Active).
	Active(id, traceID, spanID string) (release func())
}

// trailOwner is the tenant that owns sandbox id, looked up without the
// caller's scope ("", false: no such sandbox).
func (s *Server) trailOwner(id string) (string, bool) {
	sb, err := s.svc.Get(context.Background(), id)
	if err != nil {
		return "", false
	}
	return tenant.Normalize(sb.Tenant), true
}

// lifecycleAction names the trail action of a call on a sandbox, "" for
// calls the trail does not record (reads, and the server proxy, whose
// commands and file operations are recorded by what they do).
func lifecycleAction(method, kind, rest string) string {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return ""
	}
	switch kind {
	case "":
		switch method {
		case http.MethodPost:
			return "create"
		case http.MethodDelete:
			return "delete"
		}
		return strings.ToLower(method)
	case "proxy":
		// Port 18080 through the proxy is the egress API.
		if rest == "18080" || strings.HasPrefix(rest, "18080/") {
			return "egress"
		}
		return ""
	case "renew-expiration":
		return "renew"
	case "snapshots":
		return "snapshot"
	}
	return kind
}

// actorOf is the trail's actor of a principal.
func actorOf(p tenant.Principal) *trail.Actor {
	return &trail.Actor{KeyID: p.KeyID, Tenant: p.Tenant, Role: string(p.Role)}
}

// traceOf is the trace and span id of ctx's span ("" without tracing).
func traceOf(ctx context.Context) (traceID, spanID string) {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		return sc.TraceID().String(), sc.SpanID().String()
	}
	return "", ""
}

// withTrail records the lifecycle calls on sandboxes (create, delete,
// pause, resume, renew, metadata, snapshots, egress policy and Credential
// Vault changes) in the sandbox's trail, refused ones too when the
// sandbox exists. It must run inside WithRequestID.
func (s *Server) withTrail(tr AuditTrail, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, kind := sandboxOfPath(r.URL.Path)
		rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/v1"), "/sandboxes/"+id+"/")
		rest = strings.TrimPrefix(rest, kind+"/")
		action := lifecycleAction(r.Method, kind, rest)
		if action == "" || strings.HasPrefix(r.URL.Path, "/v2/") || id == "batch" {
			next.ServeHTTP(w, r)
			return
		}
		owner, known := "", false
		if id != "" {
			owner, known = s.trailOwner(id)
		}
		start := time.Now()
		sw := &web.StatusWriter{ResponseWriter: w}
		slot, _ := r.Context().Value(authSlotKey{}).(*authSlot)
		if slot == nil {
			r, slot = withAuthSlot(r)
		}
		next.ServeHTTP(sw, r)
		status := sw.Status()
		if status == 0 {
			status = http.StatusOK
		}
		if id == "" && status/100 == 2 {
			if loc := w.Header().Get("Location"); loc != "" {
				id, _ = sandboxOfPath(loc)
				owner, known = s.trailOwner(id)
			}
		}
		if id == "" || !known {
			return // no sandbox to keep a trail for
		}
		d := float64(time.Since(start).Microseconds()) / 1000
		rec := trail.Record{Time: start, Kind: trail.KindLifecycle, Action: action, SandboxID: id, Tenant: owner,
			RequestID: web.RequestID(r.Context()), Status: status, DurationMS: &d}
		rec.TraceID, rec.SpanID = traceOf(r.Context())
		if slot.ok {
			rec.Actor = actorOf(slot.p)
		}
		if err := tr.Append(rec); err != nil {
			s.log.Warn("audit trail write failed", "err", err, "id", id)
		}
	})
}

// agentTrail records what a request to a sandbox's agent does: commands,
// terminal sessions and file operations. It reads a request body only as
// far as needed (bounded), and a response only for a command's outcome;
// it never records a body, an environment or output.
type agentTrail struct {
	tr  AuditTrail
	s   *Server
	log interface {
		Warn(string, ...any)
	}
}

// maxPeek bounds the request body read to describe a call.
const maxPeek = 64 << 10

// peekBody reads up to maxPeek bytes of r's body and puts them back in
// front of the rest. ok is false when the body is longer (not parsed).
func peekBody(r *http.Request) ([]byte, bool) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, true
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, maxPeek+1))
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(b), r.Body), r.Body}
	return b, err == nil && len(b) <= maxPeek
}

// commandBody is the part of a command, code or terminal request the
// trail records (never its envs).
type commandBody struct {
	Command    string `json:"command"`
	Code       string `json:"code"`
	Cwd        string `json:"cwd"`
	Background bool   `json:"background"`
	UID        *int   `json:"uid"`
	GID        *int   `json:"gid"`
}

func truncate(s string) string {
	if len(s) <= trail.MaxLine {
		return s
	}
	return s[:trail.MaxLine] + "…"
}

// wrap returns the writer and request to proxy r with, and done to call
// once the exchange ends. path is the agent path.
func (a *agentTrail) wrap(w http.ResponseWriter, r *http.Request, id, path string) (http.ResponseWriter, *http.Request, func()) {
	rec := trail.Record{SandboxID: id, RequestID: web.RequestID(r.Context())}
	if p, ok := tenant.PrincipalFrom(r.Context()); ok {
		rec.Actor = actorOf(p)
	}
	start := time.Now()
	q := r.URL.Query()
	var scan *streamScan
	var upload *uploadScan
	var ptyOpen bool
	switch {
	case r.Method == http.MethodPost && (path == "/command" || path == "/code" || strings.HasPrefix(path, "/session/") && strings.HasSuffix(path, "/run")):
		rec.Kind, rec.Action = trail.KindCommand, trail.ActionRun
		if path == "/code" {
			rec.Action = "code"
		}
		cmd := &trail.Command{}
		if b, ok := peekBody(r); ok {
			var body commandBody
			if json.Unmarshal(b, &body) == nil {
				line := body.Command
				if line == "" {
					line = body.Code
				}
				cmd = &trail.Command{Line: truncate(line), Cwd: body.Cwd, Background: body.Background, UID: body.UID, GID: body.GID}
			}
		}
		rec.Command = cmd
		scan = &streamScan{}
	case r.Method == http.MethodDelete && path == "/command":
		rec.Kind, rec.Action = trail.KindCommand, "interrupt"
		rec.Command = &trail.Command{Session: q.Get("id")}
	case r.Method == http.MethodPost && path == "/pty":
		rec.Kind, rec.Action = trail.KindPTY, trail.ActionOpen
		rec.Command = &trail.Command{}
		if b, ok := peekBody(r); ok {
			var body commandBody
			if json.Unmarshal(b, &body) == nil {
				rec.Command = &trail.Command{Line: truncate(body.Command), Cwd: body.Cwd}
			}
		}
		ptyOpen = true
	case strings.HasPrefix(path, "/pty/") && strings.HasSuffix(path, "/ws"):
		rec.Kind, rec.Action = trail.KindPTY, trail.ActionAttach
		rec.Command = &trail.Command{Session: strings.TrimSuffix(strings.TrimPrefix(path, "/pty/"), "/ws")}
	case r.Method == http.MethodDelete && strings.HasPrefix(path, "/pty/"):
		rec.Kind, rec.Action = trail.KindPTY, trail.ActionClose
		rec.Command = &trail.Command{Session: strings.TrimPrefix(path, "/pty/")}
	case r.Method == http.MethodPost && path == "/files/upload":
		rec.Kind, rec.Action = trail.KindFile, trail.ActionWrite
		upload = newUploadScan(r)
	case r.Method == http.MethodPost && path == "/files/mv":
		rec.Kind, rec.Action = trail.KindFile, trail.ActionMove
		if b, ok := peekBody(r); ok {
			var moves []struct{ Src, Dest string }
			json.Unmarshal(b, &moves)
			for _, m := range moves {
				rec.Files = append(rec.Files, trail.File{Path: m.Src, Dest: m.Dest})
			}
		}
	case r.Method == http.MethodDelete && (path == "/files" || path == "/directories"):
		rec.Kind, rec.Action = trail.KindFile, trail.ActionRemove
		for _, p := range q["path"] {
			rec.Files = append(rec.Files, trail.File{Path: p})
		}
	case r.Method == http.MethodPost && (path == "/directories" || path == "/files/permissions" || path == "/files/replace"):
		rec.Kind = trail.KindFile
		rec.Action = map[string]string{"/directories": trail.ActionMkdir, "/files/permissions": trail.ActionChmod, "/files/replace": trail.ActionReplace}[path]
		if b, ok := peekBody(r); ok {
			var m map[string]json.RawMessage
			json.Unmarshal(b, &m)
			for p := range m {
				rec.Files = append(rec.Files, trail.File{Path: p})
			}
		}
	default:
		return w, r, func() {}
	}
	owner, known := a.s.trailOwner(id)
	if !known {
		return w, r, func() {}
	}
	rec.Tenant = owner
	// The request's span (a no-op without tracing) is the operation's:
	// one request through the proxy is one command or file operation, so
	// it is renamed for it rather than given a child, which would double
	// what tracing costs a command. The record names it.
	span := trace.SpanFromContext(r.Context())
	span.SetName("execd " + string(rec.Kind) + " " + rec.Action)
	span.SetAttributes(attribute.String("osbx.id", id))
	rec.TraceID, rec.SpanID = traceOf(r.Context())
	release := func() {}
	if rec.Kind == trail.KindCommand || rec.Kind == trail.KindPTY {
		release = a.tr.Active(id, rec.TraceID, rec.SpanID)
	}
	sw := &trailWriter{StatusWriter: web.StatusWriter{ResponseWriter: w}, scan: scan}
	if ptyOpen {
		sw.keep = &bytes.Buffer{}
	}
	return sw, r, func() {
		release()
		d := float64(time.Since(start).Microseconds()) / 1000
		rec.Time, rec.DurationMS, rec.Status = start, &d, sw.Status()
		if rec.Status == 0 {
			rec.Status = http.StatusOK
		}
		if scan != nil && rec.Command != nil {
			rec.Command.ExitCode, rec.Command.Error = scan.exit, scan.err
			if rec.Command.Session == "" {
				rec.Command.Session = scan.id
			}
		}
		if upload != nil {
			rec.Files = upload.wait()
		}
		if ptyOpen && sw.keep != nil {
			var body struct {
				SessionID string `json:"session_id"`
			}
			if json.Unmarshal(sw.keep.Bytes(), &body) == nil {
				rec.Command.Session = body.SessionID
			}
		}
		if rec.Command != nil && rec.Command.ExitCode != nil {
			span.SetAttributes(attribute.Int("process.exit.code", *rec.Command.ExitCode))
		}
		if err := a.tr.Append(rec); err != nil {
			a.log.Warn("audit trail write failed", "err", err, "id", id)
		}
	}
}

// trailWriter passes a proxied response through, scanning an event
// stream for the command's outcome, or keeping a small JSON answer.
type trailWriter struct {
	web.StatusWriter
	scan *streamScan
	keep *bytes.Buffer // at most 4 KiB of the body
}

func (w *trailWriter) Write(b []byte) (int, error) {
	if w.scan != nil {
		w.scan.feed(b)
	}
	if w.keep != nil && w.keep.Len()+len(b) <= 4<<10 {
		w.keep.Write(b)
	}
	return w.StatusWriter.Write(b)
}

func (w *trailWriter) Unwrap() http.ResponseWriter { return w.StatusWriter.ResponseWriter }

// streamScan finds, in the agent's event stream (compact JSON objects
// each followed by a blank line), the init event's id and the outcome: an
// error event (a shell command's exit code is its evalue) or
// execution_complete (exit code 0). Output events are skipped unparsed.
type streamScan struct {
	frame []byte // the start of the current frame (bounded)
	skip  bool   // the current frame is output: skip to its end
	nl    bool   // the last byte seen was a newline
	done  bool
	id    string
	exit  *int
	err   string
}

const maxFrame = 4 << 10

func (s *streamScan) feed(b []byte) {
	for len(b) > 0 && !s.done {
		if s.nl && b[0] == '\n' { // a chunk ended in "\n", this one starts with it
			s.end()
			b = b[1:]
			s.nl = false
			continue
		}
		i := bytes.Index(b, []byte("\n\n"))
		if i < 0 {
			s.add(b)
			s.nl = b[len(b)-1] == '\n'
			return
		}
		s.add(b[:i])
		s.end()
		b = b[i+2:]
		s.nl = false
	}
}

func (s *streamScan) add(b []byte) {
	if s.skip {
		return
	}
	s.frame = append(s.frame, b...)
	if len(s.frame) >= 16 && !bytes.HasPrefix(s.frame, []byte(`{"type":"e`)) && !bytes.HasPrefix(s.frame, []byte(`{"type":"i`)) {
		s.skip, s.frame = true, s.frame[:0]
	}
	if len(s.frame) > maxFrame {
		s.skip, s.frame = true, s.frame[:0]
	}
}

// end handles a whole frame.
func (s *streamScan) end() {
	frame := bytes.TrimSpace(s.frame)
	s.frame, s.skip = s.frame[:0], false
	if len(frame) == 0 {
		return
	}
	var ev struct {
		Type  string `json:"type"`
		Text  string `json:"text"`
		Error *struct {
			EName  string `json:"ename"`
			EValue string `json:"evalue"`
		} `json:"error"`
	}
	if json.Unmarshal(frame, &ev) != nil {
		return
	}
	switch ev.Type {
	case "init":
		s.id = ev.Text
	case "execution_complete":
		if s.exit == nil && s.err == "" {
			zero := 0
			s.exit = &zero
		}
		s.done = true
	case "error":
		if ev.Error != nil {
			if code, err := strconv.Atoi(ev.Error.EValue); err == nil && ev.Error.EName == "CommandExecError" {
				s.exit = &code
			} else {
				s.err = truncate(ev.Error.EName + ": " + ev.Error.EValue)
			}
		}
		s.done = true
	}
}

// uploadScan reads an upload's multipart body as the proxy sends it on,
// for the paths (from the metadata parts) and sizes of its files.
type uploadScan struct {
	pw    *io.PipeWriter
	files chan []trail.File
}

func newUploadScan(r *http.Request) *uploadScan {
	_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if err != nil || params["boundary"] == "" || r.Body == nil {
		return nil
	}
	pr, pw := io.Pipe()
	u := &uploadScan{pw: pw, files: make(chan []trail.File, 1)}
	body := r.Body
	r.Body = struct {
		io.Reader
		io.Closer
	}{io.TeeReader(body, pw), body}
	go func() {
		var out []trail.File
		mr := multipart.NewReader(pr, params["boundary"])
		for {
			part, err := mr.NextPart()
			if err != nil {
				break
			}
			switch part.FormName() {
			case "metadata":
				var md struct {
					Path string `json:"path"`
				}
				b, _ := io.ReadAll(io.LimitReader(part, 4<<10))
				if json.Unmarshal(b, &md) == nil {
					out = append(out, trail.File{Path: md.Path})
				}
			case "file":
				n, _ := io.Copy(io.Discard, part)
				for i := range out {
					if out[i].Size == nil {
						out[i].Size = &n
						break
					}
				}
			}
		}
		io.Copy(io.Discard, pr) // the tee never blocks on a reader that gave up
		u.files <- out
	}()
	return u
}

// wait ends the scan (the proxy has sent the body) and returns the files.
func (u *uploadScan) wait() []trail.File {
	if u == nil {
		return nil
	}
	u.pw.Close()
	return <-u.files
}
