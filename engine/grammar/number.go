package grammar

import (
	"errors"
	"math/big"
	"strconv"
	"strings"
)

// window is the first integer with more than maxDigits digits. Generated
// numbers stay strictly inside (-window, window); a bound beyond it is met
// by that restriction already.
const window = 10_000_000_000_000_000

var bigWindow = big.NewInt(window)

// Bounds on a number literal in a schema, so that reading one costs
// nothing: 1e1000000000 would take big.Rat minutes.
const (
	maxNumberLiteral = 64
	maxExponent      = 400
)

func parseDecimal(s string) (*big.Rat, error) {
	if len(s) > maxNumberLiteral {
		return nil, errors.New("number literal too long")
	}
	if i := strings.IndexAny(s, "eE"); i >= 0 {
		e, err := strconv.Atoi(s[i+1:])
		if err != nil || e > maxExponent || e < -maxExponent {
			return nil, errors.New("exponent out of range")
		}
	}
	r, ok := new(big.Rat).SetString(s)
	if !ok {
		return nil, errors.New("not a number")
	}
	return r, nil
}

// bound is one side of a numeric range as the schema states it.
type bound struct {
	v    *big.Rat
	excl bool
	kw   string
}

// readBounds returns the tighter of minimum and exclusiveMinimum, and of
// maximum and exclusiveMaximum; nil where the schema states none.
func readBounds(s *jsonValue, path string) (lo, hi *bound, err error) {
	for _, kw := range []string{"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"} {
		v := s.get(kw)
		if v == nil {
			continue
		}
		if v.kind != jsonNumber {
			return nil, nil, schemaErr(kw, path, "%s must be a number", kw)
		}
		r, perr := parseDecimal(v.s)
		if perr != nil {
			return nil, nil, schemaErr(kw, path, "%s: %v", kw, perr)
		}
		b := &bound{v: r, excl: strings.HasPrefix(kw, "exclusive"), kw: kw}
		if kw == "minimum" || kw == "exclusiveMinimum" {
			lo = tighter(lo, b, 1)
		} else {
			hi = tighter(hi, b, -1)
		}
	}
	return lo, hi, nil
}

// tighter picks the bound that admits less; dir is 1 for lower bounds.
func tighter(old, b *bound, dir int) *bound {
	if old == nil {
		return b
	}
	switch c := b.v.Cmp(old.v) * dir; {
	case c > 0, c == 0 && b.excl:
		return b
	}
	return old
}

func ceilRat(r *big.Rat) *big.Int {
	neg := new(big.Rat).Neg(r)
	f := floorRat(neg)
	return f.Neg(f)
}

func floorRat(r *big.Rat) *big.Int {
	q := new(big.Int)
	m := new(big.Int)
	q.DivMod(r.Num(), r.Denom(), m)
	return q
}

func (c *converter) integer(s *jsonValue, path string) (expr, error) {
	lo, hi, err := readBounds(s, path)
	if err != nil {
		return nil, err
	}
	if lo == nil && hi == nil {
		return c.b.rule(ruleInteger), nil
	}
	limit := big.NewInt(window - 1)
	l, h := new(big.Int).Neg(limit), new(big.Int).Set(limit)
	if lo != nil {
		v := ceilRat(lo.v)
		if lo.excl && lo.v.IsInt() {
			v.Add(v, big.NewInt(1))
		}
		if v.Cmp(limit) > 0 {
			return nil, schemaErr(lo.kw, path, "%s is beyond the supported range of %d digits", lo.kw, maxDigits)
		}
		if v.Cmp(l) > 0 {
			l = v
		}
	}
	if hi != nil {
		v := floorRat(hi.v)
		if hi.excl && hi.v.IsInt() {
			v.Sub(v, big.NewInt(1))
		}
		if v.Cmp(new(big.Int).Neg(limit)) < 0 {
			return nil, schemaErr(hi.kw, path, "%s is beyond the supported range of %d digits", hi.kw, maxDigits)
		}
		if v.Cmp(h) < 0 {
			h = v
		}
	}
	if l.Cmp(h) > 0 {
		return nil, emptyRange("integer", lo, hi, path)
	}
	return intRange(l.Int64(), h.Int64()), nil
}

func (c *converter) number(s *jsonValue, path string) (expr, error) {
	lo, hi, err := readBounds(s, path)
	if err != nil {
		return nil, err
	}
	if lo == nil && hi == nil {
		return c.b.rule(ruleNumber), nil
	}
	for _, b := range []*bound{lo, hi} {
		if b != nil && !b.v.IsInt() {
			return nil, schemaErr(b.kw, path, "a non-integer %s is not supported for numbers", b.kw)
		}
	}
	negWindow := new(big.Int).Neg(bigWindow)
	loV, loEx := int64(-window), true
	if lo != nil {
		v := lo.v.Num()
		if v.Cmp(bigWindow) >= 0 {
			return nil, schemaErr(lo.kw, path, "%s is beyond the supported range of %d digits", lo.kw, maxDigits)
		}
		if v.Cmp(negWindow) > 0 {
			loV, loEx = v.Int64(), lo.excl
		}
	}
	hiV, hiEx := int64(window), true
	if hi != nil {
		v := hi.v.Num()
		if v.Cmp(negWindow) <= 0 {
			return nil, schemaErr(hi.kw, path, "%s is beyond the supported range of %d digits", hi.kw, maxDigits)
		}
		if v.Cmp(bigWindow) < 0 {
			hiV, hiEx = v.Int64(), hi.excl
		}
	}
	e := numberRange(loV, loEx, hiV, hiEx)
	if e == nil {
		return nil, emptyRange("number", lo, hi, path)
	}
	return e, nil
}

