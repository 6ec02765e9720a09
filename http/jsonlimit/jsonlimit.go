// Package jsonlimit reads a JSON document from a stream while checking its
// shape: the number of elements of each array, the number of members of each
// object, the depth of nesting and the size in bytes. A document that passes a
// limit is refused as soon as the limit is passed, without reading the rest of
// it, so that a small body cannot make a later decode allocate far more memory
// than its size suggests.
package jsonlimit

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

const (
	// chunkSize bounds each read, and so how far past a limit Read reads.
	chunkSize = 32 << 10
	// minRead is the free space below which the buffer is grown before a read.
	// Growth starts small, as in io.ReadAll, so small bodies stay cheap.
	minRead = 512

	defaultMaxDepth = 64

	// maxPath bounds the bytes kept for the path of an open container. A longer
	// path cannot be in Limits.Paths, and bounding it keeps a document of long
	// keys from costing memory beyond the document itself.
	maxPath = 1024

	// maxEmptyReads is how many reads returning nothing Read tolerates in a row
	// before it gives up on the reader.
	maxEmptyReads = 100
)

// Limits bounds the shape of one JSON document.
type Limits struct {
	// MaxBytes bounds the document's size; 0 or less means no bound.
	MaxBytes int64

	// MaxDepth bounds nesting of arrays and objects; 0 or less means 64.
	// The top-level array or object has depth 1, an array or object inside it
	// depth 2, and so on; a document that is a single string, number or
	// literal has depth 0.
	MaxDepth int

	// MaxContainers bounds the arrays and objects of the whole document; 0
	// or less means no bound. Limits on each container's length do not bound
	// how many there are when they nest ([[{},{}],[{},{}]]), and each one
	// decodes into something allocated: a struct, a map, a slice.
	MaxContainers int

	// Default bounds the elements of any array, and the members of any object,
	// whose path is not in Paths; 0 or less means no bound.
	Default int

	// Paths bounds particular arrays and objects by path.
	//
	// The top-level value has the path "". A member of an object has its
	// parent's path, a dot and its key, except that members of the top-level
	// object have just their key; an element of an array has its parent's path
	// followed by "[]". In {"messages":[{"content":[]}],"prompt":[[1]]} the
	// paths of the arrays are "messages", "messages[].content", "prompt" and
	// "prompt[]", and each message object has the path "messages[]".
	//
	// Keys are compared after JSON unescaping and ignoring case, the way
	// encoding/json matches keys to struct fields, so that a document cannot
	// slip past a limit by spelling a key differently from the struct tag.
	// A path longer than 1024 bytes is never matched. A value of 0 or less
	// leaves that array or object without a bound, whatever Default says.
	Paths map[string]int
}

// LimitError says which limit a document passed.
type LimitError struct {
	// Path is the path of the array or object that passed its limit, in the
	// syntax of Limits.Paths, or for depth the path of the array or object
	// that went too deep; it is "" for the document's size. A path that was
	// too long to keep ends in "...".
	Path string
	// Kind is "elements" (of an array), "members" (of an object), "depth",
	// "containers" (of the whole document) or "bytes".
	Kind string
	// Limit is the limit that was passed.
	Limit int64
}

// Error describes the limit, for example "messages has more than 2048
// elements".
func (e *LimitError) Error() string {
	switch e.Kind {
	case "bytes":
		return fmt.Sprintf("the body is larger than %d bytes", e.Limit)
	case "containers":
		return fmt.Sprintf("the body has more than %d arrays and objects", e.Limit)
	case "depth":
		if e.Path == "" {
			return fmt.Sprintf("nesting deeper than %d", e.Limit)
		}
		return fmt.Sprintf("nesting deeper than %d at %s", e.Limit, e.Path)
	}
	what := e.Path
	if what == "" {
		what = "the top-level array"
		if e.Kind == "members" {
			what = "the top-level object"
		}
	}
	return fmt.Sprintf("%s has more than %d %s", what, e.Limit, e.Kind)
}

// SyntaxError is input that is not JSON.
type SyntaxError struct {
	// Offset is the number of bytes before the one found to be wrong; for a
	// document that ends too early, it is the document's length.
	Offset int64
	// Msg describes the error.
	Msg string
}

