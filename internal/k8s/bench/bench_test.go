package bench

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/moat-sandbox/moat/internal/k8s/k8stest"
)

// TestRun: the benchmark delivers both batches and reports the counts the
// design promises (one allocation write warm; one create per pod cold).
func TestRun(t *testing.T) {
	k8stest.RequireTools(t)
	ctrllog.SetLogger(logr.Discard())
	var out bytes.Buffer
	res, err := Run(context.Background(), Options{N: 10, Nodes: 2}, &out)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	if len(res) != 2 || res[0].Mode != "warm" || res[1].Mode != "cold" {
		t.Fatalf("results %+v", res)
	}
	warm, cold := res[0].Writes, res[1].Writes
	if warm["PUT batchsandboxes/status"] != 1 || warm["POST pods"] != 0 || k8stest.Total(warm) > 3 {
		t.Errorf("warm writes %v", warm)
	}
	if cold["POST pods"] != 10 {
		t.Errorf("cold writes %v", cold)
	}
	if !strings.Contains(out.String(), "k8s warm n=10") || !strings.Contains(out.String(), "k8s cold n=10") {
		t.Errorf("output:\n%s", out.String())
	}
}
