package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dpnode/dpnode/engine"
)

// Every field a client may send is in one of the tables below, and each
// says what the field does: it takes effect, it is refused with a 400 that
// names it (unless its value asks for nothing), or it is accepted with no
// effect because it has no meaning for a self-hosted server. A field in no
// table is unknown: it is ignored, as vLLM ignores it, and the log says so
// once a minute per name. TestFieldTablesCoverTheSDK holds the tables to
// the OpenAI SDK's request types, and the README lists them.

// fieldUse is what a request field does.
type fieldUse uint8

const (
	// fieldApplied fields take effect.
	fieldApplied fieldUse = iota
	// fieldRefused fields are a 400 naming them unless their value is
	// neutral (null, or the value that asks for nothing).
	fieldRefused
	// fieldNoEffect fields are accepted and have no effect: they have no
	// meaning for a self-hosted server, and common clients send them.
	fieldNoEffect
)

func (u fieldUse) String() string {
	switch u {
	case fieldApplied:
		return "applied"
	case fieldRefused:
		return "refused"
	default:
		return "no effect"
	}
}

// fieldRule is what one field does, and how its value is checked.
type fieldRule struct {
	name string
	use  fieldUse
	// neutral reports a value that asks for nothing, which a refused field
	// accepts; nil accepts null only.
	neutral func(v []byte) bool
	// simRefuses marks a field applied by the llama.cpp engine that the
	// simulated one cannot honour: a 400 there unless neutral.
	simRefuses bool
	// needs is what the engine must do to honour the field: a 400 under
	// an engine that lacks it (Config.EngineLacks), unless neutral.
	needs feature
	// check, when not nil, validates any value: it returns what is wrong,
	// or "".
	check func(v []byte) string
	// why says why a refused field is refused, or why a field has no
	// effect; the 400 and the README say it.
	why string
}

func applied(name string) fieldRule { return fieldRule{name: name, use: fieldApplied} }

func refused(name string, neutral func([]byte) bool, why string) fieldRule {
	return fieldRule{name: name, use: fieldRefused, neutral: neutral, why: why}
}

func noEffect(name, why string) fieldRule { return fieldRule{name: name, use: fieldNoEffect, why: why} }

// notSimulated returns r refused under the simulated engine, with why,
// unless neutral.
func (r fieldRule) notSimulated(neutral func([]byte) bool, why string) fieldRule {
	r.simRefuses, r.neutral, r.why = true, neutral, why
	return r
}

// feature is something an engine may lack (engine.Capabilities).
type feature uint8

const (
	featureLogprobs feature = iota + 1
	featurePromptLogprobs
	featureGrammar
)

// Lacks is what the ranks' engine cannot do, as engine.Capabilities says
// (turned around, so that the zero Config refuses nothing).
type Lacks struct {
	Logprobs, PromptLogprobs, Grammar bool
}

// LacksOf is what an engine of capabilities c lacks.
func LacksOf(c engine.Capabilities) Lacks {
	return Lacks{Logprobs: !c.Logprobs, PromptLogprobs: !c.PromptLogprobs, Grammar: !c.Grammar}
}

func (l Lacks) has(f feature) bool {
	switch f {
	case featureLogprobs:
		return l.Logprobs
	case featurePromptLogprobs:
		return l.PromptLogprobs
	case featureGrammar:
		return l.Grammar
	}
	return false
}

var lackWhy = map[feature]string{
	featureLogprobs:       "the engine returns no log-probabilities",
	featurePromptLogprobs: "the engine returns no log-probabilities of the prompt",
	featureGrammar:        "the engine takes no grammar or schema",
}

// need returns r refused, unless neutral, under an engine that lacks f.
func (r fieldRule) need(f feature) fieldRule {
	r.needs = f
	return r
}

// withCheck returns r with a check of its values.
func (r fieldRule) withCheck(check func(v []byte) string) fieldRule {
	r.check = check
	return r
}

const (
	whyTools      = "its chat template renders no tools and its text cannot be shaped into calls"
	whyFunctions  = "the deprecated functions API is not supported: send tools and tool_choice"
	whyStructured = "no grammar or schema can constrain it"
	whyOpenAIOnly = "it asks for a service of OpenAI's platform that this server does not have"
)

