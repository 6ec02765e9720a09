package jsonlimit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// noLimits bounds nothing but depth, and that only as far as json.Valid does,
// so that Read and json.Valid should accept the same documents.
var noLimits = Limits{MaxDepth: 10000}

// corpus holds valid and invalid documents; the tests compare Read with
// json.Valid on each.
var corpus = []string{
	// valid
	`{}`, `[]`, `""`, `0`, `-0`, `1`, `-1`, `123`, `1.5`, `-1.5e10`, `1E5`, `1e+5`, `1e-5`,
	`0.0`, `-0.0e-0`, `true`, `false`, `null`, ` 1 `, "\t\n\r {} \n",
	`{"a":1}`, `{"a":{"b":[1,2,{"c":null}]}}`, `[1,"a",true,false,null,{},[]]`,
	`{"a":1,"a":2}`, `[[[]]]`, `{"":{"":[]}}`,
	`"\"\\\/\b\f\n\r\t"`, `"\u0041\u00e9\uD83D\uDE00"`, `"\ud800"`, `"\udc00\ud800"`, `"\uDEAD"`,
	`{"\ud800x":[]}`, "\"\x7f\"", "\"\xff\xfe\"", "{\"\xff\":[]}", `"é 日本"`,
	`{ "a" : [ 1 , 2 ] , "b" : { } }`, `{"messages":[{"role":"user","content":"hi"}]}`,
	`123456789012345678901234567890`, `1e400`, `[1e400]`,
	// invalid
	``, ` `, `{`, `}`, `[`, `]`, `{"a"`, `{"a":`, `{"a":1`, `{"a":1,`, `{"a":1,}`, `[1,]`, `[,1]`,
	`{} x`, `{}{}`, `[][]`, `1 2`, `"a" "b"`, `{"a" 1}`, `{1:2}`, `{"a":1 "b":2}`, `[1 2]`,
	`"\x"`, `"\u12"`, `"\u12g4"`, `"\'"`, `"abc`, `"\`, `"\u`, "\"\x00\"", "\"\x1f\"", "\"a\nb\"",
	`01`, `00`, `-`, `-a`, `--1`, `+1`, `1.`, `1.e5`, `.5`, `1e`, `1e+`, `1e+a`, `1.5.5`, `0x10`,
	`tru`, `truex`, `nul`, `nulll`, `falsE`, `True`, `NaN`, `Infinity`, `[1}`, `{"a":1]`,
	"\x00", "\xef\xbb\xbf{}", `'a'`, `{"a":1}}`, `[[]`, `[1,2`, "\v1", "\f1", "\u00a01",
}

func TestReadAgreesWithValid(t *testing.T) {
	docs := append([]string{
		strings.Repeat("[", 10000) + strings.Repeat("]", 10000),
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001),
	}, corpus...)
	for _, doc := range docs {
		got, err := Read(strings.NewReader(doc), noLimits)
		valid := json.Valid([]byte(doc))
		if (err == nil) != valid {
			t.Errorf("Read(%.40q): error %v; json.Valid: %v", doc, err, valid)
			continue
		}
		if valid && string(got) != doc {
			t.Errorf("Read(%.40q) = %.40q", doc, got)
		}
		var se *SyntaxError
		var le *LimitError
		if err != nil && !errors.As(err, &se) && !errors.As(err, &le) {
			t.Errorf("Read(%.40q): error %T %v", doc, err, err)
		}
	}
}

