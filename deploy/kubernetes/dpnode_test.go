package kubernetes

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// joinFlag is a flag of `dpnode join` as its --help shows it.
type joinFlag struct {
	// typ is pflag's name of the value's type: int, string, duration,
	// int|auto...; empty for a boolean flag, which takes no value.
	typ string
	// def is the default, unquoted; empty where --help shows none.
	def string
}

// dpnodeJoinFlags are the flags of the dpnode built from the source tree
// that holds this module, read from `dpnode join --help`: the real
// binary's flags, not a list kept by hand.
func dpnodeJoinFlags(t *testing.T) map[string]joinFlag {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dpnode")
	// Built in the main module, with its go.sum: the binary make build
	// makes, whatever this module's dependencies resolve to.
	build := exec.Command("go", "build", "-o", bin, "./cmd/dpnode")
	build.Dir = "../.."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/dpnode: %v\n%s", err, out)
	}
	// An empty environment: the defaults of --help must not depend on
	// the DPNODE_* variables of whoever runs the tests.
	help := exec.Command(bin, "join", "--help")
	help.Env = []string{}
	out, err := help.Output()
	if err != nil {
		t.Fatalf("dpnode join --help: %v", err)
	}
	flags, err := parseHelp(out)
	if err != nil {
		t.Fatal(err)
	}
	return flags
}

var (
	// helpLine is a flag's line in pflag's usage: "  -h, --name type   usage".
	helpLine = regexp.MustCompile(`^\s+(?:-\w, )?--([a-z0-9][a-z0-9-]*)(?: (\S+))?\s{2,}(.*)$`)
	// helpDefault is the default pflag appends to a usage; dpnode's own
	// "(default: ...)" notes are not defaults pflag knows.
	helpDefault = regexp.MustCompile(`\(default ([^:()][^()]*)\)$`)
)

// parseHelp reads the flags of a cobra command's --help.
func parseHelp(help []byte) (map[string]joinFlag, error) {
	flags := map[string]joinFlag{}
	inFlags := false
	sc := bufio.NewScanner(bytes.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "Flags:":
			inFlags = true
			continue
		case strings.TrimSpace(line) == "":
			inFlags = false
			continue
		case !inFlags:
			continue
		}
		m := helpLine.FindStringSubmatch(line)
		if m == nil {
			return nil, fmt.Errorf("unexpected line among the flags of dpnode join --help: %q", line)
		}
		f := joinFlag{typ: m[2]}
		if d := helpDefault.FindStringSubmatch(m[3]); d != nil {
			f.def = d[1]
			if u, err := strconv.Unquote(d[1]); err == nil {
				f.def = u
			}
		}
		flags[m[1]] = f
	}
	if len(flags) == 0 {
		return nil, fmt.Errorf("no flags found in dpnode join --help:\n%s", help)
	}
	return flags, nil
}

// joinArgs are the flags a container passes to dpnode join, by name, each
// with its values in order (a flag may repeat).
type joinArgs struct {
	flags  map[string]joinFlag
	values map[string][]string
}

// parseJoinArgs reads a container's args as pflag would: "join", then
// --name=value, --name value, or --name for a boolean flag. Each value
// must be one that its flag's type accepts. It reads past a flag that is
// wrong, so that one mistake does not hide the others.
func parseJoinArgs(args []string, flags map[string]joinFlag) (*joinArgs, []error) {
	if len(args) == 0 || args[0] != "join" {
		return nil, []error{fmt.Errorf("args must start with the subcommand join, got %q", args)}
	}
	a := &joinArgs{flags: flags, values: map[string][]string{}}
	var errs []error
	for i := 1; i < len(args); i++ {
		flag, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			errs = append(errs, fmt.Errorf("%q: dpnode join takes flags only, written --name=value", args[i]))
			continue
		}
		name, value, hasValue := strings.Cut(flag, "=")
		f, ok := flags[name]
		if !ok {
			errs = append(errs, fmt.Errorf("dpnode join has no flag --%s", name))
			continue
		}
		switch {
		case hasValue:
		case f.typ == "":
			value = "true"
		case i+1 < len(args):
			i++
			value = args[i]
		default:
			errs = append(errs, fmt.Errorf("--%s needs a value", name))
			continue
		}
		if err := checkValue(f.typ, value); err != nil {
			errs = append(errs, fmt.Errorf("--%s=%s: %w", name, value, err))
			continue
		}
		a.values[name] = append(a.values[name], value)
	}
	return a, errs
}

