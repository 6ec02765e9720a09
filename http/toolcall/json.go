package toolcall

import (
	"encoding/json"
	"strings"
)

// scanState is where a scanner is in the JSON grammar (RFC 8259).
type scanState uint8

const (
	stValue        scanState = iota // a value is expected
	stValueOrClose                  // an array's first element, or ']'
	stKeyOrClose                    // an object's first key, or '}'
	stKey                           // a key, after a comma
	stColon                         // the colon after a key
	stNext                          // after a member or element: ',' or the close
	stString                        // in a string
	stEscape                        // after a backslash in a string
	stHex                           // in the four digits of a \u escape
	stLiteral                       // in true, false or null
	stMinus                         // after a number's minus sign
	stZero                          // after a number's leading zero
	stInt                           // in a number's integer digits
	stDot                           // after a number's decimal point
	stFrac                          // in a number's fraction digits
	stExp                           // after a number's e or E
	stExpSign                       // after the exponent's sign
	stExpDigits                     // in the exponent's digits
	stDone                          // the value is complete
	stError                         // the text is not JSON
)

// event is what a scanner stops for.
type event uint8

const (
	// evMore: the text ended; the scanner waits for more.
	evMore event = iota
	// evStart: a value begins at at.
	evStart
	// evEnd: a value ends at at (the offset just past it).
	evEnd
	// evKey: a key ends at at; its text, quotes included, is
	// text[keyStart:at].
	evKey
	// evError: the byte at at is not JSON.
	evError
)

// scanner reads one JSON value, byte by byte, across texts that grow. It
// keeps its whole state between calls to next, so each byte is read once.
// It stops for the starts and ends of values and the ends of keys that lie
// at most watch containers deep, and reads deeper ones without stopping.
type scanner struct {
	pos   int // the next byte to read
	state scanState
	stack []byte // the open containers, '{' or '['
	key   bool   // the string being read is a key
	lit   string // the rest of the literal being read
	hex   int    // digits left in the \u escape being read
	watch int

	// Set by next for the event it returns.
	at       int
	depth    int // containers around the value or key
	keyStart int
}

// reset makes s read a value that begins at pos, or after whitespace.
func (s *scanner) reset(pos, watch int) {
	s.pos, s.state, s.stack, s.key, s.lit, s.hex, s.watch = pos, stValue, s.stack[:0], false, "", 0, watch
}

