// Package toolcall reads tool calls out of the text a model generates, as
// vLLM's --tool-call-parser parsers do, for chat completions that carry
// tools. A Parser reads one choice's output as it grows, token by token,
// and says at each step what became certain: content to show, calls
// announced, argument text to append.
//
// What it promises:
//
//   - The deltas add up to the Result: the content fragments concatenate to
//     the final content, and a call's argument fragments to its final
//     arguments. A call's name comes once, in its first delta, and calls
//     are announced in order.
//   - The Result does not depend on how the text was split across Updates.
//   - Text that may still turn out to be a call is held back; text that is
//     certainly content is given at once. Content that is only whitespace
//     is never given, and the Result has it as "".
//   - A call is announced once its name is whole and its arguments have
//     begun: the arguments key was read, or Mistral's [ARGS]. Arguments
//     that are an object are the model's own text, given as it arrives and
//     never past the object's closing brace. Other values wait until they
//     are whole; a string is given decoded (it holds the object, encoded
//     twice), anything else as written.
//   - Each byte is read once: the work over a whole stream is linear in its
//     length. No input makes an Update panic.
//
// Fragments end on whole UTF-8 sequences, except in the final Update: a
// sequence cut by the end of the text waits for its last bytes.
//
// When the output ends, a call cut short keeps its arguments as far as
// they got (the server reports finish_reason "length"). If no call was
// announced, all of the output is content, markers included. If one was,
// the content is the text before the calls, and text after them that is
// not another call is dropped, as vLLM drops it. In call objects, keys may
// come in any order, unknown keys are skipped, and the arguments may be
// under "arguments" or "parameters"; an object with no arguments, or with
// no name that is a non-empty string, is not a call.
package toolcall

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Format is one model family's tool-call syntax.
type Format string

const (
	// Llama3JSON is Llama 3.1, 3.2 and 3.3's syntax: the whole output is
	// an optional <|python_tag|> and JSON objects such as
	// {"name": "f", "parameters": {...}}, separated by ';' or whitespace.
	// An output that does not begin that way, or whose first object is not
	// a call, is content.
	Llama3JSON Format = "llama3_json"
	// Hermes is the syntax of Qwen 2.5 and 3, and of Hermes 2 Pro and 3:
	// content, then calls such as <tool_call>{"name": "f", "arguments":
	// {...}}</tool_call>. A call whose </tool_call> is missing is kept.
	Hermes Format = "hermes"
	// Mistral is Mistral's syntax: content, then [TOOL_CALLS] and either a
	// JSON array of {"name": "f", "arguments": {...}} objects (Nemo) or,
	// in newer models, f[ARGS]{...}, each further call after another
	// [TOOL_CALLS] (Small 3.2). A [CALL_ID] and its id between the name and
	// [ARGS] are skipped.
	Mistral Format = "mistral"
	// Arguments is vLLM's own syntax when tool_choice names a function and
	// the server has no parser: the whole output is the arguments object
	// of Options.Named, announced at its '{'. An output that does not
	// begin with '{' is content.
	Arguments Format = "arguments"
	// JSONList is vLLM's own syntax when tool_choice is "required" and the
	// server has no parser: the whole output is a JSON array of
	// {"name": "f", "parameters": {...}} objects. An output that does not
	// begin with '[', or has no call in its array, is content.
	JSONList Format = "json_list"
)

// Markers the models write around their calls.
const (
	hermesStart  = "<tool_call>"
	mistralStart = "[TOOL_CALLS]"
	mistralArgs  = "[ARGS]"
	mistralID    = "[CALL_ID]"
	pythonTag    = "<|python_tag|>"
)

// Parsers lists the names a server accepts for --tool-call-parser, sorted.
func Parsers() []string {
	return []string{string(Hermes), string(Llama3JSON), string(Mistral)}
}

// Options tune a Parser.
type Options struct {
	// Named is the function's name for the Arguments format (required
	// there, ignored elsewhere).
	Named string
	// Single keeps only the first call (parallel_tool_calls false): later
	// calls are neither announced nor returned, and their text is not
	// content either.
	Single bool
}

// Delta is what became certain in one Update.
type Delta struct {
	// Content is text to append to the message's content.
	Content string
	// Calls are news of calls, in order of Index, at most one per call.
	Calls []CallDelta
}

// CallDelta is news of one call.
type CallDelta struct {
	// Index is the call's place among the calls, from 0.
	Index int
	// Name is the function's name, set only in the call's first CallDelta.
	Name string
	// Arguments is a fragment to append to the call's arguments.
	Arguments string
}

