package lifecycle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
)

// CreateEach makes one sandbox per request, each with its own settings;
// a request that fails takes the whole set with it.
func TestCreateEach(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	a, b := req(time.Hour), req(time.Hour)
	a.Metadata, b.Metadata = map[string]string{"child": "0"}, map[string]string{"child": "1"}
	sbs, err := h.svc.CreateEach(ctx, []CreateRequest{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 2 || sbs[0].Metadata["child"] != "0" || sbs[1].Metadata["child"] != "1" || sbs[0].ID == sbs[1].ID {
		t.Fatalf("created %+v", sbs)
	}
	var n atomic.Int32 // the set's creates run concurrently
	h.hooks.Create = func(s runtime.Spec) error {
		if n.Add(1) == 2 {
			return errors.New("boom")
		}
		return nil
	}
	if _, err := h.svc.CreateEach(ctx, []CreateRequest{a, b, a}); err == nil {
		t.Fatal("a set with a failing create succeeded")
	}
	// The failed one stays Failed (as a failed create does); the others
	// of its set are deleted.
	if list, total := h.svc.List(ctx, ListFilter{States: []State{StateRunning}}, 1, 100); total != 2 {
		t.Fatalf("a failed set left running sandboxes: %d %+v", total, list)
	}
	if _, err := h.svc.CreateEach(ctx, nil); err == nil {
		t.Fatal("an empty set was accepted")
	}
}
