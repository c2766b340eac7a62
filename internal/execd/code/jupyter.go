package code

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/moat-sandbox/moat/internal/execd/proc"
	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// A Jupyter kernel backs a code context when the image has one (see
// kernelspec.go). The agent starts the kernel itself from its kernelspec
// with a connection file (tcp on 127.0.0.1, HMAC-SHA256 signed messages)
// and speaks the Jupyter messaging protocol (v5.3) over ZeroMQ: shell
// (DEALER) for execute_request/execute_reply, iopub (SUB) for status,
// stream, execute_result, display_data and error, and control (DEALER) for
// interrupt_request when the kernelspec asks for message interrupts.

const (
	jupyterDelim         = "<IDS|MSG>"
	jupyterVersion       = "5.3"
	kernelStartTimeout   = 60 * time.Second
	kernelReplyAfterIdle = 2 * time.Second // wait for execute_reply once iopub is idle
	// kernelStartedAfterBusy is when a cell counts as started for a kernel
	// that publishes "busy" but no execute_input (tslab). ipykernel
	// publishes busy before it enables SIGINT for the cell, so
	// execute_input is the signal to wait for where there is one.
	kernelStartedAfterBusy = 250 * time.Millisecond
	// kernelRedeliver is how often an interrupt is repeated, until the
	// kernel answers the cell, for a kernel without execute_input: tslab
	// drops a SIGINT that comes while it compiles the cell.
	kernelRedeliver = 500 * time.Millisecond
	// A started cell takes a SIGINT (see kernelGate) once the kernel has
	// used kernelInCellCPU of CPU since the start (or since the last
	// SIGINT), no sooner than kernelInCellMin, or once it has not been
	// runnable for kernelAsleepInCell (a cell blocked in sleep or I/O).
	kernelInCellCPU    = 100 * time.Millisecond
	kernelInCellMin    = 100 * time.Millisecond
	kernelAsleepInCell = 300 * time.Millisecond
	kernelGatePoll     = 20 * time.Millisecond
	// An aborted request is sent again up to kernelAbortRetries times in
	// all, kernelAbortBackoff apart.
	kernelAbortRetries = 4
	kernelAbortBackoff = 300 * time.Millisecond
)

// jmsg is one Jupyter message.
type jmsg struct {
	Header   jheader         `json:"header"`
	Parent   jheader         `json:"parent_header"`
	Metadata json.RawMessage `json:"metadata"`
	Content  json.RawMessage `json:"content"`
	channel  string          // "shell", "iopub" or "control"
}

type jheader struct {
	MsgID    string `json:"msg_id,omitempty"`
	Session  string `json:"session,omitempty"`
	Username string `json:"username,omitempty"`
	Date     string `json:"date,omitempty"`
	MsgType  string `json:"msg_type,omitempty"`
	Version  string `json:"version,omitempty"`
}

// kernelClient is the agent's connection to one running kernel; it is the
// backend of a kernel-backed context.
type kernelClient struct {
	language      string
	key           []byte
	session       string
	interruptMode string
	proc          *proc.Proc
	dead          chan struct{} // closed once the kernel has exited

	ctx                   context.Context
	cancel                context.CancelFunc
	shell, control, iopub zmq4.Socket

	// announces: the kernel has published execute_input for a cell; its
	// cells' starts are then never guessed and its interrupts never
	// repeated (IRkernel dies of a SIGINT outside a cell).
	announces atomic.Bool

	mu      sync.Mutex
	waiters map[string]*jwaiter // by request msg_id
	closed  bool
}

// jwaiter collects the replies and iopub messages whose parent is one
// request. Delivery never blocks the socket readers: the queue is
// unbounded and the consumer is woken through ready.
type jwaiter struct {
	mu    sync.Mutex
	queue []jmsg
	ready chan struct{} // 1-buffered
	done  bool          // the kernel is gone
}

func newWaiter() *jwaiter { return &jwaiter{ready: make(chan struct{}, 1)} }

