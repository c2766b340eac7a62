package lifecycle

import (
	"fmt"
	"strings"

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
)

// transitions is the state machine: the states each state may move to.
var transitions = map[State][]State{
	StatePending:  {StateRunning, StateFailed, StateStopping},
	StateRunning:  {StatePausing, StateStopping, StateFailed, StateTerminated},
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
	for _, s := range transitions[from] {
		if s == to {
			return true
		}
	}
	return false
}

// transitionError is the typed error for an illegal transition.
func transitionError(id string, from, to State, code string) error {
	return errdefs.WithPublic(
		fmt.Errorf("sandbox %s: %s -> %s: %w", id, from, to, errdefs.ErrFailedPrecondition),
		code, fmt.Sprintf("sandbox %s is %s", id, from))
}
