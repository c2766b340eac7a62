package lifecycle

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// TestTransitionMatrix drives Service.transition over every pair of
// states: a pair in the table moves the sandbox, any other is refused
// with ErrFailedPrecondition (409) and its code, and leaves it as it was.
func TestTransitionMatrix(t *testing.T) {
	h := newHarness(t)
	defer h.svc.Close()
	for _, from := range AllStates {
		for _, to := range AllStates {
			e := newEntry(h.svc, Sandbox{ID: "sb-matrix", Status: Status{State: from, Reason: "before"}})
			err := e.transition(to, "after", "")
			if canTransition(from, to) {
				if err != nil || e.sb.Status.State != to || e.sb.Status.Reason != "after" {
					t.Errorf("%s -> %s: %v, status %+v", from, to, err, e.sb.Status)
				}
				continue
			}
			want := map[State]string{StatePausing: "SANDBOX::NOT_RUNNING", StateResuming: "SANDBOX::NOT_PAUSED"}[to]
			if want == "" {
				want = "SANDBOX::INVALID_STATE"
			}
			p, ok := errdefs.PublicOf(err)
			if !errdefs.IsFailedPrecondition(err) || !ok || p.Code != want {
				t.Errorf("%s -> %s: %v, want a %s refusal", from, to, err, want)
			}
			if e.sb.Status.State != from || e.sb.Status.Reason != "before" {
				t.Errorf("%s -> %s refused but the status changed: %+v", from, to, e.sb.Status)
			}
		}
	}
}

// TestRevertOnlyUndoes: a revert must undo an edge of the table.
func TestRevertOnlyUndoes(t *testing.T) {
	h := newHarness(t)
	defer h.svc.Close()
	e := newEntry(h.svc, Sandbox{ID: "sb-revert", Status: Status{State: StateStopping}})
	e.revert(Status{State: StateRunning}) // Running -> Stopping is an edge
	if e.sb.Status.State != StateRunning {
		t.Errorf("revert of a delete: %s, want Running", e.sb.Status.State)
	}
	e2 := newEntry(h.svc, Sandbox{ID: "sb-revert2", Status: Status{State: StateRunning}})
	e2.revert(Status{State: StateTerminated}) // Terminated -> Running is not
	if e2.sb.Status.State != StateRunning {
		t.Errorf("illegal revert applied: %s", e2.sb.Status.State)
	}
}

// TestRecoverFinishesInterruptedTransitions: a crash between the
// runtime's pause (resume) and the record leaves them disagreeing; Recover
// finishes the transition through the table, with its event.
func TestRecoverFinishesInterruptedTransitions(t *testing.T) {
	h := newHarness(t)
	ctx := context.Background()
	toPause, _ := h.svc.Create(ctx, req(time.Hour))
	toResume, _ := h.svc.Create(ctx, req(time.Hour))
	if err := h.svc.Pause(ctx, toResume.ID); err != nil {
		t.Fatal(err)
	}
	// The runtime moves, the records do not (the server "crashed").
	if err := h.rt.Pause(ctx, toPause.ID); err != nil {
		t.Fatal(err)
	}
	if err := h.rt.Resume(ctx, toResume.ID); err != nil {
		t.Fatal(err)
	}
	h.svc.Close()
	h.svc = h.newService(t)
	defer h.svc.Close()
	if err := h.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	for id, want := range map[string]struct {
		state State
		event string
	}{toPause.ID: {StatePaused, EventPaused}, toResume.ID: {StateRunning, EventResumed}} {
		sb, err := h.svc.Get(ctx, id)
		if err != nil || sb.Status.State != want.state {
			t.Errorf("%s after recovery: %+v, %v; want %s", id, sb.Status, err, want.state)
		}
		evs, _, _ := h.svc.Events(ctx, id)
		if len(evs) == 0 || evs[len(evs)-1].Type != EventRecovered || !hasEvent(evs, want.event) {
			t.Errorf("%s events %+v: want %s then %s", id, evs, want.event, EventRecovered)
		}
	}
}

func hasEvent(evs []Event, typ string) bool {
	for _, e := range evs {
		if e.Type == typ {
			return true
		}
	}
	return false
}

// TestStateChangesGoThroughTheTable: outside state.go no code assigns a
// sandbox's status or calls applyState, so the table is the state
// machine, not documentation.
func TestStateChangesGoThroughTheTable(t *testing.T) {
	fset := token.NewFileSet()
	files, _ := filepath.Glob("*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") || f == "state.go" {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(fset, f, src, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					if s := types.ExprString(l); strings.Contains(s, "sb.Status") {
						t.Errorf("%s: %s assigned outside the state machine", fset.Position(n.Pos()), s)
					}
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "applyState" {
					t.Errorf("%s: applyState called outside state.go", fset.Position(n.Pos()))
				}
			}
			return true
		})
	}
}
