package grammar

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
)

// jsonValue is a decoded JSON document that keeps the order of object
// members, which decides the order of properties in the output.
type jsonValue struct {
	kind jsonKind
	b    bool
	s    string // a string, or a number's literal text
	arr  []*jsonValue
	obj  []jsonMember
}

type jsonKind uint8

const (
	jsonNull jsonKind = iota
	jsonBool
	jsonNumber
	jsonString
	jsonArray
	jsonObject
)

type jsonMember struct {
	key string
	val *jsonValue
}

func (k jsonKind) String() string {
	return [...]string{"null", "boolean", "number", "string", "array", "object"}[k]
}

// maxJSONNesting bounds the nesting of a schema document: a schema level
// takes at most two JSON levels, and enum, const and default values get the
// rest.
const maxJSONNesting = 4 * MaxDepth

// get returns the member key of an object, or nil.
func (v *jsonValue) get(key string) *jsonValue {
	if v == nil || v.kind != jsonObject {
		return nil
	}
	for _, m := range v.obj {
		if m.key == key {
			return m.val
		}
	}
	return nil
}

func decodeJSON(data []byte) (*jsonValue, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := readJSON(dec, 0)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the top-level value")
	}
	return v, nil
}

func readJSON(dec *json.Decoder, depth int) (*jsonValue, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		if depth >= maxJSONNesting {
			return nil, fmt.Errorf("nested deeper than %d levels", maxJSONNesting)
		}
		if t == '{' {
			return readObject(dec, depth+1)
		}
		return readArray(dec, depth+1)
	case string:
		return &jsonValue{kind: jsonString, s: t}, nil
	case json.Number:
		return &jsonValue{kind: jsonNumber, s: string(t)}, nil
	case bool:
		return &jsonValue{kind: jsonBool, b: t}, nil
	}
	return &jsonValue{kind: jsonNull}, nil
}

func readObject(dec *json.Decoder, depth int) (*jsonValue, error) {
	v := &jsonValue{kind: jsonObject}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, _ := tok.(string)
		if seen[key] {
			// A schema with a duplicate key means different things to
			// different validators.
			return nil, fmt.Errorf("duplicate key %q", key)
		}
		seen[key] = true
		val, err := readJSON(dec, depth)
		if err != nil {
			return nil, err
		}
		v.obj = append(v.obj, jsonMember{key, val})
	}
	_, err := dec.Token()
	return v, err
}

func readArray(dec *json.Decoder, depth int) (*jsonValue, error) {
	v := &jsonValue{kind: jsonArray}
	for dec.More() {
		val, err := readJSON(dec, depth)
		if err != nil {
			return nil, err
		}
		v.arr = append(v.arr, val)
	}
	_, err := dec.Token()
	return v, err
}

// compact is v's JSON text without whitespace, strings escaped as
// escapeJSONRune does and numbers as they were written.
func (v *jsonValue) compact() string {
	var sb strings.Builder
	v.writeCompact(&sb)
	return sb.String()
}

func (v *jsonValue) writeCompact(sb *strings.Builder) {
	switch v.kind {
	case jsonNull:
		sb.WriteString("null")
	case jsonBool:
		if v.b {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case jsonNumber:
		sb.WriteString(v.s)
	case jsonString:
		sb.WriteString(quoteJSON(v.s))
	case jsonArray:
		sb.WriteByte('[')
		for i, e := range v.arr {
			if i > 0 {
				sb.WriteByte(',')
			}
			e.writeCompact(sb)
		}
		sb.WriteByte(']')
	case jsonObject:
		sb.WriteByte('{')
		for i, m := range v.obj {
			if i > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(quoteJSON(m.key))
			sb.WriteByte(':')
			m.val.writeCompact(sb)
		}
		sb.WriteByte('}')
	}
}
