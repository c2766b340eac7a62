package code

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moat-sandbox/moat/internal/errdefs"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

const (
	sigKILL = syscall.SIGKILL
	sigINT  = syscall.SIGINT

	// driverStartTimeout bounds a driver's start (a JVM compiling the
	// jshell driver takes a few seconds on a busy machine).
	driverStartTimeout = 60 * time.Second
)

// driverProc is a running built-in driver (see drivers.go).
type driverProc struct {
	d        *driver
	dir      string // the context's directory (cell files)
	p        *proc.Proc
	req      *os.File      // driver fd 4
	ctl      *bufio.Reader // driver fd 3
	out, err *syncPipe     // driver fds 1 and 2
	dead     chan struct{} // closed once the driver has exited
}

// driverMsg is one message of a driver on fd 3.
type driverMsg struct {
	Type      string            `json:"type"`
	Text      string            `json:"text"`
	Data      map[string]string `json:"data"`
	EName     string            `json:"ename"`
	EValue    string            `json:"evalue"`
	Traceback []string          `json:"traceback"`
}

// startDriver starts d for c and waits for its "ready" message, so a
// driver that cannot start (no TypeScript compiler, a broken JDK) fails
// the context's creation with its reason.
func (s *Service) startDriver(ctx context.Context, c *codeContext, d *driver) (*driverProc, error) {
	argv := append([]string(nil), d.argv...)
	if d.source != "" {
		src := filepath.Join(c.dir, d.sourceName)
		if err := os.WriteFile(src, []byte(d.source), 0o600); err != nil {
			return nil, wire.Runtime(err, "")
		}
		argv = append(argv, src)
	}
	dp, err := s.spawnDriver(c, d, argv)
	if err != nil {
		return nil, err
	}
	// Until the first cell, stderr is kept for a start failure's message.
	startErr := &tailBuffer{max: 4096}
	dp.err.setSink(startErr.write)
	s.run.Go(dp.out.run)
	s.run.Go(dp.err.run)
	if err := dp.awaitReady(ctx); err != nil {
		dp.err.barrier()
		msg := "error starting the " + c.key + " interpreter: " + err.Error()
		if tail := strings.TrimSpace(startErr.String()); tail != "" {
			msg += "; output: " + tail
		}
		return nil, errdefs.WithPublic(fmt.Errorf("%w: %v", errdefs.ErrFailedPrecondition, err), wire.CodeRuntimeError, msg)
	}
	dp.err.setSink(nil)
	return dp, nil
}

