package client

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestReadEvents(t *testing.T) {
	for i, tc := range []struct {
		name, in string
		want     []string // type:text
		wantErr  bool
	}{
		{"bare execd framing", "{\"type\":\"init\",\"text\":\"c1\"}\n\n{\"type\":\"stdout\",\"text\":\"hi\"}\n\n{\"type\":\"execution_complete\",\"execution_time\":3}\n\n",
			[]string{"init:c1", "stdout:hi", "execution_complete:"}, false},
		{"ndjson without blank lines", "{\"type\":\"init\",\"text\":\"c1\"}\n{\"type\":\"stdout\",\"text\":\"a\"}\n",
			[]string{"init:c1", "stdout:a"}, false},
		{"standard SSE", "event: init\nid: 1\ndata: {\"type\":\"init\",\"text\":\"c1\"}\n\n: heartbeat\n\nretry: 100\ndata:{\"type\":\"stderr\",\"text\":\"e\"}\n\n",
			[]string{"init:c1", "stderr:e"}, false},
		{"multi-line data", "data: {\"type\":\"stdout\",\ndata:  \"text\":\"x\"}\n\n", []string{"stdout:x"}, false},
		{"CRLF", "data: {\"type\":\"stdout\",\"text\":\"x\"}\r\n\r\n{\"type\":\"ping\",\"text\":\"pong\"}\r\n\r\n", []string{"stdout:x", "ping:pong"}, false},
		{"trailing data without blank line", "data: {\"type\":\"stdout\",\"text\":\"x\"}", []string{"stdout:x"}, false},
		{"empty", "", nil, false},
		{"bad json", "{\"type\":\n\n", nil, true},
		{"bad data json", "data: nope\n\n", nil, true},
	} {
		var got []string
		err := readEvents(strings.NewReader(tc.in), func(ev *streamEvent) error {
			got = append(got, ev.Type+":"+ev.Text)
			return nil
		})
		if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%d %s: got %q err %v, want %q err=%v", i, tc.name, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestReadEventsStopsOnCallbackError(t *testing.T) {
	stop := errors.New("stop")
	n := 0
	err := readEvents(strings.NewReader("{\"type\":\"a\"}\n{\"type\":\"b\"}\n"), func(*streamEvent) error { n++; return stop })
	if !errors.Is(err, stop) || n != 1 {
		t.Fatalf("err %v after %d events", err, n)
	}
}

func TestReadEventsLongLine(t *testing.T) {
	long := strings.Repeat("x", 1<<20)
	var got string
	err := readEvents(io.MultiReader(strings.NewReader(`{"type":"stdout","text":"`+long+`"}`+"\n\n")), func(ev *streamEvent) error {
		got = ev.Text
		return nil
	})
	if err != nil || got != long {
		t.Fatalf("err %v len %d", err, len(got))
	}
}
