//go:build llamacpp

// Package llamacpptest gives the tests of the llama.cpp engine what they
// share: the installed worker, llama.cpp's source (its tokenizers and chat
// templates), a random-weight test model, and llama.cpp's own greedy
// decoding as the reference. make llamacpp-test sets the environment it
// reads; a test run without it fails, saying so, rather than skipping.
package llamacpptest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

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
	modelOnce sync.Once
	modelPath string
	modelErr  error
)

// Model is the default test model (llamacpp.DefaultTestModel) with Llama
// 3's tokenizer and the Llama 3.1 chat template, written once per test
// binary.
func Model(t testing.TB) string {
	t.Helper()
	src := Src(t)
	modelOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dpnode-testmodel-")
		if err != nil {
			modelErr = err
			return
		}
		modelPath = filepath.Join(dir, "test-llama.gguf")
		cfg := llamacpp.DefaultTestModel()
		cfg.Vocab = filepath.Join(src, "models", "ggml-vocab-llama-bpe.gguf")
		tmpl, err := os.ReadFile(filepath.Join(src, "models", "templates", "meta-llama-Llama-3.1-8B-Instruct.jinja"))
		if err != nil {
			modelErr = err
			return
		}
		cfg.ChatTemplate = string(tmpl)
		f, err := os.Create(modelPath)
		if err != nil {
			modelErr = err
			return
		}
		if modelErr = llamacpp.WriteTestModel(f, cfg); modelErr == nil {
			modelErr = f.Close()
		}
	})
	if modelErr != nil {
		t.Fatal(modelErr)
	}
	return modelPath
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
			"-L"+libs, "-l:libllama"+flavour+".v0.4.0.so", "-l:libggml"+flavour+".v0.4.0.so", "-l:libggml-base.so", "-Wl,-rpath,"+libs)
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
	bin, libs := reference(t), BackendDir(t)
	procs := min(runtime.NumCPU(), len(prompts))
	res := make([][]uint32, len(prompts))
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
			cmd := exec.Command(bin, model, libs, kvType, strconv.Itoa(maxTokens))
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
					n, err := strconv.Atoi(f)
					if err != nil {
						errs[w] = fmt.Errorf("the reference printed %q", line)
						return
					}
					res[mine[k]] = append(res[mine[k]], uint32(n))
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
	return res
}