// emptyRange is the error for bounds that leave nothing. Only both bounds
// together can do that: each alone is checked against the window.
func emptyRange(what string, lo, hi *bound, path string) error {
	if lo == nil || hi == nil {
		return schemaErr("", path, "no %s is in range", what)
	}
	return schemaErr(lo.kw, path, "no %s satisfies both %s and %s", what, lo.kw, hi.kw)
}

// intRange matches the integers in [lo, hi] written without leading zeros
// and never as -0.
func intRange(lo, hi int64) expr {
	var alts []expr
	if lo < 0 {
		alts = append(alts, seqOf(lit("-"), digitRange(max(-hi, 1), -lo)))
	}
	if hi >= 0 {
		alts = append(alts, digitRange(max(lo, 0), hi))
	}
	return altOf(alts...)
}

// numberRange matches the decimals between lo and hi (excluded where loEx
// or hiEx), written as an integral part and an optional fraction. A
// negative number is the mirror image of a positive one behind "-"; "-0"
// needs a non-zero fraction.
func numberRange(lo int64, loEx bool, hi int64, hiEx bool) expr {
	var alts []expr
	if lo < 0 {
		a, aEx := int64(0), true
		if hi < 0 {
			a, aEx = -hi, hiEx
		}
		if e := unsignedRange(a, aEx, -lo, loEx); e != nil {
			alts = append(alts, seqOf(lit("-"), e))
		}
	}
	if hi >= 0 {
		a, aEx := lo, loEx
		if lo < 0 {
			a, aEx = 0, false
		}
		alts = append(alts, unsignedRange(a, aEx, hi, hiEx))
	}
	return altOf(alts...)
}

// unsignedRange matches the decimals x with a <= x <= b (a < x, x < b where
// excluded), 0 <= a. A number n.f lies in [n, n+1), so any fraction is fine
// from a to b-1, b itself takes only zeros, and an excluded a needs a
// non-zero fraction.
func unsignedRange(a int64, aEx bool, b int64, bEx bool) expr {
	if a > b {
		return nil
	}
	if a == b {
		if aEx || bEx {
			return nil
		}
		return seqOf(lit(strconv.FormatInt(a, 10)), optOf(zeroFraction()))
	}
	var alts []expr
	from := a
	if aEx {
		alts = append(alts, seqOf(lit(strconv.FormatInt(a, 10)), nonZeroFraction()))
		from++
	}
	if from <= b-1 {
		alts = append(alts, seqOf(digitRange(from, b-1), optOf(anyFraction())))
	}
	if !bEx {
		alts = append(alts, seqOf(lit(strconv.FormatInt(b, 10)), optOf(zeroFraction())))
	}
	return altOf(alts...)
}

// digitRange matches the integers in [a, b], 0 <= a <= b, without leading
// zeros: one group per number of digits.
func digitRange(a, b int64) expr {
	var alts []expr
	for n := len(strconv.FormatInt(a, 10)); n <= len(strconv.FormatInt(b, 10)); n++ {
		lo, hi := max(a, pow10(n-1)), min(b, pow10(n)-1)
		if n == 1 {
			lo = a
		}
		alts = append(alts, sameLength(strconv.FormatInt(lo, 10), strconv.FormatInt(hi, 10)))
	}
	return altOf(alts...)
}

func pow10(n int) int64 {
	p := int64(1)
	for range n {
		p *= 10
	}
	return p
}

// sameLength matches the digit strings from x to y, which have the same
// length: the common prefix, then x's first digit followed by anything from
// x's rest up, the digits in between followed by anything, and y's first
// digit followed by anything up to y's rest.
func sameLength(x, y string) expr {
	i := 0
	for i < len(x) && x[i] == y[i] {
		i++
	}
	if i == len(x) {
		return lit(x)
	}
	prefix := lit(x[:i])
	x, y = x[i:], y[i:]
	if len(x) == 1 {
		return seqOf(prefix, class(span(rune(x[0]), rune(y[0]))))
	}
	rest := len(x) - 1
	nines, zeros := strings.Repeat("9", rest), strings.Repeat("0", rest)
	var alts []expr
	lo, hi := x[0], y[0]
	if x[1:] != zeros {
		alts = append(alts, seqOf(lit(x[:1]), sameLength(x[1:], nines)))
		lo++
	}
	top := hi
	if y[1:] != nines {
		top--
	}
	if lo <= top {
		alts = append(alts, seqOf(class(span(rune(lo), rune(top))), repOf(digit, rest, rest)))
	}
	if y[1:] != nines {
		alts = append(alts, seqOf(lit(y[:1]), sameLength(zeros, y[1:])))
	}
	return seqOf(prefix, altOf(alts...))
}
