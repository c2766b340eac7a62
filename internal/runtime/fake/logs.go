package fake

import (
	"context"
	"strings"
)

// Logs implements runtime.LogReader: a fixed console line naming the
// sandbox and its entrypoint, cut to its last max bytes.
func (r *Runtime) Logs(ctx context.Context, id string, max int64) ([]byte, bool, error) {
	r.st.mu.Lock()
	defer r.st.mu.Unlock()
	sb, err := r.get(id)
	if err != nil {
		return nil, false, err
	}
	out := []byte("fake agent of " + id + " running " + strings.Join(sb.spec.Entrypoint, " ") + "\n")
	if max > 0 && int64(len(out)) > max {
		return out[int64(len(out))-max:], true, nil
	}
	return out, false, nil
}
