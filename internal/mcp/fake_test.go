package mcp

import (
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeMoat is an httptest lifecycle server with one in-process agent per
// sandbox under /agent/{id}, all on loopback. Images steer creation:
// "img/ok" is Running at once, "img/slow" after two polls, "img/fail"
// turns Failed, "img/bad" is rejected with 400.
type fakeMoat struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	sandboxes map[string]*fakeSandbox
	nextID    int
	creates   []map[string]any // decoded create bodies
	deletes   []string
	commands  []map[string]any // decoded command bodies
	apiKeys   []string         // OPEN-SANDBOX-API-KEY of lifecycle calls
}

type fakeSandbox struct {
	id, image, state string
	polls            int // GETs left before a slow sandbox settles
	settle           string
	files            map[string]fakeFile
	metadata         map[string]string
}

type fakeFile struct {
	data []byte
	mode int
}

const fakeAgentToken = "agent-token"

func newFakeMoat(t *testing.T) *fakeMoat {
	t.Helper()
	f := &fakeMoat{t: t, sandboxes: map[string]*fakeSandbox{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", f.create)
	mux.HandleFunc("GET /v1/sandboxes", f.list)
	mux.HandleFunc("GET /v1/sandboxes/{id}", f.get)
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", f.delete)
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", f.setState("Running", "Paused"))
	mux.HandleFunc("POST /v1/sandboxes/{id}/resume", f.setState("Paused", "Running"))
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/{port}", f.endpoint)
	mux.HandleFunc("POST /agent/{id}/command", f.agent(f.command))
	mux.HandleFunc("POST /agent/{id}/files/upload", f.agent(f.upload))
	mux.HandleFunc("GET /agent/{id}/files/download", f.agent(f.download))
	mux.HandleFunc("GET /agent/{id}/directories/list", f.agent(f.listDir))
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") {
			f.mu.Lock()
			f.apiKeys = append(f.apiKeys, r.Header.Get("OPEN-SANDBOX-API-KEY"))
			f.mu.Unlock()
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func apiErr(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, map[string]string{"code": code, "message": msg})
}

func (sb *fakeSandbox) wire() map[string]any {
	return map[string]any{"id": sb.id, "image": map[string]string{"uri": sb.image}, "status": map[string]any{"state": sb.state, "reason": reasonOf(sb.state)},
		"metadata": sb.metadata, "entrypoint": []string{"tail"}, "createdAt": "2026-01-02T03:04:05Z"}
}

func reasonOf(state string) string {
	if state == "Failed" {
		return "image_pull_failed"
	}
	return ""
}

func (f *fakeMoat) create(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		apiErr(w, 400, "SANDBOX::INVALID_REQUEST", "bad json")
		return
	}
	img, _ := body["image"].(map[string]any)
	uri, _ := img["uri"].(string)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.creates = append(f.creates, body)
	if uri == "img/bad" {
		apiErr(w, 400, "SANDBOX::INVALID_IMAGE", `image "img/bad" is not a valid reference`)
		return
	}
	f.nextID++
	sb := &fakeSandbox{id: fmt.Sprintf("sb%d", f.nextID), image: uri, state: "Running", files: map[string]fakeFile{}}
	if md, ok := body["metadata"].(map[string]any); ok {
		sb.metadata = map[string]string{}
		for k, v := range md {
			sb.metadata[k] = fmt.Sprint(v)
		}
	}
	switch uri {
	case "img/slow":
		sb.state, sb.polls, sb.settle = "Pending", 2, "Running"
	case "img/fail":
		sb.state, sb.polls, sb.settle = "Pending", 1, "Failed"
	}
	f.sandboxes[sb.id] = sb
	out := sb.wire()
	delete(out, "image")
	writeJSON(w, 202, out)
}

func (f *fakeMoat) lookup(w http.ResponseWriter, id string) *fakeSandbox {
	sb := f.sandboxes[id]
	if sb == nil {
		apiErr(w, 404, "SANDBOX::NOT_FOUND", fmt.Sprintf("sandbox %s not found", id))
	}
	return sb
}

func (f *fakeMoat) get(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.lookup(w, r.PathValue("id"))
	if sb == nil {
		return
	}
	if sb.polls > 0 {
		if sb.polls--; sb.polls == 0 {
			sb.state = sb.settle
		}
	}
	writeJSON(w, 200, sb.wire())
}

func (f *fakeMoat) list(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	states := r.URL.Query()["state"]
	var items []map[string]any
	ids := make([]string, 0, len(f.sandboxes))
	for id := range f.sandboxes {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		sb := f.sandboxes[id]
		if len(states) > 0 && !contains(states, sb.state) {
			continue
		}
		items = append(items, sb.wire())
	}
	writeJSON(w, 200, map[string]any{"items": items, "pagination": map[string]any{"page": 1, "pageSize": 50, "totalItems": len(items), "totalPages": 1, "hasNextPage": false}})
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if strings.EqualFold(v, s) {
			return true
		}
	}
	return false
}

func (f *fakeMoat) delete(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id := r.PathValue("id")
	f.deletes = append(f.deletes, id)
	if f.lookup(w, id) == nil {
		return
	}
	delete(f.sandboxes, id)
	w.WriteHeader(204)
}

func (f *fakeMoat) setState(from, to string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		sb := f.lookup(w, r.PathValue("id"))
		if sb == nil {
			return
		}
		if sb.state != from {
			apiErr(w, 409, "SANDBOX::INVALID_STATE", fmt.Sprintf("sandbox %s is %s, not %s", sb.id, sb.state, from))
			return
		}
		sb.state = to
		w.WriteHeader(204)
	}
}

