package grammar

import (
	"fmt"
	"regexp/syntax"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// lengthRange is the range of lengths, in characters, of the texts an
// expression matches.
type lengthRange struct{ min, max int }

// maxLength caps length arithmetic; it is far above anything a bounded
// pattern or schema can produce.
const maxLength = 1 << 40

func (a lengthRange) plus(b lengthRange) lengthRange {
	out := lengthRange{min(a.min+b.min, maxLength), unbounded}
	if a.max != unbounded && b.max != unbounded {
		out.max = min(a.max+b.max, maxLength)
	}
	return out
}

func (a lengthRange) either(b lengthRange) lengthRange {
	out := lengthRange{min(a.min, b.min), unbounded}
	if a.max != unbounded && b.max != unbounded {
		out.max = max(a.max, b.max)
	}
	return out
}

func (a lengthRange) times(lo, hi int) lengthRange {
	out := lengthRange{min(a.min*lo, maxLength), unbounded}
	switch {
	case a.max == 0 || hi == 0:
		out.max = 0
	case a.max != unbounded && hi != unbounded:
		out.max = min(a.max*hi, maxLength)
	}
	return out
}

// regexConv converts a parsed regular expression. Inside a JSON string
// (inJSON) each character is written in its JSON encoding, and "." leaves
// out every line terminator of ECMA-262 as well as Go's \n, so that what is
// generated matches under both dialects.
type regexConv struct {
	b      *builder
	inJSON bool
}

// convertRegex converts pattern. Inside a JSON string the pattern searches
// (JSON Schema's semantics): an end without an anchor admits any characters
// there. Otherwise the whole text must match and anchors change nothing.
func convertRegex(b *builder, pattern string, inJSON bool) (expr, lengthRange, *Error) {
	if len(pattern) > MaxPatternBytes {
		return nil, lengthRange{}, patternErr("pattern is longer than %d bytes", MaxPatternBytes)
	}
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, lengthRange{}, patternErr("%v", err)
	}
	re, atStart, perr := cutAnchor(re, syntax.OpBeginText, true)
	if perr != nil {
		return nil, lengthRange{}, perr
	}
	re, atEnd, perr := cutAnchor(re, syntax.OpEndText, false)
	if perr != nil {
		return nil, lengthRange{}, perr
	}
	rc := regexConv{b: b, inJSON: inJSON}
	e, lr, perr := rc.conv(re)
	if perr != nil {
		return nil, lengthRange{}, perr
	}
	if inJSON && !atStart {
		e = seqOf(starOf(b.rule(ruleChar)), e)
		lr.max = unbounded
	}
	if inJSON && !atEnd {
		e = seqOf(e, starOf(b.rule(ruleChar)))
		lr.max = unbounded
	}
	return e, lr, nil
}

func patternErr(format string, args ...any) *Error {
	return &Error{Keyword: "pattern", Msg: fmt.Sprintf(format, args...)}
}

// cutAnchor removes the anchor op from the start (first) or the end of re,
// and reports whether it was there. An alternation must be anchored in
// every branch or in none.
func cutAnchor(re *syntax.Regexp, op syntax.Op, first bool) (*syntax.Regexp, bool, *Error) {
	switch re.Op {
	case op:
		return &syntax.Regexp{Op: syntax.OpEmptyMatch}, true, nil
	case syntax.OpCapture, syntax.OpConcat:
		if len(re.Sub) == 0 {
			return re, false, nil
		}
		i := 0
		if !first {
			i = len(re.Sub) - 1
		}
		sub, ok, err := cutAnchor(re.Sub[i], op, first)
		if !ok || err != nil {
			return re, false, err
		}
		cp := *re
		cp.Sub = slices.Clone(re.Sub)
		cp.Sub[i] = sub
		return &cp, true, nil
	case syntax.OpAlternate:
		cp := *re
		cp.Sub = slices.Clone(re.Sub)
		n := 0
		for i, s := range re.Sub {
			sub, ok, err := cutAnchor(s, op, first)
			if err != nil {
				return re, false, err
			}
			if ok {
				cp.Sub[i] = sub
				n++
			}
		}
		switch n {
		case 0:
			return re, false, nil
		case len(re.Sub):
			return &cp, true, nil
		}
		return re, false, patternErr("an anchor must start (or end) every alternative or none")
	}
	return re, false, nil
}