func TestReadLimits(t *testing.T) {
	long := strings.Repeat("k", 2000)
	for _, tc := range []struct {
		doc  string
		l    Limits
		want *LimitError // nil: accepted
	}{
		{`{"messages":[1,2]}`, Limits{Paths: map[string]int{"messages": 2}}, nil},
		{`{"messages":[1,2,3]}`, Limits{Paths: map[string]int{"messages": 2}}, &LimitError{"messages", "elements", 2}},
		{`{"mess\u0061ges":[1,2,3]}`, Limits{Paths: map[string]int{"messages": 2}}, &LimitError{"messages", "elements", 2}},
		{`{"Messages":[1,2,3]}`, Limits{Paths: map[string]int{"messages": 2}}, &LimitError{"Messages", "elements", 2}},
		{`{"meſſages":[1,2,3]}`, Limits{Paths: map[string]int{"MESSAGES": 2}}, &LimitError{"meſſages", "elements", 2}},
		{`{"\u212a":[1,2]}`, Limits{Paths: map[string]int{"k": 1}}, &LimitError{"\u212a", "elements", 1}},
		{`{"\ud83d\ude00":[1,2]}`, Limits{Paths: map[string]int{"😀": 1}}, &LimitError{"😀", "elements", 1}},
		{`{"\ud800":[1,2]}`, Limits{Paths: map[string]int{"\ufffd": 1}}, &LimitError{"\ufffd", "elements", 1}},
		{"{\"\xff\":[1,2]}", Limits{Paths: map[string]int{"\ufffd": 1}}, &LimitError{"\ufffd", "elements", 1}},
		{`{"a\nb":[1,2]}`, Limits{Paths: map[string]int{"a\nb": 1}}, &LimitError{"a\nb", "elements", 1}},
		{`{"messages":[{"content":[1,2]},{"content":[1,2,3]}]}`, Limits{Paths: map[string]int{"messages[].content": 2}},
			&LimitError{"messages[].content", "elements", 2}},
		{`{"prompt":[[1,2],[3]]}`, Limits{Paths: map[string]int{"prompt[]": 2}}, nil},
		{`{"prompt":[[1,2],[3,4,5]]}`, Limits{Paths: map[string]int{"prompt[]": 2}}, &LimitError{"prompt[]", "elements", 2}},
		{`{"messages":[{"role":"user"},{"role":"user","content":"x","name":"n"}]}`, Limits{Paths: map[string]int{"messages[]": 2}},
			&LimitError{"messages[]", "members", 2}},
		{`{"tools":[{"function":{"parameters":{}}}]}`, Limits{MaxDepth: 5}, nil},
		{`{"tools":[{"function":{"parameters":{}}}]}`, Limits{MaxDepth: 4},
			&LimitError{"tools[].function.parameters", "depth", 4}},
		{`{"tools":[{"function":{"parameters":{"a":{}}}}]}`, Limits{MaxDepth: 5},
			&LimitError{"tools[].function.parameters.a", "depth", 5}},
		{`[[1]]`, Limits{MaxDepth: 2}, nil},
		{`[[[1]]]`, Limits{MaxDepth: 2}, &LimitError{"[][]", "depth", 2}},
		{`1`, Limits{MaxDepth: 1}, nil},
		{`[1]`, Limits{MaxDepth: 1}, nil},
		{strings.Repeat("[", 64) + strings.Repeat("]", 64), Limits{}, nil},
		{strings.Repeat("[", 65) + strings.Repeat("]", 65), Limits{},
			&LimitError{strings.Repeat("[]", 64), "depth", 64}},
		{`{"a":[1,2,3]}`, Limits{Default: 3}, nil},
		{`{"a":[1,2,3,4]}`, Limits{Default: 3}, &LimitError{"a", "elements", 3}},
		{`{"a":[1,2,3,4]}`, Limits{Default: 3, Paths: map[string]int{"messages": 10}}, &LimitError{"a", "elements", 3}},
		{`{"a":[1,2,3,4]}`, Limits{Default: 3, Paths: map[string]int{"a": 10}}, nil},
		{`{"a":[1,2,3,4]}`, Limits{Default: 1, Paths: map[string]int{"a": 0}}, nil},
		{`{"a":[1,2],"b":[1,2]}`, Limits{Default: 2, Paths: map[string]int{"a": 1, "A": 5}}, &LimitError{"a", "elements", 1}},
		{`["a","b","c"]`, Limits{Default: 2}, &LimitError{"", "elements", 2}},
		{`[1,2]`, Limits{Paths: map[string]int{"": 1}}, &LimitError{"", "elements", 1}},
		{`{"a":1,"b":2}`, Limits{Default: 2}, nil},
		{`{"a":1,"b":2,"c":3}`, Limits{Default: 2}, &LimitError{"", "members", 2}},
		{`{"x":{"a":1,"b":2,"a":3}}`, Limits{Paths: map[string]int{"x": 2}}, &LimitError{"x", "members", 2}},
		{`{"":{"":[1,2]}}`, Limits{Paths: map[string]int{".": 1}}, &LimitError{".", "elements", 1}},
		{`{"a":[[1,2,3],[1,2,3,4]]}`, Limits{Default: 3, MaxDepth: 1}, &LimitError{"a", "depth", 1}},
		// The first limit passed in the document is the one reported.
		{`{"a":[1,2,3],"b":[[[[]]]]}`, Limits{Default: 2, MaxDepth: 2}, &LimitError{"a", "elements", 2}},
		{`{"b":[[[[]]]],"a":[1,2,3]}`, Limits{Default: 2, MaxDepth: 2}, &LimitError{"b[]", "depth", 2}},
		// A path too long to keep matches nothing and is shown shortened.
		{`{"` + long + `":[1,2]}`, Limits{Paths: map[string]int{long: 1}}, nil},
		{`{"` + long + `":[1,2]}`, Limits{Default: 1}, &LimitError{"...", "elements", 1}},
		{`{"a":{"` + long + `":{"b":[1,2]}}}`, Limits{Default: 1}, &LimitError{"a...", "elements", 1}},
		// Containers are counted over the whole document, however they nest.
		{`[[{},{}],[{}]]`, Limits{MaxContainers: 6, Default: 2}, nil},
		{`[[{},{}],[{},{}]]`, Limits{MaxContainers: 6, Default: 2}, &LimitError{"[][]", "containers", 6}},
		{`{"a":[],"b":{},"c":"[]"}`, Limits{MaxContainers: 3}, nil},
		{`{"a":[],"b":{},"c":[]}`, Limits{MaxContainers: 3}, &LimitError{"c", "containers", 3}},
		{`[1,2]`, Limits{MaxBytes: 5}, nil},
		{`[1,2]`, Limits{MaxBytes: 4}, &LimitError{"", "bytes", 4}},
		{`[1,2,3]`, Limits{MaxBytes: 5, Default: 1}, &LimitError{"", "elements", 1}},
		{`[1,2,3]`, Limits{MaxBytes: 2, Default: 1}, &LimitError{"", "bytes", 2}},
	} {
		for _, r := range []io.Reader{strings.NewReader(tc.doc), iotest.OneByteReader(strings.NewReader(tc.doc))} {
			got, err := Read(r, tc.l)
			if tc.want == nil {
				if err != nil || string(got) != tc.doc {
					t.Errorf("Read(%.60q, %+v) = %.60q, %v; want the document", tc.doc, tc.l, got, err)
				}
				continue
			}
			var le *LimitError
			if !errors.As(err, &le) || *le != *tc.want {
				t.Errorf("Read(%.60q, %+v): error %v; want %+v", tc.doc, tc.l, err, tc.want)
			}
			if got != nil {
				t.Errorf("Read(%.60q, %+v) returned bytes with an error", tc.doc, tc.l)
			}
		}
	}
}

