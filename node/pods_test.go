package node_test

import (
	"fmt"
	"io"
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

	"github.com/dpnode/dpnode/node"
)

// spawnPod starts dpnode as a StatefulSet's pod: in its own UTS and mount
// namespaces, with the pod's host name, and a hosts file in which the
// headless Service's name resolves to every pod. It does not wait for
// the node to serve.
func spawnPod(t *testing.T, ip, host, hosts string, args ...string) *proc {
	t.Helper()
	const script = `mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"`
	return spawn(t, ip, "unshare", append([]string{"--uts", "--mount", "sh", "-c", script, "sh", hosts, host, dpnodeBin}, args...)...)
}

// TestPodsStartInAnyOrder starts three nodes as Kubernetes starts a
// StatefulSet's pods (in parallel, in any order), each with the same
// flags: its seeds the headless Service's name, its ranks given out, the
// first ordinal the founder, and its pod name its identity. The other
// pods come up first: they find no seed, retry, find each other, and wait
// for ranks; the founder joins them, starts the roster and gives them
// ranks. Killed and recreated at another address, as a pod whose machine
// died is, the founder joins the cluster that runs rather than founding
// another, and takes its ranks back.
func TestPodsStartInAnyOrder(t *testing.T) {
	if err := exec.Command("unshare", "--uts", "--mount", "true").Run(); err != nil {
		t.Skipf("needs new UTS and mount namespaces (root): %v", err)
	}
	ips := []string{"127.0.0.81", "127.0.0.82", "127.0.0.83"}
	const recreatedAt = "127.0.0.84"
	hosts := filepath.Join(t.TempDir(), "hosts")
	table := "127.0.0.1 localhost\n"
	for i, ip := range ips {
		table += fmt.Sprintf("%s dpnode-%d.dpnode dpnode\n", ip, i)
	}
	if err := os.WriteFile(hosts, []byte(table), 0o644); err != nil {
		t.Fatal(err)
	}
	pod := func(i int, ip string) *proc {
		name := fmt.Sprintf("dpnode-%d", i)
		return spawnPod(t, ip, name, hosts, nodeArgs(ip, "--host", ip, "--port", "0", "--node-id", name,
			"--seeds", "dpnode:7946", "--founder", node.FirstOrdinal, "--join-timeout", "2m",
			"--data-parallel-size", "6", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "auto")...)
	}
	p1 := pod(1, ips[1])
	p1.waitLog(`msg="waiting for a seed to answer"`, 30*time.Second)
	p2 := pod(2, ips[2])
	// The two find each other by the name, and wait for ranks together.
	for _, p := range []*proc{p1, p2} {
		p.waitLog(`msg="joined; asking the leader for ranks"`, 30*time.Second)
	}
	p0 := pod(0, ips[0])
	for _, p := range []*proc{p0, p1, p2} {
		if err := p.serving(); err != nil {
			t.Fatalf("the pod on %s: %v\n%s", p.ip, err, p.logs)
		}
	}
	p0.waitLog(`msg="no roster yet: this node founds the deployment"`, time.Second)
	v := p0.waitView("every pod holds two ranks", 30*time.Second, func(v clusterView) bool {
		return len(v.Nodes) == 3 && len(v.Roster.Holds) == 3 && len(v.Ranks) == 6
	})
	for _, r := range v.Ranks {
		if r.Node == p0.name && r.Rank > 1 {
			t.Errorf("the founder serves rank %d; it takes the first ranks, 0 and 1: %+v", r.Rank, v.Ranks)
		}
	}
	// The roster knows the pods by name: the founder holds ranks 0-1,
	// the others 2-3 and 4-5 in the order they were given them.
	var holders []string
	for _, h := range v.Roster.Holds {
		holders = append(holders, h.Node)
	}
	slices.Sort(holders[1:])
	if !slices.Equal(holders, []string{"dpnode-0", "dpnode-1", "dpnode-2"}) || v.Roster.Holds[0].FirstRank != 0 {
		t.Errorf("the roster's holds: %+v; want dpnode-0 on ranks 0-1, then dpnode-1 and dpnode-2", v.Roster.Holds)
	}
	if failed, err := burst(p1.url, 12, 3); failed > 0 {
		t.Fatalf("%d requests failed; first: %v", failed, err)
	}

	// The founder's pod is recreated (same name, another address) while
	// the others run: it joins them and serves its ranks again.
	p0.kill()
	p0 = pod(0, recreatedAt)
	if err := p0.serving(); err != nil {
		t.Fatalf("the restarted founder: %v\n%s", err, p0.logs)
	}
	p1.waitView("one cluster of three pods, the founder back on ranks 0 and 1", 30*time.Second, func(v clusterView) bool {
		if len(v.Nodes) != 3 || len(v.Ranks) != 6 {
			return false
		}
		for _, r := range v.Ranks {
			if (r.Rank < 2) != (r.Node == p0.name) || !r.Ready {
				return false
			}
		}
		return true
	})
	if line, _ := p0.logs.find(regexp.MustCompile(`this node starts the cluster|this node founds the deployment`), 0); line != "" {
		t.Fatalf("the restarted founder founded again: %s", line)
	}
}

