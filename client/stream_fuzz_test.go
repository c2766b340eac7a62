package client

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

// FuzzReadEvents parses arbitrary agent event streams (a sandbox's agent
// writes them, so they are untrusted): no panic; every event delivered is
// a JSON object of the stream; a stream of well-formed frames delivers
// each of them, in both framings.
func FuzzReadEvents(f *testing.F) {
	f.Add([]byte("{\"type\":\"init\",\"text\":\"c1\"}\n\n{\"type\":\"stdout\",\"text\":\"hi\\n\"}\n\n"))
	f.Add([]byte("event: stdout\ndata: {\"type\":\"stdout\",\n data: \"text\":\"a\"}\nid: 1\nretry: 10\n: comment\n\n"))
	f.Add([]byte("data: {\"type\":\"execution_complete\",\"execution_time\":3}\r\n\r\n"))
	f.Add([]byte("data:{\"type\":\"error\",\"error\":{\"ename\":\"E\",\"evalue\":\"v\",\"traceback\":[\"t\"]}}"))
	f.Add([]byte("{\"type\":\"result\",\"results\":{\"text/plain\":\"1\"}}"))
	f.Add([]byte("not json\n\n"))
	f.Add([]byte("data: {\"type\":\n\n"))
	f.Add([]byte("\n\n\n:\n"))
	f.Fuzz(func(t *testing.T, stream []byte) {
		stop := errors.New("stop")
		n := 0
		err := readEvents(bytes.NewReader(stream), func(ev *streamEvent) error {
			if ev == nil {
				t.Fatal("nil event")
			}
			if n++; n > len(stream) {
				return stop // more events than bytes: a loop
			}
			return nil
		})
		if errors.Is(err, stop) {
			t.Fatalf("%d events from %d bytes", n, len(stream))
		}
		// Every event re-encoded as one frame per framing comes back.
		var evs []streamEvent
		if readEvents(bytes.NewReader(stream), func(ev *streamEvent) error { evs = append(evs, *ev); return nil }) != nil {
			return
		}
		for _, sse := range []bool{false, true} {
			var buf bytes.Buffer
			for _, ev := range evs {
				b, _ := json.Marshal(ev)
				if sse {
					buf.WriteString("data: ")
				}
				buf.Write(b)
				buf.WriteString("\n\n")
			}
			got := 0
			if err := readEvents(&buf, func(*streamEvent) error { got++; return nil }); err != nil || got != len(evs) {
				t.Fatalf("re-framed (sse=%v): %d of %d events, %v", sse, got, len(evs), err)
			}
		}
	})
}