func TestErrorMessages(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{&LimitError{"messages", "elements", 2048}, "messages has more than 2048 elements"},
		{&LimitError{"messages[]", "members", 8}, "messages[] has more than 8 members"},
		{&LimitError{"", "elements", 3}, "the top-level array has more than 3 elements"},
		{&LimitError{"", "members", 3}, "the top-level object has more than 3 members"},
		{&LimitError{"", "bytes", 16 << 20}, "the body is larger than 16777216 bytes"},
		{&LimitError{"tools[].function.parameters", "depth", 64}, "nesting deeper than 64 at tools[].function.parameters"},
		{&SyntaxError{3, "invalid character 'x' after top-level value"}, "invalid character 'x' after top-level value at offset 3"},
	} {
		if got := tc.err.Error(); got != tc.want {
			t.Errorf("Error() = %q; want %q", got, tc.want)
		}
	}

	for doc, want := range map[string]SyntaxError{
		`{} x`:       {3, "invalid character 'x' after top-level value"},
		`[1,]`:       {3, "invalid character ']' looking for beginning of value"},
		`{"a"`:       {4, "unexpected end of JSON input"},
		"\"a\x01\"":  {2, `invalid character '\x01' in string literal`},
		`01`:         {1, "invalid character '1' after top-level value"},
		`{"a":1 "b"`: {7, `invalid character '"' after object key:value pair`},
	} {
		_, err := Read(strings.NewReader(doc), Limits{})
		var se *SyntaxError
		if !errors.As(err, &se) || *se != want {
			t.Errorf("Read(%q): error %#v; want %#v", doc, err, want)
		}
	}
}