// Call is one call, complete or as far as the output got.
type Call struct {
	// Name is the function's name.
	Name string
	// Arguments is the arguments' JSON text: the model's own text for an
	// object, cut short if the output was.
	Arguments string
}

// mode is what a Parser is reading.
type mode uint8

const (
	modeLead    mode = iota // leading whitespace (llama3_json, json_list, arguments)
	modeTag                 // whitespace after <|python_tag|> (llama3_json)
	modeSeek                // text before the next marker (hermes, mistral)
	modeOpen                // whitespace after a marker (hermes, mistral)
	modeName                // a name before [ARGS] (mistral)
	modeJSON                // JSON, with the scanner
	modeBetween             // separators between objects (llama3_json)
	modeContent             // content, to the end
	modeDrop                // text after the calls, dropped
)

// top is what the scanned JSON value is.
type top uint8

const (
	topCall  top = iota // a call object
	topArray            // an array of call objects
	topArgs             // a call's arguments
)

// role is what a call object's member is.
type role uint8

const (
	roleOther role = iota
	roleName
	roleArgs
)

// call is one call object as it is read.
type call struct {
	name      string
	role      role // the member being read
	nameSeen  bool // a "name" key was read
	named     bool // its value was read whole
	argsSeen  bool // an arguments key was read
	bad       bool // the name is not a non-empty string
	nameStart int  // where the name's string begins
	argsStart int  // where the arguments value begins, or -1
	argsEnd   int  // where it ends or was cut, or -1
	object    bool // the arguments value is an object
	args      string
	index     int  // the call's place, or -1 before it is announced
	told      bool // its name was sent
	sent      int  // bytes of its arguments sent
}

func newCall() *call { return &call{argsStart: -1, argsEnd: -1, index: -1} }

// Parser reads one choice's output as it grows. Not safe for concurrent use.
type Parser struct {
	format Format
	opts   Options

	text  string
	final bool

	mode mode
	pos  int // the next byte to read, outside modeJSON

	region    int // where the calls' text begins, or -1 before it does
	sent      int // content sent up to here
	nonSpace  int // the text's first byte that is not whitespace, or -1
	spaceSeen int // bytes searched for it

	sc        scanner
	top       top
	cand      *call // the call object being read
	nameStart int   // where a Mistral name begins
	lastCall  bool  // the last llama3_json object was a call

	calls   []*call
	flushed int // calls before this one were sent whole
}

// New returns a Parser for one choice's output in format f. Only the
// Arguments format uses o.Named, and needs it.
func New(f Format, o Options) (*Parser, error) {
	p := &Parser{format: f, opts: o, region: -1, nonSpace: -1}
	switch f {
	case Hermes, Mistral:
		p.mode = modeSeek
	case Llama3JSON, JSONList:
		p.mode = modeLead
	case Arguments:
		if o.Named == "" {
			return nil, errors.New("toolcall: the arguments format needs the function's name in Options.Named")
		}
		p.mode = modeLead
	default:
		return nil, fmt.Errorf("toolcall: unknown format %q; known are %s, %s, %s, %s and %s",
			string(f), Hermes, Llama3JSON, Mistral, Arguments, JSONList)
	}
	return p, nil
}

// Update reads text, the whole output so far, and returns what became
// certain since the previous Update. Each text must extend the previous
// one; final is true on the last call, with all of the output. A text
// shorter than the previous one is taken as the previous one, and Updates
// after the final one return nothing.
//
// In the final Update, text after the calls that is not another call is
// dropped, and a call cut short keeps its arguments as far as they got.
func (p *Parser) Update(text string, final bool) Delta {
	if p.final {
		return Delta{}
	}
	if len(text) > len(p.text) {
		p.text = text
	}
	p.final = final
	for p.step() {
	}
	if final && p.mode == modeJSON {
		p.endJSON(len(p.text))
	}
	return p.delta()
}

// Result is what the whole output said: its content and its calls. It is
// valid after the final Update; before it, it reports the content sent so
// far and the calls as far as they were read. Content that is only
// whitespace is "".
func (p *Parser) Result() (content string, calls []Call) {
	if p.final {
		if end := p.contentEnd(); p.hasNonSpace(end) {
			content = p.text[:end]
		}
	} else {
		content = p.text[:p.sent]
	}
	for _, c := range p.calls {
		args, _ := p.argsOf(c)
		calls = append(calls, Call{Name: c.name, Arguments: args})
	}
	return content, calls
}

