package sampling

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
	"pgregory.net/rapid"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// ranked is a simple reference: indices by logit, largest first, then by
// index.
func ranked(logits []float32) []int {
	idx := make([]int, len(logits))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(logits[b], logits[a]) })
	return idx
}

// probabilities is the reference distribution, in float64: temperature,
// top-k, then top-p (keeping the fewest most likely tokens whose mass
// reaches it, scaled by slack to allow for the sampler's float sums).
func probabilities(logits []float32, p Params, slack float64) []float64 {
	banned := map[int]bool{}
	for _, b := range p.Banned {
		banned[int(b)] = true
	}
	l := slices.Clone(logits)
	for b := range banned {
		l[b] = float32(math.Inf(-1))
	}
	if p.MinP > 0 {
		l = Reference(l, Params{Temperature: p.Temperature, MinP: p.MinP}, nil, nil)
	}
	order := ranked(l)
	order = slices.DeleteFunc(order, func(i int) bool { return math.IsInf(float64(l[i]), -1) })
	if p.TopK > 0 && int(p.TopK) < len(order) {
		order = order[:p.TopK]
	}
	m := float64(l[order[0]])
	w := make([]float64, len(l))
	total := 0.0
	for _, i := range order {
		w[i] = math.Exp((float64(l[i]) - m) / float64(p.Temperature))
		total += w[i]
	}
	if p.TopP > 0 && p.TopP < 1 {
		cum, keep := 0.0, 0
		for keep < len(order) && cum < float64(p.TopP)*total*slack {
			cum += w[order[keep]]
			keep++
		}
		for _, i := range order[max(keep, 1):] {
			total -= w[i]
			w[i] = 0
		}
	}
	for i := range w {
		w[i] /= total
	}
	return w
}

func draw(logits []float32, p Params) int32 {
	return NewSampler(len(logits)).Sample(slices.Clone(logits), &p)
}

// TestGreedyIsTheFirstLargest: any vocabulary size, ties, banned tokens,
// -inf and huge values.
func TestGreedyIsTheFirstLargest(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 5000).Draw(t, "n")
		values := []float32{0, 1, -1, 7.5, 7.5, float32(math.Inf(-1)), 1e30, -1e30}
		logits := make([]float32, n)
		for i := range logits {
			if rapid.Bool().Draw(t, "fromSet") {
				logits[i] = rapid.SampledFrom(values).Draw(t, "v")
			} else {
				logits[i] = rapid.Float32Range(-50, 50).Draw(t, "v")
			}
		}
		var banned []int32
		for range rapid.IntRange(0, 3).Draw(t, "nBanned") {
			banned = append(banned, int32(rapid.IntRange(0, n-1).Draw(t, "banned")))
		}
		want := ranked(logits)
		for _, i := range want {
			if !slices.Contains(banned, int32(i)) {
				if got := draw(logits, Params{Banned: banned}); got != int32(i) {
					t.Fatalf("greedy drew %d (%v), want %d (%v)", got, logits[got], i, logits[i])
				}
				return
			}
		}
	})
}

// TestDrawsFollowTheDistribution draws 20,000 times, with seeds 0 to
// 19,999, from small vocabularies under each filter, and compares each
// token's frequency with the reference probability. The seeds are fixed,
// so the counts are too: the bounds are five standard deviations, checked
// once for all.
func TestDrawsFollowTheDistribution(t *testing.T) {
	logits := []float32{2, 1.5, 1.5, 0.3, -1, -4, 3, 2.9, 0, -0.5, 1, -2, -7}
	for _, p := range []Params{
		{Temperature: 1},
		{Temperature: 0.5},
		{Temperature: 2},
		{Temperature: 1, TopK: 3},
		{Temperature: 1, TopP: 0.8},
		{Temperature: 0.7, TopK: 5, TopP: 0.9},
		{Temperature: 1, Banned: []int32{6, 0}},
		{Temperature: 1, MinP: 0.2},
		{Temperature: 0.5, MinP: 0.05, TopK: 4},
	} {
		t.Run(fmt.Sprintf("%+v", p), func(t *testing.T) {
			const draws = 20000
			want := probabilities(logits, p, 1)
			s := NewSampler(len(logits))
			counts := make([]int, len(logits))
			for seed := range uint64(draws) {
				p.Seed = seed
				counts[s.Sample(slices.Clone(logits), &p)]++
			}
			for i, c := range counts {
				got, pi := float64(c)/draws, want[i]
				if bound := 5 * math.Sqrt(pi*(1-pi)/draws); math.Abs(got-pi) > bound+1e-9 {
					t.Errorf("token %d (logit %v): frequency %.4f, want %.4f ± %.4f", i, logits[i], got, pi, bound)
				}
			}
		})
	}
}