// spawnDriver starts argv in c's cwd with stdin /dev/null and pipes on
// fds 1-4 (see drivers.go); the driver's ends close when it exits.
func (s *Service) spawnDriver(c *codeContext, d *driver, argv []string) (*driverProc, error) {
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, wire.Runtime(err, "")
	}
	defer devnull.Close()
	var fds [8]*os.File // outR outW errR errW ctlR ctlW reqR reqW
	for i := 0; i < len(fds); i += 2 {
		if fds[i], fds[i+1], err = os.Pipe(); err != nil {
			for _, f := range fds[:i] {
				f.Close()
			}
			return nil, wire.Runtime(err, "")
		}
	}
	outR, outW, errR, errW, ctlR, ctlW, reqR, reqW := fds[0], fds[1], fds[2], fds[3], fds[4], fds[5], fds[6], fds[7]
	p, err := s.run.Start(proc.Spec{
		Path: argv[0], Args: argv, Env: s.run.Env(nil), Dir: c.cwd,
		Files: []*os.File{devnull, outW, errW, ctlW, reqR},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	for _, f := range []*os.File{outW, errW, ctlW, reqR} {
		f.Close()
	}
	if err != nil {
		for _, f := range []*os.File{outR, errR, ctlR, reqW} {
			f.Close()
		}
		return nil, wire.Runtime(err, "error starting the "+c.key+" interpreter: "+err.Error())
	}
	dp := &driverProc{
		d: d, dir: c.dir, p: p, req: reqW, ctl: bufio.NewReaderSize(ctlR, 64<<10),
		out: newSyncPipe(outR), err: newSyncPipe(errR), dead: make(chan struct{}),
	}
	s.run.Go(func() {
		<-p.Done()
		close(dp.dead)
		reqW.Close()
		ctlR.Close()
	})
	return dp, nil
}

// awaitReady waits for the driver's "ready" message; on a failure it kills
// the driver and returns once its message reader has ended.
func (dp *driverProc) awaitReady(ctx context.Context) error {
	ready := make(chan error, 1)
	go func() { ready <- dp.readyMessage() }()
	t := time.NewTimer(driverStartTimeout)
	defer t.Stop()
	var err error
	answered := false
	select {
	case err = <-ready:
		answered = true
	case <-t.C:
		err = fmt.Errorf("the interpreter did not start in %s", driverStartTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		dp.p.Signal(sigKILL)
		<-dp.p.Done()
		if !answered {
			<-ready // the reader ends with the pipe
		}
	}
	return err
}

// readyMessage reads the driver's first "ready" or "error" message.
func (dp *driverProc) readyMessage() error {
	for {
		m, err := dp.next()
		if err != nil {
			return errors.New("the interpreter exited")
		}
		switch m.Type {
		case "ready":
			return nil
		case "error":
			return errors.New(m.EName + ": " + m.EValue)
		}
	}
}

// next reads the driver's next message (skipping lines that are not one).
func (dp *driverProc) next() (driverMsg, error) {
	for {
		raw, err := dp.ctl.ReadBytes('\n')
		if err != nil {
			return driverMsg{}, err
		}
		var m driverMsg
		if json.Unmarshal(raw, &m) == nil && m.Type != "" {
			return m, nil
		}
	}
}

func (dp *driverProc) process() *proc.Proc { return dp.p }

func (dp *driverProc) exited() bool {
	select {
	case <-dp.dead:
		return true
	default:
		return false
	}
}

// interrupt sends SIGINT to the driver's process group, which reaches the
// cell's subprocesses too.
func (dp *driverProc) interrupt(context.Context) error {
	dp.p.Signal(sigINT)
	return nil
}

// exec sends one cell to the driver and streams its messages until
// "done".
func (dp *driverProc) exec(ctx context.Context, x *execution, code string, stream Sink) *wire.EventError {
	line := []byte(nil)
	if dp.d.cellFile {
		cell := filepath.Join(dp.dir, "cell-"+strconv.Itoa(x.n)+dp.d.ext)
		if err := os.WriteFile(cell, []byte(dp.d.cellPrefix+code+"\n"), 0o600); err != nil {
			return &wire.EventError{EName: "RuntimeError", EValue: "cannot write the cell", Traceback: []string{err.Error()}}
		}
		defer os.Remove(cell)
		line = []byte(cell)
	} else {
		line, _ = json.Marshal(map[string]string{"code": code})
	}
	dp.out.setSink(func(b []byte) { stream.Send(wire.Event{Type: wire.EvStdout, Text: string(b)}) })
	dp.err.setSink(func(b []byte) { stream.Send(wire.Event{Type: wire.EvStderr, Text: string(b)}) })
	defer func() {
		dp.out.setSink(nil)
		dp.err.setSink(nil)
	}()
	if _, err := dp.req.Write(append(line, '\n')); err != nil {
		return &wire.EventError{EName: "RuntimeError", EValue: "interpreter is not running", Traceback: []string{err.Error()}}
	}
	var final *wire.EventError
	for {
		m, err := dp.next()
		if err != nil {
			final = &wire.EventError{EName: "RuntimeError", EValue: "interpreter exited", Traceback: []string{"the " + dp.d.language + " interpreter exited"}}
			break
		}
		switch m.Type {
		case "start":
			x.markStarted(nil)
		case "stdout":
			stream.Send(wire.Event{Type: wire.EvStdout, Text: m.Text})
		case "stderr":
			stream.Send(wire.Event{Type: wire.EvStderr, Text: m.Text})
		case "result":
			results := map[string]any{}
			for k, v := range m.Data {
				if k == "text/plain" {
					k = "text" // upstream's rename (protocol §14.2)
				}
				results[k] = v
			}
			stream.Send(wire.Event{Type: wire.EvExecutionCount, ExecutionCount: x.n})
			stream.Send(wire.Event{Type: wire.EvResult, ExecutionCount: x.n, Results: results})
		case "error":
			tb := m.Traceback
			if tb == nil {
				tb = []string{}
			}
			final = &wire.EventError{EName: m.EName, EValue: m.EValue, Traceback: tb}
		}
		if m.Type == "done" {
			break
		}
	}
	// Output written directly to fds 1/2 before "done" is delivered first.
	dp.out.barrier()
	dp.err.barrier()
	return final
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) write(p []byte) {
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
}

func (t *tailBuffer) String() string { return string(t.b) }
