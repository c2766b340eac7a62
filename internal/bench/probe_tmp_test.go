package bench

import (
	"context"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

func TestProbeExecTail(t *testing.T) {
	if os.Getenv("PROBE") == "" {
		t.Skip()
	}
	ctx := context.Background()
	c := &Client{Base: "http://127.0.0.1:47201", Key: "loadkey", HTTP: &http.Client{Timeout: 2 * time.Minute}}
	for i := 0; i < 60; i++ {
		id, err := c.Create(ctx, CreateOptions{Image: "loadbench/busybox:1", Entrypoint: []string{"tail", "-f", "/dev/null"}})
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		ep, _ := c.AgentEndpoint(ctx, id)
		t1 := time.Now()
		conn, err := net.DialTimeout("tcp", ep.Endpoint, 60*time.Second)
		t2 := time.Now()
		if err == nil {
			conn.Close()
		}
		_, err = c.Run(ctx, ep, "echo ok")
		t3 := time.Now()
		if t3.Sub(t0) > time.Second {
			t.Logf("%s ep=%v dial=%v run=%v err=%v", ep.Endpoint, t1.Sub(t0), t2.Sub(t1), t3.Sub(t2), err)
		}
		c.Delete(ctx, id)
	}
}