// commonFieldRules are the fields both endpoints take.
var commonFieldRules = []fieldRule{
	applied("model"),
	applied("max_tokens"),
	applied("n"),
	applied("seed"),
	applied("stop"),
	applied("stream"),
	applied("stream_options"),
	applied("temperature"),
	applied("top_p"),
	applied("frequency_penalty").withCheck(numberFromTo(-2, 2)),
	applied("presence_penalty").withCheck(numberFromTo(-2, 2)),
	applied("logit_bias"),
	noEffect("user", "it names the end user to OpenAI's abuse monitoring; dpnode keeps no record of it"),
	// vLLM's extensions.
	applied("top_k"),
	applied("min_tokens"),
	applied("stop_token_ids"),
	applied("include_stop_str_in_output"),
	applied("ignore_eos"),
	applied("cache_salt"),
	applied("return_token_ids"),
	applied("repetition_penalty").withCheck(numberAbove(0)),
	applied("min_p").withCheck(numberFromTo(0, 1)),
	applied("skip_special_tokens").notSimulated(nullOrBool(true), "its special tokens have no text"),
	// vLLM adds no spaces around special tokens with a fast tokenizer,
	// whatever this says; nor does dpnode.
	applied("spaces_between_special_tokens"),
	applied("prompt_logprobs").withCheck(integerFromTo(0, engine.MaxTopLogprobs)).notSimulated(isNull, "it computes no log-probabilities").need(featurePromptLogprobs),
	applied("return_tokens_as_token_ids"),
	refused("use_beam_search", nullOrBool(false), "beam search is not supported by this server"),
	refused("length_penalty", nullOrNumber(1), "beam search is not supported by this server"),
	refused("bad_words", nullOrEmpty, "banned words are not supported by this server"),
	refused("allowed_token_ids", nullOrEmpty, "allowed token lists are not supported by this server"),
	refused("truncate_prompt_tokens", isNull, "prompts are never truncated: a prompt longer than the context is a 400"),
	refused("priority", nullOrNumber(0), "requests are served in arrival order: this server has no priority scheduling"),
	applied("response_format").notSimulated(nullOrTextFormat, whyStructured).need(featureGrammar),
	applied("structured_outputs").notSimulated(isNull, whyStructured).need(featureGrammar),
	applied("guided_json").notSimulated(isNull, whyStructured).need(featureGrammar),
	applied("guided_regex").notSimulated(isNull, whyStructured).need(featureGrammar),
	applied("guided_choice").notSimulated(isNull, whyStructured).need(featureGrammar),
	applied("guided_grammar").notSimulated(isNull, whyStructured).need(featureGrammar),
}

// chatFieldRules are /v1/chat/completions' own fields.
var chatFieldRules = []fieldRule{
	applied("messages"),
	applied("max_completion_tokens"),
	applied("logprobs").notSimulated(nullOrBool(false), "it computes no log-probabilities").need(featureLogprobs),
	applied("top_logprobs").withCheck(integerFromTo(0, engine.MaxTopLogprobs)).notSimulated(nullOrNumber(0), "it computes no log-probabilities").need(featureLogprobs),
	applied("tools").notSimulated(nullOrEmpty, whyTools),
	applied("tool_choice").notSimulated(nullOrString("none", "auto"), whyTools),
	applied("parallel_tool_calls"),
	refused("functions", nullOrEmpty, whyFunctions),
	refused("function_call", nullOrString("none", "auto"), whyFunctions),
	refused("audio", isNull, "this server generates text only"),
	refused("modalities", nullOrTextModality, "this server generates text only"),
	refused("prediction", isNull, "predicted outputs are not supported by this server"),
	refused("web_search_options", isNull, whyOpenAIOnly),
	refused("verbosity", nullOrString("medium"), "the model's answers cannot be made shorter or longer on request"),
	refused("moderation", isNull, whyOpenAIOnly),
	noEffect("store", "OpenAI stores completions for its dashboard; dpnode stores none"),
	noEffect("metadata", "it tags stored completions, and dpnode stores none"),
	noEffect("prompt_cache_key", "dpnode's prefix cache finds shared prefixes by their content; cache_salt keeps tenants apart"),
	noEffect("prompt_cache_retention", "dpnode's prefix cache keeps what fits, least recently used given up first"),
	noEffect("prompt_cache_options", "dpnode's prefix cache keeps what fits, least recently used given up first"),
	noEffect("safety_identifier", "it names the end user to OpenAI's abuse monitoring; dpnode keeps no record of it"),
	noEffect("service_tier", "a self-hosted server has one tier"),
	noEffect("reasoning_effort", "the chat template is rendered without it"),
	// vLLM's chat extensions.
	refused("echo", nullOrBool(false), "echoing the last message is not supported by this server"),
	refused("add_generation_prompt", nullOrBool(true), "the template always ends with the start of the assistant's turn"),
	refused("continue_final_message", nullOrBool(false), "the template always ends with the start of the assistant's turn"),
	refused("add_special_tokens", nullOrBool(false), "the chat template writes the model's special tokens"),
	refused("chat_template", isNull, "the model's chat template (or --chat-template) renders every chat"),
	refused("chat_template_kwargs", nullOrEmpty, "the chat template is rendered with the messages only"),
	refused("documents", nullOrEmpty, "the chat template is rendered with the messages only"),
}

