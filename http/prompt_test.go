package httpapi

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// TestTokenIDsReadsWhatJSONReads: the fast reader of token-id prompts
// accepts exactly the lists encoding/json reads into []uint32, with the
// same ids.
func TestTokenIDsReadsWhatJSONReads(t *testing.T) {
	for _, in := range []string{`[1,2,3]`, ` [ 0 , 4294967295 ] `, `[4294967296]`, `[-1]`, `[1.0]`, `[1e3]`, `[01]`, `[1,]`,
		`[1 2]`, `[1]x`, `["a"]`, `[1,"a"]`, `[`, `[1`, `[,1]`, `[ 7 ]`, "[\n7\t]"} {
		checkTokenIDs(t, []byte(in))
	}
	rapid.Check(t, func(t *rapid.T) {
		ids := rapid.SliceOfN(rapid.Uint32(), 1, 64).Draw(t, "ids")
		b, _ := json.Marshal(ids)
		got, ok := tokenIDs(b)
		if !ok || !slices.Equal(got, ids) {
			t.Fatalf("%s: got %v %v", b, got, ok)
		}
		// And any mangling of it reads as encoding/json reads it.
		b = []byte(rapid.StringOf(rapid.SampledFrom([]rune("0123456789,[] -.e\"x"))).Draw(t, "text"))
		if len(b) > 0 && b[0] == '[' {
			checkTokenIDs(t, b)
		}
	})
}

// checkTokenIDs compares on what UnmarshalJSON hands tokenIDs: a trimmed
// list that is not empty.
func checkTokenIDs(t interface{ Fatalf(string, ...any) }, b []byte) {
	b = bytes.TrimSpace(b)
	var want []uint32
	err := json.Unmarshal(b, &want)
	if err == nil && len(want) == 0 {
		return
	}
	got, ok := tokenIDs(b)
	if ok != (err == nil) || (ok && !slices.Equal(got, want)) {
		t.Fatalf("%q: tokenIDs gave %v %v, encoding/json %v %v", b, got, ok, want, err)
	}
}
