package kubernetes

import (
	"context"
	"time"

	"github.com/moat-sandbox/moat/internal/runtime"
)

// SweepTokens runs the orphan token sweep of New with another minimum age.
func SweepTokens(ctx context.Context, r *Runtime, minAge time.Duration) { r.sweepTokens(ctx, minAge) }

// LabelToken labels agent token Secrets.
const LabelToken = labelToken

// Validate checks spec as Create does, on a runtime of cfg.
func Validate(cfg Config, spec runtime.Spec) error { return (&Runtime{cfg: cfg}).validate(spec) }
