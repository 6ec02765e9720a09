package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"regexp"
	"sort"
	"strings"

	"github.com/dpnode/dpnode/engine"
)

// ProfileDir is the directory of fsys in which LoadProfile looks up a
// profile by name: the profile "x" is the file ProfileDir/x.json.
const ProfileDir = "testdata/profiles"

// ErrUnknownProfile is returned (wrapped) by LoadProfile when no profile of
// the given name exists.
var ErrUnknownProfile = errors.New("sim: unknown profile")

// Kind says how a model's weights are used per token, which decides the
// form of the cost model.
type Kind string

const (
	// KindDense: every token reads every weight; a step streams the whole
	// model once whatever the batch.
	KindDense Kind = "dense"
	// KindMoE: a mixture of experts; a step streams only the experts its
	// tokens are routed to, so step time follows distinct experts touched.
	KindMoE Kind = "moe"
)

// Profile is one GPU+model pairing: what the simulated engine serves, how
// much it can hold, and how long its steps take. It mirrors the JSON files
// in ProfileDir field for field; a file with a field not listed here is
// rejected, so a misspelt coefficient cannot silently read as zero.
type Profile struct {
	// Name identifies the profile on the command line; it is the file's
	// base name without ".json".
	Name string `json:"name"`
	// Model is the served model's Hugging Face id, reported by /v1/models.
	Model string `json:"model"`
	// Kind selects the dense or the MoE form of the cost model.
	Kind Kind `json:"kind"`
	// GPU names the one accelerator the figures were measured or
	// estimated on.
	GPU string `json:"gpu"`
	// HBMBandwidthTBps is the GPU's memory bandwidth in TB/s. Decode steps
	// are bandwidth-bound, so it is what relates this profile's figures to
	// measurements taken on other hardware (MeasuredElsewhere).
	HBMBandwidthTBps float64 `json:"hbm_bandwidth_tbps"`
	// Precision is the weights' number format ("bf16", "fp8"); informative.
	Precision string `json:"precision"`
	// MaxModelLen is the longest request (prompt plus output) in tokens,
	// as vLLM's --max-model-len. Notes["max_model_len"] says why.
	MaxModelLen int `json:"max_model_len"`
	// BlockSize is the number of tokens per KV cache block (vLLM's
	// default, 16, when zero in the file).
	BlockSize int `json:"block_size"`
	// KVCacheBlocks is how many blocks the KV cache holds: vLLM's logged
	// "GPU KV cache size" divided by BlockSize.
	KVCacheBlocks int `json:"kv_cache_blocks"`
	// MaxNumSeqs is the default cap on sequences in one step (vLLM's
	// --max-num-seqs; 256 when zero in the file).
	MaxNumSeqs int `json:"max_num_seqs"`
	// MaxNumBatchedTokens is the default token budget of one step (vLLM's
	// --max-num-batched-tokens; 8192 when zero in the file).
	MaxNumBatchedTokens int `json:"max_num_batched_tokens"`
	// Cost holds the step-time coefficients (see StepTime).
	Cost CostCoefficients `json:"cost"`
	// MoE describes the experts; present exactly when Kind is KindMoE.
	MoE *MoEShape `json:"moe,omitempty"`
	// ExpertParallel prices the all-to-all of expert parallelism; present
	// exactly when Kind is KindMoE.
	ExpertParallel *ExpertParallelCost `json:"expert_parallel,omitempty"`
	// Measured lists public median inter-token latencies of this model on
	// this GPU and precision; the calibration test holds the cost model to
	// within 15% of each.
	Measured []Anchor `json:"measured"`
	// MeasuredElsewhere lists latencies of the same model measured on
	// other hardware (each names its GPU and bandwidth). They bound a
	// prediction rather than pin it: a faster GPU is no slower, and no
	// faster than the bandwidth ratio allows.
	MeasuredElsewhere []Anchor `json:"measured_elsewhere,omitempty"`
	// MeasuredPrefill lists public prefill throughputs of this model on
	// this GPU.
	MeasuredPrefill []PrefillAnchor `json:"measured_prefill,omitempty"`
	// Sources cites every public figure the profile uses; anchors refer
	// to them by ID.
	Sources []Source `json:"sources"`
	// Notes explains choices, keyed by the JSON name of the field they
	// are about (JSON has no comments).
	Notes map[string]string `json:"notes,omitempty"`
}

