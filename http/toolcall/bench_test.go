package toolcall

import (
	"fmt"
	"strings"
	"testing"
)

// feed reads text in Updates of step bytes, and returns the bytes given.
func feed(b *testing.B, f Format, text string, step int) int {
	p, err := New(f, Options{Named: "f"})
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for end := step; ; end += step {
		end = min(end, len(text))
		d := p.Update(text[:end], end == len(text))
		n += len(d.Content)
		for _, cd := range d.Calls {
			n += len(cd.Arguments)
		}
		if end == len(text) {
			return n
		}
	}
}

// proseOf returns n bytes of content with tag-like text in it.
func proseOf(n int) string {
	const line = "The <tool> of choice is a [TOOL] or a {\"json\": \"object\"}; see <tool_ and café.\n"
	return strings.Repeat(line, n/len(line)+1)[:n]
}

// argumentsOf returns a call whose arguments object is about n bytes.
func argumentsOf(n int) string {
	var sb strings.Builder
	sb.WriteString("<tool_call>\n{\"name\": \"write_file\", \"arguments\": {\"path\": \"a.go\", \"lines\": [")
	for i := 0; sb.Len() < n; i++ {
		fmt.Fprintf(&sb, "{\"n\": %d, \"text\": \"line {%d} \\\"quoted\\\" \\u00e9\"}, ", i, i)
	}
	sb.WriteString("null]}}\n</tool_call>")
	return sb.String()
}

// BenchmarkContent feeds content, 4 bytes per Update.
func BenchmarkContent(b *testing.B) {
	for _, size := range []int{256 << 10, 1 << 20} {
		for _, f := range []Format{Hermes, Mistral, Llama3JSON} {
			text := proseOf(size)
			b.Run(fmt.Sprintf("%s/%dKiB", f, size>>10), func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					if feed(b, f, text, 4) != len(text) {
						b.Fatal("content lost")
					}
				}
			})
		}
	}
}

// BenchmarkArguments feeds a call with a large arguments object, 4 bytes
// per Update.
func BenchmarkArguments(b *testing.B) {
	for _, size := range []int{16 << 10, 64 << 10, 256 << 10} {
		text := argumentsOf(size)
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if feed(b, Hermes, text, 4) < size-100 {
					b.Fatal("arguments lost")
				}
			}
		})
	}
}

// BenchmarkManyCalls feeds 1 MiB of small calls, 4 bytes per Update and in
// one piece.
func BenchmarkManyCalls(b *testing.B) {
	calls := map[Format]string{
		Hermes:     "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n</tool_call>\n",
		Llama3JSON: "{\"name\": \"get_time\", \"parameters\": {\"tz\": \"UTC\"}}; ",
		Mistral:    "[TOOL_CALLS]get_time[ARGS]{\"tz\": \"UTC\"}",
	}
	for _, f := range []Format{Hermes, Llama3JSON, Mistral} {
		text := strings.Repeat(calls[f], (1<<20)/len(calls[f]))
		for _, step := range []int{4, len(text)} {
			b.Run(fmt.Sprintf("%s/step%d", f, step), func(b *testing.B) {
				b.SetBytes(int64(len(text)))
				for b.Loop() {
					feed(b, f, text, step)
				}
			})
		}
	}
}