// endlessReader serves head and then unit repeated, counting what it serves.
// It ends after 64 MiB so that a Read that does not stop early fails rather
// than hangs.
type endlessReader struct {
	head, unit []byte
	pos        int
	served     int
}

func (r *endlessReader) Read(p []byte) (int, error) {
	if r.served >= 64<<20 {
		return 0, io.EOF
	}
	n := copy(p, r.head)
	r.head = r.head[n:]
	for n < len(p) {
		c := copy(p[n:], r.unit[r.pos:])
		r.pos = (r.pos + c) % len(r.unit)
		n += c
	}
	r.served += n
	return n, nil
}

func TestReadStopsEarly(t *testing.T) {
	head, unit := `{"messages":[`, `{},`
	r := &endlessReader{head: []byte(head), unit: []byte(unit)}
	_, err := Read(r, Limits{Paths: map[string]int{"messages": 2048}})
	want := LimitError{"messages", "elements", 2048}
	var le *LimitError
	if !errors.As(err, &le) || *le != want {
		t.Fatalf("error %v; want %v", err, &want)
	}
	if most := len(head) + 2049*len(unit) + 64<<10; r.served > most {
		t.Errorf("read %d bytes; want at most %d", r.served, most)
	}

	const maxBytes = 1 << 20
	r = &endlessReader{head: []byte(`"`), unit: []byte("abcdefgh")}
	_, err = Read(r, Limits{MaxBytes: maxBytes})
	want = LimitError{"", "bytes", maxBytes}
	if !errors.As(err, &le) || *le != want {
		t.Fatalf("error %v; want %v", err, &want)
	}
	if most := maxBytes + 64<<10; r.served > most {
		t.Errorf("read %d bytes; want at most %d", r.served, most)
	}
}

// results reads doc through several readers that split it differently.
func results(doc string, l Limits) map[string]any {
	type result struct {
		Doc string
		Err error
	}
	readers := map[string]io.Reader{
		"whole":   strings.NewReader(doc),
		"byte":    iotest.OneByteReader(strings.NewReader(doc)),
		"half":    iotest.HalfReader(strings.NewReader(doc)),
		"dataErr": iotest.DataErrReader(strings.NewReader(doc)),
	}
	got := map[string]any{}
	for name, r := range readers {
		b, err := Read(r, l)
		got[name] = result{string(b), err}
	}
	return got
}

func TestChunking(t *testing.T) {
	docs := append([]string{
		`{"messages":[{"content":[{"type":"text","text":"hello \u00e9 world"}]},{"content":"x"}],"prompt":[[1,2],[3]]}`,
		`{"a":{"b":{"c":[1,2,3,4]}}}`,
		`{"mess\u0061ges":[1.5e3,-0.25,true,false,null,"\ud83d\ude00"]}`,
	}, corpus...)
	for _, doc := range docs {
		for _, l := range []Limits{noLimits, {Default: 3, MaxDepth: 2}, {MaxBytes: 10, Paths: map[string]int{"messages": 2}}} {
			got := results(doc, l)
			for name, res := range got {
				if !reflect.DeepEqual(res, got["whole"]) {
					t.Errorf("Read(%.40q, %+v) through %s reader = %+v; whole = %+v", doc, l, name, res, got["whole"])
				}
			}
		}
	}
}

// chunkReader returns its chunks one per call, the last with err.
type chunkReader struct {
	chunks []string
	err    error
}

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, r.err
	}
	n := copy(p, r.chunks[0])
	r.chunks[0] = r.chunks[0][n:]
	if r.chunks[0] != "" {
		return n, nil
	}
	r.chunks = r.chunks[1:]
	if len(r.chunks) == 0 {
		return n, r.err
	}
	return n, nil
}

func TestReaderErrors(t *testing.T) {
	boom := errors.New("boom")
	_, err := Read(&chunkReader{chunks: []string{`[1,`, `2`}, err: boom}, Limits{})
	if err != boom {
		t.Errorf("error %v; want the reader's", err)
	}

	// The bytes that came with an error come first.
	_, err = Read(&chunkReader{chunks: []string{`[1,2,3`}, err: boom}, Limits{Default: 2})
	var le *LimitError
	if !errors.As(err, &le) {
		t.Errorf("error %v; want a limit error", err)
	}
	_, err = Read(&chunkReader{chunks: []string{`[1,2}`}, err: boom}, Limits{})
	var se *SyntaxError
	if !errors.As(err, &se) {
		t.Errorf("error %v; want a syntax error", err)
	}

	_, err = Read(&chunkReader{err: nil}, Limits{})
	if err != io.ErrNoProgress {
		t.Errorf("error %v from a reader that returns nothing; want io.ErrNoProgress", err)
	}

	// A truncated document is a syntax error, not io.ErrUnexpectedEOF.
	_, err = Read(&chunkReader{chunks: []string{`[1,`}, err: io.EOF}, Limits{})
	if !errors.As(err, &se) || se.Offset != 3 {
		t.Errorf("error %v; want a syntax error at offset 3", err)
	}
}

