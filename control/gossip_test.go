package control

import (
	"strings"
	"testing"

	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// TestMismatchNamesEveryDifference: a peer that serves another model,
// engine, engine model or expert-parallel setting is refused with a
// message naming each difference and both sides' values; a peer that
// leaves a field empty (an older node) is not refused for it.
func TestMismatchNamesEveryDifference(t *testing.T) {
	self := &dpnodev1.NodeMeta{Model: "m", Engine: "sim", Profile: "llama-3.1-8b-h100"}
	for _, tc := range []struct {
		name string
		peer *dpnodev1.NodeMeta
		want []string
	}{
		{"the same", &dpnodev1.NodeMeta{Model: "m", Engine: "sim", Profile: "llama-3.1-8b-h100"}, nil},
		{"an older node", &dpnodev1.NodeMeta{Model: "m"}, nil},
		{"another model name", &dpnodev1.NodeMeta{Model: "other", Engine: "sim", Profile: "llama-3.1-8b-h100"},
			[]string{`the model "other" (this node: "m")`}},
		{"another profile", &dpnodev1.NodeMeta{Model: "m", Engine: "sim", Profile: "qwen3-30b-a3b-h200"},
			[]string{`the engine's model "qwen3-30b-a3b-h200" (this node: "llama-3.1-8b-h100")`}},
		{"another engine, with expert parallelism", &dpnodev1.NodeMeta{Model: "m", Engine: "llamacpp", Profile: "llama, 128256-token vocabulary, 1000 bytes", ExpertParallel: true},
			[]string{`--engine "llamacpp" (this node: "sim")`, `the engine's model "llama, 128256-token vocabulary, 1000 bytes"`, "--enable-expert-parallel=true (this node: false)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := mismatch(self, tc.peer, "B")
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatal("accepted")
			}
			for _, w := range append(tc.want, "node B serves with", "every node of a cluster must serve the same") {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
		})
	}
}
