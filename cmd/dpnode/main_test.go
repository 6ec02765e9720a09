package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dpnode/dpnode/control"
	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/sim"
	"github.com/dpnode/dpnode/node"
)

// buildDpnode compiles the command once per test binary.
func buildDpnode(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dpnode")
	out, err := exec.Command("go", "build", "-buildvcs=auto", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func TestContradictoryFlagsFailBeforeAnythingStarts(t *testing.T) {
	bin := buildDpnode(t)
	cases := []struct {
		args []string
		// want is in the error, when not empty.
		want string
	}{
		{[]string{"--data-parallel-size", "2", "--data-parallel-size-local", "3"}, ""},
		{[]string{"--data-parallel-size", "4", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "3"}, ""},
		{[]string{"--engine", "nope"}, `--engine "nope" is not available; the engines are: sim (`},
		{[]string{"--max-num-seqs", "300", "--max-num-batched-tokens", "200"}, ""},
		{[]string{"--balance-policy", "least-conn"}, ""},
		{[]string{"--bind", "0.0.0.0:0"}, ""},
		// An engine's flags belong to it: the engine chosen would ignore
		// another's.
		{[]string{"--threads", "2"}, "--threads is the llamacpp engine's; --engine sim does not use it"},
		{[]string{"--engine", "llamacpp", "--sim-time-scale", "0"}, "--sim-time-scale is the sim engine's; --engine llamacpp does not use it"},
		{[]string{"--chat-template", "x.jinja"}, "--chat-template is not used by --engine sim"},
		// vLLM's flags that do not map say what to do instead.
		{[]string{"--tensor-parallel-size", "2"}, "a dpnode rank runs on one GPU"},
		{[]string{"--pipeline-parallel-size", "2"}, "a dpnode rank runs on one GPU"},
		{[]string{"--data-parallel-address", "10.0.0.1"}, "dpnode finds nodes by gossip; give --seeds 10.0.0.1:7946"},
		{[]string{"--api-server-count", "4"}, "a dpnode node runs one API server"},
		{[]string{"--dtype", "bfloat16"}, "--dtype takes only auto"},
		{[]string{"--no-enable-chunked-prefill"}, "dpnode always prefills long prompts in chunks"},
		{[]string{"--enable-chunked-prefill=false"}, "dpnode always prefills long prompts in chunks"},
		{[]string{"--enable-prefix-caching", "--no-enable-prefix-caching"}, "contradict each other"},
		{[]string{"--max-model-len", "1.5K"}, "no decimals with a binary suffix"},
		{[]string{"--max-model-len", "lots"}, "want a count such as 4096"},
		{[]string{"--no-such-flag"}, "unknown flag: --no-such-flag"},
		// A GGUF file runs on the llama.cpp engine, which reads it.
		{[]string{"--model", "/nonexistent/model.gguf", "--sim-time-scale", "1"}, "--sim-time-scale is the sim engine's; --engine llamacpp does not use it"},
	}
	for _, c := range cases {
		// Bounded: a flag that is not refused starts a node that serves
		// until killed.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, append([]string{"join", "--host", "127.0.0.1", "--port", "0", "--bind", "127.0.0.1:0", "--data-parallel-rpc-port", "0"}, c.args...)...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 1 {
			t.Fatalf("%v: exit %v, want 1\n%s", c.args, err, out)
		}
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(lines) != 1 || !strings.HasPrefix(lines[0], "dpnode: invalid flags: ") || !strings.Contains(lines[0], c.want) {
			t.Fatalf("%v: output %q; want one line with the flag error (%q), before anything starts", c.args, out, c.want)
		}
	}
}

// TestSIGTERMDrainsThenExitsZero starts a real process, opens a stream,
// sends SIGTERM mid-stream, and expects the stream to finish whole and
// the process to exit 0.
func TestSIGTERMDrainsThenExitsZero(t *testing.T) {
	bin := buildDpnode(t)
	base, cmd := startNode(t, bin, "--sim-time-scale", "1")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions",
		strings.NewReader(`{"prompt":"drain me","max_tokens":60,"ignore_eos":true,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := bufio.NewReader(resp.Body)
	first, err := body.ReadString('\n')
	if err != nil || !strings.HasPrefix(first, "data: ") {
		t.Fatalf("first line %q, %v", first, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(body)
	if err != nil {
		t.Fatalf("the stream broke during the drain: %v", err)
	}
	if !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream ended %q, want data: [DONE]", rest[max(0, len(rest)-40):])
	}
	// Token-exact: the whole text an undisturbed request produces.
	var text strings.Builder
	finish := ""
	for _, line := range strings.Split(first+string(rest), "\n") {
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var chunk struct {
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &chunk); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		for _, c := range chunk.Choices {
			text.WriteString(c.Text)
			if c.FinishReason != nil {
				finish = *c.FinishReason
			}
		}
	}
	tok := sim.NewTokenizer(0)
	h := engine.PromptHash(tok.Tokens("drain me"), nil)
	sp := &engine.SamplingParams{IgnoreEOS: true}
	var want []uint32
	for i := range 60 {
		want = append(want, tok.Sample(h, i, sp))
	}
	if text.String() != tok.Decode(want) || finish != "length" {
		t.Fatalf("drained stream %q (%s); want the undisturbed %q (length)", text.String(), finish, tok.Decode(want))
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dpnode exited with %v after draining, want 0", err)
	}
}

// startNode runs dpnode with args and returns its URL and the command.
func startNode(t *testing.T, bin string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	return startCommand(t, bin, append([]string{"join"}, args...)...)
}

// startCommand runs dpnode with args (a command and its own), on
// loopback ports it picks, and returns its URL once it serves.
func startCommand(t *testing.T, bin string, args ...string) (string, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command(bin, append(slices.Clone(args), "--host", "127.0.0.1", "--port", "0", "--bind", "127.0.0.1:0", "--data-parallel-rpc-port", "0")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	logs := bufio.NewReader(stderr)
	urlRE := regexp.MustCompile(`url=(http://\S+)`)
	for {
		line, err := logs.ReadString('\n')
		if err != nil {
			t.Fatalf("no serving line in the log: %v", err)
		}
		if m := urlRE.FindStringSubmatch(line); m != nil {
			go func() { _, _ = io.Copy(io.Discard, logs) }()
			return m[1], cmd
		}
	}
}

func post(t *testing.T, url, key, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAdminDrain drains over HTTP: the caller needs the admin key, which
// a client's API key is not; then new requests get 503, the stream in
// flight finishes, and the process exits 0.
func TestAdminDrain(t *testing.T) {
	bin := buildDpnode(t)
	base, cmd := startNode(t, bin, "--api-key", "secret", "--admin-api-key", "admin-secret", "--sim-time-scale", "1")
	for _, key := range []string{"wrong", "secret"} {
		if code, body := post(t, base+"/admin/drain", key, ""); code != http.StatusUnauthorized {
			t.Fatalf("drain with the key %q: %d %s", key, code, body)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/completions",
		strings.NewReader(`{"prompt":"finish me","max_tokens":40,"ignore_eos":true,"stream":true}`))
	req.Header.Set("Authorization", "Bearer secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body := bufio.NewReader(resp.Body)
	if _, err := body.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if code, out := post(t, base+"/admin/drain", "admin-secret", ""); code != http.StatusAccepted {
		t.Fatalf("drain: %d %s", code, out)
	}
	code, out := post(t, base+"/v1/completions", "secret", `{"prompt":"too late","max_tokens":1}`)
	if code != http.StatusServiceUnavailable || !strings.Contains(out, `"code":"draining"`) {
		t.Fatalf("a new request while draining: %d %s; want 503 draining", code, out)
	}
	rest, err := io.ReadAll(body)
	if err != nil || !strings.Contains(string(rest), `"finish_reason":"length"`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("the stream in flight during the drain: %v, ended %q", err, rest[max(0, len(rest)-60):])
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dpnode exited with %v after the drain, want 0", err)
	}
}

// TestAdminRoutesAreOffWithoutAKey: with no admin key, not even a caller
// on the machine may drain the node (a proxy or a browser there would
// speak for anyone); the node goes on serving.
func TestAdminRoutesAreOffWithoutAKey(t *testing.T) {
	bin := buildDpnode(t)
	base, cmd := startNode(t, bin)
	if code, out := post(t, base+"/admin/drain", "", ""); code != http.StatusForbidden || !strings.Contains(out, "--admin-api-key") {
		t.Fatalf("local drain without a key: %d %s; want 403 naming --admin-api-key", code, out)
	}
	if code, out := post(t, base+"/v1/completions", "", `{"prompt":"still here","max_tokens":1}`); code != http.StatusOK {
		t.Fatalf("a request after the refused drain: %d %s", code, out)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("dpnode exited with %v, want 0", err)
	}
}

// TestCertsThenAClusterOffLoopbackMayStart: dpnode certs writes what a
// node needs to bind beyond loopback, and a second run adds a node to the
// same CA.
func TestCertsThenAClusterOffLoopbackMayStart(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	run := func(args ...string) string {
		t.Helper()
		var out strings.Builder
		cmd := newRootCommand()
		cmd.SetOut(&out)
		cmd.SetArgs(args)
		if err := cmd.Execute(); err != nil {
			t.Fatalf("dpnode %v: %v", args, err)
		}
		return out.String()
	}
	first := run("certs", "--dir", dir, "node-a", "node-b")
	second := run("certs", "--dir", dir, "node-c")
	if !strings.Contains(first, "created a cluster CA") || strings.Contains(second, "created") || !strings.Contains(second, "node-c.pem") {
		t.Fatalf("first run:\n%s\nsecond run:\n%s", first, second)
	}
	key, err := os.ReadFile(filepath.Join(dir, "gossip.key"))
	if err != nil {
		t.Fatal(err)
	}
	o := node.DefaultOptions()
	o.Bind, o.GossipKey = "0.0.0.0:7946", strings.TrimSpace(string(key))
	o.TLS = control.TLSFiles{Cert: filepath.Join(dir, "node-c.pem"), Key: filepath.Join(dir, "node-c-key.pem"), CA: filepath.Join(dir, "ca.pem")}
	if err := node.CheckOptions(o); err != nil {
		t.Fatalf("a node with the files dpnode certs wrote: %v", err)
	}
}

// TestSecretFlagsAreWarnedOf: a key on the command line is logged as
// visible to the machine's users, with the variable to use instead; the
// same key from the environment is not.
func TestSecretFlagsAreWarnedOf(t *testing.T) {
	t.Setenv("DPNODE_ADMIN_API_KEY", "from-the-environment")
	cmd := newJoinCommand()
	if err := cmd.ParseFlags([]string{"--api-key", "on-the-command-line"}); err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	warnSecretFlags(cmd, slog.New(slog.NewTextHandler(&logs, nil)))
	out := logs.String()
	if !strings.Contains(out, "flag=--api-key") || !strings.Contains(out, "env=$DPNODE_API_KEY") || !strings.Contains(out, "--api-key-file") {
		t.Fatalf("no warning naming --api-key and $DPNODE_API_KEY:\n%s", out)
	}
	if strings.Contains(out, "admin-api-key") || strings.Contains(out, "on-the-command-line") {
		t.Fatalf("warned of a key from the environment, or logged a key:\n%s", out)
	}
}

// TestServeTakesAVLLMCommandLine starts dpnode as vllm serve is started:
// a positional model, several served names after one flag, a length
// with a suffix, and vLLM's flags that mean what dpnode does anyway.
func TestServeTakesAVLLMCommandLine(t *testing.T) {
	bin := buildDpnode(t)
	base, _ := startCommand(t, bin, "serve", "org/some-model", "--served-model-name", "first", "second", "--max-model-len", "2k",
		"--enable-prefix-caching", "--enable-chunked-prefill", "--tensor-parallel-size", "1", "--dtype", "auto",
		"--disable-log-requests", "--disable-log-stats", "--api-server-count", "1")
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	getJSON(t, base+"/v1/models", &models)
	if len(models.Data) != 2 || models.Data[0].ID != "first" || models.Data[1].ID != "second" || models.Data[0].MaxModelLen != 2000 {
		t.Fatalf("/v1/models: %+v; want first and second, of 2,000 tokens (2k)", models.Data)
	}
	code, body := post(t, base+"/v1/completions", "", `{"model": "second", "prompt": "hi", "max_tokens": 2}`)
	if code != http.StatusOK || !strings.Contains(body, `"model":"first"`) {
		t.Fatalf("a completion asked of its second name: %d %s", code, body)
	}
	// /version: a build from a checkout says its revision.
	var v map[string]string
	getJSON(t, base+"/version", &v)
	if v["version"] == "" || v["go"] == "" {
		t.Fatalf("/version %v: want a version and the Go version", v)
	}
	if rev, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		// Go's pseudo-version of the module, which names the revision.
		head := strings.TrimSpace(string(rev))
		if v["revision"] != head || !strings.Contains(v["version"], head[:12]) {
			t.Fatalf("/version %v: want the checkout's revision %s", v, head)
		}
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

func TestHumanIntIsVLLMs(t *testing.T) {
	for in, want := range map[string]int{"4096": 4096, "32k": 32000, "32K": 32768, "25.6k": 25600, "1m": 1000000, "1M": 1 << 20, "1G": 1 << 30} {
		if got, err := parseHumanInt(in); err != nil || got != want {
			t.Errorf("%q: %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "1.5K", "-1", "1t", "k", "2.5", "3G3", "9999999G"} {
		if got, err := parseHumanInt(in); err == nil {
			t.Errorf("%q: %d; want an error", in, got)
		}
	}
}

func TestSpreadNames(t *testing.T) {
	for _, c := range []struct{ in, want []string }{
		{[]string{"serve", "m", "--served-model-name", "a", "b", "--port", "1"},
			[]string{"serve", "m", "--served-model-name", "a", "--served-model-name", "b", "--port", "1"}},
		{[]string{"join", "--served-model-name", "a"}, []string{"join", "--served-model-name", "a"}},
		{[]string{"join", "--served-model-name=a,b", "x"}, []string{"join", "--served-model-name=a,b", "x"}},
		{[]string{"join", "--", "--served-model-name", "a", "b"}, []string{"join", "--", "--served-model-name", "a", "b"}},
	} {
		if got := spreadNames(c.in); !slices.Equal(got, c.want) {
			t.Errorf("spreadNames(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