// TestAllocationsDoNotGrowWithElements checks that the paths of containers
// cost nothing per element: only the buffer's growth should depend on size.
func TestAllocationsDoNotGrowWithElements(t *testing.T) {
	doc := func(n int) []byte {
		var b bytes.Buffer
		b.WriteString(`{"messages":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"role":"user","content":[{"type":"text","text":"hi"}],"x":{"y":[[1]]}}`)
		}
		b.WriteString(`]}`)
		return b.Bytes()
	}
	l := Limits{Default: 1 << 20, Paths: map[string]int{"messages": 1 << 20, "messages[].content": 8}}
	allocs := func(d []byte) float64 {
		return testing.AllocsPerRun(5, func() {
			if _, err := Read(bytes.NewReader(d), l); err != nil {
				t.Fatal(err)
			}
		})
	}
	small, large := allocs(doc(100)), allocs(doc(10000))
	if large-small > 20 {
		t.Errorf("%v allocations for 100 messages, %v for 10000", small, large)
	}
}

// TestPathMemoryBounded checks that long keys, nested deep, do not make the
// scanner keep memory in proportion to the document.
func TestPathMemoryBounded(t *testing.T) {
	short, long := strings.Repeat("k", 300), strings.Repeat("k", 20000)
	doc := []byte(strings.Repeat(`{"`+short+`":`, 2) + `{"` + long + `":` + strings.Repeat(`{"`+short+`":`, 50) +
		"1" + strings.Repeat("}", 53))
	s := newScanner(NewChecker(Limits{MaxDepth: 200, Paths: map[string]int{"x": 1}}))
	if err := s.scan(doc, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.finish(len(doc)); err != nil {
		t.Fatal(err)
	}
	if cap(s.path) > 4*maxPath || cap(s.fold) > 4*maxPath {
		t.Errorf("path buffers grew to %d and %d bytes", cap(s.path), cap(s.fold))
	}
}

// refLimit returns the first limit that doc, a valid document, passes, found
// by walking the tokens that encoding/json reads from it.
func refLimit(doc []byte, l Limits) (*LimitError, error) {
	type container struct {
		object  bool
		path    string
		key     string
		count   int
		limit   int
		wantKey bool
	}
	limitFor := func(path string) int {
		limit, found := l.Default, false
		for p, n := range l.Paths {
			if strings.EqualFold(p, path) {
				if !found {
					limit, found = max(n, 0), true
				} else {
					limit = tighter(limit, max(n, 0))
				}
			}
		}
		return limit
	}
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var stack []*container
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		var top *container
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].object {
				stack[len(stack)-1].wantKey = true
			}
			continue
		}
		if top != nil && top.object && top.wantKey {
			if top.count++; top.limit > 0 && top.count > top.limit {
				return &LimitError{top.path, "members", int64(top.limit)}, nil
			}
			top.key, top.wantKey = tok.(string), false
			continue
		}
		var path string
		switch {
		case top == nil:
		case top.object && len(stack) == 1:
			path = top.key
		case top.object:
			path = top.path + "." + top.key
		default:
			if top.count++; top.limit > 0 && top.count > top.limit {
				return &LimitError{top.path, "elements", int64(top.limit)}, nil
			}
			path = top.path + "[]"
		}
		if d, ok := tok.(json.Delim); ok {
			if len(stack) >= l.MaxDepth {
				return &LimitError{path, "depth", int64(l.MaxDepth)}, nil
			}
			stack = append(stack, &container{object: d == '{', path: path, limit: limitFor(path), wantKey: d == '{'})
			continue
		}
		if top != nil && top.object {
			top.wantKey = true
		}
	}
}

