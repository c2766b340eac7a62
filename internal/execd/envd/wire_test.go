package envd_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	ppb "github.com/moat-sandbox/moat/internal/execd/envd/gen/process"
)

// TestWireAsTheSDKsSendIt posts the JSON the SDKs send, byte for byte,
// and checks the framing they expect back.
func TestWireAsTheSDKsSendIt(t *testing.T) {
	e := newEnv(t, envOpts{})
	// Unary error: the status and the code in the body.
	resp, err := e.http.Post(e.url+"/filesystem.Filesystem/Stat", "application/json", strings.NewReader(`{"path":"/no/such/path"}`))
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != 404 || !strings.Contains(body, `"code":"not_found"`) || !strings.Contains(body, "path '/no/such/path' does not exist") {
		t.Fatalf("unary error: %d %s", resp.StatusCode, body)
	}
	// snake_case field names are accepted too.
	resp, err = e.http.Post(e.url+"/filesystem.Filesystem/CreateWatcher", "application/json", strings.NewReader(`{"path":"`+t.TempDir()+`","include_entry":true}`))
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"watcherId"`) {
		t.Fatalf("snake_case request: %d %s", resp.StatusCode, body)
	}
	resp, err = e.http.Post(e.url+"/filesystem.Filesystem/ListDir", "application/json", strings.NewReader(`{"path":"/","depth":1}`))
	if err != nil {
		t.Fatal(err)
	}
	var list bytes.Buffer
	json.Compact(&list, []byte(readAll(t, resp)))
	if body := list.String(); resp.StatusCode != 200 || !strings.Contains(body, `"type":"FILE_TYPE_DIRECTORY"`) || !strings.Contains(body, `"modifiedTime":"`) {
		t.Fatalf("list /: %d %.300s", resp.StatusCode, body)
	}
	// A server stream: one enveloped request, enveloped events, then the
	// end-stream frame.
	msg := []byte(`{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi; exit 3"]},"stdin":false}`)
	var env bytes.Buffer
	env.WriteByte(0)
	binary.Write(&env, binary.BigEndian, uint32(len(msg)))
	env.Write(msg)
	req, _ := http.NewRequest("POST", e.url+"/process.Process/Start", &env)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("Connect-Timeout-Ms", "60000")
	req.Header.Set("Keepalive-Ping-Interval", "50")
	resp, err = e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw := []byte(readAll(t, resp))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/connect+json" {
		t.Fatalf("stream: %d %v", resp.StatusCode, resp.Header)
	}
	var frames []string
	var flags []byte
	for len(raw) >= 5 {
		n := binary.BigEndian.Uint32(raw[1:5])
		flags = append(flags, raw[0])
		// protojson varies its whitespace on purpose: compare compacted.
		var c bytes.Buffer
		if err := json.Compact(&c, raw[5:5+n]); err != nil {
			t.Fatalf("frame %q: %v", raw[5:5+n], err)
		}
		frames = append(frames, c.String())
		raw = raw[5+n:]
	}
	if len(frames) < 3 || !strings.HasPrefix(frames[0], `{"event":{"start":{"pid":`) || frames[1] != `{"event":{"data":{"stdout":"aGkK"}}}` ||
		frames[len(frames)-2] != `{"event":{"end":{"exitCode":3,"exited":true,"status":"exit status 3","error":"exit status 3"}}}` ||
		frames[len(frames)-1] != `{}` || flags[len(flags)-1] != 2 {
		t.Fatalf("frames %q flags %v", frames, flags)
	}
}

func TestStreamInput(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx := ctxT(t, 30*time.Second)
	s, err := e.proc.Start(ctx, connect.NewRequest(&ppb.StartRequest{Process: &ppb.ProcessConfig{Cmd: "head", Args: []string{"-c", "6"}}}))
	if err != nil {
		t.Fatal(err)
	}
	s.Receive()
	pid := s.Msg().GetEvent().GetStart().GetPid()
	// Input in order on one client stream (the SDKs use SendInput).
	in := e.proc.StreamInput(ctx)
	in.Send(&ppb.StreamInputRequest{Event: &ppb.StreamInputRequest_Start{Start: &ppb.StreamInputRequest_StartEvent{Process: &ppb.ProcessSelector{Selector: &ppb.ProcessSelector_Pid{Pid: pid}}}}})
	in.Send(&ppb.StreamInputRequest{Event: &ppb.StreamInputRequest_Data{Data: &ppb.StreamInputRequest_DataEvent{Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("abc")}}}}})
	in.Send(&ppb.StreamInputRequest{Event: &ppb.StreamInputRequest_Data{Data: &ppb.StreamInputRequest_DataEvent{Input: &ppb.ProcessInput{Input: &ppb.ProcessInput_Stdin{Stdin: []byte("def")}}}}})
	if _, err := in.CloseAndReceive(); err != nil {
		t.Fatal(err)
	}
	r, err := collect[*ppb.StartResponse](s)
	if err != nil || r.stdout.String() != "abcdef" || r.end == nil || r.end.ExitCode != 0 {
		t.Fatalf("stream input: %q %v %v", r.stdout.String(), r.end, err)
	}
}