// completionFieldRules are /v1/completions' own fields.
var completionFieldRules = []fieldRule{
	applied("prompt"),
	applied("echo"),
	applied("logprobs").withCheck(integerFromTo(0, engine.MaxTopLogprobs)).notSimulated(isNull, "it computes no log-probabilities").need(featureLogprobs),
	refused("best_of", nullOrNumber(1), "best_of above 1 is not supported, as in vLLM's V1 engine").withCheck(integerFromTo(1, maxChoices)),
	refused("suffix", nullOrEmpty, "insertion (a suffix) is not supported by this server"),
	refused("add_special_tokens", nullOrBool(true), "a text prompt always gets the model's start token"),
}

// messageFieldRules are the fields of a chat message.
var messageFieldRules = []fieldRule{
	applied("role"),
	applied("content"),
	applied("name"),
	applied("tool_calls").notSimulated(nullOrEmpty, whyTools),
	applied("tool_call_id").notSimulated(nullOrString(""), whyTools),
	refused("function_call", isNull, whyFunctions),
	refused("refusal", nullOrEmpty, "a refusal in the history has no place in the model's chat template"),
	refused("audio", isNull, "this server takes text only"),
}

// contentPartFieldRules are the fields of a message's content part (only
// text parts are taken).
var contentPartFieldRules = []fieldRule{
	applied("type"),
	applied("text"),
	noEffect("prompt_cache_breakpoint", "dpnode's prefix cache finds shared prefixes by their content, wherever they end"),
}

// streamOptionRules are the fields of stream_options.
var streamOptionRules = []fieldRule{
	applied("include_usage"),
	noEffect("include_obfuscation", "the padding hides token lengths from a network observer between OpenAI and its client; dpnode adds none"),
	refused("continuous_usage_stats", nullOrBool(false), "usage comes in the last chunk only"),
}

// fieldTable looks up rules by name.
type fieldTable struct {
	where string
	rules map[string]*fieldRule
}

func newFieldTable(where string, lists ...[]fieldRule) *fieldTable {
	t := &fieldTable{where: where, rules: map[string]*fieldRule{}}
	for _, list := range lists {
		for i := range list {
			r := list[i]
			if _, dup := t.rules[r.name]; dup {
				panic("httpapi: field " + r.name + " twice in " + where)
			}
			t.rules[r.name] = &r
		}
	}
	return t
}

// lookup finds the rule of a key as encoding/json matches it to a field:
// exactly, else without regard to case.
func (t *fieldTable) lookup(key []byte) *fieldRule {
	if r, ok := t.rules[string(key)]; ok {
		return r
	}
	for name, r := range t.rules {
		if strings.EqualFold(name, string(key)) {
			return r
		}
	}
	return nil
}

var (
	chatFields        = newFieldTable("chat completions", commonFieldRules, chatFieldRules)
	completionFields  = newFieldTable("completions", commonFieldRules, completionFieldRules)
	messageFields     = newFieldTable("messages[]", messageFieldRules)
	contentPartFields = newFieldTable("messages[].content[]", contentPartFieldRules)
	streamOptFields   = newFieldTable("stream_options", streamOptionRules)
)