// CostCoefficients are the terms of the step-time model, in milliseconds.
// For a step with P prefill tokens and N decoding sequences of total
// context ΣK:
//
//	step = StepBaseMs + PrefillTokenMs·P + DecodeSeqMs·N
//	     + DecodeContextMsPer1K·ΣK/1000 + PrefillPrefixMsPer1K·(prefix product)/1000
//	     + ExpertMs·(distinct experts streamed)        (MoE only)
type CostCoefficients struct {
	// StepBaseMs (a) is the fixed cost of any step: streaming the weights
	// every step reads, plus kernel launches and sampling.
	StepBaseMs float64 `json:"step_base_ms"`
	// PrefillTokenMs (b) is the cost of each prompt token computed in the
	// step (compute-bound GEMMs).
	PrefillTokenMs float64 `json:"prefill_token_ms"`
	// DecodeSeqMs (c) is the cost of each sequence decoding one token.
	DecodeSeqMs float64 `json:"decode_seq_ms"`
	// DecodeContextMsPer1K (d) is the cost per 1,000 tokens of context
	// read by decode attention (the KV cache is streamed once a step).
	DecodeContextMsPer1K float64 `json:"decode_context_ms_per_1k"`
	// PrefillPrefixMsPer1K is the cost of one prefill token attending to
	// 1,000 tokens already in context before its chunk.
	PrefillPrefixMsPer1K float64 `json:"prefill_prefix_ms_per_1k"`
	// ExpertMs (x) is the cost of streaming one expert's weights across
	// all layers; zero for dense models.
	ExpertMs float64 `json:"expert_ms,omitempty"`
}

// MoEShape is the routing shape of a mixture-of-experts model.
type MoEShape struct {
	// NumExperts is the number of routed experts per layer.
	NumExperts int `json:"num_experts"`
	// ExpertsPerToken is how many of them each token is routed to.
	ExpertsPerToken int `json:"experts_per_token"`
}

// ExpertParallelCost prices the per-step dispatch and combine all-to-all
// when experts are spread over an EP group:
//
//	collective = (BaseMs + DecodeTokenMs·N + PrefillTokenMs·P) × (CrossNodeFactor if over RDMA)
//
// with N and P this rank's decode and prefill tokens.
type ExpertParallelCost struct {
	// BaseMs is the latency floor of one step's collectives (every MoE
	// layer dispatches and combines once, however few the tokens).
	BaseMs float64 `json:"base_ms"`
	// DecodeTokenMs is the added cost per decode token on the rank.
	DecodeTokenMs float64 `json:"decode_token_ms"`
	// PrefillTokenMs is the added cost per prefill token on the rank;
	// lower than DecodeTokenMs because large payloads use the bandwidth
	// better.
	PrefillTokenMs float64 `json:"prefill_token_ms"`
	// CrossNodeFactor multiplies the collective when the group spans nodes
	// and the all-to-all goes over RDMA instead of NVLink (2.0 when zero
	// in the file).
	CrossNodeFactor float64 `json:"cross_node_factor"`
}