// TestDrawsStayInTheirSupport: on random rows, up to Llama 3's vocabulary
// size, a draw is never a token the filters leave out, and the same seed
// draws the same token.
func TestDrawsStayInTheirSupport(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.SampledFrom([]int{1, 2, 7, 100, 1023, 1025, 5000, 128256}).Draw(t, "n")
		flat := rapid.Bool().Draw(t, "flat")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "rowSeed"), 1))
		logits := make([]float32, n)
		for i := range logits {
			if flat {
				logits[i] = float32(rng.NormFloat64() * 0.1)
			} else {
				logits[i] = float32(rng.NormFloat64() * 4)
			}
		}
		p := Params{Temperature: rapid.Float32Range(0.05, 3).Draw(t, "temperature"), Seed: rapid.Uint64().Draw(t, "seed")}
		if rapid.Bool().Draw(t, "topK") {
			p.TopK = int32(rapid.IntRange(1, n+1).Draw(t, "k"))
		}
		if rapid.Bool().Draw(t, "topP") {
			p.TopP = rapid.Float32Range(0.01, 0.999).Draw(t, "p")
		}
		got := draw(logits, p)
		if again := draw(logits, p); again != got {
			t.Fatalf("the same seed drew %d, then %d", got, again)
		}
		if got < 0 || int(got) >= n {
			t.Fatalf("drew %d of %d tokens", got, n)
		}
		// With a little slack for float sums at the nucleus's edge.
		if probabilities(logits, p, 1+1e-4)[got] == 0 {
			t.Fatalf("drew token %d (logit %v, rank %d), which %+v leaves out", got, logits[got], slices.Index(ranked(logits), int(got)), p)
		}
	})
}

// TestRowsUsesEveryRowOnce runs rows on a pool of several samplers.
func TestRowsUsesEveryRowOnce(t *testing.T) {
	for _, threads := range []int{1, 3} {
		p := NewPool(64, threads)
		var seen [100]atomic.Int32
		p.Rows(100, func(row int, s *Sampler) {
			logits := make([]float32, 64)
			logits[row%64] = 1
			if got := s.Sample(logits, &Params{}); got != int32(row%64) {
				t.Errorf("row %d drew %d", row, got)
			}
			seen[row].Add(1)
		})
		for row := range seen {
			if n := seen[row].Load(); n != 1 {
				t.Fatalf("%d threads: row %d drawn %d times", threads, row, n)
			}
		}
	}
}

