package grammar

import (
	"slices"
	"strconv"
)

// property is one declared member of an object schema.
type property struct {
	name   string
	schema *jsonValue
	path   string
}

// objectSpec is an object schema after allOf merging.
type objectSpec struct {
	props    []property
	index    map[string]int // property name -> position in props
	required []string
	// extra is additionalProperties when it admits keys: true or a schema.
	extra     *jsonValue
	extraPath string
}

func (c *converter) object(s *jsonValue, path string, depth int, hint string) (expr, error) {
	if s.get("properties") == nil && s.get("additionalProperties") == nil && s.get("required") == nil {
		return c.b.rule(ruleObject), nil
	}
	var spec objectSpec
	if err := spec.merge(s, path); err != nil {
		return nil, err
	}
	if addl := s.get("additionalProperties"); addl != nil {
		switch {
		case addl.kind == jsonObject || (addl.kind == jsonBool && addl.b):
			spec.extra = addl
			spec.extraPath = path + "/additionalProperties"
		case addl.kind != jsonBool:
			return nil, schemaErr("additionalProperties", path, "additionalProperties must be a schema")
		}
	}
	return c.objectOf(spec, path, depth, hint)
}

// merge adds the properties and required names of s.
func (spec *objectSpec) merge(s *jsonValue, path string) error {
	if props := s.get("properties"); props != nil {
		if props.kind != jsonObject {
			return schemaErr("properties", path, "properties must be an object")
		}
		if spec.index == nil {
			spec.index = map[string]int{}
		}
		for _, m := range props.obj {
			if _, dup := spec.index[m.key]; dup {
				return schemaErr("allOf", path, "property %q is declared by more than one subschema", m.key)
			}
			spec.index[m.key] = len(spec.props)
			spec.props = append(spec.props, property{m.key, m.val, path + "/properties/" + escapePointer(m.key)})
		}
	}
	if req := s.get("required"); req != nil {
		if req.kind != jsonArray {
			return schemaErr("required", path, "required must be an array of property names")
		}
		for _, v := range req.arr {
			if v.kind != jsonString {
				return schemaErr("required", path, "required must be an array of property names")
			}
			spec.required = append(spec.required, v.s)
		}
	}
	return nil
}

