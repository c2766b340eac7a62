package server

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/moat-sandbox/moat/internal/audit/trail"
	"github.com/moat-sandbox/moat/internal/egress"
	"github.com/moat-sandbox/moat/internal/egress/mitm"
	"github.com/moat-sandbox/moat/internal/lifecycle"
)

// optionalSize is a size flag in bytes (0: unset, the default applies).
func optionalSize(v string) (int64, error) {
	if v == "" || v == "0" {
		return 0, nil
	}
	r, err := lifecycle.ParseResources(map[string]string{"disk": v})
	return r.DiskBytes, err
}

// openTrail opens the sandboxes' audit trails (nil when off). A trail
// expires only once its sandbox no longer exists.
func (s *Server) openTrail(export func(trail.Record)) (*trail.Store, error) {
	cfg := s.cfg
	if cfg.AuditTrail == "" || cfg.AuditTrail == "off" {
		return nil, nil
	}
	per, _ := optionalSize(cfg.AuditTrailMax)
	total, _ := optionalSize(cfg.AuditTrailTotal)
	return trail.Open(trail.Options{Dir: cfg.AuditTrail, PerSandbox: per, Total: total, Retention: cfg.AuditRetention,
		Log: s.log, Export: export, Exists: func(id string) bool {
			if s.svc == nil {
				return true
			}
			_, err := s.svc.Get(context.Background(), id)
			return err == nil
		}})
}

// trailInterval is how often aggregated trail records are flushed and
// expired trails removed.
const trailInterval = 30 * time.Second

// auditHooks feed the egress layer's decisions and credential injections
// into the audit trail, once it is open (the egress layer starts first).
type auditHooks struct {
	store atomic.Pointer[trail.Store]
}

func (h *auditHooks) trail() *trail.Store {
	if h == nil {
		return nil
	}
	return h.store.Load()
}

// decision records an egress verdict, aggregated by host, port and rule.
func (h *auditHooks) decision(d egress.Decision) {
	st := h.trail()
	if st == nil {
		return
	}
	action := trail.ActionDeny
	if d.Allowed {
		action = trail.ActionAllow
	}
	st.Note(trail.Record{Kind: trail.KindEgress, Action: action, SandboxID: d.SandboxID,
		Egress: &trail.Egress{Host: d.Host, Port: d.Port, Allowed: d.Allowed, Rule: d.Rule, Layer: d.Layer}},
		d.Host+"\x00"+strconv.Itoa(d.Port)+"\x00"+d.Rule)
}

// injected records a credential injection (binding and host, never the
// value), aggregated by binding and host.
func (h *auditHooks) injected(_ context.Context, id, binding, host string) {
	h.credential(id, binding, host, true)
}

func (h *auditHooks) credential(id, binding, host string, injected bool) {
	st := h.trail()
	if st == nil {
		return
	}
	action := trail.ActionWithheld
	if injected {
		action = trail.ActionInject
	}
	st.Note(trail.Record{Kind: trail.KindCredential, Action: action, SandboxID: id,
		Credential: &trail.Credential{Binding: binding, Host: host, Injected: injected}}, binding+"\x00"+host)
}

// withheld wraps a credential proxy's withheld report to record it too.
func (h *auditHooks) withheld(id string, next func(context.Context, mitm.Withheld)) func(context.Context, mitm.Withheld) {
	if h == nil {
		return next
	}
	return func(ctx context.Context, w mitm.Withheld) {
		h.credential(id, w.Binding, w.Host, false)
		if next != nil {
			next(ctx, w)
		}
	}
}
