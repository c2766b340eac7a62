package cli

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/internal/image"
)

// ttyProgress draws pull progress on a terminal: one line per layer with a
// bar, plus a total line, redrawn in place (ANSI cursor-up) at most every
// redrawEvery, and at once when a layer finishes.
type ttyProgress struct {
	w io.Writer

	mu     sync.Mutex
	order  []string // layers in order of first report
	layers map[string]image.Progress
	drawn  int // lines drawn last time
	last   time.Time
	now    func() time.Time
}

const redrawEvery = 100 * time.Millisecond

func newTTYProgress(w io.Writer) *ttyProgress {
	return &ttyProgress{w: w, layers: map[string]image.Progress{}, now: time.Now}
}

// report is the image.Store.Pull progress callback.
func (t *ttyProgress) report(p image.Progress) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.layers[p.Layer]; !ok {
		t.order = append(t.order, p.Layer)
	}
	t.layers[p.Layer] = p
	if !p.Done && t.now().Sub(t.last) < redrawEvery {
		return
	}
	t.drawLocked()
}

// finish draws the final state.
func (t *ttyProgress) finish() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.order) > 0 {
		t.drawLocked()
	}
}

// drawLocked redraws every line. Preconditions: t.mu held.
func (t *ttyProgress) drawLocked() {
	t.last = t.now()
	var b strings.Builder
	if t.drawn > 0 {
		fmt.Fprintf(&b, "\x1b[%dA", t.drawn)
	}
	var done, cached int
	var complete, total int64
	for _, id := range t.order {
		p := t.layers[id]
		b.WriteString("\r\x1b[2K" + layerLine(p) + "\n")
		switch {
		case p.Cached:
			cached++
		case p.Done:
			done++
		}
		complete += p.Complete
		total += max(p.Total, p.Complete)
	}
	fmt.Fprintf(&b, "\r\x1b[2K%d/%d layers", done+cached, len(t.order))
	if cached > 0 {
		fmt.Fprintf(&b, " (%d already present)", cached)
	}
	fmt.Fprintf(&b, ", %s / %s\n", humanSize(complete), humanSize(total))
	t.drawn = len(t.order) + 1
	io.WriteString(t.w, b.String())
}

// layerLine is one layer's line: "sha256abcdef: [=====>     ] 1.2MB / 4.0MB".
func layerLine(p image.Progress) string {
	id := shortID(p.Layer)
	switch {
	case p.Cached:
		return id + ": already present"
	case p.Done:
		return fmt.Sprintf("%s: done (%s)", id, humanSize(p.Complete))
	case p.Total > 0:
		return fmt.Sprintf("%s: %s %s / %s", id, bar(p.Complete, p.Total, 30), humanSize(p.Complete), humanSize(p.Total))
	}
	return fmt.Sprintf("%s: %s", id, humanSize(p.Complete))
}

// bar renders a width-wide progress bar for n of total.
func bar(n, total int64, width int) string {
	fill := 0
	if total > 0 {
		fill = int(min(n, total) * int64(width) / total)
	}
	s := strings.Repeat("=", fill)
	if fill < width {
		s += ">" + strings.Repeat(" ", width-fill-1)
	}
	return "[" + s + "]"
}
