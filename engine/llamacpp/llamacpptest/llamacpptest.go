//go:build llamacpp

// Package llamacpptest gives the tests of the llama.cpp engine what they
// share: the installed worker, llama.cpp's source (its tokenizers and chat
// templates), a random-weight test model, and llama.cpp's own greedy
// decoding as the reference. make llamacpp-test sets the environment it
// reads; a test run without it fails, saying so, rather than skipping.
package llamacpptest

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dpnode/dpnode/engine/llamacpp"
)

// SrcEnv names llama.cpp's source tree (the bundle make llamacpp clones).
const SrcEnv = "DPNODE_LLAMACPP_SRC"

// Src is llama.cpp's source tree.
func Src(t testing.TB) string {
	t.Helper()
	dir := os.Getenv(SrcEnv)
	if dir == "" {
		t.Fatalf("%s is not set: run these tests with make llamacpp-test", SrcEnv)
	}
	return dir
}

// Worker is the worker executable.
func Worker(t testing.TB) string {
	t.Helper()
	p, err := llamacpp.FindWorker()
	if err != nil {
		t.Fatalf("%v (run these tests with make llamacpp-test)", err)
	}
	return p
}

// BackendDir is where the worker's libraries are.
func BackendDir(t testing.TB) string {
	return filepath.Join(filepath.Dir(Worker(t)), "llamacpp")
}

// Vocab is the path of one of llama.cpp's vocabulary files, by name
// (llama-bpe, qwen2, llama-spm).
func Vocab(t testing.TB, name string) string {
	return filepath.Join(Src(t), "models", "ggml-vocab-"+name+".gguf")
}

// Template is the text of one of llama.cpp's chat templates, by file name
// without .jinja.
func Template(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(Src(t), "models", "templates", name+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	modelOnce, benchOnce sync.Once
	modelPath, benchPath string
	modelErr, benchErr   error
)

// Model is the default test model (llamacpp.DefaultTestModel) with Llama
// 3's tokenizer and the Llama 3.1 chat template, written once per test
// binary.
func Model(t testing.TB) string {
	t.Helper()
	src, vocab := Src(t), Vocab(t, "llama-bpe")
	modelOnce.Do(func() {
		tmpl, err := os.ReadFile(filepath.Join(src, "models", "templates", "meta-llama-Llama-3.1-8B-Instruct.jinja"))
		if err != nil {
			modelErr = err
			return
		}
		cfg := llamacpp.DefaultTestModel()
		cfg.Vocab, cfg.ChatTemplate = vocab, string(tmpl)
		modelPath, modelErr = writeModel("test-llama.gguf", cfg)
	})
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	return modelPath
}

var (
	familyMu     sync.Mutex
	familyModels = map[[2]string]string{}
)

// FamilyModel is the default test model with the tokenizer of one of
// llama.cpp's vocabulary files (Vocab's names) and one of its chat
// templates (Template's names): a model family's tokens and chat format
// over random weights. Written once per test binary for each pair.
func FamilyModel(t testing.TB, vocab, template string) string {
	t.Helper()
	key := [2]string{vocab, template}
	familyMu.Lock()
	defer familyMu.Unlock()
	if path, ok := familyModels[key]; ok {
		return path
	}
	cfg := llamacpp.DefaultTestModel()
	cfg.Vocab, cfg.ChatTemplate = Vocab(t, vocab), Template(t, template)
	path, err := writeModel("test-"+vocab+".gguf", cfg)
	if err != nil {
		t.Fatal(err)
	}
	familyModels[key] = path
	return path
}

// BenchModel is the model of the CPU benchmarks (docs/BENCHMARKS.md): 4
// layers 256 wide, a feed-forward of 768, 4 heads over 2 KV heads, and
// Llama 3's 128,256-token vocabulary, whose output layer dominates a
// decode step as a real model's does not. Written once per test binary.
func BenchModel(t testing.TB) string {
	t.Helper()
	vocab := Vocab(t, "llama-bpe")
	benchOnce.Do(func() {
		cfg := llamacpp.DefaultTestModel()
		cfg.Vocab = vocab
		cfg.Layers, cfg.Embedding, cfg.FeedForward, cfg.Heads, cfg.KVHeads = 4, 256, 768, 4, 2
		benchPath, benchErr = writeModel("bench-llama.gguf", cfg)
	})
	if benchErr != nil {
		t.Fatal(benchErr)
	}
	return benchPath
}

// writeModel writes a test model to a new temporary folder.
func writeModel(name string, cfg llamacpp.TestModelConfig) (string, error) {
	dir, err := os.MkdirTemp("", "dpnode-testmodel-")
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name)
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	if err := llamacpp.WriteTestModel(f, cfg); err != nil {
		f.Close()
		return "", err
	}
	return path, f.Close()
}

var (
	refOnce sync.Once
	refPath string
	refErr  error
)

// reference builds testdata/greedy.c against the worker's libraries.
func reference(t testing.TB) string {
	t.Helper()
	src, libs := Src(t), BackendDir(t)
	refOnce.Do(func() {
		_, here, _, _ := runtime.Caller(0)
		prog := filepath.Join(filepath.Dir(here), "..", "testdata", "greedy.c")
		dir, err := os.MkdirTemp("", "dpnode-greedy-")
		if err != nil {
			refErr = err
			return
		}
		refPath = filepath.Join(dir, "greedy")
		flavour := ""
		if _, err := os.Stat(filepath.Join(libs, "libllama.cuda.v0.4.0.so")); err == nil {
			flavour = ".cuda"
		}
		cmd := exec.Command("cc", "-O2", "-o", refPath, prog, "-I"+filepath.Join(src, "include"), "-I"+filepath.Join(src, "ggml", "include"),
			"-L"+libs, "-l:libllama"+flavour+".v0.4.0.so", "-l:libggml"+flavour+".v0.4.0.so", "-l:libggml-base.so", "-lm", "-Wl,-rpath,"+libs)
		if out, err := cmd.CombinedOutput(); err != nil {
			refErr = fmt.Errorf("building the reference: %v\n%s", err, out)
		}
	})
	if refErr != nil {
		t.Fatal(refErr)
	}
	return refPath
}

