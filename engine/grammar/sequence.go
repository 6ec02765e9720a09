package grammar

import (
	"fmt"
	"unicode/utf8"
)

// Part is a piece of an item that Repeated writes: literal text or, when
// Schema is not nil, a JSON value valid against Schema (compact, as
// FromJSONSchema's).
type Part struct {
	Text   string
	Schema []byte
}

// MaxItems bounds how many items Repeated lets the text hold, and how many
// alternatives an item may have.
const MaxItems = 128

// Repeated returns a GBNF grammar whose root rule matches open, then
// between minItems and maxItems items separated by sep, then close. Each
// item is any one of alts, whose parts come one after the other. It writes
// a model family's tool calls: "<tool_call>\n{\"name\": \"f\", \"arguments\": "
// then the arguments valid against f's parameters, then "}\n</tool_call>",
// for each function the model may call.
//
// A schema that cannot be converted fails as FromJSONSchema fails, with
// the alternative and part it is in added to the message.
func Repeated(open string, alts [][]Part, sep, close string, minItems, maxItems int) (string, error) {
	switch {
	case len(alts) == 0:
		return "", &Error{Msg: "no alternatives for an item", source: sourceGrammar}
	case len(alts) > MaxItems:
		return "", &Error{Msg: fmt.Sprintf("more than %d alternatives for an item", MaxItems), source: sourceGrammar}
	case minItems < 1 || maxItems < minItems || maxItems > MaxItems:
		return "", &Error{Msg: fmt.Sprintf("items must number from 1 to %d, at least %d and at most %d", MaxItems, minItems, maxItems), source: sourceGrammar}
	}
	for _, s := range []string{open, sep, close} {
		if !utf8.ValidString(s) {
			return "", &Error{Msg: "literal text is not valid UTF-8", source: sourceGrammar}
		}
	}
	b := newBuilder()
	root := b.reserve("root")
	item := b.reserve("item")
	// Written last, root and item match the empty text until then, so that
	// each schema's check for rules that never finish sees only its own.
	b.exprs[root], b.exprs[item] = empty, empty
	var choices []expr
	total := 0
	for i, parts := range alts {
		var pieces []expr
		for j, p := range parts {
			if p.Schema == nil {
				if !utf8.ValidString(p.Text) {
					return "", &Error{Msg: fmt.Sprintf("alternative %d, part %d: literal text is not valid UTF-8", i, j), source: sourceGrammar}
				}
				pieces = append(pieces, lit(p.Text))
				continue
			}
			total += len(p.Schema)
			if total > MaxGrammarBytes {
				return "", tooBig(sourceSchema, "")
			}
			doc, err := decodeJSON(p.Schema)
			if err != nil {
				return "", schemaErr("", "", "alternative %d, part %d: invalid JSON: %v", i, j, err)
			}
			name := b.reserve(fmt.Sprintf("alt%d-value", i))
			if err := newConverterOn(b, doc).define(name); err != nil {
				if e, ok := err.(*Error); ok {
					e.Msg = fmt.Sprintf("alternative %d, part %d: %s", i, j, e.Msg)
				}
				return "", err
			}
			pieces = append(pieces, ref(name))
		}
		choices = append(choices, seqOf(pieces...))
	}
	b.define(item, altOf(choices...))
	rest := repOf(seqOf(lit(sep), ref(item)), minItems-1, maxItems-1)
	b.define(root, seqOf(lit(open), ref(item), rest, lit(close)))
	if b.tooBig {
		return "", tooBig(sourceGrammar, "")
	}
	return b.text(), nil
}