// Error describes the error and where it was found.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("%s at offset %d", e.Msg, e.Offset)
}

// state says what the scanner expects next.
type state uint8

const (
	stValue        state = iota // a value
	stValueOrClose              // a value or ']', after '['
	stKey                       // a key, after ',' in an object
	stKeyOrClose                // a key or '}', after '{'
	stColon                     // ':' after a key
	stAfter                     // ',' or a closing bracket; only whitespace at the top level
	stString                    // inside a string
	stEscape                    // after '\' in a string
	stHex                       // inside \uXXXX; scanner.hex digits remain
	stNeg                       // after '-' starting a number
	stZero                      // after a leading 0
	stInt                       // in the digits of the integer part
	stDot                       // after '.'
	stFrac                      // in the digits of the fraction
	stE                         // after 'e' or 'E'
	stESign                     // after the sign of the exponent
	stExp                       // in the digits of the exponent
	stLiteral                   // inside true, false or null; scanner.lit remains
)

// frame is an open array or object.
type frame struct {
	object bool
	// elided is set when the path grew too long to keep; the frame's path is
	// then its nearest kept ancestor's.
	elided bool
	count  int
	limit  int // 0 for no bound
	// pathEnd and foldEnd end this frame's path in scanner.path and its folded
	// form in scanner.fold. foldEnd is -1 when the path cannot be in Paths.
	pathEnd int
	foldEnd int
}

// scanner checks a JSON document incrementally: scan may be called on a
// growing document, each call scanning only the bytes added since the last.
type scanner struct {
	maxDepth int
	def      int
	// containers counts down the arrays and objects still allowed; below
	// zero when there is no bound.
	containers    int
	maxContainers int
	paths         map[string]int // folded path to limit; nil when there are none

	stack []frame
	// path holds the path of every open container at once: each is a prefix
	// of its children's, so a path costs nothing per element.
	path []byte
	fold []byte

	state state
	inKey bool // the string being scanned is an object key
	// keyStart and keyEnd delimit the raw contents of the last key in the
	// document, which are kept there, so keys are only unescaped when they
	// name an array or object.
	keyStart, keyEnd int
	hex              int
	lit              string
}

func newScanner(c *Checker) *scanner {
	l := c.l
	s := &scanner{maxDepth: l.MaxDepth, def: max(l.Default, 0), containers: -1, paths: c.paths}
	if l.MaxContainers > 0 {
		s.containers, s.maxContainers = l.MaxContainers, l.MaxContainers
	}
	if s.maxDepth <= 0 {
		s.maxDepth = defaultMaxDepth
	}
	return s
}

// tighter returns the smaller of two bounds, where 0 is no bound.
func tighter(a, b int) int {
	if a == 0 {
		return b
	}
	if b == 0 {
		return a
	}
	return min(a, b)
}

// scan scans doc[i:], doc[:i] having been scanned by earlier calls.
//
// Strings, the bulk of a chat body, are read here, escapes included, and so
// are the bytes between tokens, so that neither costs a call per byte; the
// bytes that begin or end a value or key, numbers and literals are read by
// helpers. A helper that reads on past doc[i] returns the index of the last
// byte it used, so that the loop goes on from the byte after it. Errors
// return from their own case, so that the loop tests none for plain bytes.
func (s *scanner) scan(doc []byte, i int) error {
	var err error
	for ; i < len(doc); i++ {
		c := doc[i]
		switch s.state {
		case stString:
			if i = plainEnd(doc, i); i == len(doc) {
				return nil
			}
			switch c = doc[i]; c {
			case '"':
				s.endString(i)
			case '\\':
				s.state = stEscape
			default:
				return syntaxError(i, c, "in string literal")
			}
		case stEscape:
			switch c {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				s.state = stString
			case 'u':
				s.state, s.hex = stHex, 4
			default:
				return syntaxError(i, c, "in string escape code")
			}
		case stHex:
			if !isHex(c) {
				return syntaxError(i, c, `in \u hexadecimal character escape`)
			}
			if s.hex--; s.hex == 0 {
				s.state = stString
			}
		case stValue, stValueOrClose:
			if c == ']' && s.state == stValueOrClose {
				s.close()
			} else if !isSpace(c) {
				if err = s.beginValue(doc, i); err != nil {
					return err
				}
			}
		case stKey, stKeyOrClose:
			if !isSpace(c) {
				if err = s.beginKey(i, c); err != nil {
					return err
				}
			}
		case stColon:
			if c == ':' {
				s.state = stValue
			} else if !isSpace(c) {
				return syntaxError(i, c, "after object key")
			}
		case stAfter:
			if !isSpace(c) {
				if err = s.afterValue(i, c); err != nil {
					return err
				}
			}
		case stNeg, stZero, stInt, stDot, stFrac:
			if i, err = s.scanNumber(doc, i); err != nil {
				return err
			}
		case stE, stESign, stExp:
			if i, err = s.scanExponent(doc, i); err != nil {
				return err
			}
		case stLiteral:
			if err = s.scanLiteral(i, c); err != nil {
				return err
			}
		}
	}
	return nil
}

