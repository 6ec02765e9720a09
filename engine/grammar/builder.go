package grammar

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

const (
	// maxRepeatCount is the largest count written as one {m,n}. llama.cpp
	// refuses a repetition whose count times the rules inside the repeated
	// item reaches 2000; items are always single rules, literals or
	// classes here, and larger counts are split into blocks of this size.
	maxRepeatCount = 1000
	// maxGroupDepth bounds nested parentheses in a rule; deeper groups
	// become rules of their own, because llama.cpp parses groups
	// recursively.
	maxGroupDepth = 8
	// maxInlineClass is the longest character class written inline; a
	// longer one (a Unicode category) becomes a shared rule.
	maxInlineClass = 64
	maxNameLen     = 32
)

// builder accumulates the rules of one grammar. Rules are written in the
// order their names were reserved, root first.
type builder struct {
	order    []string
	bodies   map[string]string
	taken    map[string]int
	interned map[string]string // rendered body -> rule name
	shared   map[string]string // shared rule kind -> rule name
	exprs    map[string]expr   // rule name -> what it matches
	size     int
	tooBig   bool
	current  string
}

func newBuilder() *builder {
	return &builder{
		bodies:   map[string]string{},
		taken:    map[string]int{},
		interned: map[string]string{},
		shared:   map[string]string{},
		exprs:    map[string]expr{},
	}
}

// reserve returns a fresh rule name derived from hint, so that rules can
// refer to a rule (recursively, too) before it is defined.
func (b *builder) reserve(hint string) string {
	base := sanitizeName(hint)
	name := base
	if b.has(name) {
		n := max(b.taken[base], 1)
		for b.has(name) {
			n++
			name = base + "-" + strconv.Itoa(n)
		}
		b.taken[base] = n
	}
	b.order = append(b.order, name)
	b.bodies[name] = ""
	return name
}

func (b *builder) has(name string) bool {
	_, ok := b.bodies[name]
	return ok
}

func sanitizeName(hint string) string {
	var sb strings.Builder
	dash := false
	for _, r := range hint {
		ok := r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r))
		switch {
		case ok:
			if dash && sb.Len() > 0 {
				sb.WriteByte('-')
			}
			dash = false
			sb.WriteRune(r)
		default:
			dash = true
		}
		if sb.Len() >= maxNameLen {
			break
		}
	}
	if sb.Len() == 0 {
		return "r"
	}
	return sb.String()
}

// define renders e as the body of the reserved rule name. Once the grammar
// is over MaxGrammarBytes nothing more is rendered; callers check tooBig.
func (b *builder) define(name string, e expr) {
	if b.tooBig {
		return
	}
	outer := b.current
	b.current = name
	body := b.render(e)
	b.current = outer
	b.exprs[name] = e
	b.store(name, body)
}

func (b *builder) store(name, body string) {
	b.bodies[name] = body
	b.size += len(name) + len(body) + len(" ::= \n")
	if b.size > MaxGrammarBytes {
		b.tooBig = true
	}
}

// text is the grammar, one rule per line.
func (b *builder) text() string {
	var sb strings.Builder
	sb.Grow(b.size)
	for _, name := range b.order {
		sb.WriteString(name)
		sb.WriteString(" ::= ")
		sb.WriteString(b.bodies[name])
		sb.WriteByte('\n')
	}
	return sb.String()
}

// hoist makes e a rule of its own and returns its name.
func (b *builder) hoist(e expr) string {
	return string(b.namedIn(b.current, b.current+"-part", e))
}

// named makes e a rule named after hint, one rule per distinct body, so
// that a large expression used many times is written once.
func (b *builder) named(hint string, e expr) ref {
	return b.namedIn(sanitizeName(hint), hint, e)
}

// namedIn renders e with rules it needs named after context.
func (b *builder) namedIn(context, hint string, e expr) ref {
	outer := b.current
	b.current = context
	body := b.render(e)
	b.current = outer
	if name, ok := b.interned[body]; ok {
		return ref(name)
	}
	name := b.reserve(hint)
	b.interned[body] = name
	b.exprs[name] = e
	b.store(name, body)
	return ref(name)
}