func (f *fakeMoat) endpoint(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	sb := f.lookup(w, r.PathValue("id"))
	if sb == nil {
		return
	}
	if r.PathValue("port") != "44772" {
		apiErr(w, 404, "SANDBOX::NOT_FOUND", "no such port")
		return
	}
	writeJSON(w, 200, map[string]any{"endpoint": strings.TrimPrefix(f.srv.URL, "http://") + "/agent/" + sb.id,
		"headers": map[string]string{"X-EXECD-ACCESS-TOKEN": fakeAgentToken}})
}

// agent checks the agent token and resolves the sandbox.
func (f *fakeMoat) agent(h func(w http.ResponseWriter, r *http.Request, sb *fakeSandbox)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-EXECD-ACCESS-TOKEN") != fakeAgentToken {
			writeJSON(w, 401, map[string]string{"error": "Unauthorized"})
			return
		}
		f.mu.Lock()
		sb := f.lookup(w, r.PathValue("id"))
		f.mu.Unlock()
		if sb != nil {
			h(w, r, sb)
		}
	}
}

func sendEvents(w http.ResponseWriter, events ...map[string]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, e := range events {
		b, _ := json.Marshal(e)
		fmt.Fprintf(w, "%s\n\n", b)
		w.(http.Flusher).Flush()
	}
}

func exitEvent(code string, trace ...string) map[string]any {
	return map[string]any{"type": "error", "error": map[string]any{"ename": "CommandExecError", "evalue": code, "traceback": trace}}
}

// command answers a few scripted command lines, as the real agent would.
func (f *fakeMoat) command(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
	var body map[string]any
	_ = json.NewDecoder(r.Body).Decode(&body)
	f.mu.Lock()
	f.commands = append(f.commands, body)
	f.mu.Unlock()
	cmd, _ := body["command"].(string)
	initEv := map[string]any{"type": "init", "text": "0123456789abcdef0123456789abcdef"}
	switch {
	case cmd == "echo hi; exit 3":
		sendEvents(w, initEv, map[string]any{"type": "stdout", "text": "hi"}, exitEvent("3", "exit status 3"))
	case cmd == "ok":
		sendEvents(w, initEv, map[string]any{"type": "stdout", "text": "out"}, map[string]any{"type": "stderr", "text": "err"},
			map[string]any{"type": "execution_complete", "execution_time": 5})
	case strings.HasPrefix(cmd, "spam "):
		var n int
		fmt.Sscan(strings.TrimPrefix(cmd, "spam "), &n)
		evs := []map[string]any{initEv}
		for i := range n {
			evs = append(evs, map[string]any{"type": "stdout", "text": fmt.Sprintf("line %04d %s", i, strings.Repeat("x", 90))})
		}
		sendEvents(w, append(evs, map[string]any{"type": "execution_complete", "execution_time": 5})...)
	case cmd == "sleep":
		ms, _ := body["timeout"].(float64)
		sendEvents(w, initEv)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		sendEvents(w, exitEvent("-1", "signal: killed"))
	case cmd == "cut":
		sendEvents(w, initEv, map[string]any{"type": "stdout", "text": "partial"})
	default:
		sendEvents(w, initEv, exitEvent("127", "exit status 127"))
	}
}

func (f *fakeMoat) upload(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
	if err := r.ParseMultipartForm(8 << 20); err != nil {
		apiErr(w, 400, "INVALID_REQUEST_BODY", err.Error())
		return
	}
	var meta struct {
		Path string `json:"path"`
		Mode int    `json:"mode"`
	}
	read := func(fh []*multipart.FileHeader) []byte {
		if len(fh) == 0 {
			return nil
		}
		fl, err := fh[0].Open()
		if err != nil {
			return nil
		}
		defer fl.Close()
		b, _ := io.ReadAll(fl)
		return b
	}
	if err := json.Unmarshal(read(r.MultipartForm.File["metadata"]), &meta); err != nil || meta.Path == "" {
		apiErr(w, 400, "INVALID_REQUEST_BODY", "metadata.path is required")
		return
	}
	data := read(r.MultipartForm.File["file"])
	f.mu.Lock()
	sb.files[meta.Path] = fakeFile{data: data, mode: meta.Mode}
	f.mu.Unlock()
	w.WriteHeader(200)
}

func (f *fakeMoat) download(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
	p := r.URL.Query().Get("path")
	f.mu.Lock()
	fl, ok := sb.files[p]
	f.mu.Unlock()
	if !ok {
		apiErr(w, 404, "FILE_NOT_FOUND", "file not found: "+p)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Write(fl.data)
}

func (f *fakeMoat) listDir(w http.ResponseWriter, r *http.Request, sb *fakeSandbox) {
	dir := strings.TrimSuffix(r.URL.Query().Get("path"), "/")
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []map[string]any
	for p, fl := range sb.files {
		if strings.HasPrefix(p, dir+"/") && !strings.Contains(p[len(dir)+1:], "/") {
			out = append(out, map[string]any{"path": p, "type": "file", "size": len(fl.data), "mode": fl.mode,
				"modified_at": "2026-01-02T03:04:05Z", "created_at": "2026-01-02T03:04:05Z", "owner": "root", "group": "root"})
		}
	}
	if out == nil {
		apiErr(w, 404, "FILE_NOT_FOUND", "no such directory: "+dir)
		return
	}
	sort.Slice(out, func(i, j int) bool { return out[i]["path"].(string) < out[j]["path"].(string) })
	writeJSON(w, 200, out)
}
