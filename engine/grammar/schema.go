package grammar

import (
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// The JSON Schema subset (2020-12, read the way llama.cpp and OpenAI's
// strict mode read it):
//
//   - Annotations are accepted and have no effect: title, description,
//     default, examples, $schema, $id (at the root only: elsewhere it would
//     move the base of $ref), $comment, deprecated, readOnly, writeOnly,
//     contentEncoding, contentMediaType, and any "x-" extension.
//   - type (one or a list), enum and const (written compactly), anyOf and
//     oneOf (alternatives; oneOf's exclusivity is not enforced, so a value
//     valid against two branches is admitted), allOf (one subschema, or
//     object schemas with properties and required that are merged), and
//     local $ref ("#...", JSON pointers with ~0, ~1 and %-escapes; recursion
//     is allowed) with $defs and definitions.
//   - Objects: properties in the schema's order, required ones always,
//     optional ones skippable; no other keys unless additionalProperties is
//     true or a schema (absent means false, as in OpenAI's strict mode and
//     llama.cpp), in which case extra keys (escape-free strings that differ
//     from every declared name) follow the declared ones. An object schema
//     without properties, required and additionalProperties is any object.
//   - Arrays: items, prefixItems, minItems, maxItems (uniqueItems: false).
//   - Strings: minLength, maxLength (in characters; an escape is one, and
//     surrogate escapes are never written), pattern (a search, as in JSON
//     Schema; Go syntax, with "." leaving out all of ECMA-262's line
//     terminators too), format (date, time, date-time, uuid, email). A
//     pattern or format is combined with minLength/maxLength only when
//     every string it matches is already within them. Characters a pattern
//     matches are written in one JSON encoding: \" \\ \b \f \n \r \t,
//     \u00XX for other control characters, and as themselves otherwise.
//   - Integers and numbers have at most 16 integral digits (numbers also
//     at most 16 fraction digits, and a two-digit exponent when unbounded).
//     Within that, integers take any bounds and numbers integer bounds,
//     both enforced exactly; a bounded number has no exponent.
//
// Keywords that would assert anything else are refused by name, as are
// unknown keywords. Without "type" the type follows from the keywords used
// (several families give alternatives); with none, any JSON value.

// keywordKind says what a keyword constrains.
type keywordKind int

const (
	kwInert keywordKind = iota // no effect on which values are valid
	kwObject
	kwArray
	kwString
	kwNumber
	kwType
	kwCombinator
)

var keywords = map[string]keywordKind{
	"title": kwInert, "description": kwInert, "default": kwInert, "examples": kwInert,
	"$schema": kwInert, "$id": kwInert, "$comment": kwInert, "deprecated": kwInert,
	"readOnly": kwInert, "writeOnly": kwInert, "contentEncoding": kwInert,
	"contentMediaType": kwInert, "$defs": kwInert, "definitions": kwInert, "uniqueItems": kwInert,

	"properties": kwObject, "required": kwObject, "additionalProperties": kwObject,
	"items": kwArray, "prefixItems": kwArray, "minItems": kwArray, "maxItems": kwArray,
	"minLength": kwString, "maxLength": kwString, "pattern": kwString, "format": kwString,
	"minimum": kwNumber, "maximum": kwNumber, "exclusiveMinimum": kwNumber, "exclusiveMaximum": kwNumber,

	"type": kwType,
	"$ref": kwCombinator, "allOf": kwCombinator, "anyOf": kwCombinator, "oneOf": kwCombinator,
	"enum": kwCombinator, "const": kwCombinator,
}

// refused are the standard keywords whose assertions a grammar cannot
// enforce here.
var refused = map[string]bool{
	"multipleOf": true, "not": true, "if": true, "then": true, "else": true,
	"patternProperties": true, "propertyNames": true, "minProperties": true, "maxProperties": true,
	"dependentRequired": true, "dependentSchemas": true, "dependencies": true,
	"unevaluatedProperties": true, "contains": true, "minContains": true, "maxContains": true,
	"unevaluatedItems": true, "additionalItems": true, "contentSchema": true,
	"$anchor": true, "$dynamicRef": true, "$dynamicAnchor": true, "$recursiveRef": true,
	"$recursiveAnchor": true, "$vocabulary": true,
}

// combinators are tried in this order; each allows only inert siblings
// (enum and const also allow type).
var combinators = []string{"$ref", "allOf", "anyOf", "oneOf", "enum", "const"}

// maxRefHops bounds a chain of schemas that are nothing but a $ref, as
// allOf follows them.
const maxRefHops = MaxDepth

type converter struct {
	b       *builder
	doc     *jsonValue
	refs    map[string]string // JSON pointer -> rule name
	pending []pendingRef
	targets []pendingRef // root and every $ref target, for the left-recursion check
	exprs   map[string]expr
}

type pendingRef struct {
	name, path string
	schema     *jsonValue
}

func newConverter(doc *jsonValue) *converter { return newConverterOn(newBuilder(), doc) }

// newConverterOn converts doc into rules of b, which other conversions
// may share.
func newConverterOn(b *builder, doc *jsonValue) *converter {
	return &converter{b: b, doc: doc, refs: map[string]string{}, exprs: map[string]expr{}}
}

func (c *converter) run() (string, error) {
	if err := c.define(c.b.reserve("root")); err != nil {
		return "", err
	}
	return c.b.text(), nil
}

// define makes the reserved rule name match the schema, with the rules it
// needs.
func (c *converter) define(name string) error {
	c.refs[""] = name
	c.pending = append(c.pending, pendingRef{name: name, path: "", schema: c.doc})
	for len(c.pending) > 0 {
		p := c.pending[0]
		c.pending = c.pending[1:]
		e, err := c.convert(p.schema, p.path, 0, p.name)
		if err != nil {
			return err
		}
		c.b.define(p.name, e)
		c.targets = append(c.targets, p)
		c.exprs[p.name] = e
		if c.b.tooBig {
			return tooBig(sourceSchema, "")
		}
	}
	if err := c.checkLeftRecursion(); err != nil {
		return err
	}
	return c.checkFinite()
}

// checkFinite refuses schemas with a part that only infinite JSON could
// satisfy, such as a required property whose value is the schema itself:
// a model that starts such a part never finishes.
func (c *converter) checkFinite() error {
	bad := c.b.unproductive()
	if len(bad) == 0 {
		return nil
	}
	for _, t := range c.targets {
		if slices.Contains(bad, t.name) {
			return schemaErr("$ref", t.path, "the schema requires itself: no finite JSON value is valid")
		}
	}
	return schemaErr("$ref", "", "the schema requires itself: no finite JSON value is valid")
}

func (c *converter) convert(s *jsonValue, path string, depth int, hint string) (expr, error) {
	if depth > MaxDepth {
		return nil, schemaErr("", path, "the schema is nested deeper than %d levels", MaxDepth)
	}
	if c.b.tooBig {
		return nil, tooBig(sourceSchema, "")
	}
	switch s.kind {
	case jsonBool:
		if s.b {
			return c.b.rule(ruleValue), nil
		}
		return nil, schemaErr("", path, "the schema false matches nothing")
	case jsonObject:
	default:
		return nil, schemaErr("", path, "a schema must be an object or a boolean, not a %s", s.kind)
	}
	if err := checkKeywords(s, path); err != nil {
		return nil, err
	}
	for _, kw := range combinators {
		if v := s.get(kw); v != nil {
			return c.combinator(kw, v, s, path, depth, hint)
		}
	}
	return c.typed(s, path, depth, hint)
}

func checkKeywords(s *jsonValue, path string) error {
	for _, m := range s.obj {
		k := m.key
		switch {
		case refused[k]:
			return schemaErr(k, path, "%s is not supported", k)
		case k == "uniqueItems" && (m.val.kind != jsonBool || m.val.b):
			return schemaErr(k, path, "uniqueItems is not supported")
		case k == "$id" && path != "":
			return schemaErr(k, path, "$id is only supported at the root")
		case strings.HasPrefix(k, "x-"):
		default:
			if _, ok := keywords[k]; !ok {
				return schemaErr(k, path, "unknown keyword %s", k)
			}
		}
	}
	return nil
}

func inert(key string) bool {
	kind, ok := keywords[key]
	return (ok && kind == kwInert) || strings.HasPrefix(key, "x-")
}

// onlyWith refuses siblings of kw that would need intersecting with it.
func onlyWith(s *jsonValue, path, kw string, allowed ...string) error {
	for _, m := range s.obj {
		if m.key == kw || inert(m.key) || slices.Contains(allowed, m.key) {
			continue
		}
		return schemaErr(m.key, path, "%s cannot be combined with %s", m.key, kw)
	}
	return nil
}

func (c *converter) combinator(kw string, v, s *jsonValue, path string, depth int, hint string) (expr, error) {
	switch kw {
	case "allOf":
		return c.allOf(v, s, path, depth, hint)
	case "enum", "const":
		if err := onlyWith(s, path, kw, "type"); err != nil {
			return nil, err
		}
		return c.enum(kw, v, s, path)
	}
	if err := onlyWith(s, path, kw); err != nil {
		return nil, err
	}
	if kw == "$ref" {
		return c.ref(v, path)
	}
	return c.anyOf(kw, v, path, depth, hint)
}

func (c *converter) anyOf(kw string, v *jsonValue, path string, depth int, hint string) (expr, error) {
	if v.kind != jsonArray || len(v.arr) == 0 {
		return nil, schemaErr(kw, path, "%s must be a non-empty array of schemas", kw)
	}
	alts := make([]expr, 0, len(v.arr))
	for i, sub := range v.arr {
		e, err := c.convert(sub, path+"/"+kw+"/"+strconv.Itoa(i), depth+1, hint)
		if err != nil {
			return nil, err
		}
		alts = append(alts, e)
	}
	return altOf(alts...), nil
}

func (c *converter) enum(kw string, v, s *jsonValue, path string) (expr, error) {
	values := []*jsonValue{v}
	if kw == "enum" {
		if v.kind != jsonArray || len(v.arr) == 0 {
			return nil, schemaErr(kw, path, "enum must be a non-empty array")
		}
		values = v.arr
	}
	types, err := declaredTypes(s, path)
	if err != nil {
		return nil, err
	}
	var alts []expr
	for _, val := range values {
		if types == nil || slices.ContainsFunc(types, func(t string) bool { return hasType(val, t) }) {
			alts = append(alts, lit(val.compact()))
		}
	}
	if len(alts) == 0 {
		return nil, schemaErr(kw, path, "no %s value is of the schema's type", kw)
	}
	return altOf(alts...), nil
}

func hasType(v *jsonValue, t string) bool {
	switch t {
	case "integer":
		if v.kind != jsonNumber {
			return false
		}
		r, err := parseDecimal(v.s)
		return err == nil && r.IsInt()
	case "number":
		return v.kind == jsonNumber
	}
	return v.kind.String() == t
}

// ref returns the rule of a $ref target, queuing its conversion the first
// time, so that recursive schemas become recursive rules.
func (c *converter) ref(v *jsonValue, path string) (expr, error) {
	if v.kind != jsonString {
		return nil, schemaErr("$ref", path, "$ref must be a string")
	}
	target, ptr, err := c.resolve(v.s, path)
	if err != nil {
		return nil, err
	}
	name, ok := c.refs[ptr]
	if !ok {
		hint := ptr[strings.LastIndexByte(ptr, '/')+1:]
		name = c.b.reserve(hint)
		c.refs[ptr] = name
		c.pending = append(c.pending, pendingRef{name: name, path: ptr, schema: target})
	}
	return ref(name), nil
}

// resolve finds the subschema a local $ref points to, and its JSON pointer
// in the one spelling used for it everywhere.
func (c *converter) resolve(r, path string) (*jsonValue, string, error) {
	frag, ok := strings.CutPrefix(r, "#")
	if !ok {
		return nil, "", schemaErr("$ref", path, "$ref %q: only references within the schema (#...) are supported", r)
	}
	frag, err := url.PathUnescape(frag)
	if err != nil {
		return nil, "", schemaErr("$ref", path, "$ref %q: %v", r, err)
	}
	if frag == "" {
		return c.doc, "", nil
	}
	if !strings.HasPrefix(frag, "/") {
		return nil, "", schemaErr("$ref", path, "$ref %q: anchors are not supported", r)
	}
	node := c.doc
	var ptr strings.Builder
	for _, raw := range strings.Split(frag[1:], "/") {
		seg := strings.ReplaceAll(strings.ReplaceAll(raw, "~1", "/"), "~0", "~")
		node = child(node, seg)
		if node == nil {
			return nil, "", schemaErr("$ref", path, "$ref %q points to nothing", r)
		}
		ptr.WriteString("/" + escapePointer(seg))
	}
	return node, ptr.String(), nil
}

func child(v *jsonValue, seg string) *jsonValue {
	switch v.kind {
	case jsonObject:
		return v.get(seg)
	case jsonArray:
		i, err := strconv.Atoi(seg)
		if err != nil || i < 0 || i >= len(v.arr) || strconv.Itoa(i) != seg {
			return nil
		}
		return v.arr[i]
	}
	return nil
}

func escapePointer(seg string) string {
	return strings.ReplaceAll(strings.ReplaceAll(seg, "~", "~0"), "/", "~1")
}

// typed converts a schema without combinators: one alternative per type.
func (c *converter) typed(s *jsonValue, path string, depth int, hint string) (expr, error) {
	types, err := declaredTypes(s, path)
	if err != nil {
		return nil, err
	}
	if types == nil {
		types = inferredTypes(s)
	}
	if len(types) == 0 {
		return c.b.rule(ruleValue), nil
	}
	alts := make([]expr, 0, len(types))
	for _, t := range types {
		e, err := c.ofType(t, s, path, depth, hint)
		if err != nil {
			return nil, err
		}
		alts = append(alts, e)
	}
	return altOf(alts...), nil
}

var typeNames = []string{"null", "boolean", "object", "array", "string", "integer", "number"}

// declaredTypes is the "type" keyword's list, or nil without one.
func declaredTypes(s *jsonValue, path string) ([]string, error) {
	t := s.get("type")
	if t == nil {
		return nil, nil
	}
	var names []string
	switch t.kind {
	case jsonString:
		names = []string{t.s}
	case jsonArray:
		for _, v := range t.arr {
			if v.kind != jsonString || slices.Contains(names, v.s) {
				return nil, schemaErr("type", path, "type must be a type name or a list of distinct names")
			}
			names = append(names, v.s)
		}
	}
	if len(names) == 0 {
		return nil, schemaErr("type", path, "type must be a type name or a non-empty list of them")
	}
	for _, n := range names {
		if !slices.Contains(typeNames, n) {
			return nil, schemaErr("type", path, "unknown type %q", n)
		}
	}
	return names, nil
}

// inferredTypes are the types whose keywords the schema uses, in order of
// first use.
func inferredTypes(s *jsonValue) []string {
	var out []string
	for _, m := range s.obj {
		var t string
		switch keywords[m.key] {
		case kwObject:
			t = "object"
		case kwArray:
			t = "array"
		case kwString:
			t = "string"
		case kwNumber:
			t = "number"
		default:
			continue
		}
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
}

func (c *converter) ofType(t string, s *jsonValue, path string, depth int, hint string) (expr, error) {
	switch t {
	case "null":
		return c.b.rule(ruleNull), nil
	case "boolean":
		return c.b.rule(ruleBoolean), nil
	case "object":
		return c.object(s, path, depth, hint)
	case "array":
		return c.array(s, path, depth, hint)
	case "string":
		return c.str(s, path)
	case "integer":
		return c.integer(s, path)
	}
	return c.number(s, path)
}

// atomic names e by a rule unless it already is a single symbol, so that
// object members and array elements stay readable and are written once.
func (c *converter) atomic(e expr, hint string) expr {
	switch e.(type) {
	case ref, lit, class:
		return e
	}
	return c.b.named(hint, e)
}

// checkLeftRecursion refuses $ref cycles that consume no text, such as a
// schema whose anyOf refers back to itself first: llama.cpp refuses such
// grammars, and they generate nothing.
func (c *converter) checkLeftRecursion() error {
	const (
		unvisited = iota
		active
		done
	)
	state := map[string]int{}
	var visit func(name string) bool
	visit = func(name string) bool {
		state[name] = active
		for _, next := range leftRefs(c.exprs[name]) {
			if _, ok := c.exprs[next]; !ok {
				continue
			}
			if state[next] == active || (state[next] == unvisited && visit(next)) {
				return true
			}
		}
		state[name] = done
		return false
	}
	for _, t := range c.targets {
		if state[t.name] == unvisited && visit(t.name) {
			return schemaErr("$ref", t.path, "the schema refers to itself before any JSON text")
		}
	}
	return nil
}

// leftRefs are the rules e may start with.
func leftRefs(e expr) []string {
	switch e := e.(type) {
	case ref:
		return []string{string(e)}
	case rep:
		return leftRefs(e.item)
	case alt:
		var out []string
		for _, p := range e {
			out = append(out, leftRefs(p)...)
		}
		return out
	case seq:
		var out []string
		for _, p := range e {
			out = append(out, leftRefs(p)...)
			if !nullable(p) {
				break
			}
		}
		return out
	}
	return nil
}

// nullable reports whether e may match the empty text. Rules are taken as
// non-empty: every schema's rule matches a JSON value.
func nullable(e expr) bool {
	switch e := e.(type) {
	case lit:
		return e == ""
	case rep:
		return e.min == 0 || nullable(e.item)
	case alt:
		return slices.ContainsFunc(e, nullable)
	case seq:
		for _, p := range e {
			if !nullable(p) {
				return false
			}
		}
		return true
	}
	return false
}