// step reads on in the current mode. It reports whether the mode changed,
// so that the new one may read on; false means it waits for more text.
//
// Each mode is read by a method of its own, except modeSeek: most Updates of
// a hermes or mistral output find it waiting for a marker, so it is read
// here, at the cost of no further call.
func (p *Parser) step() bool {
	switch p.mode {
	case modeSeek:
		marker := hermesStart
		if p.format == Mistral {
			marker = mistralStart
		}
		i, hold := find(p.text, p.pos, marker, "")
		if i < 0 {
			p.pos = hold
			return false
		}
		if p.region < 0 {
			p.region = i
		}
		p.pos, p.mode = i+len(marker), modeOpen
		return true
	case modeOpen:
		return p.afterMarker()
	case modeName:
		return p.readName()
	case modeLead, modeTag:
		return p.readLead()
	case modeBetween:
		return p.readBetween()
	case modeJSON:
		return p.readJSON()
	default: // modeContent, modeDrop
		p.pos = len(p.text)
		return false
	}
}

// afterMarker reads what follows a marker, past whitespace: a call object
// (hermes), or an array of them, another marker or a name (mistral). It
// reports whether it picked the next mode.
func (p *Parser) afterMarker() bool {
	text := p.text
	i := skipSpace(text, p.pos)
	if p.pos = i; i == len(text) {
		return false
	}
	switch {
	case p.format == Hermes && text[i] == '{':
		p.startJSON(topCall, i)
	case p.format == Hermes:
		p.mode = modeSeek
	case strings.HasPrefix(text[i:], mistralStart):
		p.mode = modeSeek
	case !p.final && strings.HasPrefix(mistralStart, text[i:]):
		// It may be another [TOOL_CALLS] rather than an array.
		return false
	case text[i] == '[':
		p.startJSON(topArray, i)
	default:
		p.nameStart, p.mode = i, modeName
	}
	return true
}

// readName reads a Mistral name up to its [ARGS] and, unless the name is
// empty, announces the call and starts reading its arguments. It reports
// whether the name ended.
func (p *Parser) readName() bool {
	text := p.text
	i, hold := find(text, p.pos, mistralArgs, mistralStart)
	if i < 0 {
		p.pos = hold
		return false
	}
	if strings.HasPrefix(text[i:], mistralStart) {
		// A marker with no [ARGS] after its name: no call.
		p.pos, p.mode = i+len(mistralStart), modeOpen
		return true
	}
	name := text[p.nameStart:i]
	if j := strings.Index(name, mistralID); j >= 0 {
		name = name[:j]
	}
	p.pos = i + len(mistralArgs)
	if name = strings.TrimSpace(name); name == "" {
		p.mode = modeSeek
		return true
	}
	c := newCall()
	c.name, c.named, c.argsSeen = name, true, true
	p.announce(c)
	p.cand = c
	p.startJSON(topArgs, p.pos)
	return true
}

// readLead reads the start of an output that may be all calls (llama3_json,
// json_list, arguments), past whitespace and, for llama3_json, a
// <|python_tag|>. It reports whether it picked the next mode.
func (p *Parser) readLead() bool {
	text := p.text
	i := skipSpace(text, p.pos)
	if p.pos = i; i == len(text) {
		return false
	}
	rest := text[i:]
	switch {
	case p.format == Llama3JSON && p.mode == modeLead && strings.HasPrefix(rest, pythonTag):
		p.region, p.pos, p.mode = i, i+len(pythonTag), modeTag
	case p.format == Llama3JSON && p.mode == modeLead && !p.final && strings.HasPrefix(pythonTag, rest):
		return false
	case p.format == Llama3JSON && rest[0] == '{':
		if p.region < 0 {
			p.region = i
		}
		p.startJSON(topCall, i)
	case p.format == JSONList && rest[0] == '[':
		p.region = i
		p.startJSON(topArray, i)
	case p.format == Arguments && rest[0] == '{':
		p.region = i
		c := newCall()
		c.name, c.named, c.argsSeen = p.opts.Named, true, true
		p.announce(c)
		p.cand = c
		p.startJSON(topArgs, i)
	default:
		p.mode = modeContent
	}
	return true
}

// readBetween reads the separators after a llama3_json object, and reports
// whether what follows them began.
func (p *Parser) readBetween() bool {
	text := p.text
	i := p.pos
	for i < len(text) && (isSpace(text[i]) || text[i] == ';') {
		i++
	}
	if p.pos = i; i == len(text) {
		return false
	}
	if text[i] == '{' {
		p.startJSON(topCall, i)
	} else {
		p.mode = modeDrop
	}
	return true
}

