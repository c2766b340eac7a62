package lifecycle

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// State is a Lifecycle API sandbox state (exact OpenSandbox spellings).
type State string

// Lifecycle states.
const (
	StatePending    State = "Pending"
	StateRunning    State = "Running"
	StatePausing    State = "Pausing"
	StatePaused     State = "Paused"
	StateResuming   State = "Resuming"
	StateStopping   State = "Stopping"
	StateTerminated State = "Terminated"
	StateFailed     State = "Failed"
)

// AllStates lists every state, in lifecycle order.
var AllStates = []State{StatePending, StateRunning, StatePausing, StatePaused, StateResuming, StateStopping, StateTerminated, StateFailed}

func (s State) String() string { return string(s) }

// ParseState parses a state case-insensitively (list filters accept "running").
func ParseState(s string) (State, error) {
	for _, st := range AllStates {
		if strings.EqualFold(s, string(st)) {
			return st, nil
		}
	}
	return "", errdefs.Invalid("SANDBOX::INVALID_PARAMETER", fmt.Sprintf("unknown state %q", s))
}

// Reason codes carried in Status.Reason.
const (
	ReasonCreating        = "SANDBOX_CREATING"
	ReasonRunning         = "SANDBOX_RUNNING"
	ReasonPaused          = "SANDBOX_PAUSED"
	ReasonStopping        = "SANDBOX_STOPPING"
	ReasonExpired         = "SANDBOX_EXPIRED"
	ReasonAgentExited     = "SANDBOX_EXITED"
	ReasonLost            = "SANDBOX_LOST"
	ReasonProvisionFailed = "PROVISIONING_ERROR"
	ReasonImagePullFailed = "IMAGE_PULL_FAILED"
	ReasonAgentTimeout    = "AGENT_START_TIMEOUT"
	// ReasonIdlePaused is the Paused status of a sandbox its idle policy
	// froze (internal/lifecycle/idle): a request to it wakes it.
	ReasonIdlePaused = "SANDBOX_IDLE_PAUSED"
	// ReasonWaking is the Resuming status of a sandbox a request wakes.
	ReasonWaking = "SANDBOX_WAKING"
	// ReasonHibernated is the Paused status of a sandbox hibernated
	// through the API (Service.Hibernate): its memory is freed.
	ReasonHibernated = "SANDBOX_HIBERNATED"
	// ReasonIdleHibernated is the Paused status of a sandbox its idle
	// policy hibernated: a request to it wakes it.
	ReasonIdleHibernated = "SANDBOX_IDLE_HIBERNATED"
)

// transitions is the state machine: the states each state may move to.
// Every change of a sandbox's state goes through it (Service.transition,
// Service.revert); nothing else assigns Status.State. The initial state
// is Pending (a new sandbox) or what a record says (Recover).
var transitions = map[State][]State{
	StatePending: {StateRunning, StateFailed, StateStopping},
	StateRunning: {
		StatePausing, StateStopping, StateFailed,
		StateRunning, // a warm pool sandbox is claimed: its status restarts
	},
	StatePausing:  {StatePaused, StateRunning, StateFailed, StateStopping},
	StatePaused:   {StateResuming, StateStopping, StateFailed},
	StateResuming: {StateRunning, StatePaused, StateFailed, StateStopping},
	StateStopping: {StateTerminated, StateFailed},
	// Terminal states may only be deleted (Stopping) again.
	StateTerminated: {StateStopping},
	StateFailed:     {StateStopping},
}

// canTransition reports whether from -> to is legal.
func canTransition(from, to State) bool {
	return slices.Contains(transitions[from], to)
}

// refusals are the codes of illegal transitions by target state (409);
// any other target is SANDBOX::INVALID_STATE.
var refusals = map[State]string{
	StatePausing:  "SANDBOX::NOT_RUNNING",
	StateResuming: "SANDBOX::NOT_PAUSED",
}

