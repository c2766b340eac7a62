package wire

import (
	"bytes"
	"strconv"
	"unicode/utf8"
)

// MaxLine bounds one stdout/stderr event; longer lines are split.
const MaxLine = 1 << 20

// LineSplitter turns a byte stream into line events the way upstream execd
// does: "\n", "\r" and "\r\n" end a line and are stripped; an empty line is
// reported as the text "\n" (so clients see the gap); the trailing partial
// line is emitted by flush.
type LineSplitter struct {
	typ    string
	buf    []byte
	lastCR bool
	ts     int64 // timestamp of the events of one write (one clock read per chunk)
}

// NewLineSplitter returns a splitter that emits events of type typ
// (EvStdout or EvStderr).
func NewLineSplitter(typ string) *LineSplitter { return &LineSplitter{typ: typ} }

// Append appends the events for p to out.
func (l *LineSplitter) Append(out []byte, p []byte) []byte {
	l.ts = nowMs()
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		if i < 0 {
			l.buf = append(l.buf, p...)
			l.lastCR = false
			if len(l.buf) >= MaxLine {
				out = l.emit(out, string(l.buf))
				l.buf = l.buf[:0]
			}
			return out
		}
		b := p[i]
		l.buf = append(l.buf, p[:i]...)
		if i > 0 {
			l.lastCR = false
		}
		switch {
		case len(l.buf) > 0:
			out = l.emit(out, string(l.buf))
			l.buf = l.buf[:0]
		case b == '\n' && l.lastCR:
			// second half of "\r\n", already emitted at "\r"
		default:
			out = l.emit(out, "\n")
		}
		l.lastCR = b == '\r'
		p = p[i+1:]
	}
	return out
}

// Flush appends the event of the trailing partial line, if any.
func (l *LineSplitter) Flush(out []byte) []byte {
	l.ts = nowMs()
	if len(l.buf) > 0 {
		out = l.emit(out, string(l.buf))
		l.buf = l.buf[:0]
	}
	return out
}

// emit appends one output event. It is the hot path of streaming, so it
// writes the same bytes AppendEvent would without reflection.
func (l *LineSplitter) emit(out []byte, text string) []byte {
	out = append(out, `{"type":"`...)
	out = append(out, l.typ...)
	out = append(out, `","text":`...)
	out = AppendJSONString(out, text)
	out = append(out, `,"timestamp":`...)
	out = strconv.AppendInt(out, l.ts, 10)
	return append(out, "}\n\n"...)
}

// AppendJSONString appends s as a JSON string exactly like encoding/json
// with SetEscapeHTML(false): invalid UTF-8 becomes U+FFFD, and U+2028 and
// U+2029 are escaped.
func AppendJSONString(out []byte, s string) []byte {
	const hex = "0123456789abcdef"
	out = append(out, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' {
				i++
				continue
			}
			out = append(out, s[start:i]...)
			switch b {
			case '"', '\\':
				out = append(out, '\\', b)
			case '\n':
				out = append(out, '\\', 'n')
			case '\r':
				out = append(out, '\\', 'r')
			case '\t':
				out = append(out, '\\', 't')
			case '\b':
				out = append(out, '\\', 'b')
			case '\f':
				out = append(out, '\\', 'f')
			default:
				out = append(out, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			out = append(out, s[start:i]...)
			out = append(out, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			out = append(out, s[start:i]...)
			out = append(out, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	out = append(out, s[start:]...)
	return append(out, '"')
}