// startJSON starts reading a JSON value of kind t at pos.
func (p *Parser) startJSON(t top, pos int) {
	watch := 0
	switch t {
	case topCall:
		watch = 1
	case topArray:
		watch = 2
	}
	p.mode, p.top = modeJSON, t
	p.sc.reset(pos, watch)
}

// readJSON reads JSON up to the end of the text, or until it stops reading
// JSON: the value ended, a byte is not JSON, or only the first call is
// kept. It reports whether it stopped.
func (p *Parser) readJSON() bool {
	depth := 0 // how deep call objects lie
	if p.top == topArray {
		depth = 1
	}
	for {
		ev := p.sc.next(p.text)
		at, d := p.sc.at, p.sc.depth
		switch {
		case ev == evMore:
			p.pos = p.sc.pos
			return false
		case ev == evError:
			p.endJSON(at)
			if p.format == Mistral && at > 0 && p.text[at-1] == '[' {
				// That '[' may begin a [TOOL_CALLS] rather than an array.
				p.pos = at - 1
			}
			return true
		case p.top == topArgs:
			c := p.cand
			if ev == evStart {
				c.argsStart, c.object = at, p.text[at] == '{'
				continue
			}
			c.argsEnd = at
			if !c.object {
				c.args = valueArgs(p.text[c.argsStart:at])
			}
			p.endJSON(at)
			return true
		case ev == evStart && d == depth:
			if p.text[at] == '{' {
				p.cand = newCall()
			}
		case p.cand == nil:
			// Inside an element that is not an object, or the array's
			// own end.
		case ev == evKey:
			p.member(p.text[p.sc.keyStart:at])
		case ev == evStart:
			p.memberStart(at)
		case ev == evEnd && d == depth+1:
			p.memberEnd(at)
		case ev == evEnd && d == depth:
			p.endCall(at)
		}
		if ev == evEnd && d == 0 {
			p.endJSON(at)
			return true
		}
		if p.mode != modeJSON {
			return true
		}
	}
}

// member reads the key of a call object's member.
func (p *Parser) member(raw string) {
	c := p.cand
	c.role = roleOther
	key, ok := unquote(raw)
	if !ok {
		return
	}
	switch {
	case key == "name" && !c.nameSeen:
		c.nameSeen, c.role = true, roleName
	case (key == "arguments" || key == "parameters") && !c.argsSeen:
		c.argsSeen, c.role = true, roleArgs
		p.maybeAnnounce(c)
	}
}

// memberStart reads the first byte of a call object's member value.
func (p *Parser) memberStart(at int) {
	c := p.cand
	switch c.role {
	case roleName:
		if p.text[at] == '"' {
			c.nameStart = at
		} else {
			c.bad = true
		}
	case roleArgs:
		c.argsStart, c.object = at, p.text[at] == '{'
	}
}

// memberEnd reads the end of a call object's member value.
func (p *Parser) memberEnd(at int) {
	c := p.cand
	switch c.role {
	case roleName:
		if !c.bad {
			name, ok := unquote(p.text[c.nameStart:at])
			c.name, c.bad = name, !ok || name == ""
		}
		c.named = true
	case roleArgs:
		c.argsEnd = at
		if !c.object {
			c.args = valueArgs(p.text[c.argsStart:at])
		}
	default:
		return
	}
	c.role = roleOther
	p.maybeAnnounce(c)
}

// maybeAnnounce announces c once its name is complete and its arguments
// have begun.
func (p *Parser) maybeAnnounce(c *call) {
	if c.index < 0 && c.named && c.argsSeen && !c.bad {
		p.announce(c)
	}
}

// announce gives c the next place among the calls.
func (p *Parser) announce(c *call) {
	c.index = len(p.calls)
	p.calls = append(p.calls, c)
}

// endCall ends the call object being read at at: where it closed, where
// the text stopped being JSON, or where the output ended.
func (p *Parser) endCall(at int) {
	c := p.cand
	p.cand = nil
	p.lastCall = c.index >= 0
	if c.index < 0 {
		return
	}
	if c.argsStart < 0 {
		c.argsStart, c.argsEnd, c.object = at, at, true
	}
	if c.argsEnd < 0 {
		c.argsEnd = at
		if !c.object {
			c.args = cutArgs(p.text[c.argsStart:at])
		}
	}
	if p.opts.Single {
		p.mode = modeDrop
	}
}

