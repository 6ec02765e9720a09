package grammar

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// CheckGBNF checks a client's grammar before admission: its size, that it
// defines root, and a light syntax check (balanced quotes, brackets and
// parentheses, valid escapes, rule names and repetitions, every referenced
// rule defined), so that most mistakes get a message naming the line.
// llama.cpp parses the grammar again when it is used.
func CheckGBNF(g string) error {
	if len(g) > MaxGrammarBytes {
		return grammarErr(0, "the grammar is larger than %d bytes", MaxGrammarBytes)
	}
	if !utf8.ValidString(g) {
		return grammarErr(0, "the grammar is not valid UTF-8")
	}
	p := &gbnfChecker{src: g, defined: map[string]bool{}}
	if err := p.parse(); err != nil {
		return err
	}
	if !p.defined["root"] {
		return grammarErr(0, "the grammar has no root rule")
	}
	for _, r := range p.refs {
		if !p.defined[r.name] {
			return grammarErr(p.lineAt(r.pos), "rule %s is not defined", r.name)
		}
	}
	return nil
}

func grammarErr(line int, format string, args ...any) *Error {
	msg := fmt.Sprintf(format, args...)
	if line > 0 {
		msg = fmt.Sprintf("line %d: %s", line, msg)
	}
	return &Error{Keyword: "grammar", Msg: msg, source: sourceGrammar}
}

// maxCheckNesting bounds nested parentheses, which llama.cpp parses
// recursively.
const maxCheckNesting = 128

// maxGBNFRepetition is llama.cpp's limit on a repetition's minimum count.
const maxGBNFRepetition = 2000

type gbnfChecker struct {
	src     string
	pos     int
	defined map[string]bool
	refs    []nameRef
}

type nameRef struct {
	name string
	pos  int
}

func (p *gbnfChecker) lineAt(pos int) int { return strings.Count(p.src[:pos], "\n") + 1 }

func (p *gbnfChecker) fail(format string, args ...any) *Error {
	return grammarErr(p.lineAt(p.pos), format, args...)
}

func (p *gbnfChecker) peek() byte {
	if p.pos < len(p.src) {
		return p.src[p.pos]
	}
	return 0
}

// space skips blanks and comments, and newlines where newlineOK.
func (p *gbnfChecker) space(newlineOK bool) {
	for p.pos < len(p.src) {
		switch c := p.src[p.pos]; {
		case c == ' ' || c == '\t':
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' && p.src[p.pos] != '\r' {
				p.pos++
			}
		case newlineOK && (c == '\n' || c == '\r'):
			p.pos++
		default:
			return
		}
	}
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-'
}

func (p *gbnfChecker) name() (string, error) {
	start := p.pos
	for p.pos < len(p.src) && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	if p.pos == start {
		return "", p.fail("expected a rule name")
	}
	return p.src[start:p.pos], nil
}

func (p *gbnfChecker) parse() error {
	p.space(true)
	for p.pos < len(p.src) {
		name, err := p.name()
		if err != nil {
			return err
		}
		p.space(false)
		if !strings.HasPrefix(p.src[p.pos:], "::=") {
			return p.fail("expected ::= after %s", name)
		}
		p.pos += 3
		p.space(true)
		if err := p.alternatives(false, 0); err != nil {
			return err
		}
		switch p.peek() {
		case '\n', '\r', 0:
		default:
			return p.fail("unexpected %q", p.peek())
		}
		p.defined[name] = true
		p.space(true)
	}
	return nil
}

func (p *gbnfChecker) alternatives(nested bool, depth int) error {
	if err := p.sequence(nested, depth); err != nil {
		return err
	}
	for p.peek() == '|' {
		p.pos++
		p.space(true)
		if err := p.sequence(nested, depth); err != nil {
			return err
		}
	}
	return nil
}