// allOf supports one subschema (Pydantic's way of annotating a $ref), or
// object schemas whose properties and required names are merged.
func (c *converter) allOf(v, s *jsonValue, path string, depth int, hint string) (expr, error) {
	if v.kind != jsonArray || len(v.arr) == 0 {
		return nil, schemaErr("allOf", path, "allOf must be a non-empty array of schemas")
	}
	if len(v.arr) == 1 && onlyWith(s, path, "allOf") == nil {
		return c.convert(v.arr[0], path+"/allOf/0", depth+1, hint)
	}
	var spec objectSpec
	if err := mergeable(s, path, "allOf"); err != nil {
		return nil, err
	}
	if err := spec.merge(s, path); err != nil {
		return nil, err
	}
	for i, part := range v.arr {
		part, ppath, err := c.deref(part, path+"/allOf/"+strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		if part.kind == jsonBool && part.b {
			continue
		}
		if part.kind != jsonObject {
			return nil, schemaErr("allOf", ppath, "allOf is only supported over object schemas")
		}
		if err := mergeable(part, ppath); err != nil {
			return nil, err
		}
		if err := spec.merge(part, ppath); err != nil {
			return nil, err
		}
	}
	return c.objectOf(spec, path, depth, hint)
}

// mergeable accepts a schema that allOf can merge: an object schema with
// nothing but properties and required.
func mergeable(s *jsonValue, path string, allowed ...string) error {
	for _, m := range s.obj {
		switch {
		case inert(m.key), m.key == "properties", m.key == "required", slices.Contains(allowed, m.key):
		case m.key == "type" && isObjectType(m.val):
		default:
			return schemaErr("allOf", path, "allOf is only supported over object schemas with properties and required, not %s", m.key)
		}
	}
	return nil
}

func isObjectType(t *jsonValue) bool {
	return (t.kind == jsonString && t.s == "object") ||
		(t.kind == jsonArray && len(t.arr) == 1 && t.arr[0].kind == jsonString && t.arr[0].s == "object")
}

// deref follows schemas that are only a $ref.
func (c *converter) deref(s *jsonValue, path string) (*jsonValue, string, error) {
	for range maxRefHops {
		r := s.get("$ref")
		if r == nil || onlyWith(s, path, "$ref") != nil {
			return s, path, nil
		}
		if r.kind != jsonString {
			return nil, "", schemaErr("$ref", path, "$ref must be a string")
		}
		next, ptr, err := c.resolve(r.s, path)
		if err != nil {
			return nil, "", err
		}
		s, path = next, ptr
	}
	return nil, "", schemaErr("$ref", path, "more than %d $ref in a row", maxRefHops)
}

// objectOf writes the members in declaration order, then any extra ones.
func (c *converter) objectOf(spec objectSpec, path string, depth int, hint string) (expr, error) {
	required := make([]bool, len(spec.props))
	for _, name := range spec.required {
		i, ok := spec.index[name]
		if !ok {
			return nil, schemaErr("required", path, "required property %q is not in properties", name)
		}
		required[i] = true
	}
	members := make([]expr, len(spec.props))
	names := make([]string, len(spec.props))
	for i, p := range spec.props {
		val, err := c.convert(p.schema, p.path, depth+1, p.name)
		if err != nil {
			return nil, err
		}
		members[i] = c.member(quoteJSON(p.name), c.atomic(val, p.name))
		names[i] = p.name
	}
	var extra expr
	if spec.extra != nil {
		val, err := c.convert(spec.extra, spec.extraPath, depth+1, hint+"-extra")
		if err != nil {
			return nil, err
		}
		key, kerr := c.extraKey(names, hint)
		if kerr != nil {
			kerr.Path = spec.extraPath
			return nil, kerr
		}
		extra = c.b.named(hint+"-extra", seqOf(key, c.b.rule(ruleWS), lit(":"), c.b.rule(ruleWS), val))
	}
	body, optional := c.members(members, required, extra, hint)
	ws := c.b.rule(ruleWS)
	switch {
	case body == empty:
		return seqOf(lit("{"), ws, lit("}")), nil
	case optional:
		return seqOf(lit("{"), ws, optOf(seqOf(body, ws)), lit("}")), nil
	}
	return seqOf(lit("{"), ws, body, ws, lit("}")), nil
}

func (c *converter) member(key string, val expr) expr {
	return seqOf(lit(key), c.b.rule(ruleWS), lit(":"), c.b.rule(ruleWS), val)
}

// members writes the declared members, each optional one skippable, with
// separators only between members present, then the extra members. The
// first member written is any optional one before the first required one,
// or that one; the rest after member j is a rule shared by the choices.
// optional reports whether no member at all is a match.
func (c *converter) members(kvs []expr, required []bool, extra expr, hint string) (body expr, optional bool) {
	sep := c.b.sep()
	var more expr = empty
	if extra != nil {
		more = starOf(seqOf(sep, extra))
	}
	firstReq := slices.Index(required, true)
	if len(kvs) == 0 {
		if extra == nil {
			return empty, true
		}
		return seqOf(extra, more), true
	}
	shared := firstReq
	if firstReq < 0 {
		shared = len(kvs) - 1
	}
	tails := make([]expr, len(kvs)+1)
	tails[len(kvs)] = more
	for j := len(kvs) - 1; j >= 1; j-- {
		item := seqOf(sep, kvs[j])
		if !required[j] {
			item = optOf(item)
		}
		tails[j] = seqOf(item, tails[j+1])
		if j <= shared {
			tails[j] = c.b.named(hint+"-rest", tails[j])
		}
	}
	var firsts []expr
	for i := range kvs {
		firsts = append(firsts, seqOf(kvs[i], tails[i+1]))
		if required[i] {
			break
		}
	}
	if firstReq < 0 && extra != nil {
		firsts = append(firsts, seqOf(extra, more))
	}
	return altOf(firsts...), firstReq < 0
}

// extraKey matches a key that is none of the declared names. It writes
// keys without escapes, so that a name cannot sneak back in escaped.
func (c *converter) extraKey(names []string, hint string) (expr, *Error) {
	if len(names) == 0 {
		return c.b.rule(ruleString), nil
	}
	root := &trieNode{}
	nodes := 0
	for _, n := range names {
		nodes += root.add(n)
	}
	if nodes*minTrieNodeBytes > MaxGrammarBytes {
		return nil, tooBig(sourceSchema, "additionalProperties")
	}
	return seqOf(lit(`"`), c.b.named(hint+"-key", root.excluding(c.b.rule(ruleKeyChar))), lit(`"`)), nil
}

// minTrieNodeBytes is the least text a trie node takes in the grammar, so
// that names too long to exclude are refused before the work is done.
const minTrieNodeBytes = 24

// trieNode is one prefix of the declared names.
type trieNode struct {
	next     []rune
	children map[rune]*trieNode
	terminal bool
}

var plainChars = jsonEscapes.complement()

// add adds a name and returns how many nodes that took.
func (t *trieNode) add(name string) int {
	for _, r := range name {
		if !plainChars.contains(r) {
			// An escape-free key cannot spell this name.
			return 0
		}
	}
	added := 0
	for _, r := range name {
		if t.children == nil {
			t.children = map[rune]*trieNode{}
		}
		nt, ok := t.children[r]
		if !ok {
			nt = &trieNode{}
			t.children[r] = nt
			t.next = append(t.next, r)
			added++
		}
		t = nt
	}
	t.terminal = true
	return added
}

// excluding matches escape-free text that continues from this prefix to
// anything but a declared name: stop here (unless this is a name), follow
// a name further, or leave every name with another character.
func (t *trieNode) excluding(keyChar expr) expr {
	var alts []expr
	if !t.terminal {
		alts = append(alts, empty)
	}
	next := slices.Clone(t.next)
	slices.Sort(next)
	var taken []runeRange
	for _, r := range next {
		alts = append(alts, seqOf(lit(string(r)), t.children[r].excluding(keyChar)))
		taken = append(taken, runeRange{r, r})
	}
	alts = append(alts, seqOf(class(plainChars.minus(newCharset(taken...))), starOf(keyChar)))
	return altOf(alts...)
}

func (c *converter) array(s *jsonValue, path string, depth int, hint string) (expr, error) {
	lo, _, err := count(s, "minItems", path)
	if err != nil {
		return nil, err
	}
	hi, hasMax, err := count(s, "maxItems", path)
	if err != nil {
		return nil, err
	}
	if !hasMax {
		hi = unbounded
	}
	prefix, err := c.prefixItems(s, path, depth, hint)
	if err != nil {
		return nil, err
	}
	item, err := c.items(s, path, depth, hint)
	if err != nil {
		return nil, err
	}
	if item == nil && (hi == unbounded || hi > len(prefix)) {
		hi = len(prefix)
	}
	if hi != unbounded && lo > hi {
		return nil, schemaErr("minItems", path, "minItems %d is more than the array can hold (%d)", lo, hi)
	}
	ws := c.b.rule(ruleWS)
	if hi == 0 {
		return seqOf(lit("["), ws, lit("]")), nil
	}
	elems := c.elements(prefix, item, lo, hi)
	if lo == 0 {
		return seqOf(lit("["), ws, optOf(seqOf(elems, ws)), lit("]")), nil
	}
	return seqOf(lit("["), ws, elems, ws, lit("]")), nil
}

func (c *converter) prefixItems(s *jsonValue, path string, depth int, hint string) ([]expr, error) {
	p := s.get("prefixItems")
	if p == nil {
		return nil, nil
	}
	if p.kind != jsonArray {
		return nil, schemaErr("prefixItems", path, "prefixItems must be an array of schemas")
	}
	out := make([]expr, len(p.arr))
	for i, sub := range p.arr {
		e, err := c.convert(sub, path+"/prefixItems/"+strconv.Itoa(i), depth+1, hint+"-"+strconv.Itoa(i))
		if err != nil {
			return nil, err
		}
		out[i] = c.atomic(e, hint+"-"+strconv.Itoa(i))
	}
	return out, nil
}

// items is the schema of the elements after prefixItems, nil when there
// may be none.
func (c *converter) items(s *jsonValue, path string, depth int, hint string) (expr, error) {
	it := s.get("items")
	switch {
	case it == nil:
		return c.b.rule(ruleValue), nil
	case it.kind == jsonBool && !it.b:
		return nil, nil
	case it.kind == jsonArray:
		return nil, schemaErr("items", path, "items must be a schema (use prefixItems for tuples)")
	}
	e, err := c.convert(it, path+"/items", depth+1, hint+"-item")
	if err != nil {
		return nil, err
	}
	return c.atomic(e, hint+"-item"), nil
}

// elements writes at least one and between lo and hi elements: the prefix
// items in order, each after the lo-th optional, then the items.
func (c *converter) elements(prefix []expr, item expr, lo, hi int) expr {
	sep := c.b.sep()
	if len(prefix) == 0 {
		upper := unbounded
		if hi != unbounded {
			upper = hi - 1
		}
		return seqOf(item, repOf(seqOf(sep, item), max(lo, 1)-1, upper))
	}
	used := len(prefix)
	var rest expr = empty
	switch {
	case hi != unbounded && hi <= len(prefix):
		used = hi
	case item != nil:
		upper := unbounded
		if hi != unbounded {
			upper = hi - len(prefix)
		}
		rest = repOf(seqOf(sep, item), max(lo-len(prefix), 0), upper)
	}
	var tail expr = rest
	for i := used - 1; i >= 1; i-- {
		part := seqOf(sep, prefix[i], tail)
		if i >= lo {
			part = optOf(part)
		}
		tail = part
	}
	return seqOf(prefix[0], tail)
}

// count reads a non-negative integer keyword; ok is false when it is absent.
func count(s *jsonValue, kw, path string) (n int, ok bool, err error) {
	v := s.get(kw)
	if v == nil {
		return 0, false, nil
	}
	if v.kind == jsonNumber {
		if r, err := parseDecimal(v.s); err == nil && r.IsInt() && r.Sign() >= 0 {
			if !r.Num().IsInt64() || r.Num().Int64() > maxCount {
				return 0, false, schemaErr(kw, path, "%s above %d is not supported", kw, maxCount)
			}
			return int(r.Num().Int64()), true, nil
		}
	}
	return 0, false, schemaErr(kw, path, "%s must be a non-negative integer", kw)
}

// maxCount bounds minLength, maxLength, minItems and maxItems: no model
// writes a million characters or elements in one response.
const maxCount = 1_000_000

func (c *converter) str(s *jsonValue, path string) (expr, error) {
	lo, hasMin, err := count(s, "minLength", path)
	if err != nil {
		return nil, err
	}
	hi, hasMax, err := count(s, "maxLength", path)
	if err != nil {
		return nil, err
	}
	if !hasMax {
		hi = unbounded
	}
	if hasMax && lo > hi {
		return nil, schemaErr("minLength", path, "minLength is greater than maxLength")
	}
	pattern, format := s.get("pattern"), s.get("format")
	var body expr
	var lr lengthRange
	switch {
	case pattern != nil && format != nil:
		return nil, schemaErr("format", path, "format cannot be combined with pattern")
	case pattern != nil:
		if pattern.kind != jsonString {
			return nil, schemaErr("pattern", path, "pattern must be a string")
		}
		e, plr, perr := convertRegex(c.b, pattern.s, true)
		if perr != nil {
			perr.Path, perr.source = path, sourceSchema
			return nil, perr
		}
		body, lr = e, plr
	case format != nil:
		f, ok := formats[format.s]
		if format.kind != jsonString || !ok {
			return nil, schemaErr("format", path, "format %s is not supported", format.compact())
		}
		body, lr = c.b.rule(f.rule), lengthRange{f.min, f.max}
	default:
		return seqOf(lit(`"`), repOf(c.b.rule(ruleChar), lo, hi), lit(`"`)), nil
	}
	if hasMin && lr.min < lo {
		return nil, schemaErr("minLength", path, "minLength %d is only supported with a pattern or format whose matches are all that long", lo)
	}
	if hasMax && (lr.max == unbounded || lr.max > hi) {
		return nil, schemaErr("maxLength", path, "maxLength %d is only supported with an anchored pattern or a format whose matches are all that short", hi)
	}
	return seqOf(lit(`"`), body, lit(`"`)), nil
}