// Anchor is one measured median inter-token latency: Batch sequences
// decoding at about ContextTokens of context each.
type Anchor struct {
	// GPU and HBMBandwidthTBps name the hardware of a MeasuredElsewhere
	// anchor; they are empty in Measured, whose hardware is the profile's.
	GPU              string  `json:"gpu,omitempty"`
	HBMBandwidthTBps float64 `json:"hbm_bandwidth_tbps,omitempty"`
	// Batch is the number of sequences decoding together.
	Batch int `json:"batch"`
	// ContextTokens is the typical context length of each sequence.
	ContextTokens int `json:"context_tokens"`
	// MedianITLMs is the measured median inter-token latency in ms.
	MedianITLMs float64 `json:"median_itl_ms"`
	// Source is the ID of the entry in Sources that reports the figure.
	Source string `json:"source"`
	// Notes qualifies the measurement.
	Notes string `json:"notes,omitempty"`
}

// PrefillAnchor is one measured prefill throughput: prompts of
// PromptTokens each, processed back to back.
type PrefillAnchor struct {
	// PromptTokens is the length of each prompt.
	PromptTokens int `json:"prompt_tokens"`
	// InputTokensPerS is the measured prompt tokens processed per second.
	InputTokensPerS float64 `json:"input_tokens_per_s"`
	// Source is the ID of the entry in Sources that reports the figure.
	Source string `json:"source"`
	// Notes qualifies the measurement.
	Notes string `json:"notes,omitempty"`
}

// Source is one public document a profile's figures come from.
type Source struct {
	// ID is how anchors refer to the source.
	ID string `json:"id"`
	// Title says what the source is.
	Title string `json:"title"`
	// URL locates it; empty for a derivation that is not published.
	URL string `json:"url,omitempty"`
	// Figures lists the figures taken from it and where they went.
	Figures string `json:"figures"`
}

// profileNameRE is what a profile name may look like: something that can
// never be mistaken for a path.
var profileNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// LoadProfile returns the validated profile nameOrPath. A bare name such as
// "llama-3.1-8b-h100" is the file ProfileDir/<name>.json in fsys (normally
// dpnode.SimProfiles); anything containing a path separator or ending in
// ".json" is read from disk. An unknown name's error lists the names that
// exist.
func LoadProfile(fsys fs.FS, nameOrPath string) (*Profile, error) {
	var (
		data []byte
		err  error
	)
	byName := !strings.ContainsRune(nameOrPath, '/') &&
		!strings.ContainsRune(nameOrPath, os.PathSeparator) &&
		!strings.HasSuffix(nameOrPath, ".json")
	if byName {
		if nameOrPath == "" {
			return nil, fmt.Errorf("%w: the name is empty; available profiles: %s",
				ErrUnknownProfile, strings.Join(ProfileNames(fsys), ", "))
		}
		data, err = fs.ReadFile(fsys, path.Join(ProfileDir, nameOrPath+".json"))
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrInvalid) {
			return nil, fmt.Errorf("%w %q: available profiles: %s (or give the path of a profile .json file)",
				ErrUnknownProfile, nameOrPath, strings.Join(ProfileNames(fsys), ", "))
		}
	} else {
		data, err = os.ReadFile(nameOrPath)
	}
	if err != nil {
		return nil, fmt.Errorf("sim: reading profile %s: %w", nameOrPath, err)
	}
	p, err := parseProfile(data)
	if err != nil {
		return nil, fmt.Errorf("sim: profile %s: %w", nameOrPath, err)
	}
	if byName && p.Name != nameOrPath {
		return nil, fmt.Errorf("sim: profile %s: the file says its name is %q; rename the file or fix \"name\"", nameOrPath, p.Name)
	}
	return p, nil
}

// ProfileNames returns the names of the profiles in fsys's ProfileDir,
// sorted.
func ProfileNames(fsys fs.FS) []string {
	// The pattern is constant and well formed, so Glob cannot fail.
	files, _ := fs.Glob(fsys, ProfileDir+"/*.json")
	names := make([]string, 0, len(files))
	for _, f := range files {
		names = append(names, strings.TrimSuffix(path.Base(f), ".json"))
	}
	sort.Strings(names)
	return names
}

