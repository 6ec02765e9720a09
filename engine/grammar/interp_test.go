package grammar

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A GBNF interpreter for the subset this package writes: a parser, a
// random generator and a matcher, so that tests can check grammars by what
// they admit rather than by their text.

type nodeKind int

const (
	nLit nodeKind = iota
	nClass
	nRef
	nSeq
	nAlt
	nRep
	nAny
)

type gnode struct {
	kind     nodeKind
	lit      []rune
	ranges   []runeRange
	neg      bool
	name     string
	kids     []*gnode
	min, max int // max -1: unbounded
}

type tgrammar struct {
	rules  map[string]*gnode
	height map[string]int // least derivation height of each rule
}

type gparser struct {
	src []rune
	pos int
}

func parseGBNF(src string) (*tgrammar, error) {
	g := &tgrammar{rules: map[string]*gnode{}}
	for i, line := range strings.Split(src, "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		name, body, ok := strings.Cut(line, " ::= ")
		if !ok {
			return nil, fmt.Errorf("line %d: no ::=", i+1)
		}
		for _, c := range name {
			if !isNameByte(byte(c)) || c > 127 {
				return nil, fmt.Errorf("line %d: bad rule name %q", i+1, name)
			}
		}
		if _, dup := g.rules[name]; dup {
			return nil, fmt.Errorf("line %d: rule %s defined twice", i+1, name)
		}
		p := &gparser{src: []rune(body)}
		n, err := p.alternatives()
		if err != nil {
			return nil, fmt.Errorf("line %d (%s): %v", i+1, name, err)
		}
		if p.pos != len(p.src) {
			return nil, fmt.Errorf("line %d (%s): trailing %q", i+1, name, string(p.src[p.pos:]))
		}
		g.rules[name] = n
	}
	if g.rules["root"] == nil {
		return nil, fmt.Errorf("no root rule")
	}
	for name, n := range g.rules {
		if err := g.checkRefs(n); err != nil {
			return nil, fmt.Errorf("rule %s: %v", name, err)
		}
	}
	g.computeHeights()
	for name, h := range g.height {
		if h == math.MaxInt {
			return nil, fmt.Errorf("rule %s derives no finite text", name)
		}
	}
	return g, nil
}

func (g *tgrammar) checkRefs(n *gnode) error {
	if n.kind == nRef && g.rules[n.name] == nil {
		return fmt.Errorf("undefined rule %s", n.name)
	}
	for _, k := range n.kids {
		if err := g.checkRefs(k); err != nil {
			return err
		}
	}
	return nil
}

func (p *gparser) peek() rune {
	if p.pos < len(p.src) {
		return p.src[p.pos]
	}
	return 0
}

func (p *gparser) space() {
	for p.peek() == ' ' {
		p.pos++
	}
}

func (p *gparser) alternatives() (*gnode, error) {
	var alts []*gnode
	for {
		p.space()
		s, err := p.sequence()
		if err != nil {
			return nil, err
		}
		alts = append(alts, s)
		p.space()
		if p.peek() != '|' {
			break
		}
		p.pos++
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return &gnode{kind: nAlt, kids: alts}, nil
}

func (p *gparser) sequence() (*gnode, error) {
	seq := &gnode{kind: nSeq}
	for {
		p.space()
		var item *gnode
		var err error
		switch c := p.peek(); {
		case c == '"':
			item, err = p.literal()
		case c == '[':
			item, err = p.class()
		case c == '(':
			p.pos++
			item, err = p.alternatives()
			if err == nil && p.peek() != ')' {
				err = fmt.Errorf("expected ) at %d", p.pos)
			}
			p.pos++
		case c == '.':
			p.pos++
			item = &gnode{kind: nAny}
		case c < 128 && isNameByte(byte(c)):
			start := p.pos
			for p.peek() < 128 && p.peek() > 0 && isNameByte(byte(p.peek())) {
				p.pos++
			}
			item = &gnode{kind: nRef, name: string(p.src[start:p.pos])}
		default:
			return seq, nil
		}
		if err != nil {
			return nil, err
		}
		item, err = p.postfix(item)
		if err != nil {
			return nil, err
		}
		seq.kids = append(seq.kids, item)
	}
}

func (p *gparser) postfix(item *gnode) (*gnode, error) {
	for {
		lo, hi := 0, 0
		switch p.peek() {
		case '*':
			lo, hi = 0, -1
		case '+':
			lo, hi = 1, -1
		case '?':
			lo, hi = 0, 1
		case '{':
			end := slices.Index(p.src[p.pos:], '}')
			if end < 0 {
				return nil, fmt.Errorf("unterminated {")
			}
			spec := string(p.src[p.pos+1 : p.pos+end])
			var err error
			if lo, hi, err = parseCount(spec); err != nil {
				return nil, err
			}
			p.pos += end
		default:
			return item, nil
		}
		if item.kind == nLit && len(item.lit) == 0 {
			return nil, fmt.Errorf("repetition of an empty literal")
		}
		if item.kind == nSeq || item.kind == nAlt || item.kind == nRep {
			return nil, fmt.Errorf("repetition of a group or repetition (llama.cpp would multiply rules)")
		}
		if lo > 1000 || hi > 1000 {
			return nil, fmt.Errorf("repetition count above 1000")
		}
		p.pos++
		item = &gnode{kind: nRep, kids: []*gnode{item}, min: lo, max: hi}
	}
}

func parseCount(spec string) (int, int, error) {
	a, b, comma := strings.Cut(spec, ",")
	lo, err := strconv.Atoi(a)
	if err != nil {
		return 0, 0, fmt.Errorf("bad count %q", spec)
	}
	if !comma {
		return lo, lo, nil
	}
	if b == "" {
		return lo, -1, nil
	}
	hi, err := strconv.Atoi(b)
	if err != nil || hi < lo {
		return 0, 0, fmt.Errorf("bad count %q", spec)
	}
	return lo, hi, nil
}

func (p *gparser) literal() (*gnode, error) {
	p.pos++
	n := &gnode{kind: nLit}
	for p.peek() != '"' {
		if p.pos >= len(p.src) {
			return nil, fmt.Errorf("unterminated literal")
		}
		r, err := p.char()
		if err != nil {
			return nil, err
		}
		n.lit = append(n.lit, r)
	}
	p.pos++
	return n, nil
}

func (p *gparser) class() (*gnode, error) {
	p.pos++
	n := &gnode{kind: nClass}
	if p.peek() == '^' {
		n.neg = true
		p.pos++
	}
	for p.peek() != ']' {
		if p.pos >= len(p.src) {
			return nil, fmt.Errorf("unterminated class")
		}
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.peek() == '-' && p.pos+1 < len(p.src) && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
		}
		if hi < lo {
			return nil, fmt.Errorf("inverted range")
		}
		n.ranges = append(n.ranges, runeRange{lo, hi})
	}
	p.pos++
	if len(n.ranges) == 0 {
		return nil, fmt.Errorf("empty class")
	}
	return n, nil
}