// endString reads the quote, at i, that ends a string.
func (s *scanner) endString(i int) {
	if s.inKey {
		s.keyEnd = i
		s.state = stColon
	} else {
		s.state = stAfter
	}
}

// beginKey reads c, at i, where an object's key or (after '{') its closing
// brace is expected. A key counts as one of the object's members.
func (s *scanner) beginKey(i int, c byte) error {
	switch {
	case c == '"':
		top := &s.stack[len(s.stack)-1]
		if top.count++; top.limit > 0 && top.count > top.limit {
			return s.limitError(top, "members")
		}
		s.keyStart, s.inKey, s.state = i+1, true, stString
	case c == '}' && s.state == stKeyOrClose:
		s.close()
	default:
		return syntaxError(i, c, "looking for beginning of object key string")
	}
	return nil
}

// afterValue reads c, at i, after a complete value: a comma or the closing
// bracket of the container around it. At the top level nothing may follow.
func (s *scanner) afterValue(i int, c byte) error {
	n := len(s.stack)
	if n == 0 {
		return syntaxError(i, c, "after top-level value")
	}
	object := s.stack[n-1].object
	switch {
	case c == ',' && object:
		s.state = stKey
	case c == ',':
		s.state = stValue
	case c == '}' && object, c == ']' && !object:
		s.close()
	case object:
		return syntaxError(i, c, "after object key:value pair")
	default:
		return syntaxError(i, c, "after array element")
	}
	return nil
}

// scanNumber reads a number's sign, integer part and fraction from doc[i],
// and returns the index of the last byte it used. Runs of digits are read
// in one go; the byte that ends a number belongs to what follows, so it is
// left for the loop to read again.
func (s *scanner) scanNumber(doc []byte, i int) (int, error) {
	c := doc[i]
	switch s.state {
	case stNeg:
		switch {
		case c == '0':
			s.state = stZero
		case '1' <= c && c <= '9':
			s.state = stInt
		default:
			return i, syntaxError(i, c, "in numeric literal")
		}
	case stZero, stInt:
		if s.state == stInt {
			if i = skipDigits(doc, i); i == len(doc) {
				return i - 1, nil
			}
			c = doc[i]
		}
		switch c {
		case '.':
			s.state = stDot
		case 'e', 'E':
			s.state = stE
		default:
			// The number ended at c, which belongs to what follows.
			s.state = stAfter
			return i - 1, nil
		}
	case stDot:
		if !isDigit(c) {
			return i, syntaxError(i, c, "after decimal point in numeric literal")
		}
		s.state = stFrac
	default: // stFrac
		if i = skipDigits(doc, i); i == len(doc) {
			return i - 1, nil
		}
		if c = doc[i]; c != 'e' && c != 'E' {
			s.state = stAfter
			return i - 1, nil
		}
		s.state = stE
	}
	return i, nil
}

