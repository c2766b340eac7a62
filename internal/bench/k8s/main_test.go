package k8s

import (
	"testing"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestMain removes the binaries the tests built.
func TestMain(m *testing.M) { testutil.Main(m) }