func (p *gparser) char() (rune, error) {
	c := p.peek()
	p.pos++
	if c != '\\' {
		return c, nil
	}
	e := p.peek()
	p.pos++
	digits := 0
	switch e {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case '\\', '"', '[', ']', '-':
		return e, nil
	case 'x':
		digits = 2
	case 'u':
		digits = 4
	case 'U':
		digits = 8
	default:
		return 0, fmt.Errorf("unknown escape \\%c", e)
	}
	if p.pos+digits > len(p.src) {
		return 0, fmt.Errorf("short escape")
	}
	v, err := strconv.ParseUint(string(p.src[p.pos:p.pos+digits]), 16, 32)
	if err != nil {
		return 0, err
	}
	p.pos += digits
	return rune(v), nil
}

func (n *gnode) matchesRune(r rune) bool {
	switch n.kind {
	case nAny:
		return true
	case nClass:
		in := slices.ContainsFunc(n.ranges, func(rr runeRange) bool { return rr.lo <= r && r <= rr.hi })
		return in != n.neg
	}
	return false
}

// computeHeights finds each rule's least derivation height, by fixpoint.
func (g *tgrammar) computeHeights() {
	g.height = map[string]int{}
	for name := range g.rules {
		g.height[name] = math.MaxInt
	}
	for changed := true; changed; {
		changed = false
		for name, n := range g.rules {
			if h := g.nodeHeight(n); h < g.height[name] {
				g.height[name] = h
				changed = true
			}
		}
	}
}

func (g *tgrammar) nodeHeight(n *gnode) int {
	switch n.kind {
	case nRef:
		if h := g.height[n.name]; h < math.MaxInt {
			return h + 1
		}
		return math.MaxInt
	case nSeq:
		h := 0
		for _, k := range n.kids {
			h = max(h, g.nodeHeight(k))
		}
		return h
	case nAlt:
		h := math.MaxInt
		for _, k := range n.kids {
			h = min(h, g.nodeHeight(k))
		}
		return h
	case nRep:
		if n.min == 0 {
			return 0
		}
		return g.nodeHeight(n.kids[0])
	}
	return 0
}

// generator derives random text. Past maxDepth nested rules it takes the
// alternatives of least height and the fewest repetitions, so it ends.
type generator struct {
	g        *tgrammar
	pick     func(n int) int // uniform in [0, n)
	maxDepth int
	out      []rune
	steps    int
}

const maxGenSteps = 200_000

func (gn *generator) generate() (string, error) {
	gn.out = gn.out[:0]
	gn.steps = 0
	if err := gn.emit(gn.g.rules["root"], 0); err != nil {
		return "", err
	}
	return string(gn.out), nil
}

