package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/internal/k8s/k8stest"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestRun: `moat controller` as its own process fills the pool and
// delivers both batches with the counts the design promises (one record
// and one status write warm; one create per pod cold).
func TestRun(t *testing.T) {
	k8stest.RequireTools(t)
	var out bytes.Buffer
	res, err := Run(context.Background(), Options{N: 10, Nodes: 2, Moat: testutil.MoatBinary(t)}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if len(res) != 3 || res[0].Mode != "fill" || res[1].Mode != "warm" || res[2].Mode != "cold" {
		t.Fatalf("results %+v", res)
	}
	fill, warm, cold := res[0].Writes, res[1].Writes, res[2].Writes
	if fill["POST pods"] != 10 {
		t.Errorf("fill writes %v", fill)
	}
	if warm["PUT batchsandboxes"] != 1 || warm["PUT batchsandboxes/status"] != 1 || warm["POST pods"] != 0 || k8stest.Total(warm) > 3 {
		t.Errorf("warm writes %v", warm)
	}
	if cold["POST pods"] != 10 {
		t.Errorf("cold writes %v", cold)
	}
	if !strings.Contains(out.String(), "k8s warm n=10") || !strings.Contains(out.String(), "k8s cold n=10") {
		t.Errorf("output:\n%s", out.String())
	}
}
