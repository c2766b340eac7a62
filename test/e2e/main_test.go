package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestMain skips the whole suite with -short (make test-short: unit tests
// only): every test here starts real servers, sandboxes or browsers, and
// some prepare images or npm packages before they could skip one by one.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("test/e2e: end-to-end tests skipped with -short")
		os.Exit(0)
	}
	testutil.Main(m)
}
