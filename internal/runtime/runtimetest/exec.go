package runtimetest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/agentproto"
	"github.com/moat-sandbox/moat/internal/runtime"
)

// Exec runs command with sh in sandbox id through its agent's POST
// /command (the moat agent; the suite's Token) and returns its output
// (stdout and stderr lines, each ending in "\n") and exit code.
func Exec(ctx context.Context, rt runtime.Runtime, id, command string) (string, int, error) {
	ep, err := rt.Endpoint(ctx, id, agentproto.Port)
	if err != nil {
		return "", -1, err
	}
	body, _ := json.Marshal(map[string]any{"command": command, "timeout": 30000})
	ctx, cancel := context.WithTimeout(ctx, 40*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+ep+"/command", bytes.NewReader(body))
	req.Header.Set(agentproto.TokenHeader, Token)
	req.Header.Set("Content-Type", "application/json")
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return "", -1, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", -1, fmt.Errorf("POST /command: %s %s", resp.Status, data)
	}
	code := -1
	var out strings.Builder
	for frame := range strings.SplitSeq(string(data), "\n\n") {
		var ev struct {
			Type  string `json:"type"`
			Text  string `json:"text"`
			Error *struct {
				EValue string `json:"evalue"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(frame)), &ev) != nil {
			continue
		}
		switch ev.Type {
		case "stdout", "stderr":
			out.WriteString(ev.Text + "\n")
		case "execution_complete":
			code = 0
		case "error":
			if ev.Error != nil {
				if n, err := strconv.Atoi(ev.Error.EValue); err == nil {
					code = n
				}
			}
		}
	}
	if code == -1 && err != nil {
		return out.String(), code, err
	}
	return out.String(), code, nil
}
