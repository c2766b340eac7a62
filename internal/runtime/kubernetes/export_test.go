package kubernetes

import (
	"context"
	"time"
)

// SweepTokens runs the orphan token sweep of New with another minimum age.
func SweepTokens(ctx context.Context, r *Runtime, minAge time.Duration) { r.sweepTokens(ctx, minAge) }

// LabelToken labels agent token Secrets.
const LabelToken = labelToken
