package client

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// streamEvent is one agent ServerStreamEvent.
type streamEvent struct {
	Type           string          `json:"type"`
	Text           string          `json:"text,omitempty"`
	ExecutionCount int             `json:"execution_count,omitempty"`
	ExecutionTime  int64           `json:"execution_time,omitempty"`
	Timestamp      int64           `json:"timestamp,omitempty"`
	Results        map[string]any  `json:"results,omitempty"`
	Error          *ExecutionError `json:"error,omitempty"`
}

// maxEventSize bounds one event (a very long output line).
const maxEventSize = 64 << 20

// readEvents parses an agent event stream and calls fn for each event
// until EOF or fn fails. It accepts both framings the agent contract
// allows: bare compact JSON objects, one a line, separated by blank lines
// (execd's form, also plain NDJSON), and standard SSE, where "data:" lines
// accumulate until a blank line; "event:", "id:", "retry:" and ":" comment
// lines are ignored (the type is inside the JSON).
func readEvents(r io.Reader, fn func(*streamEvent) error) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxEventSize)
	var data []byte
	hasData := false
	emit := func(b []byte) error {
		b = bytes.TrimSpace(b)
		if len(b) == 0 {
			return nil
		}
		var ev streamEvent
		if err := json.Unmarshal(b, &ev); err != nil {
			return fmt.Errorf("bad event %.80q: %w", b, err)
		}
		return fn(&ev)
	}
	for sc.Scan() {
		line := bytes.TrimSuffix(sc.Bytes(), []byte("\r"))
		switch {
		case len(line) == 0:
			if hasData {
				if err := emit(data); err != nil {
					return err
				}
				data, hasData = data[:0], false
			}
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
			if hasData {
				data = append(data, '\n')
			}
			data = append(data, v...)
			hasData = true
		case line[0] == ':' || bytes.HasPrefix(line, []byte("event:")) || bytes.HasPrefix(line, []byte("id:")) ||
			bytes.HasPrefix(line, []byte("retry:")):
		default:
			if err := emit(line); err != nil {
				return err
			}
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	if hasData {
		return emit(data)
	}
	return nil
}
