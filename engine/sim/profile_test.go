package sim_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/dpnode/dpnode"
	"github.com/dpnode/dpnode/engine/sim"
)

// shipped are the profiles the binary must carry.
var shipped = []string{"llama-3.1-8b-h100", "qwen3-30b-a3b-h200", "qwen3-30b-a3b-h200-fp8"}

func TestEmbeddedProfilesLoad(t *testing.T) {
	names := sim.ProfileNames(dpnode.SimProfiles)
	if !slices.Equal(names, shipped) {
		t.Fatalf("embedded profiles %v, want %v", names, shipped)
	}
	if onDisk := sim.ProfileNames(os.DirFS("../..")); !slices.Equal(onDisk, names) {
		t.Errorf("profiles on disk %v differ from embedded %v", onDisk, names)
	}
	for _, name := range names {
		p, err := sim.LoadProfile(dpnode.SimProfiles, name)
		if err != nil {
			t.Fatalf("LoadProfile(%q): %v", name, err)
		}
		if p.Name != name || p.Model == "" || p.KVCacheBlocks == 0 || len(p.Sources) == 0 {
			t.Errorf("%s loaded as %+v", name, p)
		}
	}
	llama, _ := sim.LoadProfile(dpnode.SimProfiles, "llama-3.1-8b-h100")
	if llama.Model != "meta-llama/Llama-3.1-8B-Instruct" || llama.Kind != sim.KindDense ||
		llama.MaxModelLen != 32768 || llama.BlockSize != 16 || llama.KVCacheBlocks != 25600 ||
		llama.MaxNumSeqs != 256 || llama.MaxNumBatchedTokens != 8192 || llama.MoE != nil {
		t.Errorf("llama-3.1-8b-h100 = %+v", llama)
	}
	qwen, _ := sim.LoadProfile(dpnode.SimProfiles, "qwen3-30b-a3b-h200")
	if qwen.Model != "Qwen/Qwen3-30B-A3B" || qwen.Kind != sim.KindMoE || qwen.MaxModelLen != 40960 ||
		qwen.KVCacheBlocks != 45000 || qwen.MoE == nil || *qwen.MoE != (sim.MoEShape{NumExperts: 128, ExpertsPerToken: 8}) ||
		qwen.ExpertParallel == nil || qwen.ExpertParallel.CrossNodeFactor != 2.0 {
		t.Errorf("qwen3-30b-a3b-h200 = %+v", qwen)
	}
}

func TestUnknownProfileListsNames(t *testing.T) {
	for _, name := range []string{"llama-70b-h100", ""} {
		_, err := sim.LoadProfile(dpnode.SimProfiles, name)
		if !errors.Is(err, sim.ErrUnknownProfile) {
			t.Fatalf("LoadProfile(%q) = %v, want ErrUnknownProfile", name, err)
		}
		for _, known := range shipped {
			if !strings.Contains(err.Error(), known) {
				t.Errorf("error %q does not list %s", err, known)
			}
		}
	}
}

func TestLoadProfileFromPath(t *testing.T) {
	rel := filepath.Join("..", "..", "testdata", "profiles", "llama-3.1-8b-h100.json")
	p, err := sim.LoadProfile(dpnode.SimProfiles, rel)
	if err != nil || p.Name != "llama-3.1-8b-h100" {
		t.Fatalf("LoadProfile(%q) = %v, %v", rel, p, err)
	}

	// A bare file name ending in .json is a path too, not a profile name;
	// and a file on disk may be named anything.
	data, err := os.ReadFile(rel)
	if err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir())
	if err := os.WriteFile("mine.json", data, 0o644); err != nil {
		t.Fatal(err)
	}
	if p, err := sim.LoadProfile(dpnode.SimProfiles, "mine.json"); err != nil || p.Name != "llama-3.1-8b-h100" {
		t.Errorf("LoadProfile(mine.json) = %v, %v", p, err)
	}
	if _, err := sim.LoadProfile(dpnode.SimProfiles, "missing.json"); err == nil || !errors.Is(err, os.ErrNotExist) ||
		errors.Is(err, sim.ErrUnknownProfile) {
		t.Errorf("LoadProfile(missing.json) = %v, want a wrapped not-exist error", err)
	}
}

func TestLoadProfileNameMismatch(t *testing.T) {
	data, err := dpnode.SimProfiles.ReadFile("testdata/profiles/llama-3.1-8b-h100.json")
	if err != nil {
		t.Fatal(err)
	}
	fsys := fstest.MapFS{"testdata/profiles/other.json": {Data: data}}
	if _, err := sim.LoadProfile(fsys, "other"); err == nil || !strings.Contains(err.Error(), `"llama-3.1-8b-h100"`) {
		t.Errorf("LoadProfile(other) = %v, want a name mismatch", err)
	}
	if _, err := sim.LoadProfile(fsys, "nope"); err == nil || !strings.Contains(err.Error(), "available profiles: other") {
		t.Errorf("LoadProfile(nope) = %v, want the list [other]", err)
	}
}