// transitionError is the typed error for an illegal transition or an
// operation refused in a state: ErrFailedPrecondition (409) with code.
func transitionError(id string, from, to State, code string) error {
	return errdefs.WithPublic(
		fmt.Errorf("sandbox %s: %s -> %s: %w", id, from, to, errdefs.ErrFailedPrecondition),
		code, fmt.Sprintf("sandbox %s is %s", id, from))
}

// transition moves e to state to (with reason and message) if the table
// allows it, else returns the transition's refusal (see refusals). The
// caller holds e.mu.
func (e *Entry) transition(to State, reason, msg string) error {
	s := e.svc
	from := e.sb.Status.State
	if !canTransition(from, to) {
		code := refusals[to]
		if code == "" {
			code = "SANDBOX::INVALID_STATE"
		}
		return transitionError(e.sb.ID, from, to, code)
	}
	e.applyState(Status{State: to, Reason: reason, Message: msg, LastTransitionAt: s.Now()}, true)
	return nil
}

// ClaimRunning makes sb, the record of a sandbox about to be claimed from
// a runtime's pool (still pending), running as of at. It is the
// transition without its event: the record is made before the claim is
// written (the runtime stores it with the claim, so it must be final),
// and the event follows once the claim holds (recordTransition).
func ClaimRunning(sb *Sandbox, at time.Time) {
	if canTransition(sb.Status.State, StateRunning) {
		sb.Status = Status{State: StateRunning, Reason: ReasonRunning, LastTransitionAt: at}
	}
}

// mustTransition is transition for the server's own moves (reaper,
// recovery, create), where an illegal one is a bug to log, not an API
// answer: e keeps its state.
func (e *Entry) mustTransition(to State, reason, msg string) {
	if err := e.transition(to, reason, msg); err != nil {
		e.svc.log.Error("illegal sandbox state transition refused", "id", e.sb.ID, "err", err)
	}
}

// revert undoes the transition that led to e's state when the runtime
// refused to carry it out (a failed pause, resume or delete): e goes back
// to prev, the status it had. It is legal only if the table leads from
// prev to the current state. The caller holds e.mu.
func (e *Entry) revert(prev Status) {
	if !canTransition(prev.State, e.sb.Status.State) {
		e.svc.log.Error("illegal sandbox state revert refused", "id", e.sb.ID, "from", e.sb.Status.State, "to", prev.State)
		return
	}
	e.applyState(prev, false)
}

// operations are the requests that do not change the state, with the
// states that admit them and the code of a refusal (409).
var operations = map[string]struct {
	in   []State
	code string
}{
	opRenew:    {[]State{StatePending, StateRunning, StatePausing, StatePaused, StateResuming, StateStopping}, "SANDBOX::INVALID_STATE"},
	opMetadata: {[]State{StateRunning, StatePausing, StatePaused, StateResuming}, "SANDBOX::INVALID_STATE"},
	opEndpoint: {[]State{StateRunning, StatePausing, StatePaused, StateResuming}, "SANDBOX::NOT_RUNNING"},
}

// Operations of the operations table.
const (
	opRenew    = "renew-expiration"
	opMetadata = "patch-metadata"
	opEndpoint = "endpoint"
)

// admit checks that a sandbox in state st admits operation op.
func admit(id string, st State, op string) error {
	o := operations[op]
	if !slices.Contains(o.in, st) {
		return transitionError(id, st, st, o.code)
	}
	return nil
}

// applyState sets e's status and its consequences (quota, and the event
// of the transition unless it is undone by revert, which records none).
// Only transition and revert call it (state.go): every change goes
// through the transitions table. The caller holds e.mu.
func (e *Entry) applyState(status Status, event bool) {
	s := e.svc
	prev, st := e.sb.Status, status.State
	e.sb.Status = status
	if isTerminal(st) {
		s.quota.release(e.sb.ID)
		e.markEnded()
	}
	e.done.Store(isTerminal(st))
	if event {
		s.events.recordTransition(e, prev)
	}
}
