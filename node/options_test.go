package node

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dpnode/dpnode/dp"
	"github.com/dpnode/dpnode/engine/gguf"
	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engines/simengine"
)

func TestContradictoryFlagsAreRefusedWithOneClearError(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Options)
		want   string
	}{
		{"unknown engine", func(o *Options) { o.Engine = "vllm" }, `--engine "vllm" is not available`},
		{"negative time scale", func(o *Options) { simengine.Of(o.Engines).TimeScale = -1 }, "--sim-time-scale must be"},
		{"unknown profile", func(o *Options) { simengine.Of(o.Engines).Profile = "gpt-9" }, "available profiles: llama-3.1-8b-h100"},
		{"local above size", func(o *Options) { o.DataParallelSize, o.DataParallelSizeLocal = 2, 4 }, "--data-parallel-size-local (4) cannot exceed --data-parallel-size (2)"},
		{"start plus local above size", func(o *Options) {
			o.DataParallelSize, o.DataParallelSizeLocal, o.DataParallelStartRank = 4, 2, 3
		}, "would host ranks 3 to 4"},
		{"start rank past size", func(o *Options) { o.DataParallelSize, o.DataParallelStartRank = 2, 2 }, "--data-parallel-size-local must be at least 1"},
		{"headless with a port", func(o *Options) { o.Headless, o.PortSet, o.DataParallelSize = true, true, 2 }, "--port cannot be set"},
		{"headless with an API key", func(o *Options) { o.Headless, o.APIKeys = true, []string{"k"} }, "--api-key has no effect"},
		{"an API key with a space", func(o *Options) { o.APIKeys = []string{"a b"} }, "--api-key: an API key must be non-empty"},
		{"a missing API key file", func(o *Options) { o.APIKeyFile = "/nonexistent/keys" }, "--api-key: the API key file"},
		{"an empty admin key", func(o *Options) { o.AdminAPIKeys = []string{""} }, "--admin-api-key"},
		{"negative pending requests", func(o *Options) { o.MaxPendingRequests = -2 }, "--max-pending-requests must be at least 0"},
		{"external with two local ranks", func(o *Options) { o.DataParallelRank, o.DataParallelSizeLocal, o.DataParallelSize = 1, 2, 4 }, "must be 1 or unset"},
		{"half the TLS files", func(o *Options) { o.TLS.Cert = "node.pem" }, "go together"},
		{"short gossip key", func(o *Options) { o.GossipKey = "c2hvcnQ=" }, "--gossip-key must be 16, 24 or 32 bytes"},
		{"bad bind", func(o *Options) { o.Bind = "host:port:extra" }, "--bind"},
		{"budget below sequences", func(o *Options) { o.MaxNumSeqs, o.MaxNumBatchedTokens = 512, 256 }, "--max-num-batched-tokens (256) must be at least --max-num-seqs (512)"},
		{"context beyond the KV cache", func(o *Options) { o.MaxModelLen = 1 << 30 }, "cannot hold one sequence"},
		{"bad port", func(o *Options) { o.Port = 70000 }, "--port must be between"},
		{"bad host", func(o *Options) { o.Host = "not a host" }, "--host must be"},
		{"no gpus", func(o *Options) { o.GPUs = 0 }, "--gpus must be at least 1"},
		{"no join timeout", func(o *Options) { o.JoinTimeout = 0 }, "--join-timeout must be positive"},
		{"a node ID with a space", func(o *Options) { o.NodeID = "pod 0" }, "--node-id must be"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := DefaultOptions()
			tc.mutate(&o)
			_, err := o.check()
			if err == nil || !IsFlagError(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want a flag error containing %q", err, tc.want)
			}
		})
	}
}

