// Package grammar turns a request's structured-output constraint (a JSON
// schema, "any JSON object", a regular expression, a list of choices or a
// client's own grammar) into GBNF, the grammar language of llama.cpp's
// grammar sampler, so that the API server can refuse a bad constraint with a
// clear message before the request is admitted.
//
// What it promises:
//
//   - Every repetition a generated grammar allows is bounded where the
//     constraint bounds it (maxLength, maxItems, {m,n}, digit counts), and
//     whitespace between JSON tokens is at most one space, so that text
//     sampled from even a random-weight model under the grammar finishes.
//   - A generated grammar only admits text that satisfies the constraint.
//     Where exact enforcement is not possible the conversion fails instead
//     of loosening the constraint; where it would be costly the grammar
//     admits a documented subset (canonical JSON escapes, at most 16 integer
//     and 16 fraction digits, a fixed property order).
//   - Every failure is an *Error that names the offending keyword and where
//     it is; no input makes a conversion panic, loop or use memory beyond
//     what the limits below allow.
//
// The grammars never need llama.cpp's repetition expansion beyond its own
// limits: a repeated item is always a single rule, literal or character
// class, and counts above 1000 are decomposed into nested blocks.
package grammar

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"
)

// Limits on what a conversion accepts and produces. They bound the work the
// API server does per request, and the work llama.cpp does when it parses
// and runs the grammar, independently of what a client sends.
const (
	// MaxSchemaBytes bounds a JSON schema. Real response schemas are a few
	// KiB; 64 KiB leaves room for generous descriptions.
	MaxSchemaBytes = 64 << 10
	// MaxDepth bounds how deeply subschemas nest (properties, items,
	// anyOf...). Real schemas stay under ten levels; the bound keeps the
	// converter's recursion shallow. A recursive $ref is a rule, not
	// nesting, so it does not count.
	MaxDepth = 32
	// MaxPatternBytes bounds a regular expression, whether it comes as a
	// schema's pattern or as a guided regex. Go's parser already bounds
	// nested repetition; this bounds the size of what is converted.
	MaxPatternBytes = 4 << 10
	// MaxChoices bounds a guided choice list: each choice is one
	// alternative that the sampler tracks at every step.
	MaxChoices = 1024
	// MaxGrammarBytes bounds both a client's GBNF and any generated
	// grammar. llama.cpp parses the grammar for every request and keeps a
	// stack per live alternative; 256 KiB is far above any useful grammar
	// and well below what would make admission slow.
	MaxGrammarBytes = 256 << 10
)

// Error is a constraint that cannot be turned into a grammar: the client's
// to fix, so its message names what is wrong and where.
type Error struct {
	// Keyword is the JSON-schema keyword at fault, or "pattern", "choice"
	// or "grammar" for the other constraints; empty for a limit or a
	// malformed schema document.
	Keyword string
	// Path is the JSON pointer to the subschema at fault ("" for the root
	// or for constraints other than a schema).
	Path string
	// Msg says what is wrong.
	Msg string

	source string
}

// Error reads like "json_schema /properties/age: multipleOf is not supported".
func (e *Error) Error() string {
	var sb strings.Builder
	sb.WriteString(e.source)
	if e.Path != "" {
		sb.WriteByte(' ')
		sb.WriteString(e.Path)
	}
	sb.WriteString(": ")
	sb.WriteString(e.Msg)
	return sb.String()
}

const (
	sourceSchema  = "json_schema"
	sourceRegex   = "regex"
	sourceChoice  = "choice"
	sourceGrammar = "grammar"
)

// FromJSONSchema returns a GBNF grammar whose root rule matches compact JSON
// text (at most one space between tokens) that is valid against schema.
// See schema.go for the supported subset of JSON Schema 2020-12.
func FromJSONSchema(schema []byte) (string, error) {
	if len(schema) > MaxSchemaBytes {
		return "", schemaErr("", "", "schema is larger than %d bytes", MaxSchemaBytes)
	}
	doc, err := decodeJSON(schema)
	if err != nil {
		return "", schemaErr("", "", "invalid JSON: %v", err)
	}
	return newConverter(doc).run()
}

// JSONObject returns a GBNF grammar that matches any JSON object, for
// response_format json_object.
func JSONObject() string { return jsonObjectGrammar() }

var jsonObjectGrammar = sync.OnceValue(func() string {
	b := newBuilder()
	root := b.reserve("root")
	b.define(root, b.rule(ruleObject))
	return b.text()
})

// FromRegex returns a GBNF grammar whose root matches exactly the texts that
// pattern (Go/RE2 syntax, Perl flags) matches as a whole, as vLLM's guided
// regex does. ^ and $ are accepted at the ends, where they change nothing.
func FromRegex(pattern string) (string, error) {
	b := newBuilder()
	root := b.reserve("root")
	e, _, err := convertRegex(b, pattern, false)
	if err != nil {
		err.source = sourceRegex
		return "", err
	}
	b.define(root, e)
	if b.tooBig {
		return "", tooBig(sourceRegex, "pattern")
	}
	return b.text(), nil
}

// FromChoice returns a GBNF grammar whose root matches exactly one of
// choices, as vLLM's guided choice does.
func FromChoice(choices []string) (string, error) {
	if len(choices) == 0 {
		return "", choiceErr("the choice list is empty")
	}
	if len(choices) > MaxChoices {
		return "", choiceErr("more than %d choices", MaxChoices)
	}
	total := 0
	alts := make([]expr, 0, len(choices))
	for i, c := range choices {
		if !utf8.ValidString(c) {
			return "", choiceErr("choice %d is not valid UTF-8", i)
		}
		total += len(c)
		if total > MaxGrammarBytes {
			return "", choiceErr("the choices are longer than %d bytes in all", MaxGrammarBytes)
		}
		alts = append(alts, lit(c))
	}
	b := newBuilder()
	b.define(b.reserve("root"), altOf(alts...))
	if b.tooBig {
		return "", tooBig(sourceChoice, "choice")
	}
	return b.text(), nil
}

func schemaErr(keyword, path, format string, args ...any) *Error {
	return &Error{Keyword: keyword, Path: path, Msg: fmt.Sprintf(format, args...), source: sourceSchema}
}

func choiceErr(format string, args ...any) *Error {
	return &Error{Keyword: "choice", Msg: fmt.Sprintf(format, args...), source: sourceChoice}
}

func tooBig(source, keyword string) *Error {
	return &Error{Keyword: keyword, Msg: "the grammar would be larger than " + strconv.Itoa(MaxGrammarBytes) + " bytes", source: source}
}
