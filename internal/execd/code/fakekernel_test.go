package code

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
)

// A fake Jupyter kernel whose timing the tests control (the test binary,
// run from a kernelspec with MOAT_FAKE_KERNEL set). Like IRkernel it dies
// of a SIGINT outside a cell. Modes: late (execute_input 400 ms after busy,
// then 50 ms of its own code), slowreply (no execute_input, 900 ms to
// reply after an interrupt), drops (tslab: no execute_input, 600 ms CPU
// compile that drops a SIGINT, SIGINT between cells ignored).
const fakeKernelEnv = "MOAT_FAKE_KERNEL"

// kernel states for the SIGINT handler.
const (
	fkOutside   = iota // the kernel's own code
	fkCompiling        // drops SIGINT
	fkInCell           // a SIGINT interrupts the cell
)

func runFakeKernel(mode, connPath string) int {
	data, err := os.ReadFile(connPath)
	if err != nil {
		return 2
	}
	var cf connectionFile
	if json.Unmarshal(data, &cf) != nil {
		return 2
	}
	var state atomic.Int32
	var interrupted atomic.Bool
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT)
	go func() {
		for range sigs {
			switch state.Load() {
			case fkInCell:
				interrupted.Store(true)
			case fkOutside:
				if mode != "drops" {
					fmt.Fprintln(os.Stderr, "fake kernel: SIGINT outside a cell; Execution halted")
					os.Exit(1)
				}
			}
		}
	}()
	ctx := context.Background()
	addr := func(p int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", p) }
	shell, control, iopub := zmq4.NewRouter(ctx), zmq4.NewRouter(ctx), zmq4.NewPub(ctx)
	for _, l := range []struct {
		s zmq4.Socket
		p int
	}{{shell, cf.ShellPort}, {control, cf.ControlPort}, {iopub, cf.IOPubPort}} {
		if err := l.s.Listen(addr(l.p)); err != nil {
			return 2
		}
	}
	key := []byte(cf.Key)
	sign := func(parts ...[]byte) []byte {
		mac := hmac.New(sha256.New, key)
		for _, p := range parts {
			mac.Write(p)
		}
		return []byte(hex.EncodeToString(mac.Sum(nil)))
	}
	send := func(s zmq4.Socket, ids [][]byte, parent []byte, typ string, content any) {
		h, _ := json.Marshal(jheader{MsgID: fmt.Sprint(time.Now().UnixNano()), MsgType: typ, Version: jupyterVersion})
		meta := []byte("{}")
		body, _ := json.Marshal(content)
		frames := append(append([][]byte{}, ids...), []byte(jupyterDelim), sign(h, parent, meta, body), h, parent, meta, body)
		s.Send(zmq4.NewMsgFrom(frames...))
	}
	status := func(parent []byte, st string) {
		send(iopub, nil, parent, "status", map[string]string{"execution_state": st})
	}
	spin := func(d time.Duration, until func() bool) {
		for start := time.Now(); time.Since(start) < d || d == 0; {
			if until != nil && until() {
				return
			}
		}
	}
	count := 0
	for {
		msg, err := shell.Recv()
		if err != nil {
			return 0
		}
		i := 0
		for i < len(msg.Frames) && string(msg.Frames[i]) != jupyterDelim {
			i++
		}
		if len(msg.Frames) < i+6 {
			continue
		}
		ids, h, content := msg.Frames[:i], msg.Frames[i+2], msg.Frames[i+5]
		var hdr jheader
		json.Unmarshal(h, &hdr)
		switch hdr.MsgType {
		case "kernel_info_request":
			status(h, "busy")
			send(shell, ids, h, "kernel_info_reply", map[string]any{"status": "ok", "protocol_version": jupyterVersion})
			status(h, "idle")
		case "execute_request":
			var req struct{ Code string }
			json.Unmarshal(content, &req)
			count++
			status(h, "busy")
			input := func() {
				if mode == "late" {
					send(iopub, nil, h, "execute_input", map[string]any{"code": req.Code, "execution_count": count})
				}
			}
			if req.Code != "loop" {
				input()
				send(shell, ids, h, "execute_reply", map[string]any{"status": "ok", "execution_count": count})
				status(h, "idle")
				continue
			}
			interrupted.Store(false)
			switch mode {
			case "late":
				time.Sleep(400 * time.Millisecond)
				input()
				time.Sleep(50 * time.Millisecond)
			case "drops":
				state.Store(fkCompiling)
				spin(600*time.Millisecond, nil)
			}
			state.Store(fkInCell)
			spin(0, interrupted.Load)
			state.Store(fkOutside)
			if mode == "slowreply" {
				time.Sleep(900 * time.Millisecond)
			}
			send(iopub, nil, h, "error", map[string]any{"ename": "KeyboardInterrupt", "evalue": "", "traceback": []string{}})
			send(shell, ids, h, "execute_reply", map[string]any{"status": "error", "ename": "KeyboardInterrupt", "evalue": "", "traceback": []string{}, "execution_count": count})
			status(h, "idle")
		}
	}
}

// fakeKernelDir installs a kernelspec for language that runs this test
// binary as a fake kernel in mode, and returns the kernelspec directory.
func fakeKernelDir(t interface {
	TempDir() string
	Fatal(...any)
}, language, mode string) string {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	spec := KernelSpec{Argv: []string{exe, "{connection_file}"}, Language: language, Env: map[string]string{fakeKernelEnv: mode}}
	data, _ := json.Marshal(spec)
	os.MkdirAll(filepath.Join(dir, "fake-"+mode), 0o755)
	if err := os.WriteFile(filepath.Join(dir, "fake-"+mode, "kernel.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}