// parseProfile decodes one profile strictly and validates it.
func parseProfile(data []byte) (*Profile, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var p Profile
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("not a valid profile file: %w", err)
	}
	if dec.More() {
		return nil, errors.New("not a valid profile file: more than one JSON value")
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// validate fills the defaults vLLM would use for absent limits and rejects
// a profile that could not describe a real deployment. It reports every
// problem at once, each naming the JSON field to fix, in the order of the
// checks below: what the profile is, its limits, its cost, its kind, then
// the sources and the anchors that cite them.
func (p *Profile) validate() error {
	p.fillDefaults()
	var bad problems
	p.checkIdentity(&bad)
	p.checkLimits(&bad)
	p.checkCost(&bad)
	p.checkKind(&bad)
	ids := p.checkSources(&bad)
	p.checkAnchors(&bad, ids)
	return errors.Join(bad...)
}

// problems collects what is wrong with a profile, so that validate can
// report all of it rather than stop at the first.
type problems []error

// add records one problem.
func (ps *problems) add(format string, args ...any) {
	*ps = append(*ps, fmt.Errorf(format, args...))
}

// fillDefaults sets the limits a file leaves at zero to vLLM's defaults,
// and the cross-node factor to its usual 2.
func (p *Profile) fillDefaults() {
	if p.BlockSize == 0 {
		p.BlockSize = 16
	}
	if p.MaxNumSeqs == 0 {
		p.MaxNumSeqs = 256
	}
	if p.MaxNumBatchedTokens == 0 {
		p.MaxNumBatchedTokens = 8192
	}
	if p.ExpertParallel != nil && p.ExpertParallel.CrossNodeFactor == 0 {
		p.ExpertParallel.CrossNodeFactor = 2.0
	}
}

// checkIdentity checks what the profile is: its name, model and GPU.
func (p *Profile) checkIdentity(bad *problems) {
	if !profileNameRE.MatchString(p.Name) || strings.HasSuffix(p.Name, ".json") {
		bad.add("name %q must be lower-case letters, digits, '.', '-' or '_', not ending in .json", p.Name)
	}
	if p.Model == "" {
		bad.add("model is empty; give the served model's Hugging Face id")
	}
	if p.GPU == "" {
		bad.add("gpu is empty; name the GPU the figures are for")
	}
	if p.HBMBandwidthTBps <= 0 {
		bad.add("hbm_bandwidth_tbps is %g; it must be the GPU's memory bandwidth in TB/s", p.HBMBandwidthTBps)
	}
}

// checkLimits checks the scheduler's limits, and that the KV cache and the
// step budget can serve at least one request of the longest length.
func (p *Profile) checkLimits(bad *problems) {
	if p.MaxModelLen <= 0 {
		bad.add("max_model_len is %d; it must be positive", p.MaxModelLen)
	}
	if p.BlockSize < 0 {
		bad.add("block_size is %d; it must be positive", p.BlockSize)
	}
	if p.KVCacheBlocks <= 0 {
		bad.add("kv_cache_blocks is %d; the KV cache needs at least one block", p.KVCacheBlocks)
	} else if p.BlockSize > 0 && p.MaxModelLen > 0 && p.KVCacheBlocks*p.BlockSize < p.MaxModelLen {
		bad.add("kv_cache_blocks %d of %d tokens hold %d tokens, fewer than one request of max_model_len %d; lower max_model_len",
			p.KVCacheBlocks, p.BlockSize, p.KVCacheBlocks*p.BlockSize, p.MaxModelLen)
	}
	if p.MaxNumSeqs < 0 {
		bad.add("max_num_seqs is %d; it must be positive", p.MaxNumSeqs)
	}
	if p.MaxNumBatchedTokens < 0 {
		bad.add("max_num_batched_tokens is %d; it must be positive", p.MaxNumBatchedTokens)
	} else if p.MaxNumBatchedTokens < p.MaxNumSeqs {
		bad.add("max_num_batched_tokens %d is below max_num_seqs %d, so a step could not give every sequence a token",
			p.MaxNumBatchedTokens, p.MaxNumSeqs)
	}
}

// checkCost checks the step-time coefficients: the two that every step
// pays must be positive, and none may be negative.
func (p *Profile) checkCost(bad *problems) {
	c := p.Cost
	if c.StepBaseMs <= 0 {
		bad.add("cost.step_base_ms is %g; every step costs something, so it must be positive", c.StepBaseMs)
	}
	if c.PrefillTokenMs <= 0 {
		bad.add("cost.prefill_token_ms is %g; it must be positive or prefill would be free", c.PrefillTokenMs)
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"cost.decode_seq_ms", c.DecodeSeqMs},
		{"cost.decode_context_ms_per_1k", c.DecodeContextMsPer1K},
		{"cost.prefill_prefix_ms_per_1k", c.PrefillPrefixMsPer1K},
		{"cost.expert_ms", c.ExpertMs},
	} {
		if f.v < 0 {
			bad.add("%s is %g; a cost cannot be negative", f.name, f.v)
		}
	}
}

