package main

import (
	"bufio"
	"cmp"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Item is one request of a workload. Prompts are token ids: lengths are
// exact on any server that accepts token-id prompts (vLLM and dpnode do),
// and requests that share a prefix share its ids.
type Item struct {
	// Arrival is when the request is sent, from the start of the run; a
	// closed loop ignores it.
	Arrival   time.Duration
	Prompt    []uint32
	MaxTokens int
}

// Dist is a distribution of lengths.
type Dist struct {
	Kind string
	// A and B are the parameters: fixed n; uniform lo, hi; lognormal
	// median, sigma; pareto min, alpha.
	A, B float64
}

// ParseDist reads "fixed:N", "uniform:LO,HI", "lognormal:MEDIAN,SIGMA" or
// "pareto:MIN,ALPHA".
func ParseDist(s string) (Dist, error) {
	kind, args, _ := strings.Cut(s, ":")
	var nums []float64
	for a := range strings.SplitSeq(args, ",") {
		if a == "" {
			continue
		}
		v, err := strconv.ParseFloat(a, 64)
		if err != nil || v < 0 || math.IsInf(v, 0) {
			return Dist{}, fmt.Errorf("length distribution %q: %q is not a non-negative number", s, a)
		}
		nums = append(nums, v)
	}
	d := Dist{Kind: kind}
	want := 2
	switch kind {
	case "fixed":
		want = 1
	case "uniform", "lognormal", "pareto":
	default:
		return Dist{}, fmt.Errorf("length distribution %q: want fixed:N, uniform:LO,HI, lognormal:MEDIAN,SIGMA or pareto:MIN,ALPHA", s)
	}
	if len(nums) != want {
		return Dist{}, fmt.Errorf("length distribution %q: %s takes %d numbers", s, kind, want)
	}
	d.A = nums[0]
	if want == 2 {
		d.B = nums[1]
	}
	switch {
	case d.A < 1:
		return Dist{}, fmt.Errorf("length distribution %q: lengths start at 1", s)
	case kind == "uniform" && d.B < d.A:
		return Dist{}, fmt.Errorf("length distribution %q: the high end is below the low", s)
	case kind == "pareto" && d.B <= 0:
		return Dist{}, fmt.Errorf("length distribution %q: alpha must be positive", s)
	}
	return d, nil
}

// Sample draws a length of at least 1.
func (d Dist) Sample(rng *rand.Rand) int {
	var v float64
	switch d.Kind {
	case "fixed":
		v = d.A
	case "uniform":
		v = d.A + rng.Float64()*(d.B-d.A+1)
	case "lognormal":
		v = d.A * math.Exp(rng.NormFloat64()*d.B)
	case "pareto":
		v = d.A / math.Pow(1-rng.Float64(), 1/d.B)
	}
	return max(1, int(math.Min(v, 1e9)))
}

func (d Dist) String() string {
	switch d.Kind {
	case "fixed":
		return fmt.Sprintf("fixed:%g", d.A)
	default:
		return fmt.Sprintf("%s:%g,%g", d.Kind, d.A, d.B)
	}
}

// Synthetic describes a generated workload.
type Synthetic struct {
	Requests int
	Input    Dist
	Output   Dist
	// InputMax and OutputMax cut the drawn lengths (0: no cut).
	InputMax, OutputMax int
	// PrefixGroups > 0 gives every prompt one of that many shared
	// prefixes of PrefixLen tokens, chosen at random, ahead of its own
	// Input tokens.
	PrefixGroups int
	PrefixLen    int
	// MaxModelLen bounds prompt plus output.
	MaxModelLen int
	Seed        uint64
}

// Items yields a workload's requests one at a time, in order; ok is false
// after the last. A simulation of a million requests draws each when it
// reaches it, and holds only those in flight.
type Items func() (it Item, ok bool)

// Workload starts a run's requests from the first, each time it is called.
type Workload func() Items

// sliceItems yields items in order.
func sliceItems(items []Item) Items {
	next := 0
	return func() (Item, bool) {
		if next == len(items) {
			return Item{}, false
		}
		next++
		return items[next-1], true
	}
}

// collect gathers what next yields.
func collect(next Items) []Item {
	var items []Item
	for it, ok := next(); ok; it, ok = next() {
		items = append(items, it)
	}
	return items
}

// Generate draws the workload's requests, without arrival times.
func (s Synthetic) Generate() []Item { return collect(s.Items()) }

// Items draws the requests Generate returns, one at a time.
func (s Synthetic) Items() Items {
	rng := rand.New(rand.NewPCG(s.Seed, 0x5eed))
	drawn := 0
	return func() (Item, bool) {
		if drawn == s.Requests {
			return Item{}, false
		}
		drawn++
		var prompt []uint32
		if s.PrefixGroups > 0 {
			prompt = append(prompt, tokens(uint64(rng.IntN(s.PrefixGroups))+1<<40, s.PrefixLen)...)
		}
		prompt = append(prompt, tokens(rng.Uint64(), capAt(s.Input.Sample(rng), s.InputMax))...)
		it := Item{Prompt: prompt, MaxTokens: capAt(s.Output.Sample(rng), s.OutputMax)}
		fitItem(&it, s.MaxModelLen)
		return it, true
	}
}

func capAt(v, most int) int {
	if most > 0 {
		return min(v, most)
	}
	return v
}

// tokens returns n token ids drawn from seed: the same seed, the same ids.
func tokens(seed uint64, n int) []uint32 {
	rng := rand.New(rand.NewPCG(seed, 0x70c5))
	ids := make([]uint32, n)
	for i := range ids {
		// Clear of special and single-character ids of common
		// vocabularies, inside any of them.
		ids[i] = 1000 + uint32(rng.IntN(30000))
	}
	return ids
}

// fit cuts prompts, then outputs, so that every request fits maxModelLen.
func fit(items []Item, maxModelLen int) []Item {
	for i := range items {
		fitItem(&items[i], maxModelLen)
	}
	return items
}

// fitItem cuts a request's prompt, then its output, to fit maxModelLen (0: no
// cut).
func fitItem(it *Item, maxModelLen int) {
	if maxModelLen <= 0 {
		return
	}
	if len(it.Prompt) > maxModelLen-1 {
		it.Prompt = it.Prompt[:maxModelLen-1]
	}
	it.MaxTokens = max(1, min(it.MaxTokens, maxModelLen-len(it.Prompt)))
}

// cutItems cuts prompts to inputMax tokens and outputs to outputMax (0:
// no cut).
func cutItems(items []Item, inputMax, outputMax int) {
	for i := range items {
		if inputMax > 0 && len(items[i].Prompt) > inputMax {
			items[i].Prompt = items[i].Prompt[:inputMax]
		}
		if outputMax > 0 {
			items[i].MaxTokens = min(items[i].MaxTokens, outputMax)
		}
	}
}

// Poisson spaces items as arrivals at rate per second.
func Poisson(items []Item, rate float64, seed uint64) {
	Bursts(items, rate, 1, seed)
}

// Bursts spaces items as bursts of burst requests that arrive at the same
// instant, the bursts a Poisson process at rate/burst per second: the same
// mean rate as Poisson's, in the shape vLLM's tests send (200 at once),
// which is where balancing on snapshots goes stale. A burst of 1 is
// Poisson.
func Bursts(items []Item, rate float64, burst int, seed uint64) {
	c := newBurstClock(rate, burst, seed)
	for i := range items {
		items[i].Arrival = c.next()
	}
}

// InBursts gives next's requests the arrival times Bursts gives a slice
// of them.
func InBursts(next Items, rate float64, burst int, seed uint64) Items {
	c := newBurstClock(rate, burst, seed)
	return func() (Item, bool) {
		it, ok := next()
		if ok {
			it.Arrival = c.next()
		}
		return it, ok
	}
}

// burstClock draws the arrival times of Bursts, one at a time.
type burstClock struct {
	rng   *rand.Rand
	rate  float64
	burst int
	// drawn counts the times drawn; at is the last.
	drawn int
	at    time.Duration
}

func newBurstClock(rate float64, burst int, seed uint64) *burstClock {
	return &burstClock{rng: rand.New(rand.NewPCG(seed, 0xa77)), rate: rate, burst: max(burst, 1)}
}

func (c *burstClock) next() time.Duration {
	if c.drawn%c.burst == 0 {
		c.at += time.Duration(c.rng.ExpFloat64() * float64(c.burst) / c.rate * float64(time.Second))
	}
	c.drawn++
	return c.at
}

// TraceBlockTokens is the tokens per hash id of Mooncake's traces.
const TraceBlockTokens = 512

// LoadTrace reads a trace: JSON lines with timestamp (ms), input_length,
// output_length and optionally hash_ids (prefix blocks of 512 tokens, as
// Mooncake's), or a CSV with TIMESTAMP, ContextTokens and GeneratedTokens
// (as Azure's LLM inference traces). A hash id becomes blockTokens
// tokens, and a JSON trace's prompt lengths scale with it (by
// blockTokens/512), so that a small model replays the trace's sharing at
// its own scale. Arrivals keep the trace's spacing, divided by speed; at
// most limit requests are read (0: all).
func LoadTrace(path string, blockTokens int, speed float64, limit, maxModelLen int) ([]Item, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var items []Item
	if strings.EqualFold(filepath.Ext(path), ".csv") {
		items, err = readCSVTrace(f, limit)
	} else {
		items, err = readJSONTrace(f, blockTokens, limit)
	}
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("trace %s holds no request", path)
	}
	if speed <= 0 {
		speed = 1
	}
	slices.SortStableFunc(items, func(a, b Item) int { return cmp.Compare(a.Arrival, b.Arrival) })
	first := items[0].Arrival
	for i := range items {
		items[i].Arrival = time.Duration(float64(items[i].Arrival-first) / speed)
	}
	return fit(items, maxModelLen), nil
}