// BenchmarkSample is one row of Llama 3's vocabulary.
func BenchmarkSample(b *testing.B) {
	const n = 128256
	rng := rand.New(rand.NewPCG(1, 2))
	logits := benchRow(rng, n)
	// A history of a 1,000-token prompt and 200 tokens drawn.
	var prompt, output []uint32
	for i := range 1200 {
		if t := uint32(rng.IntN(n)); i < 1000 {
			prompt = append(prompt, t)
		} else {
			output = append(output, t)
		}
	}
	h := NewHistory(prompt, output)
	for _, p := range []Params{{}, {Temperature: 1}, {Temperature: 1, TopK: 50}, {Temperature: 1, TopP: 0.95}, {Temperature: 0.8, TopK: 50, TopP: 0.95},
		{Temperature: 1, MinP: 0.05}, {Temperature: 1, Presence: 0.5, Frequency: 0.5, Repetition: 1.1, History: h}} {
		b.Run(fmt.Sprintf("t=%g,k=%d,p=%g,minp=%g,penalties=%v", p.Temperature, p.TopK, p.TopP, p.MinP, p.Penalized()), func(b *testing.B) {
			s := NewSampler(n)
			row := slices.Clone(logits)
			for i := 0; b.Loop(); i++ {
				p.Seed = uint64(i)
				// A step's rows are new; min-p and the penalties write
				// over them.
				copy(row, logits)
				s.Sample(row, &p)
			}
		})
	}
}

// TestPenaltiesBiasAndMinPAreVLLMs: on random rows and histories, the
// token drawn with logit bias, penalties and min-p is the one the same
// seed draws from the reference's logits with none of them. Logits within
// a hair of the min-p cut, where float32 and float64 may disagree, are
// moved off it first.
func TestPenaltiesBiasAndMinPAreVLLMs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.SampledFrom([]int{2, 17, 1000, 4096}).Draw(t, "n")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "rowSeed"), 2))
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 3)
		}
		token := rapid.Int32Range(0, int32(n-1))
		prompt := rapid.SliceOfN(token, 0, 40).Draw(t, "prompt")
		output := rapid.SliceOfN(token, 0, 40).Draw(t, "output")
		p := Params{Temperature: rapid.SampledFrom([]float32{0, 0.3, 1, 1.7}).Draw(t, "temperature"), Seed: rapid.Uint64().Draw(t, "seed")}
		if rapid.Bool().Draw(t, "penalties") {
			p.Presence = rapid.Float32Range(-2, 2).Draw(t, "presence")
			p.Frequency = rapid.Float32Range(-2, 2).Draw(t, "frequency")
			p.Repetition = rapid.SampledFrom([]float32{0, 1, 0.5, 1.3, 2}).Draw(t, "repetition")
		}
		for range rapid.IntRange(0, 4).Draw(t, "nBias") {
			p.LogitBias = append(p.LogitBias, Bias{Token: token.Draw(t, "biased"), Value: rapid.Float32Range(-100, 100).Draw(t, "bias")})
		}
		if rapid.Bool().Draw(t, "banned") {
			p.Banned = []int32{token.Draw(t, "ban")}
		}
		if rapid.Bool().Draw(t, "minP") {
			p.MinP = rapid.Float32Range(0.001, 1).Draw(t, "minP")
		}
		if rapid.Bool().Draw(t, "topK") {
			p.TopK = int32(rapid.IntRange(1, n).Draw(t, "k"))
		}
		// Distinct bias tokens: vLLM's bias is a map.
		slices.SortFunc(p.LogitBias, func(a, b Bias) int { return cmp.Compare(a.Token, b.Token) })
		p.LogitBias = slices.CompactFunc(p.LogitBias, func(a, b Bias) bool { return a.Token == b.Token })
		if p.MinP > 0 && p.Temperature > 0 {
			off := Params{Temperature: p.Temperature, MinP: 0, Banned: p.Banned, LogitBias: p.LogitBias,
				Presence: p.Presence, Frequency: p.Frequency, Repetition: p.Repetition}
			pre := Reference(logits, off, prompt, output)
			top := math.Inf(-1)
			for _, x := range pre {
				top = math.Max(top, float64(x))
			}
			cut := top + float64(p.Temperature)*math.Log(float64(p.MinP))
			for i, x := range pre {
				if d := float64(x) - cut; math.Abs(d) < 1e-3 && !math.IsInf(float64(x), 0) && float64(x) != top {
					logits[i] -= 0.01
				}
			}
		}
		want := draw(Reference(logits, p, prompt, output), Params{Temperature: p.Temperature, TopK: p.TopK, Seed: p.Seed})
		p.History = NewHistory(u32(prompt), u32(output))
		if got := draw(logits, p); got != want {
			t.Fatalf("drew %d, the reference %d", got, want)
		}
	})
}