// endJSON ends the JSON value being read at at, the offset past it or of
// the byte that is not JSON, and picks what to read next.
func (p *Parser) endJSON(at int) {
	if p.cand != nil {
		p.endCall(at)
	}
	p.pos = at
	if p.mode == modeDrop {
		return
	}
	switch p.format {
	case Hermes, Mistral:
		p.mode = modeSeek
	case Llama3JSON:
		switch {
		case p.lastCall && p.sc.state == stDone:
			p.mode = modeBetween
		case len(p.calls) == 0:
			p.mode = modeContent
		default:
			p.mode = modeDrop
		}
	default: // JSONList, Arguments
		if len(p.calls) == 0 {
			p.mode = modeContent
		} else {
			p.mode = modeDrop
		}
	}
}

// valueArgs is the arguments given by a complete value that is not an
// object: a string's decoded text, or any other value as written.
func valueArgs(raw string) string {
	if raw != "" && raw[0] == '"' {
		if s, ok := unquote(raw); ok {
			return s
		}
	}
	return raw
}

// cutArgs is the arguments given by a value that is not an object, cut
// short: a string's text as far as it got, or any other value's.
func cutArgs(raw string) string {
	if raw != "" && raw[0] == '"' {
		return unquotePrefix(raw)
	}
	return strings.TrimRight(raw, " \t\r\n")
}

// argsOf returns c's arguments so far, and whether more may come.
func (p *Parser) argsOf(c *call) (string, bool) {
	switch {
	case c.argsEnd >= 0 && c.object:
		return p.text[c.argsStart:c.argsEnd], false
	case c.argsEnd >= 0:
		return c.args, false
	case c.argsStart >= 0 && c.object:
		return p.text[c.argsStart:p.sc.pos], true
	default:
		return "", true
	}
}

// contentEnd is where the content that is certain ends.
func (p *Parser) contentEnd() int {
	switch {
	case p.mode == modeContent || p.final && len(p.calls) == 0:
		return len(p.text)
	case p.region >= 0:
		return p.region
	default:
		return p.pos
	}
}

// hasNonSpace reports whether text[:end] holds a byte that is not
// whitespace.
func (p *Parser) hasNonSpace(end int) bool {
	for p.nonSpace < 0 && p.spaceSeen < end {
		if !isSpace(p.text[p.spaceSeen]) {
			p.nonSpace = p.spaceSeen
		}
		p.spaceSeen++
	}
	return p.nonSpace >= 0 && p.nonSpace < end
}

// delta collects what became certain since the previous one.
func (p *Parser) delta() Delta {
	var d Delta
	end := p.contentEnd()
	if end == len(p.text) && !p.final {
		end = whole(p.text)
	}
	if end > p.sent && p.hasNonSpace(end) {
		d.Content = p.text[p.sent:end]
		p.sent = end
	}
	for i := p.flushed; i < len(p.calls); i++ {
		c := p.calls[i]
		args, open := p.argsOf(c)
		n := len(args)
		if open && !p.final {
			n = whole(args)
		}
		cd := CallDelta{Index: i}
		if n > c.sent {
			cd.Arguments = args[c.sent:n]
			c.sent = n
		}
		if !c.told || cd.Arguments != "" {
			if !c.told {
				cd.Name, c.told = c.name, true
			}
			d.Calls = append(d.Calls, cd)
		}
		if !open && c.sent == len(args) && p.flushed == i {
			p.flushed = i + 1
		}
	}
	return d
}

// isSpace reports ASCII whitespace.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

// skipSpace returns the offset of the first byte at or after i that is not
// whitespace, or len(s).
func skipSpace(s string, i int) int {
	for i < len(s) && isSpace(s[i]) {
		i++
	}
	return i
}

// find returns the offset of the first of the markers a or b (b may be
// empty, or begins with a's first byte) at or after from. When there is
// none it returns -1 and the offset from which a marker may still begin,
// once the text grows. Each marker has its first byte nowhere else, so a
// marker found is never overtaken by one that begins earlier and ends in
// text yet to come, and the first offset that may begin one is the only
// one. It reads each byte once.
func find(s string, from int, a, b string) (int, int) {
	for i := from; i < len(s); i++ {
		j := strings.IndexByte(s[i:], a[0])
		if j < 0 {
			break
		}
		i += j
		rest := s[i:]
		if strings.HasPrefix(rest, a) || b != "" && strings.HasPrefix(rest, b) {
			return i, 0
		}
		if strings.HasPrefix(a, rest) || b != "" && strings.HasPrefix(b, rest) {
			return -1, i
		}
	}
	return -1, len(s)
}

// whole returns len(s), less a UTF-8 sequence begun at its end but not
// complete.
func whole(s string) int {
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				return i
			}
			break
		}
	}
	return len(s)
}