// unproductive returns the rules that match no finite text, in order:
// a model could enter them and never finish.
func (b *builder) unproductive() []string {
	users := map[string][]string{}
	for _, name := range b.order {
		for _, r := range refsIn(b.exprs[name], nil) {
			users[r] = append(users[r], name)
		}
	}
	done := map[string]bool{}
	queue := slices.Clone(b.order)
	for len(queue) > 0 {
		name := queue[len(queue)-1]
		queue = queue[:len(queue)-1]
		if done[name] || !productive(b.exprs[name], done) {
			continue
		}
		done[name] = true
		queue = append(queue, users[name]...)
	}
	var out []string
	for _, name := range b.order {
		if !done[name] {
			out = append(out, name)
		}
	}
	return out
}

func refsIn(e expr, out []string) []string {
	switch e := e.(type) {
	case ref:
		out = append(out, string(e))
	case rep:
		out = refsIn(e.item, out)
	case seq:
		for _, p := range e {
			out = refsIn(p, out)
		}
	case alt:
		for _, p := range e {
			out = refsIn(p, out)
		}
	}
	return out
}

func productive(e expr, done map[string]bool) bool {
	switch e := e.(type) {
	case lit:
		return true
	case class:
		return len(e) > 0
	case ref:
		return done[string(e)]
	case rep:
		return e.min == 0 || productive(e.item, done)
	case seq:
		for _, p := range e {
			if !productive(p, done) {
				return false
			}
		}
		return true
	case alt:
		for _, p := range e {
			if productive(p, done) {
				return true
			}
		}
	}
	return false
}

func (b *builder) render(e expr) string { return b.renderAlt(e, 0) }

func (b *builder) renderAlt(e expr, depth int) string {
	a, ok := e.(alt)
	if !ok {
		return b.renderSeq(e, depth)
	}
	parts := make([]string, len(a))
	for i, p := range a {
		parts[i] = b.renderSeq(p, depth)
	}
	return strings.Join(parts, " | ")
}

func (b *builder) renderSeq(e expr, depth int) string {
	s, ok := e.(seq)
	if !ok {
		return b.renderItem(e, depth)
	}
	parts := make([]string, len(s))
	for i, p := range s {
		parts[i] = b.renderItem(p, depth)
	}
	return strings.Join(parts, " ")
}

func (b *builder) renderItem(e expr, depth int) string {
	switch e := e.(type) {
	case nil:
		// The converters refuse constraints that match nothing, so this
		// only keeps the grammar exact if one slips through.
		return noMatch
	case lit:
		return quoteGBNF(string(e))
	case class:
		return b.renderClass(charset(e))
	case ref:
		return string(e)
	case rep:
		text, item := b.atom(e.item, depth)
		return b.renderRep(symbol{text, item}, e.min, e.max)
	}
	if depth >= maxGroupDepth {
		return b.hoist(e)
	}
	return "(" + b.renderAlt(e, depth+1) + ")"
}

// atom renders e as one symbol that a repetition operator can follow, and
// returns the expression that symbol stands for.
func (b *builder) atom(e expr, depth int) (string, expr) {
	switch e := e.(type) {
	case lit, class, ref:
		return b.renderItem(e, depth), e
	}
	name := b.hoist(e)
	return name, ref(name)
}

// symbol is a rendered atom with the expression it stands for, which the
// productivity check needs.
type symbol struct {
	text string
	e    expr
}

// noMatch is a class that matches no code point. An empty class cannot be
// written: llama.cpp would read "[]" as the empty text.
const noMatch = `[^\x00-\U0010FFFF]`

func (b *builder) renderClass(cs charset) string {
	if len(cs) == 0 {
		return noMatch
	}
	text := classText(cs)
	if len(text) <= maxInlineClass {
		return text
	}
	if name, ok := b.interned[text]; ok {
		return name
	}
	name := b.reserve("class")
	b.interned[text] = name
	b.exprs[name] = class(cs)
	b.store(name, text)
	return name
}

// renderRep writes atom repeated min..max times. Counts above
// maxRepeatCount are split into blocks of maxRepeatCount items.
func (b *builder) renderRep(atom symbol, min, max int) string {
	if min <= maxRepeatCount && max <= maxRepeatCount {
		return atom.text + quantifier(min, max)
	}
	var parts []string
	if min > 0 {
		parts = append(parts, b.exactly(atom, min))
	}
	switch {
	case max == unbounded:
		parts = append(parts, atom.text+"*")
	case max > min:
		parts = append(parts, b.upTo(atom, max-min))
	}
	return joinNonEmpty(parts)
}