// Greedy returns llama.cpp's own single-sequence greedy continuation of
// each prompt, maxTokens long, past end tokens (as with ignore_eos),
// computed with a KV cache of kvType ("f16" or "f32"). The prompts are
// shared among a reference process per core.
func Greedy(t testing.TB, model, kvType string, maxTokens int, prompts [][]uint32) [][]uint32 {
	t.Helper()
	ids, _ := greedy(t, model, kvType, maxTokens, prompts, false)
	return ids
}

// GreedyLogprobs is Greedy with each token's log-probability, the
// log-softmax of llama.cpp's logits computed in float64.
func GreedyLogprobs(t testing.TB, model, kvType string, maxTokens int, prompts [][]uint32) ([][]uint32, [][]float64) {
	t.Helper()
	return greedy(t, model, kvType, maxTokens, prompts, true)
}

func greedy(t testing.TB, model, kvType string, maxTokens int, prompts [][]uint32, logprobs bool) ([][]uint32, [][]float64) {
	t.Helper()
	bin, libs := reference(t), BackendDir(t)
	procs := min(runtime.NumCPU(), len(prompts))
	res := make([][]uint32, len(prompts))
	lps := make([][]float64, len(prompts))
	errs := make([]error, procs)
	var wg sync.WaitGroup
	for w := range procs {
		wg.Go(func() {
			var mine []int
			for i := w; i < len(prompts); i += procs {
				mine = append(mine, i)
			}
			var in bytes.Buffer
			for _, i := range mine {
				for j, id := range prompts[i] {
					if j > 0 {
						in.WriteByte(' ')
					}
					in.WriteString(strconv.Itoa(int(id)))
				}
				in.WriteByte('\n')
			}
			args := []string{model, libs, kvType, strconv.Itoa(maxTokens)}
			if logprobs {
				args = append(args, "logprobs")
			}
			cmd := exec.Command(bin, args...)
			cmd.Stdin = &in
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				errs[w] = fmt.Errorf("the reference decoder failed: %v\n%s", err, stderr.String())
				return
			}
			lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
			if len(lines) != len(mine) {
				errs[w] = fmt.Errorf("the reference answered %d of %d prompts", len(lines), len(mine))
				return
			}
			for k, line := range lines {
				for _, f := range strings.Fields(line) {
					id, lp, _ := strings.Cut(f, ":")
					n, err := strconv.Atoi(id)
					x, lpErr := strconv.ParseFloat(lp, 64)
					if err != nil || (logprobs && lpErr != nil) {
						errs[w] = fmt.Errorf("the reference printed %q", line)
						return
					}
					res[mine[k]] = append(res[mine[k]], uint32(n))
					if logprobs {
						lps[mine[k]] = append(lps[mine[k]], x)
					}
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return res, lps
}

// Logits returns llama.cpp's own logits for each token of continuation:
// row j predicts continuation[j], after prompt and continuation[:j], from
// one sequence fed the prompt whole and then one token at a time, with a
// KV cache of kvType ("f16" or "f32"). A row is the model's vocabulary
// long.
func Logits(t testing.TB, model, kvType string, prompt, continuation []uint32) [][]float32 {
	t.Helper()
	bin, libs := reference(t), BackendDir(t)
	file := filepath.Join(t.TempDir(), "logits")
	var in bytes.Buffer
	for _, id := range prompt {
		fmt.Fprintf(&in, "%d ", id)
	}
	in.WriteString("|")
	for _, id := range continuation {
		fmt.Fprintf(&in, " %d", id)
	}
	in.WriteByte('\n')
	cmd := exec.Command(bin, model, libs, kvType, "0", "logits", file)
	cmd.Stdin = &in
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the reference decoder failed: %v\n%s", err, stderr.String())
	}
	var rows, vocab int
	if _, err := fmt.Sscanf(string(out), "%d %d", &rows, &vocab); err != nil || rows != len(continuation) {
		t.Fatalf("the reference printed %q for %d tokens", out, len(continuation))
	}
	raw, err := os.ReadFile(file)
	if err != nil || len(raw) != rows*vocab*4 {
		t.Fatalf("the reference wrote %d bytes of logits for %d rows of %d (%v)", len(raw), rows, vocab, err)
	}
	rowsOut := make([][]float32, rows)
	for j := range rowsOut {
		rowsOut[j] = make([]float32, vocab)
		for v := range vocab {
			rowsOut[j][v] = math.Float32frombits(binary.NativeEndian.Uint32(raw[(j*vocab+v)*4:]))
		}
	}
	return rowsOut
}

// Tokenizer starts model's tokenizer (a vocabulary worker), closed when
// the test ends.
func Tokenizer(t testing.TB, model string) *llamacpp.Tokenizer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tok, err := llamacpp.NewTokenizer(ctx, llamacpp.WorkerConfig{Binary: Worker(t), Logger: slog.New(slog.DiscardHandler)}, model, llamacpp.TokenizerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tok.Close() })
	return tok
}