func (rc *regexConv) conv(re *syntax.Regexp) (expr, lengthRange, *Error) {
	switch re.Op {
	case syntax.OpEmptyMatch:
		return empty, lengthRange{}, nil
	case syntax.OpLiteral:
		return rc.literal(re.Rune, re.Flags&syntax.FoldCase != 0)
	case syntax.OpCharClass:
		var rs []runeRange
		for i := 0; i+1 < len(re.Rune); i += 2 {
			rs = append(rs, runeRange{re.Rune[i], re.Rune[i+1]})
		}
		return rc.set(newCharset(rs...))
	case syntax.OpAnyCharNotNL:
		return rc.set(span(0, maxRune).minus(rc.lineTerminators()))
	case syntax.OpAnyChar:
		return rc.set(span(0, maxRune))
	case syntax.OpCapture:
		return rc.conv(re.Sub[0])
	case syntax.OpStar:
		return rc.repeat(re.Sub[0], 0, unbounded)
	case syntax.OpPlus:
		return rc.repeat(re.Sub[0], 1, unbounded)
	case syntax.OpQuest:
		return rc.repeat(re.Sub[0], 0, 1)
	case syntax.OpRepeat:
		return rc.repeat(re.Sub[0], re.Min, re.Max)
	case syntax.OpConcat:
		return rc.concat(re.Sub)
	case syntax.OpAlternate:
		return rc.alternate(re.Sub)
	case syntax.OpBeginLine, syntax.OpEndLine, syntax.OpBeginText, syntax.OpEndText:
		return nil, lengthRange{}, patternErr("^ and $ are only supported at the start and end of the pattern, without (?m)")
	case syntax.OpWordBoundary, syntax.OpNoWordBoundary:
		return nil, lengthRange{}, patternErr(`\b and \B are not supported`)
	}
	return nil, lengthRange{}, patternErr("the pattern can never match")
}

func (rc *regexConv) lineTerminators() charset {
	if rc.inJSON {
		return chars("\n\r\u2028\u2029")
	}
	return chars("\n")
}

func (rc *regexConv) literal(runes []rune, fold bool) (expr, lengthRange, *Error) {
	parts := make([]expr, 0, len(runes))
	for _, r := range runes {
		if !utf8.ValidRune(r) {
			return nil, lengthRange{}, patternErr("the pattern has a surrogate, which no text holds")
		}
		if cs := foldSet(r); fold && (len(cs) > 1 || cs[0].lo != cs[0].hi) {
			// A character with other cases matches any of them.
			e, _, _ := rc.set(cs)
			parts = append(parts, e)
		} else {
			parts = append(parts, rc.char(r))
		}
	}
	return seqOf(parts...), lengthRange{len(runes), len(runes)}, nil
}

// foldSet is r with every character that case-folds to it.
func foldSet(r rune) charset {
	rs := []runeRange{{r, r}}
	for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
		rs = append(rs, runeRange{f, f})
	}
	return newCharset(rs...)
}

func (rc *regexConv) char(r rune) expr {
	if !rc.inJSON {
		return lit(string(r))
	}
	var sb strings.Builder
	escapeJSONRune(&sb, r)
	return lit(sb.String())
}

// set matches one character of cs. Inside a JSON string the characters that
// need escapes become alternatives of their own, and a set with many of
// them becomes a shared rule.
func (rc *regexConv) set(cs charset) (expr, lengthRange, *Error) {
	one := lengthRange{1, 1}
	if len(cs) == 0 {
		return nil, lengthRange{}, patternErr("the pattern has a character class that matches nothing")
	}
	if !rc.inJSON {
		return class(cs), one, nil
	}
	var parts []expr
	if plain := cs.minus(jsonEscapes); len(plain) > 0 {
		parts = append(parts, class(plain))
	}
	for _, r := range `"\` {
		if cs.contains(r) {
			parts = append(parts, rc.char(r))
		}
	}
	controls := cs.intersect(span(0, asciiControl))
	if slices.Equal(controls, span(0, asciiControl)) {
		parts = append(parts, seqOf(lit(`\u00`), class(chars("01")), rc.b.rule(ruleHexDigit)))
	} else {
		for _, r := range controls {
			for c := r.lo; c <= r.hi; c++ {
				parts = append(parts, rc.char(c))
			}
		}
	}
	e := altOf(parts...)
	if len(parts) > 3 {
		e = rc.b.named("pattern-char", e)
	}
	return e, one, nil
}

func (rc *regexConv) repeat(sub *syntax.Regexp, lo, hi int) (expr, lengthRange, *Error) {
	e, lr, err := rc.conv(sub)
	if err != nil {
		return nil, lengthRange{}, err
	}
	return repOf(e, lo, hi), lr.times(lo, hi), nil
}

func (rc *regexConv) concat(subs []*syntax.Regexp) (expr, lengthRange, *Error) {
	parts := make([]expr, 0, len(subs))
	var total lengthRange
	for _, s := range subs {
		e, lr, err := rc.conv(s)
		if err != nil {
			return nil, lengthRange{}, err
		}
		parts = append(parts, e)
		total = total.plus(lr)
	}
	return seqOf(parts...), total, nil
}

func (rc *regexConv) alternate(subs []*syntax.Regexp) (expr, lengthRange, *Error) {
	parts := make([]expr, 0, len(subs))
	var total lengthRange
	for i, s := range subs {
		e, lr, err := rc.conv(s)
		if err != nil {
			return nil, lengthRange{}, err
		}
		parts = append(parts, e)
		if i == 0 {
			total = lr
		} else {
			total = total.either(lr)
		}
	}
	return altOf(parts...), total, nil
}