// TestStartingNodeAnswers: a node waiting for its seeds (as it would while
// loading its model) answers on its port at once: /health says starting,
// and a request gets a 503 it can retry elsewhere, where a port that
// accepts and never answers would read as hung to a probe. SIGTERM stops
// its wait.
func TestStartingNodeAnswers(t *testing.T) {
	const ip = "127.0.0.87"
	p := spawn(t, ip, dpnodeBin, nodeArgs(ip, "--host", ip, "--port", "8000", "--data-parallel-start-rank", "auto",
		"--data-parallel-size", "2", "--seeds", "127.0.0.88:7946", "--join-timeout", "1m")...)
	p.waitLog(`msg="waiting for a seed to answer"`, 30*time.Second)
	client := &http.Client{Timeout: 5 * time.Second}
	for path, want := range map[string]string{"/health": `"status":"starting"`, "/v1/models": `"code":"starting"`} {
		resp, err := client.Get("http://" + ip + ":8000" + path)
		if err != nil {
			t.Fatalf("GET %s while the node joins: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(body), want) || resp.Header.Get("Retry-After") == "" {
			t.Errorf("GET %s while the node joins: %d %s (Retry-After %q); want 503 with %s", path, resp.StatusCode, body, resp.Header.Get("Retry-After"), want)
		}
	}
	// SIGTERM while it waits (a pod deleted before it joined): it stops
	// at once, not at the end of --join-timeout, and exits 0.
	p.signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			t.Fatalf("stopped while joining: %v, want exit 0", p.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("SIGTERM did not stop a node waiting for its seeds")
	}
}

// TestNewerNodeWithTheSameIDReplacesTheOlder: two live nodes with one
// --node-id would serve the same ranks. The newer one, once it serves,
// takes over: the older (a pod cut off and replaced, still running) goes.
func TestNewerNodeWithTheSameIDReplacesTheOlder(t *testing.T) {
	const ipA, ipB = "127.0.0.93", "127.0.0.94"
	args := func(ip string, extra ...string) []string {
		return nodeArgs(ip, append([]string{"--host", ip, "--port", "0", "--node-id", "dpnode-0",
			"--data-parallel-size", "2", "--data-parallel-size-local", "2", "--data-parallel-start-rank", "auto"}, extra...)...)
	}
	a := startProc(t, ipA, args(ipA)...)
	b := startProc(t, ipB, args(ipB, "--seeds", ipA+":7946")...)
	select {
	case <-a.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the older node with the same --node-id still runs")
	}
	a.waitLog(`a newer node with this node's --node-id "dpnode-0" serves, at 127.0.0.94:7946`, time.Second)
	b.waitView("the newer node alone, on the ID's ranks", 15*time.Second, func(v clusterView) bool {
		return len(v.Nodes) == 1 && len(v.Ranks) == 2 && v.Ranks[0].Node == b.name && v.Ranks[0].Ready && v.Ranks[1].Ready
	})
	if failed, err := burst(b.url, 12, 3); failed > 0 {
		t.Fatalf("%d requests failed; first: %v", failed, err)
	}
}