// checkKind checks that the kind is known and that the sections and
// coefficients about experts are present exactly when it is MoE.
func (p *Profile) checkKind(bad *problems) {
	switch p.Kind {
	case KindDense:
		if p.MoE != nil {
			bad.add("kind is dense but a moe section is present; remove it or set kind to moe")
		}
		if p.Cost.ExpertMs != 0 {
			bad.add("kind is dense but cost.expert_ms is %g; a dense model has no experts", p.Cost.ExpertMs)
		}
		if p.ExpertParallel != nil {
			bad.add("kind is dense but an expert_parallel section is present; expert parallelism needs experts")
		}
	case KindMoE:
		p.checkMoE(bad)
	default:
		bad.add("kind is %q; it must be %q or %q", p.Kind, KindDense, KindMoE)
	}
}

// checkMoE checks the sections a MoE profile needs: the experts' shape,
// the cost of streaming one, and the price of expert parallelism.
func (p *Profile) checkMoE(bad *problems) {
	if p.MoE == nil {
		bad.add("kind is moe but the moe section (num_experts, experts_per_token) is missing")
	} else {
		if p.MoE.NumExperts <= 0 {
			bad.add("moe.num_experts is %d; a MoE model needs experts", p.MoE.NumExperts)
		}
		if p.MoE.ExpertsPerToken <= 0 || p.MoE.ExpertsPerToken > p.MoE.NumExperts {
			bad.add("moe.experts_per_token is %d; it must be between 1 and num_experts (%d)",
				p.MoE.ExpertsPerToken, p.MoE.NumExperts)
		}
	}
	if p.Cost.ExpertMs <= 0 {
		bad.add("kind is moe but cost.expert_ms is %g; streaming an expert must cost something", p.Cost.ExpertMs)
	}
	if ep := p.ExpertParallel; ep == nil {
		bad.add("kind is moe but the expert_parallel section is missing")
	} else {
		if ep.BaseMs < 0 || ep.DecodeTokenMs < 0 || ep.PrefillTokenMs < 0 {
			bad.add("expert_parallel costs (%g, %g, %g) cannot be negative", ep.BaseMs, ep.DecodeTokenMs, ep.PrefillTokenMs)
		}
		if ep.CrossNodeFactor < 1 {
			bad.add("expert_parallel.cross_node_factor is %g; crossing nodes is never faster, so it must be at least 1", ep.CrossNodeFactor)
		}
	}
}

// checkSources checks that there are sources, each with a title, the
// figures taken from it and an ID of its own, and returns the IDs, which
// the anchors must cite.
func (p *Profile) checkSources(bad *problems) map[string]bool {
	ids := make(map[string]bool, len(p.Sources))
	if len(p.Sources) == 0 {
		bad.add("sources is empty; cite where the figures come from")
	}
	for i, s := range p.Sources {
		switch {
		case s.ID == "":
			bad.add("sources[%d].id is empty", i)
		case ids[s.ID]:
			bad.add("sources[%d].id %q is used twice", i, s.ID)
		}
		ids[s.ID] = true
		if s.Title == "" || s.Figures == "" {
			bad.add("sources[%d] (%q) needs a title and the figures taken from it", i, s.ID)
		}
	}
	return ids
}