// checkFields holds the members of body, a request the decoder has read
// as JSON, to table: a refused field with a value that asks for something
// is a 400 naming it; unknown fields are logged. Messages, their content
// parts and stream_options are checked too.
func (s *Server) checkFields(body []byte, table *fieldTable) *apiError {
	var e *apiError
	eachMember(body, func(key, val []byte) bool {
		var r *fieldRule
		r, e = s.checkField(table, fieldPath{}, key, val)
		if e != nil || r == nil {
			return e == nil
		}
		switch r.name {
		case "messages":
			i := 0
			eachElement(val, func(msg []byte) bool {
				at := fieldPath{prefix: "messages", index: i}
				i++
				eachMember(msg, func(key, val []byte) bool {
					r, e = s.checkField(messageFields, at, key, val)
					if e == nil && r != nil && r.name == "content" {
						eachElement(val, func(part []byte) bool {
							eachMember(part, func(key, val []byte) bool {
								_, e = s.checkField(contentPartFields, fieldPath{prefix: "messages", index: at.index, sub: "content[]"}, key, val)
								return e == nil
							})
							return e == nil
						})
					}
					return e == nil
				})
				return e == nil
			})
		case "stream_options":
			eachMember(val, func(key, val []byte) bool {
				_, e = s.checkField(streamOptFields, fieldPath{prefix: "stream_options", index: -1}, key, val)
				return e == nil
			})
		}
		return e == nil
	})
	return e
}

// fieldPath is where a nested field is, written out only for an error or
// a log line: "messages[2].content[].", "stream_options.", or nothing.
type fieldPath struct {
	prefix string
	// index is the element of prefix, -1 for none.
	index int
	sub   string
}

func (p fieldPath) join(name string) string {
	switch {
	case p.prefix == "":
		return name
	case p.index < 0:
		return p.prefix + "." + name
	case p.sub != "":
		return fmt.Sprintf("%s[%d].%s.%s", p.prefix, p.index, p.sub, name)
	}
	return fmt.Sprintf("%s[%d].%s", p.prefix, p.index, name)
}

// checkField checks one member against table; it returns the member's
// rule, nil for an unknown one.
func (s *Server) checkField(table *fieldTable, at fieldPath, key, val []byte) (*fieldRule, *apiError) {
	r := table.lookup(key)
	if r == nil {
		s.unknownFields.warn(s.cfg.Logger, at.join(string(key)), table.where)
		return nil, nil
	}
	if r.check != nil && !isNull(val) {
		if msg := r.check(val); msg != "" {
			param := at.join(r.name)
			return r, badRequest(param+" "+msg, param)
		}
	}
	simRefused := r.simRefuses && s.cfg.SimulatedEngine
	lacked := r.needs != 0 && s.cfg.EngineLacks.has(r.needs)
	refuse := r.use == fieldRefused || simRefused || lacked
	if !refuse || isNull(val) || (r.neutral != nil && r.neutral(val)) {
		return r, nil
	}
	param := at.join(r.name)
	if lacked && !simRefused && r.use != fieldRefused {
		return r, badRequest(fmt.Sprintf("%s is not supported by --engine %s: %s", param, s.cfg.Engine, lackWhy[r.needs]), param)
	}
	if s.cfg.SimulatedEngine {
		return r, badRequest(fmt.Sprintf("%s is not supported by the simulated engine (--engine sim), whose text is deterministic: %s", param, r.why), param)
	}
	return r, badRequest(fmt.Sprintf("%s is not supported: %s", param, r.why), param)
}

// unknownFields logs a request field no table names, once a minute per
// name.
type unknownFields struct {
	mu     sync.Mutex
	logged map[string]time.Time
}

// unknownFieldNames bounds the names remembered; past it the memory starts
// again, so a client sending ever new names costs a log line each, at most.
const unknownFieldNames = 1024

func (u *unknownFields) warn(log *slog.Logger, name, where string) {
	now := time.Now()
	u.mu.Lock()
	last, seen := u.logged[name]
	if seen && now.Sub(last) < time.Minute {
		u.mu.Unlock()
		return
	}
	if u.logged == nil || len(u.logged) >= unknownFieldNames {
		u.logged = map[string]time.Time{}
	}
	u.logged[name] = now
	u.mu.Unlock()
	log.Warn("a request field this server does not know was ignored (logged once a minute per name)", "field", name, "in", where)
}

// The neutral values.

func isNull(v []byte) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

// nullOrEmpty accepts null, "", [] and {}.
func nullOrEmpty(v []byte) bool {
	v = bytes.TrimSpace(v)
	if len(v) >= 2 && (v[0] == '[' || v[0] == '{') {
		return len(bytes.TrimSpace(v[1:len(v)-1])) == 0
	}
	return isNull(v) || bytes.Equal(v, []byte(`""`))
}