type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

func readJSONTrace(r io.Reader, blockTokens, limit int) ([]Item, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<16), 1<<24)
	var items []Item
	for line := 1; sc.Scan() && (limit <= 0 || len(items) < limit); line++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var tl traceLine
		if err := json.Unmarshal(sc.Bytes(), &tl); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if tl.Timestamp == nil || tl.InputLength < 1 || tl.OutputLength < 1 {
			return nil, fmt.Errorf("line %d: want timestamp, input_length and output_length of at least 1", line)
		}
		inputLen := max(1, (tl.InputLength*blockTokens+TraceBlockTokens-1)/TraceBlockTokens)
		var prompt []uint32
		for _, h := range tl.HashIDs {
			if len(prompt) >= inputLen {
				break
			}
			prompt = append(prompt, tokens(h, blockTokens)...)
		}
		if len(prompt) < inputLen {
			// Past the shared blocks: this request's own tokens.
			prompt = append(prompt, tokens(uint64(line)<<32|0xfeed, inputLen-len(prompt))...)
		}
		prompt = prompt[:inputLen]
		items = append(items, Item{Arrival: time.Duration(*tl.Timestamp * float64(time.Millisecond)), Prompt: prompt, MaxTokens: tl.OutputLength})
	}
	return items, sc.Err()
}

func readCSVTrace(r io.Reader, limit int) ([]Item, error) {
	cr := csv.NewReader(r)
	head, err := cr.Read()
	if err != nil {
		return nil, err
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(h)] = i
	}
	ts, okT := col["TIMESTAMP"]
	in, okI := col["ContextTokens"]
	out, okO := col["GeneratedTokens"]
	if !okT || !okI || !okO {
		return nil, errors.New("want the columns TIMESTAMP, ContextTokens and GeneratedTokens")
	}
	var items []Item
	for line := 2; limit <= 0 || len(items) < limit; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		at, err := time.Parse("2006-01-02 15:04:05.999999999", strings.TrimSpace(rec[ts]))
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		n, errI := strconv.Atoi(rec[in])
		m, errO := strconv.Atoi(rec[out])
		if errI != nil || errO != nil || n < 1 {
			return nil, fmt.Errorf("line %d: bad token counts %q, %q", line, rec[in], rec[out])
		}
		// Azure's trace has requests that generated nothing; they still
		// ask for a token.
		items = append(items, Item{Arrival: time.Duration(at.UnixNano()), Prompt: tokens(uint64(line)<<32|0xa2, n), MaxTokens: max(m, 1)})
	}
	return items, nil
}
