//go:build chaos

package node_test

import (
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The openai engine in the chaos suite: every node stands in front of two
// OpenAI-compatible servers of its own (dpnode processes of the simulated
// engine, on the node's address), and one more fault, kill -9 of a server
// (a crashed engine: its requests move; the server comes back on its
// port, and the rank with it). A moved request continues from its output
// so far, but the simulated text is a function of the whole prompt: only
// the streams clear of faults are held to the undisturbed text.
func init() {
	s := &chaosServers{byIP: map[string][]*chaosServer{}}
	chaosEngines["openai"] = chaosEngineKind{
		args: func(t *testing.T, ip string) []string {
			args := []string{"--engine", "openai", "--model", simModel, "--engine-health-interval", "200ms"}
			for _, srv := range s.of(t, ip) {
				args = append(args, "--engine-url", srv.url)
			}
			return args
		},
		expected: func(_ *testing.T, reqs []chaosRequest) []string {
			out := make([]string, len(reqs))
			for i, q := range reqs {
				out[i] = simText(q.prompt, q.maxTokens)
			}
			return out
		},
		inexactMoves: true,
		faults: func(r *chaosRun) []func() fault {
			kill := func() fault { return s.kill(r) }
			return []func() fault{kill, kill}
		},
		check: func(*chaosRun) {},
	}
}

// chaosServers are the servers of every node, by the node's address.
type chaosServers struct {
	mu   sync.Mutex
	byIP map[string][]*chaosServer
}

type chaosServer struct {
	args []string
	url  string
	p    *proc
}

// of starts ip's two servers, once: a node restarted or added again finds
// them where they were.
func (s *chaosServers) of(t *testing.T, ip string) []*chaosServer {
	s.mu.Lock()
	defer s.mu.Unlock()
	if srvs, ok := s.byIP[ip]; ok {
		return srvs
	}
	var srvs []*chaosServer
	for k := range 2 {
		port := 18100 + k
		args := nodeArgs(ip, "--host", ip, "--port", fmt.Sprint(port), "--bind", fmt.Sprintf("%s:%d", ip, 17100+k),
			"--data-parallel-rpc-port", "0", "--gpus", "1", "--sim-time-scale", "0.2")
		srv := &chaosServer{args: args, url: fmt.Sprintf("http://%s:%d", ip, port)}
		srv.p = startProc(t, ip, args...)
		srvs = append(srvs, srv)
	}
	s.byIP[ip] = srvs
	return srvs
}

// kill kills a server (SIGKILL) and starts it again on its port.
func (s *chaosServers) kill(r *chaosRun) fault {
	s.mu.Lock()
	var all []*chaosServer
	for _, ip := range []string{"127.0.0.181", "127.0.0.182", "127.0.0.183"} {
		all = append(all, s.byIP[ip]...)
	}
	s.mu.Unlock()
	srv := all[r.rng.IntN(len(all))]
	f := fault{kind: "kill -9 an engine's server", name: "kill -9 the server " + srv.url + " and restart it", start: time.Now()}
	srv.p.signal(syscall.SIGKILL)
	<-srv.p.done
	time.Sleep(time.Duration(1+r.rng.IntN(3)) * time.Second)
	srv.p = startProc(r.t, srv.p.ip, srv.args...)
	r.waitWhole()
	f.end = time.Now()
	return f
}