func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isHex(c byte) bool { return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F' }

// next reads text from s.pos until an event that is watched. In stDone and
// stError it reads nothing and returns evMore.
//
// The bytes that come most often, in strings, between tokens and around
// keys, are read here or by helpers small enough to be inlined, so that they
// cost no call; a number is read by one call, and so is a comma or close
// after a value. Helpers that may stop return the event to stop for and
// true, or false to read on.
func (s *scanner) next(text string) event {
	for s.pos < len(text) {
		switch c := text[s.pos]; s.state {
		case stString:
			if s.pos = plainEnd(text, s.pos); s.pos == len(text) {
				return evMore
			}
			switch c = text[s.pos]; {
			case c == '\\':
				s.state = stEscape
				s.pos++
			case c < 0x20:
				return s.fail()
			default:
				if ev, stop := s.endString(); stop {
					return ev
				}
			}
		case stEscape:
			if !s.readEscape(c) {
				return s.fail()
			}
		case stHex:
			if !s.readHex(c) {
				return s.fail()
			}
		case stValue, stValueOrClose:
			switch {
			case isJSONSpace(c):
				s.pos++
			case c == ']' && s.state == stValueOrClose:
				if s.close() {
					return evEnd
				}
			default:
				if ev := s.begin(c); ev != evMore {
					return ev
				}
			}
		case stKeyOrClose, stKey:
			switch {
			case isJSONSpace(c):
				s.pos++
			case c == '"':
				s.keyStart, s.key, s.state = s.pos, true, stString
				s.pos++
			case c == '}' && s.state == stKeyOrClose:
				if s.close() {
					return evEnd
				}
			default:
				return s.fail()
			}
		case stColon:
			if c == ':' {
				s.state = stValue
			} else if !isJSONSpace(c) {
				return s.fail()
			}
			s.pos++
		case stNext:
			if isJSONSpace(c) {
				s.pos++
			} else if ev, stop := s.readNext(c); stop {
				return ev
			}
		case stLiteral:
			if ev, stop := s.readLiteral(c); stop {
				return ev
			}
		case stMinus, stZero, stInt, stDot, stFrac, stExp, stExpSign, stExpDigits:
			if ev, stop := s.readNumber(text); stop {
				return ev
			}
		default: // stDone, stError
			return evMore
		}
	}
	return evMore
}

// plainEnd returns the offset of the first byte at or after i that ends a
// run of plain string contents ('"', '\\' or a control character), or
// len(text).
func plainEnd(text string, i int) int {
	for i < len(text) {
		if c := text[i]; c == '"' || c == '\\' || c < 0x20 {
			break
		}
		i++
	}
	return i
}

// endString reads the quote, at s.pos, that ends a string or a key.
func (s *scanner) endString() (event, bool) {
	s.pos++
	if !s.key {
		return evEnd, s.ended()
	}
	s.key = false
	s.state = stColon
	if len(s.stack) <= s.watch {
		s.at, s.depth = s.pos, len(s.stack)
		return evKey, true
	}
	return evMore, false
}

// readEscape reads c, at s.pos, after a backslash in a string, and reports
// whether it may be there.
func (s *scanner) readEscape(c byte) bool {
	switch c {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		s.state = stString
	case 'u':
		s.state, s.hex = stHex, 4
	default:
		return false
	}
	s.pos++
	return true
}

// readHex reads c, at s.pos, in the digits of a \u escape, and reports
// whether it may be there.
func (s *scanner) readHex(c byte) bool {
	if !isHex(c) {
		return false
	}
	s.pos++
	if s.hex--; s.hex == 0 {
		s.state = stString
	}
	return true
}

// readNext reads c, at s.pos, after a member or element, c not being
// whitespace: a comma, or the close of the container.
func (s *scanner) readNext(c byte) (event, bool) {
	top := s.stack[len(s.stack)-1]
	switch {
	case c == ',' && top == '{':
		s.state = stKey
	case c == ',':
		s.state = stValue
	case c == '}' && top == '{', c == ']' && top == '[':
		return evEnd, s.close()
	default:
		return s.fail(), true
	}
	s.pos++
	return evMore, false
}

// readLiteral reads c, at s.pos, in true, false or null.
func (s *scanner) readLiteral(c byte) (event, bool) {
	if c != s.lit[0] {
		return s.fail(), true
	}
	s.pos++
	if s.lit = s.lit[1:]; s.lit == "" {
		return evEnd, s.ended()
	}
	return evMore, false
}

// readNumber reads a number from s.pos until it ends, it proves not to be
// JSON or the text ends. The byte that ends a number is not read: it
// belongs to what follows.
func (s *scanner) readNumber(text string) (event, bool) {
	for ; s.pos < len(text); s.pos++ {
		c := text[s.pos]
		switch s.state {
		case stMinus:
			switch {
			case c == '0':
				s.state = stZero
			case isDigit(c):
				s.state = stInt
			default:
				return s.fail(), true
			}
		case stDot, stExpSign:
			if !isDigit(c) {
				return s.fail(), true
			}
			if s.state == stDot {
				s.state = stFrac
			} else {
				s.state = stExpDigits
			}
		case stExp:
			switch {
			case c == '+' || c == '-':
				s.state = stExpSign
			case isDigit(c):
				s.state = stExpDigits
			default:
				return s.fail(), true
			}
		default: // stZero, stInt, stFrac, stExpDigits
			switch {
			case isDigit(c) && s.state != stZero:
			case c == '.' && (s.state == stZero || s.state == stInt):
				s.state = stDot
			case (c == 'e' || c == 'E') && s.state != stExpDigits:
				s.state = stExp
			default:
				// The number ended before c, which is read again.
				return evEnd, s.ended()
			}
		}
	}
	return evMore, true
}

// begin starts the value whose first byte, c, is at s.pos. It returns
// evStart if the start is watched, evError if c begins no value (which
// fails), and evMore otherwise.
func (s *scanner) begin(c byte) event {
	s.at, s.depth = s.pos, len(s.stack)
	switch {
	case c == '{':
		s.stack = append(s.stack, '{')
		s.state = stKeyOrClose
	case c == '[':
		s.stack = append(s.stack, '[')
		s.state = stValueOrClose
	case c == '"':
		s.state = stString
	case c == '-':
		s.state = stMinus
	case c == '0':
		s.state = stZero
	case isDigit(c):
		s.state = stInt
	case c == 't':
		s.state, s.lit = stLiteral, "rue"
	case c == 'f':
		s.state, s.lit = stLiteral, "alse"
	case c == 'n':
		s.state, s.lit = stLiteral, "ull"
	default:
		return s.fail()
	}
	s.pos++
	if s.depth <= s.watch {
		return evStart
	}
	return evMore
}

// close reads the byte at s.pos, which closes the innermost container, and
// reports whether the container's end is watched.
func (s *scanner) close() bool {
	s.stack = s.stack[:len(s.stack)-1]
	s.pos++
	return s.ended()
}

// ended records that a value ended just before s.pos, and reports whether
// its end is watched.
func (s *scanner) ended() bool {
	if len(s.stack) == 0 {
		s.state = stDone
	} else {
		s.state = stNext
	}
	s.at, s.depth = s.pos, len(s.stack)
	return s.depth <= s.watch
}

// fail records that the byte at s.pos is not JSON.
func (s *scanner) fail() event {
	s.state, s.at = stError, s.pos
	return evError
}

// unquote decodes a complete JSON string, quotes included.
func unquote(raw string) (string, bool) {
	if len(raw) >= 2 && !strings.ContainsAny(raw[1:len(raw)-1], `\"`) {
		return raw[1 : len(raw)-1], true
	}
	var s string
	if json.Unmarshal([]byte(raw), &s) != nil {
		return "", false
	}
	return s, true
}

// unquotePrefix decodes a JSON string that was cut short, as far as it got:
// an escape cut in two is left out.
func unquotePrefix(raw string) string {
	for k := 0; k <= 6 && k < len(raw); k++ {
		if s, ok := unquote(raw[:len(raw)-k] + `"`); ok {
			return s
		}
	}
	return ""
}