// scanExponent reads a number's exponent from doc[i], as scanNumber reads
// the rest of it.
func (s *scanner) scanExponent(doc []byte, i int) (int, error) {
	c := doc[i]
	switch s.state {
	case stE:
		switch {
		case c == '+' || c == '-':
			s.state = stESign
		case isDigit(c):
			s.state = stExp
		default:
			return i, syntaxError(i, c, "in exponent of numeric literal")
		}
	case stESign:
		if !isDigit(c) {
			return i, syntaxError(i, c, "in exponent of numeric literal")
		}
		s.state = stExp
	default: // stExp
		if i = skipDigits(doc, i); i < len(doc) {
			// The number ended at doc[i], which belongs to what follows.
			s.state = stAfter
		}
		return i - 1, nil
	}
	return i, nil
}

// scanLiteral reads c, at i, inside true, false or null.
func (s *scanner) scanLiteral(i int, c byte) error {
	if c != s.lit[0] {
		return syntaxError(i, c, fmt.Sprintf("in literal (expecting %s)", quoteChar(s.lit[0])))
	}
	if s.lit = s.lit[1:]; s.lit == "" {
		s.state = stAfter
	}
	return nil
}

// finish reports whether a document of n bytes, all scanned, is complete.
func (s *scanner) finish(n int) error {
	if len(s.stack) == 0 {
		switch s.state {
		case stAfter, stZero, stInt, stFrac, stExp:
			return nil
		}
	}
	return &SyntaxError{Offset: int64(n), Msg: "unexpected end of JSON input"}
}

// beginValue starts the value whose first byte is doc[i].
func (s *scanner) beginValue(doc []byte, i int) error {
	c := doc[i]
	switch c {
	case '{', '[', '"', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 't', 'f', 'n':
	default:
		return syntaxError(i, c, "looking for beginning of value")
	}
	if n := len(s.stack); n > 0 && !s.stack[n-1].object {
		top := &s.stack[n-1]
		if top.count++; top.limit > 0 && top.count > top.limit {
			return s.limitError(top, "elements")
		}
	}
	switch c {
	case '{', '[':
		return s.open(doc, c == '{')
	case '"':
		s.inKey, s.state = false, stString
	case '-':
		s.state = stNeg
	case '0':
		s.state = stZero
	case 't':
		s.lit, s.state = "rue", stLiteral
	case 'f':
		s.lit, s.state = "alse", stLiteral
	case 'n':
		s.lit, s.state = "ull", stLiteral
	default:
		s.state = stInt
	}
	return nil
}

// open pushes a frame for an array or object beginning in doc.
func (s *scanner) open(doc []byte, object bool) error {
	f := frame{object: object}
	if s.paths == nil {
		f.foldEnd = -1
	}
	if n := len(s.stack); n > 0 {
		p := &s.stack[n-1]
		f.elided, f.pathEnd, f.foldEnd = p.elided, p.pathEnd, -1
		if !f.elided {
			s.path = s.path[:p.pathEnd]
			if !p.object {
				s.path = append(s.path, "[]"...)
			} else {
				if n > 1 {
					s.path = append(s.path, '.')
				}
				s.path = appendKey(s.path, doc[s.keyStart:s.keyEnd], maxPath)
			}
			if len(s.path) > maxPath {
				f.elided = true
				s.path = s.path[:p.pathEnd]
			} else {
				f.pathEnd = len(s.path)
			}
		}
		if !f.elided && p.foldEnd >= 0 {
			s.fold = appendFolded(s.fold[:p.foldEnd], s.path[p.pathEnd:f.pathEnd])
			f.foldEnd = len(s.fold)
		}
	}
	f.limit = s.def
	if f.foldEnd >= 0 {
		if n, ok := s.paths[string(s.fold[:f.foldEnd])]; ok {
			f.limit = n
		}
	}
	if len(s.stack) >= s.maxDepth {
		return &LimitError{Path: s.pathOf(&f), Kind: "depth", Limit: int64(s.maxDepth)}
	}
	switch s.containers {
	case 0:
		return &LimitError{Path: s.pathOf(&f), Kind: "containers", Limit: int64(s.maxContainers)}
	default:
		s.containers--
	case -1:
	}
	s.stack = append(s.stack, f)
	if object {
		s.state = stKeyOrClose
	} else {
		s.state = stValueOrClose
	}
	return nil
}

// close pops the innermost array or object, which has just ended.
func (s *scanner) close() {
	s.stack = s.stack[:len(s.stack)-1]
	s.state = stAfter
}