// fuzzLimits are the limits that FuzzRead checks against refLimit.
var fuzzLimits = []Limits{
	{Default: 3, MaxDepth: 4},
	{Default: 3, MaxDepth: 4, Paths: map[string]int{"a": 1, "A[]": 0, "b.c": 2, "": 4, "[]": 2, "k": 1}},
}

func FuzzRead(f *testing.F) {
	for _, doc := range corpus {
		f.Add([]byte(doc))
	}
	for _, doc := range []string{
		`{"a":[1,2],"b":{"c":[1,2,3]}}`, `[[1,2,3],[1,2]]`, `{"K":[{}, {}]}`, `{"\u212a":[1,2]}`,
		`[[[[[]]]]]`, `{"a":{"b":{"c":{"d":{}}}}}`, `{"x":1,"x":2,"x":3,"x":4}`,
	} {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		got, err := Read(bytes.NewReader(doc), noLimits)
		valid := json.Valid(doc)
		if (err == nil) != valid {
			t.Fatalf("Read: error %v; json.Valid: %v", err, valid)
		}
		if valid && !bytes.Equal(got, doc) {
			t.Fatalf("Read returned %q", got)
		}

		for _, l := range fuzzLimits {
			_, err := Read(bytes.NewReader(doc), l)
			_, errBytes := Read(iotest.OneByteReader(bytes.NewReader(doc)), l)
			if fmt.Sprint(err) != fmt.Sprint(errBytes) {
				t.Fatalf("Read(%+v): error %v; one byte at a time: %v", l, err, errBytes)
			}
			if !valid {
				if err == nil {
					t.Fatalf("Read(%+v) accepted an invalid document", l)
				}
				continue
			}
			want, rerr := refLimit(doc, l)
			if rerr != nil {
				t.Fatalf("reference: %v", rerr)
			}
			if want == nil {
				if err != nil {
					t.Fatalf("Read(%+v): error %v; want none", l, err)
				}
				continue
			}
			var le *LimitError
			if !errors.As(err, &le) {
				t.Fatalf("Read(%+v): error %v; want %v", l, err, want)
			}
			if len(want.Path) > maxPath {
				// The path was too long to keep, so Read shows less of it.
				le.Path = want.Path
			}
			if *le != *want {
				t.Fatalf("Read(%+v): error %+v; want %+v", l, le, want)
			}
		}
	})
}

// chatBody returns a chat completion request of about size bytes.
func chatBody(size int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"llama-3.1-8b-instruct","stream":true,"max_tokens":1024,"temperature":0.7,"messages":[`)
	b.WriteString(`{"role":"system","content":"You are a helpful assistant. Answer briefly."}`)
	sentences := []string{
		`The quick brown fox jumps over the lazy dog. `,
		`Here is some code:\n\n    func main() {\n\tfmt.Println(\"hello\")\n    }\n`,
		`Prices went up by 3.5% in 2024, according to the report. `,
		`Caf\u00e9 au lait, na\u00efve r\u00e9sum\u00e9, Stra\u00dfe; 東京 and München. `,
		`Could you explain the difference between a process and a thread? `,
	}
	for i := 0; b.Len() < size; i++ {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		if i%5 == 4 {
			fmt.Fprintf(&b, `,{"role":%q,"content":[{"type":"text","text":"`, role)
		} else {
			fmt.Fprintf(&b, `,{"role":%q,"content":"`, role)
		}
		for j := range 4 + i%13 {
			b.WriteString(sentences[(i+j)%len(sentences)])
		}
		if i%5 == 4 {
			b.WriteString(`"}]}`)
		} else {
			b.WriteString(`"}`)
		}
	}
	b.WriteString(`]}`)
	return b.Bytes()
}

var chatLimits = Limits{
	MaxBytes: 16 << 20,
	Default:  1 << 16,
	Paths:    map[string]int{"messages": 4096, "messages[].content": 64, "tools": 128},
}

func BenchmarkRead(b *testing.B) {
	body := chatBody(1 << 20)
	if !json.Valid(body) {
		b.Fatal("the body is not valid JSON")
	}
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := Read(bytes.NewReader(body), chatLimits); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkValid is for comparison with BenchmarkRead.
func BenchmarkValid(b *testing.B) {
	body := chatBody(1 << 20)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if !json.Valid(body) {
			b.Fatal("the body is not valid JSON")
		}
	}
}
