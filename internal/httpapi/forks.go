package httpapi

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/gen/lifecycleapi"
	"github.com/moat-sandbox/moat/internal/lifecycle/fork"
	"github.com/moat-sandbox/moat/internal/web"
)

// forkOverride is the wire ForkOverride; networkPolicy stays raw JSON for
// the core's parser (the generated model is a typed struct).
type forkOverride struct {
	Env           map[string]string `json:"env"`
	Metadata      map[string]string `json:"metadata"`
	Timeout       *json.Number      `json:"timeout"`
	NetworkPolicy json.RawMessage   `json:"networkPolicy"`
}

// forkRequest is the wire ForkSandboxRequest.
type forkRequest struct {
	forkOverride
	Count    int            `json:"count"`
	Children []forkOverride `json:"children"`
	// CopyCredentialVault copies the source's Credential Vault into
	// every child (default: each child's vault starts empty).
	CopyCredentialVault bool `json:"copyCredentialVault"`
}

func (o forkOverride) override(field string) (fork.Override, error) {
	out := fork.Override{Env: o.Env, Metadata: o.Metadata}
	if len(o.NetworkPolicy) > 0 && string(o.NetworkPolicy) != "null" {
		out.NetworkPolicy = o.NetworkPolicy
	}
	if o.Timeout != nil {
		n, err := o.Timeout.Float64()
		if err != nil || n != math.Trunc(n) || n < 60 || n > math.MaxInt32 {
			return out, errdefs.Invalid("SANDBOX::INVALID_PARAMETER", field+"timeout must be an integer number of seconds, at least 60")
		}
		out.Timeout = time.Duration(n) * time.Second
	}
	return out, nil
}

func (s *Server) forkSandbox(w http.ResponseWriter, r *http.Request) error {
	var body forkRequest
	// An empty body is count 0: the source is looked up first (another
	// tenant's answers 404 whatever the body), then count is refused.
	if err := web.DecodeJSON(r, &body, true); err != nil {
		return err
	}
	all, err := body.override("")
	if err != nil {
		return err
	}
	req := fork.Request{Count: body.Count, All: all, CopyCredentialVault: body.CopyCredentialVault}
	for i, c := range body.Children {
		o, err := c.override(fmt.Sprintf("children[%d].", i))
		if err != nil {
			return err
		}
		req.Children = append(req.Children, o)
	}
	op, err := s.svc.Forks.Fork(r.Context(), r.PathValue("id"), req)
	if err != nil {
		return err
	}
	w.Header().Set("Location", "/v1/operations/"+op.ID)
	web.WriteJSON(w, http.StatusAccepted, operationToJSON(op))
	return nil
}

func (s *Server) getOperation(w http.ResponseWriter, r *http.Request) error {
	op, err := s.svc.Forks.Get(r.Context(), r.PathValue("operationId"))
	if err != nil {
		return err
	}
	web.WriteJSON(w, http.StatusOK, operationToJSON(op))
	return nil
}

func operationToJSON(op fork.Operation) lifecycleapi.Operation {
	out := lifecycleapi.Operation{ID: op.ID, Kind: op.Kind, State: lifecycleapi.OperationState(op.State),
		SourceID: op.SourceID, SnapshotID: optString(op.SnapshotID), Count: op.Count,
		Children:  make([]lifecycleapi.ForkChild, 0, len(op.Children)),
		CreatedAt: op.CreatedAt.UTC(), UpdatedAt: op.UpdatedAt.UTC()}
	if op.Memory {
		out.Memory = &op.Memory
	}
	for _, c := range op.Children {
		out.Children = append(out.Children, lifecycleapi.ForkChild{ID: c.ID, Hostname: optString(c.Hostname), MachineID: optString(c.MachineID)})
	}
	if op.Error != nil {
		out.Error = &lifecycleapi.ErrorResponse{Code: op.Error.Code, Message: op.Error.Message}
	}
	return out
}