func (w *jwaiter) push(m jmsg) {
	w.mu.Lock()
	w.queue = append(w.queue, m)
	w.mu.Unlock()
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

func (w *jwaiter) finish() {
	w.mu.Lock()
	w.done = true
	w.mu.Unlock()
	select {
	case w.ready <- struct{}{}:
	default:
	}
}

// take returns the queued messages and whether the kernel is gone.
func (w *jwaiter) take() ([]jmsg, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	q := w.queue
	w.queue = nil
	return q, w.done
}

// connectionFile is the kernel's connection info.
type connectionFile struct {
	IP              string `json:"ip"`
	Transport       string `json:"transport"`
	ShellPort       int    `json:"shell_port"`
	IOPubPort       int    `json:"iopub_port"`
	StdinPort       int    `json:"stdin_port"`
	ControlPort     int    `json:"control_port"`
	HBPort          int    `json:"hb_port"`
	Key             string `json:"key"`
	SignatureScheme string `json:"signature_scheme"`
	KernelName      string `json:"kernel_name"`
}

// portPool hands out the five TCP ports of a kernel's connection file on
// 127.0.0.1, the way jupyter_client picks them (bind to port 0, then
// release), but never a port that a live kernel of this agent was given:
// kernels bind their ports only once started, so two contexts created at
// once could otherwise be handed the same port.
type portPool struct {
	mu    sync.Mutex
	inUse map[int]bool // guarded by mu
}

func newPortPool() *portPool { return &portPool{inUse: make(map[int]bool)} }

// take returns n distinct free ports, reserved until release.
func (pp *portPool) take(n int) ([]int, error) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 100*n {
			return nil, errors.New("no free port on 127.0.0.1")
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l) // held until all are picked: no repeats
		if p := l.Addr().(*net.TCPAddr).Port; !pp.inUse[p] {
			ports = append(ports, p)
		}
	}
	for _, p := range ports {
		pp.inUse[p] = true
	}
	return ports, nil
}

// release returns ports to the pool.
func (pp *portPool) release(ports []int) {
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for _, p := range ports {
		delete(pp.inUse, p)
	}
}

// startKernel launches the kernelspec for c and connects to it; it returns
// once the kernel answers on shell and publishes on iopub. Its connection
// file and log live in the context's directory.
func (s *Service) startKernel(ctx context.Context, c *codeContext, ks *KernelSpec) (*kernelClient, error) {
	ports, err := s.ports.take(5)
	if err != nil {
		return nil, wire.Runtime(err, "error allocating kernel ports: "+err.Error())
	}
	cf := newConnectionFile(ks.Name, ports)
	kp, err := s.spawnKernel(c, ks, cf)
	if err != nil {
		s.ports.release(ports)
		return nil, err
	}
	// The ports are the kernel's until it exits.
	kctx, cancel := context.WithCancel(s.run.Context())
	k := &kernelClient{
		language: c.key,
		key:      []byte(cf.Key), session: wire.NewID(), interruptMode: ks.InterruptMode, proc: kp,
		dead: make(chan struct{}),
		ctx:  kctx, cancel: cancel, waiters: make(map[string]*jwaiter),
	}
	// The sockets exist before the watcher below may close them.
	sockOpts := []zmq4.Option{zmq4.WithDialerRetry(50 * time.Millisecond), zmq4.WithDialerMaxRetries(-1)}
	k.shell = zmq4.NewDealer(k.ctx, sockOpts...)
	k.control = zmq4.NewDealer(k.ctx, sockOpts...)
	k.iopub = zmq4.NewSub(k.ctx, sockOpts...)
	s.run.Go(func() {
		<-kp.Done()
		s.ports.release(ports)
		close(k.dead)
		k.close()
	})
	if err := s.connectKernel(ctx, k, cf); err != nil {
		kp.Signal(syscall.SIGKILL)
		<-kp.Done()
		msg := "error starting the " + ks.Name + " Jupyter kernel: " + err.Error()
		if t := kernelLogTail(c.dir, 2048); t != "" {
			msg += "; kernel output: " + t
		}
		return nil, wire.Runtime(err, msg)
	}
	return k, nil
}