func (p *gbnfChecker) sequence(nested bool, depth int) error {
	hasItem := false
	for {
		var err error
		switch c := p.peek(); {
		case c == '"':
			err = p.literal()
		case c == '[':
			err = p.class()
		case c == '(':
			err = p.group(depth)
		case c == '.':
			p.pos++
		case c == '<' || c == '!':
			err = p.token()
		case isNameByte(c):
			start := p.pos
			var name string
			name, err = p.name()
			p.refs = append(p.refs, nameRef{name, start})
		case c == '*' || c == '+' || c == '?' || c == '{':
			if !hasItem {
				return p.fail("%q must follow an item", c)
			}
			err = p.repetition()
		default:
			return nil
		}
		if err != nil {
			return err
		}
		hasItem = true
		p.space(nested)
	}
}

func (p *gbnfChecker) group(depth int) error {
	if depth >= maxCheckNesting {
		return p.fail("parentheses nested deeper than %d", maxCheckNesting)
	}
	p.pos++
	p.space(true)
	if err := p.alternatives(true, depth+1); err != nil {
		return err
	}
	if p.peek() != ')' {
		return p.fail("expected )")
	}
	p.pos++
	return nil
}

func (p *gbnfChecker) literal() error {
	p.pos++
	for p.peek() != '"' {
		if p.pos >= len(p.src) {
			return p.fail("unterminated literal")
		}
		if err := p.char(); err != nil {
			return err
		}
	}
	p.pos++
	return nil
}

func (p *gbnfChecker) class() error {
	p.pos++
	if p.peek() == '^' {
		p.pos++
	}
	for p.peek() != ']' {
		if p.pos >= len(p.src) {
			return p.fail("unterminated character class")
		}
		if err := p.char(); err != nil {
			return err
		}
		if p.peek() == '-' && p.pos+1 < len(p.src) && p.src[p.pos+1] != ']' {
			p.pos++
			if err := p.char(); err != nil {
				return err
			}
		}
	}
	p.pos++
	return nil
}

// char reads one character or escape of a literal or class.
func (p *gbnfChecker) char() error {
	if p.peek() != '\\' {
		_, n := utf8.DecodeRuneInString(p.src[p.pos:])
		p.pos += n
		return nil
	}
	p.pos++
	hex := 0
	switch p.peek() {
	case 'x':
		hex = 2
	case 'u':
		hex = 4
	case 'U':
		hex = 8
	case 't', 'r', 'n', '\\', '"', '[', ']', '-':
	default:
		return p.fail("unknown escape \\%c", p.peek())
	}
	p.pos++
	for range hex {
		if !isHex(p.peek()) {
			return p.fail("expected %d hex digits", hex)
		}
		p.pos++
	}
	return nil
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

// token reads <name>, <[id]> or their negation with !.
func (p *gbnfChecker) token() error {
	if p.peek() == '!' {
		p.pos++
	}
	if p.peek() != '<' {
		return p.fail("expected < after !")
	}
	end := strings.IndexByte(p.src[p.pos:], '>')
	if end < 0 || strings.ContainsAny(p.src[p.pos:p.pos+end], "\n\r") {
		return p.fail("unterminated token")
	}
	p.pos += end + 1
	return nil
}

func (p *gbnfChecker) repetition() error {
	if c := p.peek(); c != '{' {
		p.pos++
		return nil
	}
	p.pos++
	p.space(false)
	lo, ok := p.int()
	if !ok {
		return p.fail("expected a count after {")
	}
	p.space(false)
	hi := lo
	if p.peek() == ',' {
		p.pos++
		p.space(false)
		hi = -1
		if n, ok := p.int(); ok {
			hi = n
		}
		p.space(false)
	}
	if p.peek() != '}' {
		return p.fail("expected }")
	}
	p.pos++
	if lo > maxGBNFRepetition {
		return p.fail("a repetition of more than %d", maxGBNFRepetition)
	}
	if hi >= 0 && hi < lo {
		return p.fail("a repetition {%d,%d} with its maximum below its minimum", lo, hi)
	}
	return nil
}

func (p *gbnfChecker) int() (int, bool) {
	start := p.pos
	n := 0
	for p.pos < len(p.src) && p.src[p.pos] >= '0' && p.src[p.pos] <= '9' {
		if n <= maxGBNFRepetition*10 {
			n = n*10 + int(p.src[p.pos]-'0')
		}
		p.pos++
	}
	return n, p.pos > start
}
