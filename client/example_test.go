package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/client"
)

// Example is the README example; it is compiled, not run (it needs a server).
func Example() {
	ctx := context.Background()
	c, err := client.New("http://127.0.0.1:8080", client.WithAPIKey("key"),
		client.WithRetry(3, 200*time.Millisecond), client.WithServerProxy())
	if err != nil {
		return
	}
	sb, err := c.CreateSandbox(ctx, client.CreateRequest{
		Image:      &client.ImageSpec{URI: "docker.io/library/python:3.12-slim"},
		Entrypoint: []string{"sleep", "infinity"},
		Timeout:    10 * time.Minute,
	})
	if err != nil {
		return
	}
	defer c.DeleteSandbox(context.WithoutCancel(ctx), sb.ID)

	h, err := c.Sandbox(ctx, sb.ID)
	if err != nil {
		return
	}
	if err := h.Upload(ctx, "/work/main.py", strings.NewReader("print('hi')"), 0o644); err != nil {
		return
	}
	x, err := h.Run(ctx, "python3 /work/main.py", client.RunOptions{Cwd: "/work", Timeout: time.Minute},
		client.Handlers{OnStdout: func(line string) { fmt.Println(line) }})
	if err != nil {
		return
	}
	fmt.Println("exit code", x.ExitCode)

	if _, err := c.GetSandbox(ctx, "missing"); client.IsNotFound(err) {
		var ae *client.APIError
		if errors.As(err, &ae) {
			fmt.Println(ae.Code, ae.RequestID)
		}
	}
}