func u32(ids []int32) []uint32 {
	out := make([]uint32, len(ids))
	for i, t := range ids {
		out[i] = uint32(t)
	}
	return out
}

// TestHistoryCountsWhatIsAdded: a token added counts as drawn once more,
// as a sequence's own draws do between the engine's full histories.
func TestHistoryCountsWhatIsAdded(t *testing.T) {
	logits := []float32{1, 1, 1, 1}
	h := NewHistory([]uint32{0}, []uint32{1})
	h.Add(1)
	h.Add(2)
	p := Params{Frequency: 0.5, Presence: 0.25, Repetition: 2, History: h}
	h.penalize(logits, &p)
	// Token 0: the prompt's (repetition); 1: drawn twice; 2: once; 3: never.
	if want := []float32{0.5, 0.5 - 1 - 0.25, 0.5 - 0.5 - 0.25, 1}; !slices.Equal(logits, want) {
		t.Fatalf("%v, want %v", logits, want)
	}
}

// TestLogprobsAreTheLogSoftmax: a logit less lse is its token's
// log-softmax within 1e-4 of a float64 reference, and the top tokens are
// the reference ranking's first, with theirs.
func TestLogprobsAreTheLogSoftmax(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.SampledFrom([]int{1, 5, 1024, 1025, 128256}).Draw(t, "n")
		rng := rand.New(rand.NewPCG(rapid.Uint64().Draw(t, "rowSeed"), 3))
		logits := make([]float32, n)
		for i := range logits {
			logits[i] = float32(rng.NormFloat64() * 4)
		}
		if rapid.Bool().Draw(t, "banned") {
			logits[rapid.IntRange(0, n-1).Draw(t, "ban")] = float32(math.Inf(-1))
		}
		m := math.Inf(-1)
		for _, l := range logits {
			m = math.Max(m, float64(l))
		}
		sum := 0.0
		for _, l := range logits {
			sum += math.Exp(float64(l) - m)
		}
		want := m + math.Log(sum)
		k := rapid.IntRange(0, MaxTopLogprobs).Draw(t, "k")
		top := make([]Logprob, k)
		lse, got := NewSampler(n).Logprobs(logits, top)
		if math.Abs(float64(lse)-want) > 1e-4 {
			t.Fatalf("lse %v, want %v", lse, want)
		}
		if got != min(k, n) {
			t.Fatalf("%d top tokens, want %d", got, min(k, n))
		}
		order := ranked(logits)
		for j := range got {
			if top[j].Token != int32(order[j]) || math.Abs(float64(top[j].Logprob)-(float64(logits[order[j]])-want)) > 1e-4 {
				t.Fatalf("top %d: %+v, want token %d with %v", j, top[j], order[j], float64(logits[order[j]])-want)
			}
		}
	})
}

// BenchmarkLogprobs is what a row that asks for log-probabilities costs
// beside its draw: the log-sum-exp of Llama 3's vocabulary and its top 5.
func BenchmarkLogprobs(b *testing.B) {
	const n = 128256
	logits := benchRow(rand.New(rand.NewPCG(1, 2)), n)
	s := NewSampler(n)
	var top [5]Logprob
	for b.Loop() {
		s.Logprobs(logits, top[:])
	}
}

// BenchmarkRank is a prompt token's rank in a row of Llama 3's vocabulary,
// which prompt_logprobs adds to each prompt row's log-probabilities.
func BenchmarkRank(b *testing.B) {
	const n = 128256
	logits := benchRow(rand.New(rand.NewPCG(1, 2)), n)
	for i := 0; b.Loop(); i++ {
		Rank(logits, int32(i%n))
	}
}