func nullOrBool(want bool) func([]byte) bool {
	return func(v []byte) bool {
		var b bool
		return json.Unmarshal(v, &b) == nil && b == want
	}
}

func nullOrNumber(want float64) func([]byte) bool {
	return func(v []byte) bool {
		x, ok := number(v)
		return ok && x == want
	}
}

func nullOrString(want ...string) func([]byte) bool {
	return func(v []byte) bool {
		var s string
		if json.Unmarshal(v, &s) != nil {
			return false
		}
		for _, w := range want {
			if s == w {
				return true
			}
		}
		return false
	}
}

// nullOrTextFormat accepts response_format {"type": "text"}: plain text.
func nullOrTextFormat(v []byte) bool {
	var f map[string]json.RawMessage
	if json.Unmarshal(v, &f) != nil || len(f) != 1 {
		return false
	}
	return nullOrString("text")(f["type"])
}

// nullOrTextModality accepts modalities ["text"].
func nullOrTextModality(v []byte) bool {
	var m []string
	return json.Unmarshal(v, &m) == nil && len(m) == 1 && m[0] == "text"
}

// The checks.

func number(v []byte) (float64, bool) {
	x, err := strconv.ParseFloat(string(bytes.TrimSpace(v)), 64)
	return x, err == nil
}

func numberFromTo(lo, hi float64) func([]byte) string {
	return func(v []byte) string {
		x, ok := number(v)
		switch {
		case !ok:
			return "must be a number"
		case x < lo || x > hi:
			return fmt.Sprintf("must be between %v and %v, got %v", lo, hi, x)
		}
		return ""
	}
}

func numberAbove(lo float64) func([]byte) string {
	return func(v []byte) string {
		x, ok := number(v)
		switch {
		case !ok:
			return "must be a number"
		case x <= lo:
			return fmt.Sprintf("must be above %v, got %v", lo, x)
		}
		return ""
	}
}

func integerFromTo(lo, hi int) func([]byte) string {
	return func(v []byte) string {
		x, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		switch {
		case err != nil:
			return "must be an integer"
		case x < int64(lo) || x > int64(hi):
			return fmt.Sprintf("must be between %d and %d, got %d", lo, hi, x)
		}
		return ""
	}
}

// A scanner of JSON the decoder has already read, so known to be valid:
// it finds members and elements without decoding their values.

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index past the string that starts at b[i].
func skipString(b []byte, i int) int {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return len(b)
		}
		j += k
		// A quote after an odd number of backslashes is escaped.
		n := 0
		for j-1-n > i && b[j-1-n] == '\\' {
			n++
		}
		j++
		if n%2 == 0 {
			return j
		}
	}
}

// skipValue returns the index past the value that starts at b[i].
func skipValue(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i = skipString(b, i)
			if depth == 0 {
				return i
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth <= 0 {
				return i + 1 + min(depth, 0)
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i
			}
		}
		i++
	}
	return i
}

// eachMember calls fn with each member of the object obj, a key as it is
// written (escapes unread) and its value, until fn returns false. A value
// that is not an object has no members.
func eachMember(obj []byte, fn func(key, val []byte) bool) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i++
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return
		}
		end := skipString(obj, i)
		key := obj[i+1 : end-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			var k string
			if json.Unmarshal(obj[i:end], &k) == nil {
				key = []byte(k)
			}
		}
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		i = skipSpace(obj, i+1)
		vend := skipValue(obj, i)
		if !fn(key, obj[i:vend]) {
			return
		}
		i = skipSpace(obj, vend)
		if i >= len(obj) || obj[i] != ',' {
			return
		}
		i++
	}
}

// eachElement calls fn with each element of the array arr until fn
// returns false. A value that is not an array has no elements.
func eachElement(arr []byte, fn func(val []byte) bool) {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return
	}
	i = skipSpace(arr, i+1)
	if i < len(arr) && arr[i] == ']' {
		return
	}
	for i < len(arr) {
		end := skipValue(arr, i)
		if !fn(arr[i:end]) {
			return
		}
		i = skipSpace(arr, end)
		if i >= len(arr) || arr[i] != ',' {
			return
		}
		i = skipSpace(arr, i+1)
	}
}