// TestBadProfilesRejected writes broken variants of shipped profiles to disk
// and checks each is refused with a message naming what to fix.
func TestBadProfilesRejected(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		base    string
		edit    func(m map[string]any)
		raw     string // the file's whole content, instead of base+edit
		wantMsg string
	}{
		{name: "not json", raw: "name: x\n", wantMsg: "not a valid profile file"},
		{name: "two values", raw: "{} {}", wantMsg: "more than one JSON value"},
		{name: "misspelt field", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["kv_cache_block"] = 1.0
		}, wantMsg: `unknown field "kv_cache_block"`},
		{name: "negative coefficient", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			cost(m)["decode_seq_ms"] = -0.03
		}, wantMsg: "cost.decode_seq_ms is -0.03; a cost cannot be negative"},
		{name: "zero base cost", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			delete(cost(m), "step_base_ms")
		}, wantMsg: "cost.step_base_ms is 0"},
		{name: "zero blocks", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["kv_cache_blocks"] = 0
		}, wantMsg: "kv_cache_blocks is 0"},
		{name: "request larger than cache", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["max_model_len"] = 1 << 20
		}, wantMsg: "fewer than one request of max_model_len 1048576"},
		{name: "budget below seqs", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["max_num_batched_tokens"] = 128
		}, wantMsg: "max_num_batched_tokens 128 is below max_num_seqs 256"},
		{name: "unknown kind", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["kind"] = "sparse"
		}, wantMsg: `kind is "sparse"`},
		{name: "moe without experts", base: "qwen3-30b-a3b-h200", edit: func(m map[string]any) {
			delete(m, "moe")
		}, wantMsg: "the moe section (num_experts, experts_per_token) is missing"},
		{name: "moe with zero experts", base: "qwen3-30b-a3b-h200", edit: func(m map[string]any) {
			m["moe"] = map[string]any{"num_experts": 0, "experts_per_token": 8}
		}, wantMsg: "moe.num_experts is 0"},
		{name: "more active than experts", base: "qwen3-30b-a3b-h200", edit: func(m map[string]any) {
			m["moe"] = map[string]any{"num_experts": 4, "experts_per_token": 8}
		}, wantMsg: "moe.experts_per_token is 8; it must be between 1 and num_experts (4)"},
		{name: "moe without expert cost", base: "qwen3-30b-a3b-h200", edit: func(m map[string]any) {
			delete(cost(m), "expert_ms")
		}, wantMsg: "cost.expert_ms is 0"},
		{name: "cross node faster", base: "qwen3-30b-a3b-h200", edit: func(m map[string]any) {
			m["expert_parallel"].(map[string]any)["cross_node_factor"] = 0.5
		}, wantMsg: "cross_node_factor is 0.5"},
		{name: "dense with experts", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["moe"] = map[string]any{"num_experts": 128, "experts_per_token": 8}
		}, wantMsg: "kind is dense but a moe section is present"},
		{name: "uncited anchor", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["measured"].([]any)[0].(map[string]any)["source"] = "hearsay"
		}, wantMsg: `measured[0]: source "hearsay" is not the id of an entry in sources`},
		{name: "no sources", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["sources"] = []any{}
			m["measured"] = []any{}
			m["measured_prefill"] = []any{}
		}, wantMsg: "sources is empty"},
		{name: "name like a path", base: "llama-3.1-8b-h100", edit: func(m map[string]any) {
			m["name"] = "a/b"
		}, wantMsg: `name "a/b" must be`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := []byte(tc.raw)
			if tc.base != "" {
				data = editProfile(t, tc.base, tc.edit)
			}
			file := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "-")+".json")
			if err := os.WriteFile(file, data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := sim.LoadProfile(dpnode.SimProfiles, file)
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", tc.wantMsg)
			}
			if !strings.HasPrefix(err.Error(), "sim: profile ") || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q, want the prefix \"sim: profile \" and %q", err, tc.wantMsg)
			}
		})
	}
}

func TestValidateFillsDefaults(t *testing.T) {
	data := editProfile(t, "qwen3-30b-a3b-h200", func(m map[string]any) {
		delete(m, "block_size")
		delete(m, "max_num_seqs")
		delete(m, "max_num_batched_tokens")
		delete(m["expert_parallel"].(map[string]any), "cross_node_factor")
	})
	file := filepath.Join(t.TempDir(), "defaults.json")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := sim.LoadProfile(dpnode.SimProfiles, file)
	if err != nil {
		t.Fatal(err)
	}
	if p.BlockSize != 16 || p.MaxNumSeqs != 256 || p.MaxNumBatchedTokens != 8192 || p.ExpertParallel.CrossNodeFactor != 2.0 {
		t.Errorf("defaults not filled: block_size %d, max_num_seqs %d, max_num_batched_tokens %d, cross_node_factor %g",
			p.BlockSize, p.MaxNumSeqs, p.MaxNumBatchedTokens, p.ExpertParallel.CrossNodeFactor)
	}
}

func TestCheckExpertParallel(t *testing.T) {
	qwen, _ := sim.LoadProfile(dpnode.SimProfiles, "qwen3-30b-a3b-h200")
	llama, _ := sim.LoadProfile(dpnode.SimProfiles, "llama-3.1-8b-h100")
	for _, tc := range []struct {
		p       *sim.Profile
		ranks   int
		wantErr string
	}{
		{qwen, 1, ""},
		{qwen, 2, ""},
		{qwen, 8, ""},
		{qwen, 3, "128 experts cannot be split evenly over 3"},
		{qwen, 0, "must be at least 1"},
		{llama, 1, ""},
		{llama, 2, "is dense; expert parallelism needs a MoE model"},
	} {
		err := tc.p.CheckExpertParallel(tc.ranks)
		if (tc.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s.CheckExpertParallel(%d) = %v, want %q", tc.p.Name, tc.ranks, err, tc.wantErr)
		}
	}
}

// editProfile returns the shipped profile base as JSON after edit.
func editProfile(t *testing.T, base string, edit func(map[string]any)) []byte {
	t.Helper()
	data, err := dpnode.SimProfiles.ReadFile("testdata/profiles/" + base + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	edit(m)
	out, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func cost(m map[string]any) map[string]any { return m["cost"].(map[string]any) }
