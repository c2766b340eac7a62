package e2b

import (
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/lifecycle"
	"github.com/moat-sandbox/moat/internal/web"
)

// Listing, as infra's: a cursor (X-Next-Token, opaque to the SDKs) over
// the sandboxes in start order, newest first unless order=asc. The cursor
// is base64url("<RFC3339Nano startedAt>__<id>[__asc]"), the last sandbox
// of the page; the next page starts after it, so sandboxes made or killed
// meanwhile neither repeat nor shift the pages.
const (
	defaultLimit = 100
	maxLimit     = 100
)

type cursor struct {
	at  time.Time
	id  string
	asc bool
}

func (c cursor) encode() string {
	s := c.at.UTC().Format(time.RFC3339Nano) + "__" + c.id
	if c.asc {
		s += "__asc"
	}
	return base64.RawURLEncoding.EncodeToString([]byte(s))
}

func parseCursor(tok string) (cursor, error) {
	bad := invalid("nextToken is not a token this server issued")
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(tok, "="))
	if err != nil {
		return cursor{}, bad
	}
	parts := strings.Split(string(raw), "__")
	if len(parts) < 2 || len(parts) > 3 || (len(parts) == 3 && parts[2] != "asc") {
		return cursor{}, bad
	}
	at, err := time.Parse(time.RFC3339Nano, parts[0])
	if err != nil {
		return cursor{}, bad
	}
	return cursor{at: at, id: parts[1], asc: len(parts) == 3}, nil
}

// before reports whether a sandbox started at (at, id) comes before
// (at2, id2) in the order.
func before(asc bool, at time.Time, id string, at2 time.Time, id2 string) bool {
	if !at.Equal(at2) {
		return at.Before(at2) == asc
	}
	return id < id2
}

// listQuery is a parsed list request.
type listQuery struct {
	states       []string // running, paused; empty: both
	metadata     map[string]string
	limit        int
	after        *cursor
	asc          bool
	startedAfter time.Time
	template     string
}

func parseListQuery(q url.Values, v2 bool) (listQuery, error) {
	lq := listQuery{limit: defaultLimit}
	for _, v := range q["state"] {
		for _, s := range strings.Split(v, ",") {
			switch s = strings.TrimSpace(s); s {
			case "running", "paused":
				lq.states = append(lq.states, s)
			case "":
			default:
				return lq, invalid(fmt.Sprintf("state %q is not running or paused", s))
			}
		}
	}
	md, err := parseMetadataQuery(q.Get("metadata"))
	if err != nil {
		return lq, err
	}
	lq.metadata = md
	if !v2 {
		return lq, nil
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxLimit {
			return lq, invalid(fmt.Sprintf("limit must be an integer between 1 and %d", maxLimit))
		}
		lq.limit = n
	}
	switch o := q.Get("order"); o {
	case "", "desc":
	case "asc":
		lq.asc = true
	default:
		return lq, invalid("order must be asc or desc")
	}
	if tok := q.Get("nextToken"); tok != "" {
		c, err := parseCursor(tok)
		if err != nil {
			return lq, err
		}
		if c.asc != lq.asc {
			return lq, invalid("nextToken was issued for the other order")
		}
		lq.after = &c
	}
	if v := q.Get("startedAfter"); v != "" {
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			return lq, invalid("startedAfter must be an RFC 3339 timestamp")
		}
		lq.startedAfter = t
	}
	lq.template = q.Get("template")
	return lq, nil
}

// parseMetadataQuery decodes the metadata filter as infra does: the
// (already query-decoded) value is unescaped once more, split on '&' and
// '=', and each key and value unescaped again.
func parseMetadataQuery(raw string) (map[string]string, error) {
	if raw == "" {
		return nil, nil
	}
	bad := invalid("metadata must be url-encoded key=value pairs joined by '&'")
	s, err := url.QueryUnescape(raw)
	if err != nil {
		return nil, bad
	}
	out := map[string]string{}
	for _, pair := range strings.Split(s, "&") {
		kv := strings.Split(pair, "=")
		if len(kv) != 2 {
			return nil, bad
		}
		k, err1 := url.QueryUnescape(kv[0])
		v, err2 := url.QueryUnescape(kv[1])
		if err1 != nil || err2 != nil || k == "" {
			return nil, bad
		}
		out[k] = v
	}
	return out, nil
}

// matches reports whether sb passes the query's filters.
func (lq listQuery) matches(sb lifecycle.Sandbox) bool {
	st := state(sb.Status.State)
	if st == "" || (len(lq.states) > 0 && !slices.Contains(lq.states, st)) {
		return false
	}
	if !lq.startedAfter.IsZero() && !sb.CreatedAt.After(lq.startedAfter) {
		return false
	}
	if lq.template != "" && templateOf(sb) != lq.template {
		return false
	}
	if len(lq.metadata) > 0 {
		md := metadataOf(sb)
		for k, v := range lq.metadata {
			if got, ok := md[k]; !ok || got != v {
				return false
			}
		}
	}
	return true
}

// page returns the sandboxes of the query's page, the cursor of the next
// page ("" on the last), and how many of the caller's sandboxes run.
func (a *API) page(r *http.Request, lq listQuery) ([]lifecycle.Sandbox, string, int) {
	all, _ := a.svc.List(r.Context(), lifecycle.ListFilter{}, 1, math.MaxInt32)
	running := 0
	var out []lifecycle.Sandbox
	for _, sb := range all {
		if state(sb.Status.State) == "running" {
			running++
		}
		if lq.matches(sb) {
			out = append(out, sb)
		}
	}
	slices.SortFunc(out, func(x, y lifecycle.Sandbox) int {
		if before(lq.asc, x.CreatedAt, x.ID, y.CreatedAt, y.ID) {
			return -1
		}
		return 1
	})
	if c := lq.after; c != nil {
		i := 0
		for i < len(out) && !before(lq.asc, c.at, c.id, out[i].CreatedAt, out[i].ID) {
			i++
		}
		out = out[i:]
	}
	next := ""
	if len(out) > lq.limit {
		out = out[:lq.limit]
		last := out[len(out)-1]
		next = cursor{at: last.CreatedAt, id: last.ID, asc: lq.asc}.encode()
	}
	return out, next, running
}

func (a *API) listV1(w http.ResponseWriter, r *http.Request) error {
	lq, err := parseListQuery(r.URL.Query(), false)
	if err != nil {
		return err
	}
	if len(lq.states) == 0 {
		lq.states = []string{"running"} // v1 lists running sandboxes only
	}
	lq.limit = math.MaxInt32
	items, _, _ := a.page(r, lq)
	a.writeList(w, items)
	return nil
}

func (a *API) listV2(w http.ResponseWriter, r *http.Request) error {
	lq, err := parseListQuery(r.URL.Query(), true)
	if err != nil {
		return err
	}
	items, next, running := a.page(r, lq)
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	w.Header().Set("X-Total-Running", strconv.Itoa(running))
	a.writeList(w, items)
	return nil
}

func (a *API) writeList(w http.ResponseWriter, items []lifecycle.Sandbox) {
	out := make([]detailJSON, 0, len(items))
	for _, sb := range items {
		out = append(out, a.detail(sb, false))
	}
	web.WriteJSON(w, http.StatusOK, out)
}
