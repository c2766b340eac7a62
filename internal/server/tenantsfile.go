package server

import (
	"bytes"
	"context"
	"os"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/tenant"
)

// defaultTenantsReload is how often the tenants file is reread.
const defaultTenantsReload = 5 * time.Second

// tenantsFile is the tenants file as last read (Config.TenantsFile): the
// namespaces it names. The server rereads it while it runs (watch), so
// a ConfigMap update reaches every replica without a restart, as with
// OpenSandbox.
type tenantsFile struct {
	path string
	mu   sync.RWMutex
	// content is the file as last applied; namespaces what it names.
	content    []byte
	namespaces map[string]string
}

func newTenantsFile(path string, fts []tenant.FileTenant) *tenantsFile {
	f := &tenantsFile{path: path}
	f.content, _ = os.ReadFile(path)
	f.set(fts)
	return f
}

func (f *tenantsFile) set(fts []tenant.FileTenant) {
	ns := map[string]string{}
	for _, ft := range fts {
		if ft.Namespace != "" {
			ns[ft.Name] = ft.Namespace
		}
	}
	f.mu.Lock()
	f.namespaces = ns
	f.mu.Unlock()
}

// lookup is the namespace the file names for tenant t.
func (f *tenantsFile) lookup(t string) (string, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	ns, ok := f.namespaces[t]
	return ns, ok
}

// watch rereads the file every interval until ctx ends and applies a
// changed one to the registry (keys) and the placement (namespaces). A
// file that does not read or check is logged and the last good one kept.
func (s *Server) watchTenantsFile(ctx context.Context, f *tenantsFile, every time.Duration) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
		b, err := os.ReadFile(f.path)
		if err == nil && bytes.Equal(b, f.content) {
			continue
		}
		fts, err := tenant.LoadTenantsFile(f.path)
		if err == nil {
			err = s.tenants.SetFileTenants(fts)
		}
		if err != nil {
			s.log.Warn("tenants file not reloaded; the last good one stays in force", "file", f.path, "err", err)
			f.content = b
			continue
		}
		f.content = b
		f.set(fts)
		s.log.Info("tenants file reloaded", "file", f.path, "tenants", len(fts))
	}
}
