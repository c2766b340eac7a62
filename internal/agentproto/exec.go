package agentproto

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"github.com/moat-sandbox/moat/internal/errdefs"
)

// CommandPath runs a command (the OpenSandbox execd API's POST /command,
// api/openapi/execd.yaml): the server uses it for its own small chores
// in a sandbox (a fork child's identity).
const CommandPath = "/command"

// Exec runs command with the agent's shell in the foreground and returns
// its stdout (lines joined by "\n"). A command that exits non-zero or
// that the agent cannot run is an ErrUnavailable class error with its
// output.
func (c *Client) Exec(ctx context.Context, endpoint, token, command string) (string, error) {
	data, err := json.Marshal(map[string]string{"command": command})
	if err != nil {
		return "", fmt.Errorf("agent %s: %v: %w", endpoint, err, errdefs.ErrInvalidArgument)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+endpoint+CommandPath, bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("agent %s: %v: %w", endpoint, err, errdefs.ErrInvalidArgument)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set(TokenHeader, token)
	}
	resp, err := c.http().Do(req)
	if err != nil {
		return "", fmt.Errorf("agent %s: %v: %w", endpoint, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("agent %s: %s status %d: %w", endpoint, CommandPath, resp.StatusCode, errdefs.ErrUnavailable)
	}
	var out, errOut []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimPrefix(strings.TrimSpace(sc.Text()), "data:")
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		var ev struct {
			Type  string `json:"type"`
			Text  string `json:"text"`
			Error *struct {
				EName  string `json:"ename"`
				EValue string `json:"evalue"`
			} `json:"error"`
		}
		if json.Unmarshal([]byte(line), &ev) != nil {
			continue
		}
		switch ev.Type {
		case "stdout":
			out = append(out, ev.Text)
		case "stderr":
			errOut = append(errOut, ev.Text)
		case "error":
			msg := "command failed"
			if ev.Error != nil {
				msg = ev.Error.EName + " " + ev.Error.EValue
			}
			return strings.Join(out, "\n"), fmt.Errorf("agent %s: %s: %s %s: %w", endpoint, command, msg, strings.Join(errOut, "; "), errdefs.ErrUnavailable)
		case "execution_complete":
			return strings.Join(out, "\n"), nil
		}
	}
	return strings.Join(out, "\n"), fmt.Errorf("agent %s: %s: the stream ended before the command completed: %w", endpoint, command, errdefs.ErrUnavailable)
}