func TestTopologyDefaults(t *testing.T) {
	cases := []struct {
		size, local, start, gpus int
		want                     dp.Topology
	}{
		{-1, -1, -1, 2, dp.Topology{Size: 2, LocalSize: 2}},
		{-1, -1, -1, 8, dp.Topology{Size: 8, LocalSize: 8}},
		{4, -1, -1, 8, dp.Topology{Size: 4, LocalSize: 4}},
		{4, 2, 2, 2, dp.Topology{Size: 4, LocalSize: 2, StartRank: 2}},
		{-1, 1, -1, 2, dp.Topology{Size: 1, LocalSize: 1}},
	}
	for _, tc := range cases {
		o := DefaultOptions()
		o.DataParallelSize, o.DataParallelSizeLocal, o.DataParallelStartRank = tc.size, tc.local, tc.start
		p, err := o.check()
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.topology(tc.gpus)
		if err != nil || got != tc.want {
			t.Errorf("%+v with %d GPUs: %+v, %v; want %+v", tc, tc.gpus, got, err, tc.want)
		}
	}
}

func TestTooFewGPUsIsAClearError(t *testing.T) {
	o := DefaultOptions()
	o.Host, o.Port = "127.0.0.1", 0
	o.Bind, o.RPCPort = "127.0.0.1:0", 0
	o.Logger = slog.New(slog.DiscardHandler)
	o.DataParallelSize = 4
	_, err := Start(o)
	if err == nil || !strings.Contains(err.Error(), "4 local ranks need 4 GPUs but only 2 were found") || !strings.Contains(err.Error(), "--gpus") {
		t.Fatalf("error %v; want one naming the GPU shortfall and --gpus", err)
	}
}

// TestLlamaCppWithoutTheWorkerSaysHowToGetIt: on a machine without make
// llamacpp's worker, --engine llamacpp fails at once, before anything
// starts, saying how to install it.
func TestLlamaCppWithoutTheWorkerSaysHowToGetIt(t *testing.T) {
	dir := t.TempDir()
	vocab, model := filepath.Join(dir, "vocab.gguf"), filepath.Join(dir, "model.gguf")
	f, err := os.Create(vocab)
	if err != nil {
		t.Fatal(err)
	}
	tokens := &gguf.Array{Elem: gguf.TypeString, Values: []gguf.Value{"<s>", "a", "b"}}
	if err := gguf.Write(f, []gguf.KV{{Key: "tokenizer.ggml.model", Value: "gpt2"}, {Key: "tokenizer.ggml.tokens", Value: tokens}}, nil); err != nil {
		t.Fatal(err)
	}
	f.Close()
	cfg := llamacpp.DefaultTestModel()
	cfg.Vocab, cfg.Embedding, cfg.FeedForward = vocab, 8, 8
	f, err = os.Create(model)
	if err != nil {
		t.Fatal(err)
	}
	if err := llamacpp.WriteTestModel(f, cfg); err != nil {
		t.Fatal(err)
	}
	f.Close()
	t.Setenv(llamacpp.WorkerEnv, "")
	t.Chdir(dir)
	o := DefaultOptions()
	o.Engine, o.Model = "llamacpp", model
	_, err = o.check()
	if err == nil || !IsFlagError(err) || !strings.Contains(err.Error(), "make llamacpp") {
		t.Fatalf("error %v; want a flag error that says to run make llamacpp", err)
	}
}

func TestFounderRule(t *testing.T) {
	for _, tc := range []struct {
		seeds    []string
		founder  string
		hostname string
		want     bool
	}{
		{nil, "", "gpu-7", true},
		{[]string{"a:7946"}, "", "gpu-0", false},
		{[]string{"dpnode:7946"}, FirstOrdinal, "dpnode-0", true},
		{[]string{"dpnode:7946"}, FirstOrdinal, "dpnode-10", false},
		{[]string{"dpnode:7946"}, FirstOrdinal, "dpnode-0.dpnode-gossip.serving.svc.cluster.local", true},
		{[]string{"dpnode:7946"}, FirstOrdinal, "dpnode-1", false},
		{[]string{"a:7946"}, "gpu-3", "gpu-3.example.internal", true},
		{[]string{"a:7946"}, "gpu-3", "gpu-30", false},
	} {
		o := Options{Seeds: tc.seeds, Founder: tc.founder, Hostname: tc.hostname}
		if got := o.founds(); got != tc.want {
			t.Errorf("--seeds %v --founder %q on host %q: founds %v, want %v", tc.seeds, tc.founder, tc.hostname, got, tc.want)
		}
	}
}
