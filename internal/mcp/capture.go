package mcp

import (
	"fmt"
	"unicode/utf8"
)

// capture keeps a bounded view of a stream: its first half and its last
// half of limit bytes, dropping the middle once more than limit bytes were
// written. Errors tend to be at the end of a command's output and context
// at its start, so both are worth keeping.
//
// Invariant: head fills first (up to headCap); only then does the ring
// receive bytes, so head+ring is the whole stream while total <= limit.
type capture struct {
	headCap int
	head    []byte
	ring    []byte // len == tail capacity once allocated
	pos     int    // next write position in ring
	filled  int    // valid bytes in ring (<= len(ring))
	tailCap int
	total   int64
}

func newCapture(limit int) *capture {
	h := limit - limit/2
	return &capture{headCap: h, tailCap: limit / 2}
}

func (c *capture) write(b []byte) {
	c.total += int64(len(b))
	if n := min(c.headCap-len(c.head), len(b)); n > 0 {
		c.head = append(c.head, b[:n]...)
		b = b[n:]
	}
	if len(b) == 0 || c.tailCap == 0 {
		return
	}
	if c.ring == nil {
		c.ring = make([]byte, c.tailCap)
	}
	if len(b) >= c.tailCap {
		copy(c.ring, b[len(b)-c.tailCap:])
		c.pos, c.filled = 0, c.tailCap
		return
	}
	n := copy(c.ring[c.pos:], b)
	if n < len(b) {
		copy(c.ring, b[n:])
	}
	c.pos = (c.pos + len(b)) % c.tailCap
	c.filled = min(c.filled+len(b), c.tailCap)
}

// line writes one output line and its terminator.
func (c *capture) line(s string) {
	c.write([]byte(s))
	c.write([]byte{'\n'})
}

// truncated reports whether bytes were dropped.
func (c *capture) truncated() bool {
	return c.total > int64(len(c.head)+c.filled)
}

func (c *capture) tail() []byte {
	if c.filled < c.tailCap {
		return c.ring[:c.filled]
	}
	out := make([]byte, 0, c.tailCap)
	out = append(out, c.ring[c.pos:]...)
	return append(out, c.ring[:c.pos]...)
}

// String returns the kept bytes; when the middle was dropped, a marker
// line says how much, and the cut ends are trimmed to whole UTF-8
// characters.
func (c *capture) String() string {
	if !c.truncated() {
		return string(c.head) + string(c.tail())
	}
	head, tail := trimRuneEnd(c.head), trimRuneStart(c.tail())
	omitted := c.total - int64(len(head)+len(tail))
	return fmt.Sprintf("%s\n[... %d bytes omitted ...]\n%s", head, omitted, tail)
}

// trimRuneEnd drops an incomplete UTF-8 sequence at the end of b.
func trimRuneEnd(b []byte) []byte {
	for i := 1; i <= utf8.UTFMax && i <= len(b); i++ {
		if utf8.RuneStart(b[len(b)-i]) {
			if r, _ := utf8.DecodeRune(b[len(b)-i:]); r == utf8.RuneError && !utf8.FullRune(b[len(b)-i:]) {
				return b[:len(b)-i]
			}
			return b
		}
	}
	return b
}

// trimRuneStart drops UTF-8 continuation bytes at the start of b.
func trimRuneStart(b []byte) []byte {
	for i := 0; i < utf8.UTFMax && i < len(b); i++ {
		if utf8.RuneStart(b[i]) {
			return b[i:]
		}
	}
	return b
}