// newConnectionFile is the connection info of a kernel on ports (shell,
// iopub, stdin, control, heartbeat) with a fresh signing key.
func newConnectionFile(kernelName string, ports []int) connectionFile {
	var keyb [32]byte
	rand.Read(keyb[:])
	return connectionFile{
		IP: "127.0.0.1", Transport: "tcp",
		ShellPort: ports[0], IOPubPort: ports[1], StdinPort: ports[2], ControlPort: ports[3], HBPort: ports[4],
		Key: hex.EncodeToString(keyb[:]), SignatureScheme: "hmac-sha256", KernelName: kernelName,
	}
}

// spawnKernel writes cf to the context's directory and starts the
// kernelspec's argv on it, its output going to the kernel log.
func (s *Service) spawnKernel(c *codeContext, ks *KernelSpec, cf connectionFile) (*proc.Proc, error) {
	data, _ := json.Marshal(cf)
	connPath := filepath.Join(c.dir, "kernel.json")
	if err := os.WriteFile(connPath, data, 0o600); err != nil {
		return nil, wire.Runtime(err, "")
	}
	logf, err := os.OpenFile(filepath.Join(c.dir, kernelLogName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, wire.Runtime(err, "")
	}
	defer logf.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return nil, wire.Runtime(err, "")
	}
	defer devnull.Close()
	argv := make([]string, len(ks.Argv))
	for i, a := range ks.Argv {
		argv[i] = strings.ReplaceAll(a, "{connection_file}", connPath)
	}
	var extra []string
	for k, v := range ks.Env {
		extra = append(extra, k+"="+v)
	}
	kp, err := s.run.Start(proc.Spec{
		Path: argv[0], Args: argv, Env: proc.MergeEnv(s.run.Env(nil), extra), Dir: c.cwd,
		Files: []*os.File{devnull, logf, logf},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		return nil, wire.Runtime(err, "error starting the "+ks.Name+" Jupyter kernel: "+err.Error())
	}
	return kp, nil
}

// connectKernel dials the kernel's iopub, shell and control sockets to its ports, starts
// their readers and waits, bounded by kernelStartTimeout and ctx, until
// the kernel is ready.
func (s *Service) connectKernel(ctx context.Context, k *kernelClient, cf connectionFile) error {
	startCtx, stop := context.WithTimeout(ctx, kernelStartTimeout)
	defer stop()
	ready := make(chan struct{})
	defer close(ready) // runs before stop
	go func() {
		// A startup timeout or a cancelled request unblocks the dials
		// (the kernel's death does so through k.close).
		<-startCtx.Done()
		select {
		case <-ready:
		default:
			k.cancel()
		}
	}()
	addr := func(port int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port) }
	for _, d := range []struct {
		sck  zmq4.Socket
		port int
	}{{k.iopub, cf.IOPubPort}, {k.shell, cf.ShellPort}, {k.control, cf.ControlPort}} {
		if err := dialKernel(startCtx, d.sck, addr(d.port)); err != nil {
			return k.exitedOr(err)
		}
	}
	if err := k.iopub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return err
	}
	s.run.Go(func() { k.readLoop(k.shell, "shell") })
	s.run.Go(func() { k.readLoop(k.control, "control") })
	s.run.Go(func() { k.readLoop(k.iopub, "iopub") })
	return k.exitedOr(k.waitReady(startCtx))
}