// checkAnchors checks the measurements the cost model is held to: each
// must be positive and cite one of ids, and only one taken on other
// hardware may name its GPU.
func (p *Profile) checkAnchors(bad *problems, ids map[string]bool) {
	for i, a := range p.Measured {
		checkAnchor(bad, ids, "measured", i, a, false)
	}
	for i, a := range p.MeasuredElsewhere {
		checkAnchor(bad, ids, "measured_elsewhere", i, a, true)
	}
	for i, a := range p.MeasuredPrefill {
		if a.PromptTokens <= 0 || a.InputTokensPerS <= 0 {
			bad.add("measured_prefill[%d]: prompt_tokens %d and input_tokens_per_s %g must be positive",
				i, a.PromptTokens, a.InputTokensPerS)
		}
		if !ids[a.Source] {
			bad.add("measured_prefill[%d]: source %q is not the id of an entry in sources", i, a.Source)
		}
	}
}

// checkAnchor checks the latency anchor field[i]; elsewhere says it was
// measured on other hardware, which it must then name.
func checkAnchor(bad *problems, ids map[string]bool, field string, i int, a Anchor, elsewhere bool) {
	if a.Batch <= 0 || a.ContextTokens < 0 || a.MedianITLMs <= 0 {
		bad.add("%s[%d]: batch %d, context_tokens %d and median_itl_ms %g must be positive",
			field, i, a.Batch, a.ContextTokens, a.MedianITLMs)
	}
	if !ids[a.Source] {
		bad.add("%s[%d]: source %q is not the id of an entry in sources", field, i, a.Source)
	}
	if elsewhere && (a.GPU == "" || a.HBMBandwidthTBps <= 0) {
		bad.add("%s[%d]: a measurement on other hardware needs gpu and hbm_bandwidth_tbps", field, i)
	}
	if !elsewhere && (a.GPU != "" || a.HBMBandwidthTBps != 0) {
		bad.add("%s[%d]: gpu and hbm_bandwidth_tbps belong in measured_elsewhere; measured is this profile's GPU", field, i)
	}
}

// CheckExpertParallel reports whether the profile can run with an expert
// parallel group of the given size: the model must be MoE and, as vLLM
// requires, the experts must divide evenly among the ranks.
func (p *Profile) CheckExpertParallel(ranks int) error {
	switch {
	case ranks < 1:
		return fmt.Errorf("sim: profile %s: expert-parallel group size %d must be at least 1", p.Name, ranks)
	case ranks == 1:
		return nil
	case p.Kind != KindMoE:
		return fmt.Errorf("sim: profile %s is %s; expert parallelism needs a MoE model", p.Name, p.Kind)
	case p.MoE.NumExperts%ranks != 0:
		return fmt.Errorf("sim: profile %s: %d experts cannot be split evenly over %d expert-parallel ranks; use a divisor of %d",
			p.Name, p.MoE.NumExperts, ranks, p.MoE.NumExperts)
	}
	return nil
}

// SchedulerConfig is the engine configuration the profile describes:
// vLLM's defaults for this model on this GPU, with prefix caching on.
func (p *Profile) SchedulerConfig() engine.SchedulerConfig {
	return engine.SchedulerConfig{
		MaxNumSeqs:          p.MaxNumSeqs,
		MaxNumBatchedTokens: p.MaxNumBatchedTokens,
		BlockSize:           p.BlockSize,
		NumBlocks:           p.KVCacheBlocks,
		MaxModelLen:         p.MaxModelLen,
		EnablePrefixCaching: true,
		EOSTokenIDs:         []uint32{EOSToken},
	}
}
