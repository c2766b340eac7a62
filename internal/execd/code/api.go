package code

import (
	"context"
	"strconv"

	"github.com/moat-sandbox/moat/internal/execd/wire"
)

// The Go API below is what the agent's other faces (the E2B code
// interpreter, package e2bcode) build on: the same contexts as /code, with
// executions that queue instead of failing "session is busy".

// Sink receives the events of one execution (a *wire.Stream is one).
// Send's error is ignored by the backends: a sink that can no longer
// deliver drops what follows.
type Sink interface {
	Send(wire.Event) error
}

// Create starts a context of language (its interpreter running in cwd, or
// in the agent's when cwd is "") and returns it.
func (s *Service) Create(ctx context.Context, language, cwd string) (ContextInfo, error) {
	c, err := s.createContext(ctx, language, cwd)
	if err != nil {
		return ContextInfo{}, err
	}
	return c.info(), nil
}

// Lookup returns the context id, or a 404 error.
func (s *Service) Lookup(id string) (ContextInfo, error) {
	c, err := s.contexts.Get(id)
	if err != nil {
		return ContextInfo{}, err
	}
	return c.info(), nil
}

// Contexts returns every context in creation order.
func (s *Service) Contexts() []ContextInfo {
	var out []ContextInfo
	for _, c := range s.listContexts("") {
		out = append(out, c.info())
	}
	return out
}

// Remove kills the interpreter of context id and forgets the context.
func (s *Service) Remove(id string) error { return s.removeContext(id) }

// Restart replaces the interpreter of context id by a fresh one of the
// same language and cwd, under the same id and in the same place of the
// order (so a default context stays the default). An execution running
// in the old interpreter ends with the interpreter's exit.
func (s *Service) Restart(ctx context.Context, id string) error {
	old, err := s.contexts.Get(id)
	if err != nil {
		return err
	}
	old.mu.Lock()
	old.restarts++
	gen := "-r" + strconv.Itoa(old.restarts)
	old.mu.Unlock()
	c, err := s.startContext(ctx, id, gen, old.language, old.cwd)
	if err != nil {
		return err
	}
	c.restarts = old.restarts
	prev, err := s.contexts.Replace(id, c)
	if err != nil { // removed meanwhile
		c.close()
		return err
	}
	prev.close()
	return nil
}

// Exec runs code in context id and streams its events to sink: first an
// init event (Text the context id, ExecutionCount the context's execution
// number), then the cell's stdout, stderr, execution_count and result
// events. It returns the error that ended the cell (nil on success), or
// err when the cell could not run (unknown context, exited interpreter,
// ctx done while waiting). Executions in one context queue: each waits for
// the one before it. ctx ending mid-cell interrupts the cell.
func (s *Service) Exec(ctx context.Context, id, code string, sink Sink) (final *wire.EventError, err error) {
	c, err := s.contexts.Get(id)
	if err != nil {
		return nil, err
	}
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.turn }()
	x, err := c.begin(s.run)
	if err != nil {
		return nil, err
	}
	defer x.end()
	sink.Send(wire.Event{Type: wire.EvInit, Text: c.id, ExecutionCount: x.n})
	return s.runCell(ctx, c, x, code, sink), nil
}

// info is the context's public view.
func (c *codeContext) info() ContextInfo {
	return ContextInfo{ID: c.id, Language: c.language, Cwd: c.cwd}
}
