package grammar

// Shared rules, defined once per grammar on first use. They are the JSON
// building blocks: every one is bounded except the nesting of "any value",
// which a schema does not bound either.
const (
	ruleWS       = "ws"
	ruleChar     = "char"
	ruleKeyChar  = "keychar"
	ruleHex4     = "hex4"
	ruleString   = "string"
	ruleNumber   = "number"
	ruleInteger  = "integer"
	ruleBoolean  = "boolean"
	ruleNull     = "null"
	ruleValue    = "value"
	ruleObject   = "object"
	ruleArray    = "array"
	ruleMember   = "member"
	ruleDate     = "date"
	ruleTime     = "time"
	ruleDateTime = "date-time"
	ruleUUID     = "uuid"
	ruleEmail    = "email"
	ruleLeapYear = "leap-year"
	ruleHexDigit = "hexdigit"
)

// maxDigits bounds the integer and fraction digits of numbers that the
// schema does not bound: enough for any float64 or int53, and a random
// model cannot spin out digits forever.
const maxDigits = 16

// maxExpDigits bounds the exponent of an unbounded number. Two digits keep
// every value within float64's range: 1e999 would not decode in most
// clients.
const maxExpDigits = 2

// rule returns a reference to the shared rule kind, defining it first if
// this grammar does not have it yet.
func (b *builder) rule(kind string) expr {
	if name, ok := b.shared[kind]; ok {
		return ref(name)
	}
	name := b.reserve(kind)
	b.shared[kind] = name
	b.define(name, b.sharedBody(kind))
	return ref(name)
}

var (
	digit     = class(span('0', '9'))
	digit19   = class(span('1', '9'))
	hexDigits = class(span('0', '9').union(span('a', 'f')).union(span('A', 'F')))
)

func (b *builder) sharedBody(kind string) expr {
	switch kind {
	case ruleWS:
		// At most one space: a random model cannot loop on whitespace.
		return optOf(lit(" "))
	case ruleChar:
		return altOf(
			class(jsonEscapes.complement()),
			seqOf(lit(`\`), altOf(class(chars(`"\/bfnrt`)), seqOf(lit("u"), b.rule(ruleHex4)))))
	case ruleKeyChar:
		// A character of an extra property's key: no escapes.
		return class(plainChars)
	case ruleHex4:
		// Surrogate escapes are left out so that every escape is exactly
		// one character, as minLength and maxLength count them.
		return altOf(
			seqOf(class(chars("0123456789abcABC")), repOf(b.rule(ruleHexDigit), 3, 3)),
			seqOf(class(chars("dD")), class(span('0', '7')), repOf(b.rule(ruleHexDigit), 2, 2)),
			seqOf(class(chars("efEF")), repOf(b.rule(ruleHexDigit), 3, 3)))
	case ruleHexDigit:
		return hexDigits
	case ruleString:
		return seqOf(lit(`"`), starOf(b.rule(ruleChar)), lit(`"`))
	case ruleNumber:
		return seqOf(optOf(lit("-")), altOf(lit("0"), seqOf(digit19, repOf(digit, 0, maxDigits-1))),
			optOf(anyFraction()),
			optOf(seqOf(class(chars("eE")), optOf(class(chars("+-"))), repOf(digit, 1, maxExpDigits))))
	case ruleInteger:
		return altOf(lit("0"), seqOf(optOf(lit("-")), digit19, repOf(digit, 0, maxDigits-1)))
	case ruleBoolean:
		return altOf(lit("true"), lit("false"))
	case ruleNull:
		return lit("null")
	case ruleValue:
		return altOf(b.rule(ruleObject), b.rule(ruleArray), b.rule(ruleString), b.rule(ruleNumber),
			b.rule(ruleBoolean), b.rule(ruleNull))
	case ruleObject:
		return b.collection("{", b.rule(ruleMember), "}")
	case ruleMember:
		return seqOf(b.rule(ruleString), b.rule(ruleWS), lit(":"), b.rule(ruleWS), b.rule(ruleValue))
	case ruleArray:
		return b.collection("[", b.rule(ruleValue), "]")
	}
	return b.formatBody(kind)
}

// collection is open item (sep item)* close, with optional single spaces.
func (b *builder) collection(open string, item expr, close string) expr {
	more := starOf(seqOf(b.sep(), item))
	return seqOf(lit(open), b.rule(ruleWS), optOf(seqOf(item, more, b.rule(ruleWS))), lit(close))
}

// sep is the separator between members or elements.
func (b *builder) sep() expr {
	return seqOf(b.rule(ruleWS), lit(","), b.rule(ruleWS))
}

func anyFraction() expr { return seqOf(lit("."), repOf(digit, 1, maxDigits)) }

func zeroFraction() expr { return seqOf(lit("."), repOf(lit("0"), 1, maxDigits)) }

// nonZeroFraction ends in a non-zero digit, so it is never just zeros.
func nonZeroFraction() expr {
	return seqOf(lit("."), repOf(digit, 0, maxDigits-1), digit19)
}
