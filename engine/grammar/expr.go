package grammar

import (
	"slices"
	"strings"
)

// expr is a grammar expression under construction. Conversions build exprs
// and the builder renders them; a nil expr matches nothing, so that an empty
// numeric interval or an exhausted enum can be detected before rendering.
type expr interface{ isExpr() }

// lit matches its code points in order.
type lit string

// class matches one code point in any of its ranges.
type class charset

// ref matches the rule it names.
type ref string

// seq matches its parts one after the other.
type seq []expr

// alt matches any one of its parts.
type alt []expr

// rep matches item between min and max times; max is unbounded for no limit.
type rep struct {
	item     expr
	min, max int
}

const unbounded = -1

func (lit) isExpr()   {}
func (class) isExpr() {}
func (ref) isExpr()   {}
func (seq) isExpr()   {}
func (alt) isExpr()   {}
func (rep) isExpr()   {}

// empty matches the empty text.
var empty = lit("")

// seqOf flattens and merges literals so that rendered rules stay short.
func seqOf(parts ...expr) expr {
	var out seq
	for _, p := range parts {
		switch p := p.(type) {
		case nil:
			return nil
		case seq:
			for _, q := range p {
				out = appendSeq(out, q)
			}
		default:
			out = appendSeq(out, p)
		}
	}
	switch len(out) {
	case 0:
		return empty
	case 1:
		return out[0]
	}
	return out
}

func appendSeq(out seq, p expr) seq {
	l, ok := p.(lit)
	if !ok {
		return append(out, p)
	}
	if l == "" {
		return out
	}
	if n := len(out); n > 0 {
		if prev, ok := out[n-1].(lit); ok {
			out[n-1] = prev + l
			return out
		}
	}
	return append(out, l)
}

// altOf drops alternatives that match nothing; it returns nil when none is
// left.
func altOf(parts ...expr) expr {
	var out alt
	for _, p := range parts {
		switch p := p.(type) {
		case nil:
		case alt:
			out = append(out, p...)
		default:
			out = append(out, p)
		}
	}
	switch len(out) {
	case 0:
		return nil
	case 1:
		return out[0]
	}
	return out
}

// repOf simplifies the repetitions that llama.cpp would reject (of an empty
// item) or that need no operator.
func repOf(item expr, min, max int) expr {
	switch {
	case item == nil:
		if min == 0 {
			return empty
		}
		return nil
	case max == 0 || item == empty:
		return empty
	case min == 1 && max == 1:
		return item
	}
	return rep{item: item, min: min, max: max}
}

func optOf(e expr) expr { return repOf(e, 0, 1) }

func starOf(e expr) expr { return repOf(e, 0, unbounded) }

// runeRange is an inclusive range of code points.
type runeRange struct{ lo, hi rune }

// charset is a sorted list of disjoint, non-adjacent ranges without
// surrogates, which never occur in UTF-8 text.
type charset []runeRange

const (
	maxRune      = '\U0010FFFF'
	surrogateLo  = 0xD800
	surrogateHi  = 0xDFFF
	asciiControl = 0x1F
)

// newCharset normalizes any list of ranges.
func newCharset(rs ...runeRange) charset {
	var parts charset
	for _, r := range rs {
		if r.lo > r.hi {
			continue
		}
		parts = appendWithoutSurrogates(parts, r)
	}
	slices.SortFunc(parts, func(a, b runeRange) int { return int(a.lo - b.lo) })
	var out charset
	for _, r := range parts {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

func appendWithoutSurrogates(cs charset, r runeRange) charset {
	if r.hi < surrogateLo || r.lo > surrogateHi {
		return append(cs, r)
	}
	if r.lo < surrogateLo {
		cs = append(cs, runeRange{r.lo, surrogateLo - 1})
	}
	if r.hi > surrogateHi {
		cs = append(cs, runeRange{surrogateHi + 1, r.hi})
	}
	return cs
}

func chars(s string) charset {
	var rs []runeRange
	for _, r := range s {
		rs = append(rs, runeRange{r, r})
	}
	return newCharset(rs...)
}

func span(lo, hi rune) charset { return newCharset(runeRange{lo, hi}) }

func (cs charset) union(other charset) charset {
	return newCharset(append(slices.Clone(cs), other...)...)
}

// complement is relative to all code points but the surrogates.
func (cs charset) complement() charset {
	var out []runeRange
	next := rune(0)
	for _, r := range cs {
		if r.lo > next {
			out = append(out, runeRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= maxRune {
		out = append(out, runeRange{next, maxRune})
	}
	return newCharset(out...)
}

func (cs charset) minus(other charset) charset {
	return cs.intersect(other.complement())
}

func (cs charset) intersect(other charset) charset {
	var out []runeRange
	for _, a := range cs {
		for _, b := range other {
			out = append(out, runeRange{max(a.lo, b.lo), min(a.hi, b.hi)})
		}
	}
	return newCharset(out...)
}

func (cs charset) contains(r rune) bool {
	_, found := slices.BinarySearchFunc(cs, r, func(rr runeRange, r rune) int {
		switch {
		case rr.hi < r:
			return -1
		case rr.lo > r:
			return 1
		}
		return 0
	})
	return found
}

// jsonEscapes are the characters a JSON string cannot hold as themselves.
var jsonEscapes = span(0, asciiControl).union(chars(`"\`))

// escapeJSONRune is the one encoding of r that generated grammars use inside
// JSON strings: the short escapes where JSON has them, \u00XX for the other
// control characters, and the character itself otherwise.
func escapeJSONRune(sb *strings.Builder, r rune) {
	const hex = "0123456789abcdef"
	switch r {
	case '"':
		sb.WriteString(`\"`)
	case '\\':
		sb.WriteString(`\\`)
	case '\b':
		sb.WriteString(`\b`)
	case '\f':
		sb.WriteString(`\f`)
	case '\n':
		sb.WriteString(`\n`)
	case '\r':
		sb.WriteString(`\r`)
	case '\t':
		sb.WriteString(`\t`)
	default:
		if r <= asciiControl {
			sb.WriteString(`\u00`)
			sb.WriteByte(hex[r>>4])
			sb.WriteByte(hex[r&0xF])
			return
		}
		sb.WriteRune(r)
	}
}

// quoteJSON is s as a JSON string literal, quotes included.
func quoteJSON(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for _, r := range s {
		escapeJSONRune(&sb, r)
	}
	sb.WriteByte('"')
	return sb.String()
}
