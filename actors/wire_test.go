package actors

import (
	"reflect"
	"testing"

	"pgregory.net/rapid"

	"github.com/dpnode/dpnode/engine"
)

// TestSamplingSurvivesTheWire fills every field of engine.SamplingParams,
// found by reflection, and sends it through the wire form a request takes
// to a rank on another node, or to the rank it migrates to: a field the
// wire forgets fails here, not in a request quietly sampled without it.
func TestSamplingSurvivesTheWire(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var sp engine.SamplingParams
		v := reflect.ValueOf(&sp).Elem()
		for i := range v.NumField() {
			f := v.Field(i)
			name := v.Type().Field(i).Name
			switch f.Kind() {
			case reflect.Int:
				f.SetInt(int64(rapid.IntRange(1, 1<<20).Draw(t, name)))
			case reflect.Float32:
				f.SetFloat(float64(rapid.Float32Range(-2, 2).Filter(func(x float32) bool { return x != 0 }).Draw(t, name)))
			case reflect.Bool:
				f.SetBool(true)
			case reflect.String:
				f.SetString(rapid.StringN(1, 64, -1).Draw(t, name))
			case reflect.Pointer: // *int64
				seed := rapid.Int64().Draw(t, name)
				f.Set(reflect.ValueOf(&seed))
			case reflect.Slice: // []uint32
				f.Set(reflect.ValueOf(rapid.SliceOfN(rapid.Uint32(), 1, 8).Draw(t, name)))
			case reflect.Map: // map[uint32]float32
				f.Set(reflect.ValueOf(rapid.MapOfN(rapid.Uint32(), rapid.Float32Range(-100, 100), 1, 8).Draw(t, name)))
			default:
				t.Fatalf("SamplingParams.%s is a %s: teach this test to fill it", name, f.Kind())
			}
		}
		if got := samplingFromWire(samplingToWire(sp)); !reflect.DeepEqual(got, sp) {
			t.Fatalf("through the wire:\n got %+v\nwant %+v", got, sp)
		}
	})
}

// TestOutputsSurviveTheWire: a step's finish reason and log-probabilities
// come back from their wire form as they were, nil entries included.
func TestOutputsSurviveTheWire(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		f := engine.FinishReason(rapid.IntRange(int(engine.NotFinished), int(engine.FinishedError)).Draw(t, "finish"))
		if got := finishFromWire(finishToWire(f)); got != f {
			t.Fatalf("finish %v came back %v", f, got)
		}
		var lps []*engine.TokenLogprobs
		if rapid.Bool().Draw(t, "some") {
			lps = make([]*engine.TokenLogprobs, rapid.IntRange(0, 4).Draw(t, "n"))
			for i := range lps {
				if rapid.Bool().Draw(t, "set") {
					k := rapid.IntRange(0, 3).Draw(t, "top")
					lps[i] = &engine.TokenLogprobs{Logprob: rapid.Float32().Draw(t, "lp"), Rank: rapid.Uint32().Draw(t, "rank"),
						TopTokenIds: rapid.SliceOfN(rapid.Uint32(), k, k).Draw(t, "ids"), TopLogprobs: rapid.SliceOfN(rapid.Float32(), k, k).Draw(t, "lps")}
				}
			}
		}
		if got := logprobsFromWire(logprobsToWire(lps)); !reflect.DeepEqual(got, lps) {
			t.Fatalf("log-probabilities %v came back %v", lps, got)
		}
	})
}
