package runtimetest

import (
	"os"
	"testing"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// AgentBinary is the agent backends mount into sandboxes in tests: the
// real one (testutil.AgentBinary), or the stand-in of ./stubagent when
// MOAT_TEST_STUB_AGENT=1 (to test a backend without the agent).
func AgentBinary(t testing.TB) string {
	t.Helper()
	if os.Getenv("MOAT_TEST_STUB_AGENT") != "1" {
		return testutil.AgentBinary(t)
	}
	return testutil.Build(t, "./internal/runtime/runtimetest/stubagent")
}
