package main

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/dpnode/dpnode/node"
)

// vllmFlags are vLLM's flags that launch scripts carry over: those whose
// meaning maps onto dpnode's are taken, the others refused with what to do
// instead, never ignored.
type vllmFlags struct {
	enablePrefixCaching  bool
	enableChunkedPrefill bool
	noChunkedPrefill     bool
	disableLogRequests   bool
	tensorParallel       int
	pipelineParallel     int
	apiServerCount       int
	dpAddress            string
	dtype                string
}

func addVLLMFlags(f *pflag.FlagSet, o *node.Options, v *vllmFlags) {
	f.BoolVar(&v.enablePrefixCaching, "enable-prefix-caching", true, "keep freed KV blocks findable by their tokens (--no-enable-prefix-caching turns it off)")
	f.BoolVar(&o.LogRequests, "enable-log-requests", false, "log one line per finished request at info: id, rank, token counts, TTFT, end-to-end time, finish reason, moves (never its text)")
	f.BoolVar(&v.disableLogRequests, "disable-log-requests", false, "")
	_ = f.MarkDeprecated("disable-log-requests", "requests are not logged unless --enable-log-requests, as in vLLM since 0.10.1; it does nothing")
	f.BoolVar(&o.DisableLogStats, "disable-log-stats", false, "no stats line every 10 s (the metrics stay)")
	f.BoolVar(&v.enableChunkedPrefill, "enable-chunked-prefill", true, "prefill long prompts in chunks of at most --max-num-batched-tokens per step (always on)")
	f.BoolVar(&v.noChunkedPrefill, "no-enable-chunked-prefill", false, "")
	_ = f.MarkHidden("no-enable-chunked-prefill")
	f.IntVar(&v.tensorParallel, "tensor-parallel-size", 1, "GPUs per rank: 1 (a rank runs on one GPU)")
	f.IntVar(&v.pipelineParallel, "pipeline-parallel-size", 1, "pipeline stages per rank: 1")
	f.IntVar(&v.apiServerCount, "api-server-count", 1, "API servers on this node: 1 (more API servers are more nodes)")
	f.StringVar(&v.dpAddress, "data-parallel-address", "", "not used: dpnode finds nodes by --seeds")
	f.StringVar(&v.dtype, "dtype", "auto", "weights' type: auto (the model file's own)")
}

// check applies what was set, or says why dpnode cannot.
func (v *vllmFlags) check(f *pflag.FlagSet, o *node.Options) error {
	if f.Changed("enable-prefix-caching") {
		if f.Changed("no-enable-prefix-caching") && v.enablePrefixCaching == o.NoPrefixCaching {
			return errors.New("invalid flags: --enable-prefix-caching and --no-enable-prefix-caching contradict each other")
		}
		o.NoPrefixCaching = !v.enablePrefixCaching
	}
	switch {
	case v.noChunkedPrefill || !v.enableChunkedPrefill:
		return errors.New("invalid flags: dpnode always prefills long prompts in chunks; bound a step's tokens with --max-num-batched-tokens instead of turning chunked prefill off")
	case v.tensorParallel != 1:
		return fmt.Errorf("invalid flags: --tensor-parallel-size %d: a dpnode rank runs on one GPU. Serve a model that fits one GPU (a smaller or quantized GGUF), "+
			"or run a server with tensor parallelism per group of GPUs (vLLM, SGLang) and put dpnode in front of them with --engine openai", v.tensorParallel)
	case v.pipelineParallel != 1:
		return fmt.Errorf("invalid flags: --pipeline-parallel-size %d: a dpnode rank runs on one GPU; run a server with pipeline parallelism behind --engine openai instead", v.pipelineParallel)
	case v.apiServerCount != 1:
		return fmt.Errorf("invalid flags: --api-server-count %d: a dpnode node runs one API server. For more, start more nodes: with --data-parallel-lb internal "+
			"every node's API server balances over every rank (--headless nodes host ranks only)", v.apiServerCount)
	case v.dpAddress != "":
		return fmt.Errorf("invalid flags: --data-parallel-address %s: dpnode finds nodes by gossip; give --seeds %s:7946 (a member's --bind address) instead", v.dpAddress, v.dpAddress)
	case !strings.EqualFold(v.dtype, "auto"):
		return fmt.Errorf("invalid flags: --dtype %s: the weights keep the model file's own types (a GGUF file says them); --dtype takes only auto", v.dtype)
	}
	return nil
}

// humanInt is a count flag that takes vLLM's spellings: 32k is 32,000 and
// 32K is 32,768 (lowercase suffixes are powers of 1000, uppercase of
// 1024); 25.6k is 25,600, a decimal with an uppercase suffix an error.
type humanInt int

var humanIntForm = regexp.MustCompile(`^(\d+(?:\.\d+)?)([kKmMgG]?)$`)

func (h *humanInt) String() string { return strconv.Itoa(int(*h)) }

func (h *humanInt) Type() string { return "int" }

func (h *humanInt) Set(s string) error {
	n, err := parseHumanInt(s)
	if err != nil {
		return err
	}
	*h = humanInt(n)
	return nil
}

func parseHumanInt(s string) (int, error) {
	m := humanIntForm.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("want a count such as 4096, 32k (32,000) or 32K (32,768); got %q", s)
	}
	num, suffix := m[1], m[2]
	if suffix == "" {
		if strings.Contains(num, ".") {
			return 0, fmt.Errorf("want a whole count, got %q", s)
		}
		return strconv.Atoi(num)
	}
	if suffix == strings.ToUpper(suffix) {
		if strings.Contains(num, ".") {
			return 0, fmt.Errorf("%q: no decimals with a binary suffix such as %s; did you mean %s%s?", s, suffix, num, strings.ToLower(suffix))
		}
		n, err := strconv.Atoi(num)
		if err != nil {
			return 0, err
		}
		shift := map[string]uint{"K": 10, "M": 20, "G": 30}[suffix]
		if n > math.MaxInt32>>shift {
			return 0, fmt.Errorf("%q is too large", s)
		}
		return n << shift, nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return 0, err
	}
	v := f * map[string]float64{"k": 1e3, "m": 1e6, "g": 1e9}[suffix]
	if v > math.MaxInt32 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int(v), nil
}

// spreadNames rewrites vLLM's --served-model-name A B C (several names
// after one flag) as one flag per name: the names run to the next
// argument that starts with "-". Put a positional model before the flag,
// as vLLM's parser would also take it for a name.
func spreadNames(args []string) []string {
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		a := args[i]
		out = append(out, a)
		if a == "--" {
			return append(out, args[i+1:]...)
		}
		if a != "--served-model-name" {
			continue
		}
		if i+1 < len(args) {
			out = append(out, args[i+1])
			i++
		}
		for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
			out = append(out, "--served-model-name", args[i+1])
			i++
		}
	}
	return out
}