func (s *scanner) pathOf(f *frame) string {
	p := string(s.path[:f.pathEnd])
	if f.elided {
		p += "..."
	}
	return p
}

func (s *scanner) limitError(f *frame, kind string) error {
	return &LimitError{Path: s.pathOf(f), Kind: kind, Limit: int64(f.limit)}
}

// appendKey appends the unescaped form of raw, the contents of a valid JSON
// string, to dst, stopping once dst is longer than limit. It decodes as
// encoding/json does, so keys compare as they will when the document is
// decoded: a surrogate escape that is not part of a pair, and each byte of
// invalid UTF-8, become U+FFFD.
func appendKey(dst, raw []byte, limit int) []byte {
	for i := 0; i < len(raw) && len(dst) <= limit; {
		c := raw[i]
		switch {
		case c == '\\':
			if raw[i+1] != 'u' {
				dst = append(dst, unescape(raw[i+1]))
				i += 2
				continue
			}
			r := hex4(raw[i+2 : i+6])
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(raw) >= i+6 && raw[i] == '\\' && raw[i+1] == 'u' {
					r2 = hex4(raw[i+2 : i+6])
				}
				if r = utf16.DecodeRune(r, r2); r != utf8.RuneError {
					i += 6
				}
			}
			dst = utf8.AppendRune(dst, r)
		case c < utf8.RuneSelf:
			dst = append(dst, c)
			i++
		default:
			r, n := utf8.DecodeRune(raw[i:])
			dst = utf8.AppendRune(dst, r)
			i += n
		}
	}
	return dst
}

// unescape returns the byte that the escape \c stands for, c not being 'u'.
func unescape(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c // '"', '\\' or '/'
}

// hex4 decodes four hexadecimal digits, already checked by the scanner.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c <= '9':
			c -= '0'
		case c <= 'F':
			c -= 'A' - 10
		default:
			c -= 'a' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// appendFolded appends s to dst with case folded as encoding/json folds keys
// and field names: ASCII letters upper-cased, other letters replaced by the
// smallest rune that they equal under simple case folding.
func appendFolded(dst, s []byte) []byte {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			dst = append(dst, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(s[i:])
		for {
			r2 := unicode.SimpleFold(r)
			if r2 <= r {
				r = r2
				break
			}
			r = r2
		}
		dst = utf8.AppendRune(dst, r)
		i += n
	}
	return dst
}

// plainEnd returns the index of the first byte in doc[i:] that needs the
// scanner's attention inside a string ('"', '\\' or a control character), or
// len(doc). Most of a chat body is string contents, so it tests eight bytes
// at a time.
func plainEnd(doc []byte, i int) int {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	for {
		for ; i+8 <= len(doc); i += 8 {
			x := binary.LittleEndian.Uint64(doc[i:])
			q, b := x^(ones*'"'), x^(ones*'\\')
			// Each term has a byte's high bit set iff some byte of x is below
			// 0x20, or is a quote or a backslash.
			if ((x-ones*' ')&^x|(q-ones)&^q|(b-ones)&^b)&highs != 0 {
				break
			}
		}
		for end := min(i+8, len(doc)); i < end; i++ {
			if c := doc[i]; c < ' ' || c == '"' || c == '\\' {
				return i
			}
		}
		if i == len(doc) {
			return i
		}
	}
}

func isSpace(c byte) bool { return c == ' ' || c == '\n' || c == '\r' || c == '\t' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// skipDigits returns the index of the first byte in doc[i:] that is not a
// digit, or len(doc).
func skipDigits(doc []byte, i int) int {
	for i < len(doc) && isDigit(doc[i]) {
		i++
	}
	return i
}

func isHex(c byte) bool {
	return isDigit(c) || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func syntaxError(i int, c byte, context string) error {
	return &SyntaxError{Offset: int64(i), Msg: "invalid character " + quoteChar(c) + " " + context}
}

// quoteChar formats c as a quoted character literal.
func quoteChar(c byte) string {
	switch c {
	case '\'':
		return `'\''`
	case '"':
		return `'"'`
	}
	q := strconv.Quote(string(rune(c)))
	return "'" + q[1:len(q)-1] + "'"
}