// dialKernel dials one of a starting kernel's sockets. The socket retries
// a refused connection itself (WithDialerRetry); a kernel that is still
// setting its sockets up may also accept a connection and reset it
// before the ZMTP greeting, which is retried here until ctx ends.
func dialKernel(ctx context.Context, sck zmq4.Socket, endpoint string) error {
	for {
		err := sck.Dial(endpoint)
		if err == nil || !strings.Contains(err.Error(), "could not open a ZMTP connection") {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// exitedOr is err, or "the kernel exited" when that is why (nil stays nil).
func (k *kernelClient) exitedOr(err error) error {
	if err != nil && k.proc.Exited() {
		return errors.New("the kernel exited")
	}
	return err
}

// kernelLogName is the kernel's stdout and stderr, in its context's
// directory.
const kernelLogName = "kernel.log"

// kernelLogTail is the end (at most max bytes, trimmed) of the kernel log
// in dir; empty when there is none.
func kernelLogTail(dir string, max int) string {
	b, err := os.ReadFile(filepath.Join(dir, kernelLogName))
	if err != nil {
		return ""
	}
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return strings.TrimSpace(string(b))
}

// waitReady sends kernel_info_request until one is answered on shell and
// its busy/idle status has arrived on iopub, which proves the iopub
// subscription is live (messages published before it are lost).
func (k *kernelClient) waitReady(ctx context.Context) error {
	for {
		id, w, err := k.request(k.shell, "kernel_info_request", map[string]any{})
		if err != nil {
			return err
		}
		replied, published := false, false
		t := time.NewTimer(time.Second)
	wait:
		for !(replied && published) {
			select {
			case <-ctx.Done():
				t.Stop()
				k.forget(id)
				return fmt.Errorf("kernel did not become ready in %s", kernelStartTimeout)
			case <-t.C:
				break wait
			case <-w.ready:
			}
			msgs, gone := w.take()
			for _, m := range msgs {
				if m.channel == "shell" {
					replied = true
				} else if m.channel == "iopub" {
					published = true
				}
			}
			if gone {
				t.Stop()
				k.forget(id)
				return errors.New("the kernel exited")
			}
		}
		t.Stop()
		k.forget(id)
		if replied && published {
			return nil
		}
	}
}

func (k *kernelClient) close() {
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return
	}
	k.closed = true
	ws := k.waiters
	k.waiters = map[string]*jwaiter{}
	k.mu.Unlock()
	k.cancel()
	for _, s := range []zmq4.Socket{k.shell, k.control, k.iopub} {
		if s != nil {
			s.Close()
		}
	}
	for _, w := range ws {
		w.finish()
	}
}

func (k *kernelClient) process() *proc.Proc { return k.proc }

func (k *kernelClient) exited() bool {
	select {
	case <-k.dead:
		return true
	default:
		return false
	}
}

func (k *kernelClient) forget(id string) {
	k.mu.Lock()
	delete(k.waiters, id)
	k.mu.Unlock()
}

func (k *kernelClient) sign(parts ...[]byte) []byte {
	mac := hmac.New(sha256.New, k.key)
	for _, p := range parts {
		mac.Write(p)
	}
	return []byte(hex.EncodeToString(mac.Sum(nil)))
}

// request sends a message on sck and registers a waiter for its replies.
func (k *kernelClient) request(sck zmq4.Socket, msgType string, content any) (string, *jwaiter, error) {
	id := wire.NewID()
	h, _ := json.Marshal(jheader{
		MsgID: id, Session: k.session, Username: "moat", MsgType: msgType, Version: jupyterVersion,
		Date: time.Now().UTC().Format("2006-01-02T15:04:05.000000Z"),
	})
	parent, meta := []byte("{}"), []byte("{}")
	body, err := json.Marshal(content)
	if err != nil {
		return "", nil, err
	}
	w := newWaiter()
	k.mu.Lock()
	if k.closed {
		k.mu.Unlock()
		return "", nil, errors.New("the kernel connection is closed")
	}
	k.waiters[id] = w
	k.mu.Unlock()
	msg := zmq4.NewMsgFrom([]byte(jupyterDelim), k.sign(h, parent, meta, body), h, parent, meta, body)
	if err := sck.SendMulti(msg); err != nil {
		k.forget(id)
		return "", nil, err
	}
	return id, w, nil
}

// readLoop parses and verifies messages from one socket and hands each to
// the waiter of its parent request; others are dropped.
func (k *kernelClient) readLoop(sck zmq4.Socket, channel string) {
	for {
		raw, err := sck.Recv()
		if err != nil {
			if k.ctx.Err() != nil {
				return
			}
			// A broken connection: the kernel is gone or going.
			k.close()
			return
		}
		m, ok := k.parse(raw.Frames)
		if !ok {
			continue
		}
		m.channel = channel
		k.mu.Lock()
		w := k.waiters[m.Parent.MsgID]
		k.mu.Unlock()
		if w != nil {
			w.push(m)
		}
	}
}

func (k *kernelClient) parse(frames [][]byte) (jmsg, bool) {
	i := 0
	for i < len(frames) && string(frames[i]) != jupyterDelim {
		i++
	}
	if len(frames) < i+6 {
		return jmsg{}, false
	}
	sig, h, p, meta, content := frames[i+1], frames[i+2], frames[i+3], frames[i+4], frames[i+5]
	if !hmac.Equal(bytes.ToLower(sig), k.sign(h, p, meta, content)) {
		return jmsg{}, false
	}
	var m jmsg
	if json.Unmarshal(h, &m.Header) != nil || json.Unmarshal(p, &m.Parent) != nil {
		return jmsg{}, false
	}
	m.Metadata, m.Content = meta, content
	return m, true
}

// interrupt interrupts the running cell: SIGINT to the kernel's process
// group, or, for interrupt_mode "message", an interrupt_request on control
// whose interrupt_reply it waits for (bounded by ctx).
func (k *kernelClient) interrupt(ctx context.Context) error {
	if k.interruptMode != "message" {
		k.proc.Signal(syscall.SIGINT)
		return nil
	}
	id, w, err := k.request(k.control, "interrupt_request", map[string]any{})
	if err != nil {
		return err
	}
	defer k.forget(id)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for {
		select {
		case <-ctx.Done():
			return errors.New("the kernel did not answer interrupt_request")
		case <-w.ready:
		}
		msgs, gone := w.take()
		for _, m := range msgs {
			if m.Header.MsgType == "interrupt_reply" {
				return nil
			}
		}
		if gone {
			return errors.New("the kernel exited")
		}
	}
}

// exec executes code in the kernel and streams events exactly as upstream
// execd maps Jupyter messages (protocol §2.2): stream -> stdout/stderr with
// the raw text; execute_result -> execution_count (the kernel's) then
// result with text/plain renamed to text; display_data -> result; error ->
// the returned error; the cell ends once the kernel is idle and has
// replied. The cell counts as started (for held interrupts) at its
// execute_input, which kernels publish once they run the cell, or shortly
// after "busy" for a kernel that does not publish it.
func (k *kernelClient) exec(ctx context.Context, x *execution, code string, stream Sink) *wire.EventError {
	for attempt := 1; ; attempt++ {
		final, aborted := k.execOnce(x, code, stream)
		// A kernel may refuse a request for a moment after a failed cell
		// (tslab aborts what arrives within 200 ms): the cell did not run,
		// so it is sent again, unless the client interrupted it.
		if !aborted || attempt == kernelAbortRetries || x.interruptRequested() {
			return final
		}
		time.Sleep(kernelAbortBackoff)
	}
}

// execOnce sends one execute_request; aborted reports that the kernel
// refused it without running it.
func (k *kernelClient) execOnce(x *execution, code string, stream Sink) (_ *wire.EventError, aborted bool) {
	// stop_on_error is false: the agent runs one cell at a time, and with
	// true ipykernel answers "aborted" to a request that comes right after
	// a failed one (it aborts its queue for a moment).
	id, wt, err := k.request(k.shell, "execute_request", map[string]any{
		"code": code, "silent": false, "store_history": true, "user_expressions": map[string]any{},
		"allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return &wire.EventError{EName: "RuntimeError", EValue: "kernel is not running", Traceback: []string{err.Error()}}, false
	}
	defer k.forget(id)
	cr := &cellRun{k: k, x: x, stream: stream, gate: k.newGate()}
	defer cr.gate.settle()
	defer cr.stopRedeliver()
	for !(cr.replied && cr.idle) {
		select {
		case <-wt.ready:
		case <-cr.afterBusy:
			cr.guessStarted()
			continue
		case <-cr.redeliver:
			x.redeliver()
			continue
		case <-cr.afterIdle:
			cr.noReply()
			continue
		}
		msgs, gone := wt.take()
		for _, m := range msgs {
			cr.handle(m)
		}
		if gone {
			final := &wire.EventError{EName: "RuntimeError", EValue: "kernel exited", Traceback: []string{"the " + k.language + " Jupyter kernel exited"}}
			return final, false
		}
	}
	return cr.final, cr.aborted
}

// cellRun is one execute_request's view of the kernel: what it has said
// about the cell so far, and the timers that stand in for what a kernel
// may never say (execute_input, execute_reply).
type cellRun struct {
	k      *kernelClient
	x      *execution
	stream Sink
	// gate places this attempt's interrupts inside the cell; it closes
	// (no more SIGINT) once the kernel has answered the cell or the
	// attempt is over.
	gate *kernelGate

	final     *wire.EventError
	aborted   bool
	streamed  bool // the cell produced output, a result or an error
	replied   bool
	idle      bool
	busy      bool
	afterIdle <-chan time.Time
	afterBusy <-chan time.Time
	redeliver <-chan time.Time // only when the start was guessed
	ticker    *time.Ticker     // redeliver's
}

func (cr *cellRun) started() {
	cr.gate.start()
	cr.x.markStarted(cr.gate)
}

// guessStarted: busy without execute_input for kernelStartedAfterBusy.
// The start is a guess: a kernel may still be compiling the cell (tslab
// drops a SIGINT then), so a delivered interrupt is repeated until the
// kernel answers.
func (cr *cellRun) guessStarted() {
	cr.afterBusy = nil
	cr.started()
	cr.ticker = time.NewTicker(kernelRedeliver)
	cr.redeliver = cr.ticker.C
}

func (cr *cellRun) stopRedeliver() {
	if cr.ticker != nil {
		cr.ticker.Stop()
	}
}

// noReply: idle for kernelReplyAfterIdle without execute_reply, which
// ipykernel never sends when SIGINT lands in its own code before it runs
// the cell.
func (cr *cellRun) noReply() {
	cr.replied = true
	if cr.final == nil && cr.x.interruptDelivered() {
		cr.final = &wire.EventError{EName: "KeyboardInterrupt", EValue: "interrupted before the cell ran", Traceback: []string{}}
	}
}

// handle maps one message of the cell to events and state.
func (cr *cellRun) handle(m jmsg) {
	switch m.Header.MsgType {
	case "execute_input":
		// The start is known: no guess, no repeat (a repeat that lands
		// after the kernel has finished the cell kills IRkernel).
		cr.k.announces.Store(true)
		cr.afterBusy, cr.redeliver = nil, nil
		cr.started()
	case "stream":
		cr.started()
		cr.streamed = true
		var st struct{ Name, Text string }
		json.Unmarshal(m.Content, &st)
		typ := wire.EvStdout
		if st.Name == "stderr" {
			typ = wire.EvStderr
		}
		cr.stream.Send(wire.Event{Type: typ, Text: st.Text})
	case "execute_result", "display_data":
		cr.streamed = true
		cr.sendResult(m)
	case "error":
		cr.streamed = true
		cr.gate.settle()
		cr.final = kernelError(m.Content)
	case "status":
		if m.channel == "iopub" {
			cr.status(m)
		}
	case "execute_reply":
		cr.reply(m)
	}
}

// sendResult sends an execute_result (after its execution_count) or a
// display_data as a result event, text/plain renamed to text (upstream's
// rename, protocol §14.2).
func (cr *cellRun) sendResult(m jmsg) {
	var res struct {
		ExecutionCount int            `json:"execution_count"`
		Data           map[string]any `json:"data"`
	}
	json.Unmarshal(m.Content, &res)
	results := map[string]any{}
	for mime, v := range res.Data {
		if mime == "text/plain" {
			mime = "text"
		}
		results[mime] = v
	}
	if m.Header.MsgType == "execute_result" {
		cr.stream.Send(wire.Event{Type: wire.EvExecutionCount, ExecutionCount: res.ExecutionCount})
	}
	cr.stream.Send(wire.Event{Type: wire.EvResult, ExecutionCount: res.ExecutionCount, Results: results})
}

// status follows the kernel's busy/idle on iopub.
func (cr *cellRun) status(m jmsg) {
	var st struct {
		ExecutionState string `json:"execution_state"`
	}
	json.Unmarshal(m.Content, &st)
	switch st.ExecutionState {
	case "busy":
		if !cr.busy && !cr.k.announces.Load() {
			cr.busy = true
			cr.afterBusy = time.After(kernelStartedAfterBusy)
		}
	case "idle":
		cr.idle = true
		if !cr.replied {
			cr.afterIdle = time.After(kernelReplyAfterIdle)
		}
	}
}

// reply ends the cell on execute_reply; an abort of a cell that produced
// nothing means the kernel refused it without running it.
func (cr *cellRun) reply(m jmsg) {
	cr.replied = true
	cr.redeliver = nil
	cr.gate.settle()
	var rep struct {
		Status string `json:"status"`
	}
	json.Unmarshal(m.Content, &rep)
	switch {
	case rep.Status == "error" && cr.final == nil:
		cr.final = kernelError(m.Content)
	case (rep.Status == "aborted" || rep.Status == "abort") && cr.final == nil:
		cr.final = &wire.EventError{EName: "ExecutionAborted", EValue: "execution was aborted", Traceback: []string{}}
		cr.aborted = !cr.streamed
	}
}

// kernelGate places a cell's SIGINTs inside the kernel's evaluation of it:
// a SIGINT in the kernel's own code around the cell kills IRkernel, and a
// loaded machine stretches that code past any fixed wait. So it opens on
// /proc evidence: kernelInCellCPU used since the start or last SIGINT, or
// (before the first SIGINT) not runnable for kernelAsleepInCell. It never
// opens once the kernel has answered the cell.
type kernelGate struct {
	pgid int
	dead <-chan struct{} // the kernel has exited
	over chan struct{}   // closed by settle

	mu    sync.Mutex
	since time.Time     // the start, or the last SIGINT
	cpu0  time.Duration // the group's CPU time at since
	armed bool          // since is set
}

func (k *kernelClient) newGate() *kernelGate {
	return &kernelGate{pgid: k.proc.Pid, dead: k.dead, over: make(chan struct{})}
}

// settle closes the gate for good: the kernel has answered the cell.
func (g *kernelGate) settle() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.over:
	default:
		close(g.over)
	}
}

// start records the start of the cell (only the first call counts).
func (g *kernelGate) start() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.armed {
		g.arm()
	}
}

