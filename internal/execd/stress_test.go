package execd

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/moat-sandbox/moat/internal/execd/wire"
	"github.com/moat-sandbox/moat/internal/testutil"
)

// TestStreamsNeverLoseOutput runs 100 foreground commands at once, each
// printing just over 10 MiB to stdout (16 of 1 MiB under the race
// detector), through the real HTTP + SSE path,
// and checks every byte of every stream in order: command i prints lines
// "%09d <pad i>" numbered 1..n, so a lost, duplicated, reordered, split or
// foreign line is caught at the line it happens. It then checks the
// command's merged log (GET /command/{id}/logs) against the same bytes.
// Streams are verified as they arrive, so memory stays at a few buffers
// per stream.
func TestStreamsNeverLoseOutput(t *testing.T) {
	const lineLen = 101 // 9 digits, a space, 90 pad bytes, "\n"
	commands, lines := 100, (10<<20+lineLen-1)/lineLen
	if testutil.RaceEnabled {
		// A GiB through the race detector takes many minutes: 16
		// concurrent streams of 1 MiB still exercise every path.
		commands, lines = 16, (1<<20+lineLen-1)/lineLen
	}
	e := newTestEnv(t)
	var wg sync.WaitGroup
	errs := make(chan error, commands)
	for i := range commands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := checkStream(e, i, lines); err != nil {
				errs <- fmt.Errorf("command %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// stressPad is command i's line tail: 90 bytes naming the command.
func stressPad(i int) string {
	p := fmt.Sprintf("cmd%03d-", i)
	return strings.Repeat(p, 90/len(p)+1)[:90]
}

func checkStream(e *testEnv, i, lines int) error {
	pad := stressPad(i)
	cmd := fmt.Sprintf("seq -f '%%09.0f %s' 1 %d", pad, lines)
	body, _ := json.Marshal(map[string]any{"command": cmd})
	resp, err := e.ts.Client().Post(e.ts.URL+"/command", "application/json", bytes.NewReader(body))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		data, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("status %d: %s", resp.StatusCode, data)
	}
	br := bufio.NewReaderSize(resp.Body, 64<<10)
	const prefix = `{"type":"stdout","text":"`
	want := sha256.New()
	var id string
	n := 0 // stdout lines seen
	var line []byte
	for {
		frame, err := br.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("stream ended after %d lines without execution_complete: %v", n, err)
		}
		if len(frame) == 1 { // the blank line that ends a frame
			continue
		}
		if bytes.HasPrefix(frame, []byte(prefix)) {
			// Fast path: the text has no characters JSON escapes.
			text := frame[len(prefix):]
			end := bytes.IndexByte(text, '"')
			if end < 0 {
				return fmt.Errorf("bad stdout frame %q", frame)
			}
			n++
			line = strconv.AppendInt(line[:0], int64(n), 10)
			line = append(bytes.Repeat([]byte("0"), max(0, 9-len(line))), line...)
			line = append(append(line, ' '), pad...)
			if !bytes.Equal(text[:end], line) {
				return fmt.Errorf("line %d = %q, want %q", n, text[:end], line)
			}
			want.Write(append(line, '\n'))
			continue
		}
		var ev wire.Event
		if err := json.Unmarshal(frame, &ev); err != nil {
			return fmt.Errorf("bad frame %q: %v", frame, err)
		}
		switch ev.Type {
		case wire.EvInit:
			id = ev.Text
		case wire.EvPing:
		case wire.EvExecutionComplete:
			if n != lines {
				return fmt.Errorf("got %d lines, want %d", n, lines)
			}
			return checkLog(e, id, want.Sum(nil))
		default:
			return fmt.Errorf("unexpected event after %d lines: %s", n, frame)
		}
	}
}

// checkLog compares the command's merged output log with sum.
func checkLog(e *testEnv, id string, sum []byte) error {
	resp, err := e.ts.Client().Get(e.ts.URL + "/command/" + id + "/logs")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	h := sha256.New()
	size, err := io.Copy(h, resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("logs: status %d, %v", resp.StatusCode, err)
	}
	if !bytes.Equal(h.Sum(nil), sum) {
		return fmt.Errorf("logs (%d bytes) differ from the stream", size)
	}
	return nil
}
