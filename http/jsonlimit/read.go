package jsonlimit

import (
	"io"
	"slices"
)

// Read reads r to its end and returns the bytes, or the first error: a
// *LimitError as soon as a limit is passed (having read no more of r than the
// chunk in which it was passed: at most 32 KiB beyond the byte that passed it),
// a *SyntaxError for input that is not one JSON value (optionally surrounded by
// whitespace), or an error of r itself, returned as is. Errors found in the
// document are reported in the order of the document, so a body that is both
// malformed and too large is reported as whichever comes first.
//
// Limits aside, Read accepts exactly the documents that encoding/json's Valid
// accepts, which refuses nesting deeper than 10000; like Valid, it accepts
// invalid UTF-8 inside strings. The memory Read uses beyond the document
// grows with the depth of nesting, not with the size of the document.
func Read(r io.Reader, l Limits) ([]byte, error) {
	return NewChecker(l).Read(r)
}

// Checker is Limits made ready once to check many documents: the names of
// its paths are folded when it is made, not for every document. It is
// safe for concurrent use.
type Checker struct {
	l Limits
	// paths maps each folded path to its limit; nil when there are none.
	paths map[string]int
}

// NewChecker prepares l for Read.
func NewChecker(l Limits) *Checker {
	c := &Checker{l: l}
	if len(l.Paths) > 0 {
		c.paths = make(map[string]int, len(l.Paths))
		for p, n := range l.Paths {
			k := string(appendFolded(nil, []byte(p)))
			n = max(n, 0)
			if old, ok := c.paths[k]; ok {
				n = tighter(old, n)
			}
			c.paths[k] = n
		}
	}
	return c
}

// Read reads and checks one document from r, as the function Read does
// with c's limits.
func (c *Checker) Read(r io.Reader) ([]byte, error) {
	l := c.l
	s := newScanner(c)
	var buf []byte
	empty := 0
	for {
		if cap(buf)-len(buf) < minRead {
			buf = slices.Grow(buf, max(len(buf), minRead))
		}
		start := len(buf)
		room := min(cap(buf)-start, chunkSize)
		if l.MaxBytes > 0 {
			// Reading one byte past MaxBytes is enough to know it was passed.
			if left := l.MaxBytes - int64(start); left < int64(room) {
				room = int(left) + 1
			}
		}
		n, rerr := r.Read(buf[start : start+room])
		buf = buf[:start+n]

		end := len(buf)
		tooLarge := l.MaxBytes > 0 && int64(end) > l.MaxBytes
		if tooLarge {
			end = int(l.MaxBytes)
		}
		if err := s.scan(buf[:end], start); err != nil {
			return nil, err
		}
		if tooLarge {
			return nil, &LimitError{Kind: "bytes", Limit: l.MaxBytes}
		}

		switch {
		case rerr == io.EOF:
			if err := s.finish(len(buf)); err != nil {
				return nil, err
			}
			return buf, nil
		case rerr != nil:
			return nil, rerr
		case n == 0:
			empty++
			if empty >= maxEmptyReads {
				return nil, io.ErrNoProgress
			}
		default:
			empty = 0
		}
	}
}