// arm starts a measurement from now. Preconditions: g.mu is held.
func (g *kernelGate) arm() {
	g.since, g.cpu0, g.armed = time.Now(), readGroupUsage(g.pgid).cpu, true
}

func (g *kernelGate) sent() {
	g.mu.Lock()
	g.arm()
	g.mu.Unlock()
}

func (g *kernelGate) wait(ctx context.Context, again bool) bool {
	g.mu.Lock()
	if !g.armed {
		g.arm()
	}
	since, cpu0 := g.since, g.cpu0
	g.mu.Unlock()
	lastRunnable := since
	t := time.NewTicker(kernelGatePoll)
	defer t.Stop()
	for {
		select {
		case <-g.over:
			return false
		case <-g.dead:
			return false
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		now := time.Now()
		u := readGroupUsage(g.pgid)
		if u.nmembers == 0 {
			// No /proc to read: the start delay alone.
			if now.Sub(since) >= kernelInCellMin {
				return true
			}
			continue
		}
		if u.running {
			lastRunnable = now
		}
		if now.Sub(since) >= kernelInCellMin && u.cpu-cpu0 >= kernelInCellCPU {
			return true
		}
		// After a SIGINT only CPU tells that the cell still runs: a
		// kernel that took it may sleep while it wraps up the cell.
		if !again && now.Sub(lastRunnable) >= kernelAsleepInCell {
			return true
		}
	}
}

func kernelError(content json.RawMessage) *wire.EventError {
	var e wire.EventError
	json.Unmarshal(content, &e)
	if e.Traceback == nil {
		e.Traceback = []string{}
	}
	if e.EName == "" {
		// Some kernels (tslab) reply "error" and print the error to
		// stderr without an error message.
		e.EName, e.EValue = "Error", "the kernel reported an error (see stderr)"
	}
	return &e
}
