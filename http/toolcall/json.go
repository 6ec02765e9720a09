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
func (s *scanner) next(text string) event {
	for s.pos < len(text) {
		c := text[s.pos]
		switch s.state {
		case stString:
			i := s.pos
			for i < len(text) {
				c = text[i]
				if c == '"' || c == '\\' || c < 0x20 {
					break
				}
				i++
			}
			s.pos = i
			switch {
			case i == len(text):
				return evMore
			case c == '\\':
				s.state = stEscape
				s.pos++
			case c < 0x20:
				return s.fail()
			case s.key:
				s.pos++
				s.key = false
				s.state = stColon
				if len(s.stack) <= s.watch {
					s.at, s.depth = s.pos, len(s.stack)
					return evKey
				}
			default:
				s.pos++
				if s.ended() {
					return evEnd
				}
			}
		case stEscape:
			switch c {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.state = stString
			case 'u':
				s.state, s.hex = stHex, 4
			default:
				return s.fail()
			}
			s.pos++
		case stHex:
			if !isHex(c) {
				return s.fail()
			}
			s.pos++
			if s.hex--; s.hex == 0 {
				s.state = stString
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
				if s.begin(c) {
					return evStart
				}
				if s.state == stError {
					return evError
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
			switch {
			case isJSONSpace(c):
				s.pos++
			case c == ':':
				s.state = stValue
				s.pos++
			default:
				return s.fail()
			}
		case stNext:
			top := s.stack[len(s.stack)-1]
			switch {
			case isJSONSpace(c):
				s.pos++
			case c == ',' && top == '{':
				s.state = stKey
				s.pos++
			case c == ',':
				s.state = stValue
				s.pos++
			case c == '}' && top == '{', c == ']' && top == '[':
				if s.close() {
					return evEnd
				}
			default:
				return s.fail()
			}
		case stLiteral:
			if c != s.lit[0] {
				return s.fail()
			}
			s.pos++
			if s.lit = s.lit[1:]; s.lit == "" && s.ended() {
				return evEnd
			}
		case stMinus:
			switch {
			case c == '0':
				s.state = stZero
			case isDigit(c):
				s.state = stInt
			default:
				return s.fail()
			}
			s.pos++
		case stZero, stInt, stFrac, stExpDigits:
			switch {
			case isDigit(c) && s.state != stZero:
				s.pos++
			case c == '.' && (s.state == stZero || s.state == stInt):
				s.state = stDot
				s.pos++
			case (c == 'e' || c == 'E') && s.state != stExpDigits:
				s.state = stExp
				s.pos++
			default:
				// The number ended before c, which is read again.
				if s.ended() {
					return evEnd
				}
			}
		case stDot, stExpSign:
			if !isDigit(c) {
				return s.fail()
			}
			if s.state == stDot {
				s.state = stFrac
			} else {
				s.state = stExpDigits
			}
			s.pos++
		case stExp:
			switch {
			case c == '+' || c == '-':
				s.state = stExpSign
			case isDigit(c):
				s.state = stExpDigits
			default:
				return s.fail()
			}
			s.pos++
		default: // stDone, stError
			return evMore
		}
	}
	return evMore
}

// begin starts the value whose first byte, c, is at s.pos, and reports
// whether its start is watched. A byte that begins no value fails.
func (s *scanner) begin(c byte) bool {
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
		s.fail()
		return false
	}
	s.pos++
	return s.depth <= s.watch
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