func (gn *generator) emit(n *gnode, depth int) error {
	gn.steps++
	if gn.steps > maxGenSteps {
		return fmt.Errorf("generation did not finish in %d steps", maxGenSteps)
	}
	deep := depth > gn.maxDepth
	switch n.kind {
	case nLit:
		gn.out = append(gn.out, n.lit...)
	case nClass, nAny:
		gn.out = append(gn.out, gn.randomRune(n))
	case nRef:
		return gn.emit(gn.g.rules[n.name], depth+1)
	case nSeq:
		for _, k := range n.kids {
			if err := gn.emit(k, depth); err != nil {
				return err
			}
		}
	case nAlt:
		k := n.kids[gn.pick(len(n.kids))]
		if deep {
			k = slices.MinFunc(n.kids, func(a, b *gnode) int { return gn.g.nodeHeight(a) - gn.g.nodeHeight(b) })
		}
		return gn.emit(k, depth)
	case nRep:
		for range gn.count(n, deep) {
			if err := gn.emit(n.kids[0], depth); err != nil {
				return err
			}
		}
	}
	return nil
}

// count favours the bounds, where mistakes hide.
func (gn *generator) count(n *gnode, deep bool) int {
	hi := n.max
	if hi < 0 {
		hi = n.min + 6
	}
	if deep {
		return n.min
	}
	switch gn.pick(4) {
	case 0:
		return n.min
	case 1:
		return hi
	}
	return n.min + gn.pick(hi-n.min+1)
}

// samples are the characters tried for negated classes: mostly ASCII,
// with control characters, escapes' characters and some beyond ASCII.
var samples = []rune("abcXYZ019 _-.,:;!?\"\\/'{}[]@#$%^&*()+=<>|~`\n\r\t\x00\x01\x1f\x7fé€ß中文😀\u2028\u00a0\ufffd")

func (gn *generator) randomRune(n *gnode) rune {
	if !n.neg && n.kind == nClass {
		for {
			rr := n.ranges[gn.pick(len(n.ranges))]
			size := int(rr.hi - rr.lo + 1)
			r := rr.lo + rune(gn.pick(size))
			if gn.pick(3) == 0 && size > 1 {
				r = []rune{rr.lo, rr.hi}[gn.pick(2)]
			}
			if utf8.ValidRune(r) {
				return r
			}
		}
	}
	for range 100 {
		r := samples[gn.pick(len(samples))]
		if n.matchesRune(r) {
			return r
		}
	}
	for r := rune(0); ; r++ {
		if utf8.ValidRune(r) && n.matchesRune(r) {
			return r
		}
	}
}

// matcher decides whether a grammar matches a text, by memoized sets of
// end positions (the grammars have no left recursion).
type matcher struct {
	g    *tgrammar
	in   []rune
	memo map[matchKey][]int
	busy map[matchKey]bool
}

type matchKey struct {
	n   *gnode
	pos int
}

func (g *tgrammar) matches(s string) bool {
	m := &matcher{g: g, in: []rune(s), memo: map[matchKey][]int{}, busy: map[matchKey]bool{}}
	return slices.Contains(m.match(g.rules["root"], 0), len(m.in))
}

func (m *matcher) match(n *gnode, pos int) []int {
	key := matchKey{n, pos}
	if ends, ok := m.memo[key]; ok {
		return ends
	}
	if m.busy[key] {
		return nil
	}
	m.busy[key] = true
	ends := m.compute(n, pos)
	delete(m.busy, key)
	m.memo[key] = ends
	return ends
}

func (m *matcher) compute(n *gnode, pos int) []int {
	switch n.kind {
	case nLit:
		if pos+len(n.lit) <= len(m.in) && slices.Equal(m.in[pos:pos+len(n.lit)], n.lit) {
			return []int{pos + len(n.lit)}
		}
		return nil
	case nClass, nAny:
		if pos < len(m.in) && n.matchesRune(m.in[pos]) {
			return []int{pos + 1}
		}
		return nil
	case nRef:
		return m.match(m.g.rules[n.name], pos)
	case nSeq:
		cur := []int{pos}
		for _, k := range n.kids {
			cur = m.step(k, cur)
		}
		return cur
	case nAlt:
		var out []int
		for _, k := range n.kids {
			out = union(out, m.match(k, pos))
		}
		return out
	}
	return m.repeat(n, pos)
}

func (m *matcher) step(n *gnode, from []int) []int {
	var out []int
	for _, p := range from {
		out = union(out, m.match(n, p))
	}
	return out
}

func (m *matcher) repeat(n *gnode, pos int) []int {
	cur := []int{pos}
	var out []int
	if n.min == 0 {
		out = []int{pos}
	}
	seen := map[int]bool{}
	for i := 1; n.max < 0 || i <= n.max; i++ {
		cur = m.step(n.kids[0], cur)
		if i >= n.min {
			var fresh []int
			for _, p := range cur {
				if !seen[p] {
					seen[p] = true
					fresh = append(fresh, p)
				}
			}
			out = union(out, cur)
			if n.max < 0 {
				cur = fresh
			}
		}
		if len(cur) == 0 {
			break
		}
	}
	return out
}

func union(a, b []int) []int {
	out := append(slices.Clone(a), b...)
	slices.Sort(out)
	return slices.Compact(out)
}