func quantifier(min, max int) string {
	switch {
	case min == 1 && max == 1:
		return ""
	case min == 0 && max == 1:
		return "?"
	case min == 0 && max == unbounded:
		return "*"
	case min == 1 && max == unbounded:
		return "+"
	case min == max:
		return fmt.Sprintf("{%d}", min)
	case max == unbounded:
		return fmt.Sprintf("{%d,}", min)
	}
	return fmt.Sprintf("{%d,%d}", min, max)
}

// block is a rule for maxRepeatCount atoms.
func (b *builder) block(atom symbol) symbol {
	body := atom.text + quantifier(maxRepeatCount, maxRepeatCount)
	name, ok := b.interned[body]
	if !ok {
		name = b.reserve(b.current + "-block")
		b.interned[body] = name
		b.exprs[name] = rep{item: atom.e, min: maxRepeatCount, max: maxRepeatCount}
		b.store(name, body)
	}
	return symbol{name, ref(name)}
}

// exactly writes atom exactly n times.
func (b *builder) exactly(atom symbol, n int) string {
	if n <= maxRepeatCount {
		if n == 0 {
			return ""
		}
		return atom.text + quantifier(n, n)
	}
	return joinNonEmpty([]string{b.exactly(b.block(atom), n/maxRepeatCount), b.exactly(atom, n%maxRepeatCount)})
}

// upTo writes atom 0..n times: either fewer than q whole blocks and up to a
// block's worth of single items, or exactly q blocks and up to the
// remainder.
func (b *builder) upTo(atom symbol, n int) string {
	switch {
	case n == 0:
		return ""
	case n <= maxRepeatCount:
		return atom.text + quantifier(0, n)
	}
	q, r := n/maxRepeatCount, n%maxRepeatCount
	blk := b.block(atom)
	fewer := joinNonEmpty([]string{b.upTo(blk, q-1), atom.text + quantifier(0, maxRepeatCount-1)})
	whole := joinNonEmpty([]string{b.exactly(blk, q), b.upTo(atom, r)})
	return "(" + fewer + " | " + whole + ")"
}

func joinNonEmpty(parts []string) string {
	var kept []string
	for _, p := range parts {
		if p != "" && p != quoteGBNF("") {
			kept = append(kept, p)
		}
	}
	if len(kept) == 0 {
		return quoteGBNF("")
	}
	return strings.Join(kept, " ")
}

// quoteGBNF writes s as a GBNF literal.
func quoteGBNF(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"', '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		default:
			writeGBNFRune(&sb, r)
		}
	}
	sb.WriteByte('"')
	return sb.String()
}

// classText writes cs as a GBNF class, negated when that is shorter. The
// negated form also admits surrogates, which never occur in text.
func classText(cs charset) string {
	neg := cs.complement()
	useNeg := len(neg) > 0 && len(neg) < len(cs)
	ranges := cs
	var sb strings.Builder
	sb.WriteByte('[')
	if useNeg {
		sb.WriteByte('^')
		ranges = neg
	}
	for _, r := range ranges {
		writeClassRune(&sb, r.lo)
		if r.hi > r.lo {
			if r.hi > r.lo+1 {
				sb.WriteByte('-')
			}
			writeClassRune(&sb, r.hi)
		}
	}
	sb.WriteByte(']')
	return sb.String()
}

func writeClassRune(sb *strings.Builder, r rune) {
	switch r {
	case '\\', ']', '[', '-', '"':
		sb.WriteByte('\\')
		sb.WriteRune(r)
	case '^':
		// llama.cpp knows no \^ escape.
		sb.WriteString(`\x5E`)
	default:
		writeGBNFRune(sb, r)
	}
}

func writeGBNFRune(sb *strings.Builder, r rune) {
	switch {
	case r == '\n':
		sb.WriteString(`\n`)
	case r == '\r':
		sb.WriteString(`\r`)
	case r == '\t':
		sb.WriteString(`\t`)
	case r < 0x80 && !unicode.IsPrint(r):
		fmt.Fprintf(sb, `\x%02X`, r)
	case unicode.IsPrint(r):
		sb.WriteRune(r)
	case r <= 0xFFFF:
		fmt.Fprintf(sb, `\u%04X`, r)
	default:
		fmt.Fprintf(sb, `\U%08X`, r)
	}
}