// checkValue reports whether pflag would take value for a flag of type
// typ. Values with $(VAR) in them are checked for the variable elsewhere.
func checkValue(typ, value string) error {
	var err error
	switch typ {
	case "":
		_, err = strconv.ParseBool(value)
	case "int":
		_, err = strconv.Atoi(value)
	case "int|auto":
		if value != "auto" {
			var n int
			if n, err = strconv.Atoi(value); err == nil && n < 0 {
				err = fmt.Errorf("negative")
			}
		}
	case "float":
		_, err = strconv.ParseFloat(value, 64)
	case "duration":
		_, err = time.ParseDuration(value)
	case "string", "strings", "stringArray":
	default:
		err = fmt.Errorf("a flag of type %s, which this test does not know how to check: teach checkValue", typ)
	}
	return err
}

// has reports whether the flag was given.
func (a *joinArgs) has(name string) bool { return len(a.values[name]) > 0 }

// get is the flag's last value, or its default.
func (a *joinArgs) get(name string) string {
	if v := a.values[name]; len(v) > 0 {
		return v[len(v)-1]
	}
	return a.flags[name].def
}

// bool is a boolean flag's value.
func (a *joinArgs) bool(name string) bool {
	b, _ := strconv.ParseBool(a.get(name))
	return b
}

// int is an integer flag's value; -1 when it has none.
func (a *joinArgs) int(name string) int {
	n, err := strconv.Atoi(a.get(name))
	if err != nil {
		return -1
	}
	return n
}

// duration is a duration flag's value; 0 when it has none.
func (a *joinArgs) duration(name string) time.Duration {
	d, _ := time.ParseDuration(a.get(name))
	return d
}

// openPort is a port that dpnode listens on.
type openPort struct {
	port     int32
	protocol corev1.Protocol
	// http: the port answers HTTP (/health, /metrics).
	http bool
	what string
}

// openPorts are the ports dpnode join listens on with these flags, as
// node.Start opens them: the HTTP port unless headless, the metrics port
// when set, gossip (memberlist: TCP and UDP) on the --bind port, and the
// actor transport on --data-parallel-rpc-port.
func (a *joinArgs) openPorts() ([]openPort, error) {
	var ports []openPort
	if !a.bool("headless") {
		ports = append(ports, openPort{port: int32(a.int("port")), protocol: corev1.ProtocolTCP, http: true, what: "--port"})
	}
	if p := a.int("metrics-port"); p >= 0 {
		ports = append(ports, openPort{port: int32(p), protocol: corev1.ProtocolTCP, http: true, what: "--metrics-port"})
	}
	_, gossip, err := splitHostPort(a.get("bind"), 7946)
	if err != nil {
		return nil, fmt.Errorf("--bind: %w", err)
	}
	ports = append(ports,
		openPort{port: gossip, protocol: corev1.ProtocolTCP, what: "gossip (--bind)"},
		openPort{port: gossip, protocol: corev1.ProtocolUDP, what: "gossip (--bind)"},
		openPort{port: int32(a.int("data-parallel-rpc-port")), protocol: corev1.ProtocolTCP, what: "--data-parallel-rpc-port"})
	for _, p := range ports {
		// 0 is a port chosen at start: nothing can name it beforehand.
		if p.port <= 0 || p.port > 65535 {
			return nil, fmt.Errorf("%s: port %d cannot be named in a manifest", p.what, p.port)
		}
	}
	return ports, nil
}

// splitHostPort splits host[:port] as dpnode does, with the default port
// where none is given.
func splitHostPort(s string, defaultPort int32) (string, int32, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		if ae, ok := err.(*net.AddrError); ok && ae.Err == "missing port in address" {
			return s, defaultPort, nil
		}
		return "", 0, err
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("bad port in %q", s)
	}
	return host, int32(n), nil
}