// benchRow is a row of n logits, normal with a deviation of 3.
func benchRow(rng *rand.Rand, n int) []float32 {
	logits := make([]float32, n)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	return logits
}

// allowed is a Constraint that allows a fixed set of tokens.
type allowed struct {
	set map[int32]bool
	end int32
}

func (a allowed) Allows(t int32) bool { return a.set[t] }
func (a allowed) End() int32          { return a.end }
func (a allowed) Mask(logits []float32) int {
	n := 0
	for i := range logits {
		if !a.set[int32(i)] {
			logits[i] = float32(math.Inf(-1))
		} else if !math.IsInf(float64(logits[i]), -1) {
			n++
		}
	}
	return n
}

// TestConstrainedDrawsFollowTheMaskedDistribution: a draw checked against
// the constraint, and drawn again from the masked row only when the
// constraint refuses it, is a draw from the masked row: each token's
// frequency over 20,000 fixed seeds is the masked distribution's, the
// greedy token is the largest allowed, and a row whose allowed tokens are
// all banned ends with the constraint's end token.
func TestConstrainedDrawsFollowTheMaskedDistribution(t *testing.T) {
	logits := []float32{2, 1.5, 1.5, 0.3, -1, -4, 3, 2.9, 0, -0.5, 1, -2, -7}
	c := allowed{set: map[int32]bool{1: true, 3: true, 6: true, 9: true, 12: true}, end: 12}
	var refused []int32
	for i := range logits {
		if !c.set[int32(i)] {
			refused = append(refused, int32(i))
		}
	}
	for _, temp := range []float32{0.5, 1, 2} {
		const draws = 20000
		want := probabilities(logits, Params{Temperature: temp, Banned: refused}, 1)
		s := NewSampler(len(logits))
		counts := make([]int, len(logits))
		for seed := range uint64(draws) {
			counts[s.Sample(slices.Clone(logits), &Params{Temperature: temp, Seed: seed, Constraint: c})]++
		}
		for i, n := range counts {
			got, pi := float64(n)/draws, want[i]
			if bound := 5 * math.Sqrt(pi*(1-pi)/draws); math.Abs(got-pi) > bound+1e-9 {
				t.Errorf("temperature %v, token %d: frequency %.4f, want %.4f ± %.4f", temp, i, got, pi, bound)
			}
		}
	}
	if got := draw(logits, Params{Constraint: c}); got != 6 {
		t.Errorf("greedy drew %d, want 6", got)
	}
	if got := draw(logits, Params{Constraint: c, Banned: []int32{6}}); got != 1 {
		t.Errorf("greedy with 6 banned drew %d, want 1", got)
	}
	if got := draw(logits, Params{Temperature: 1, Constraint: c, Banned: []int32{1, 3, 6, 9, 12}}); got != 12 {
		t.Errorf("with every allowed token banned, drew %d, want the end token 12", got)
	}
}

// TestRankIsThePlaceBySortedLogit: a token's rank is its place in the
// logits sorted from the largest, counting from 1, ties sharing the
// best place; the top token's rank is 1.
func TestRankIsThePlaceBySortedLogit(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 300).Draw(t, "n")
		// Few distinct values, so that ties happen.
		logits := rapid.SliceOfN(rapid.SampledFrom([]float32{-3, -1, 0, 0.5, 2, float32(math.Inf(-1))}), n, n).Draw(t, "logits")
		token := rapid.Int32Range(0, int32(n-1)).Draw(t, "token")
		sorted := slices.Clone(logits)
		slices.SortFunc(sorted, func(a, b float32) int { return cmp.Compare(b, a) })
		want := slices.Index(sorted, logits[token]) + 1
		if got := Rank(logits, token); got != want {
			t.Fatalf("rank %d, want %d: token %d of %v", got, want, token, logits)
		}
		if Rank(logits, int32(slices.Index(logits, sorted[0]))) != 1 {
			t.Fatal("the largest logit's token is not first")
		}
	})
}
