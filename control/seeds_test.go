package control

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dpnode/dpnode/control/controltest"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// gossipOn starts a gossip endpoint on ip:7946 with the seeds and rule
// given.
func gossipOn(t *testing.T, ip string, dns Resolver, founder bool, timeout time.Duration, seeds ...string) (*Membership, error) {
	t.Helper()
	m, err := StartMembership(context.Background(), MembershipConfig{
		Name: "node-" + ip, Bind: ip + ":7946", Seeds: seeds, Resolver: dns, Founder: founder, JoinTimeout: timeout,
		Profile: "local", Meta: &dpnodev1.NodeMeta{Model: "m"}, Logger: slog.New(slog.DiscardHandler),
	})
	if err == nil {
		t.Cleanup(func() { m.Leave(time.Second) })
	}
	return m, err
}

func TestSeedAddressesResolveEveryName(t *testing.T) {
	dns := &controltest.DNS{Names: map[string][]string{
		"dpnode-headless": {"10.0.0.1", "10.0.0.2", "10.0.0.3"},
		"dpnode-0":        {"10.0.0.1"},
	}}
	got, err := seedAddresses(dns, []string{"dpnode-headless:7946", "dpnode-0", "10.0.0.9:7000", "gone:7946"}, 7946, "10.0.0.2:7946")
	want := []string{"10.0.0.1:7946", "10.0.0.3:7946", "10.0.0.9:7000"}
	if !slices.Equal(got, want) {
		t.Errorf("addresses %v, want %v: every address of each name, this node's own left out, no repeats", got, want)
	}
	var dnsErr *net.DNSError
	if !errors.As(err, &dnsErr) || !strings.Contains(err.Error(), `seed "gone:7946"`) {
		t.Errorf("the name that resolves to nothing: error %v, want it named", err)
	}
	if got, err := seedAddresses(dns, []string{"dpnode-0:7946"}, 7946, "10.0.0.1:7946"); len(got) != 0 || err == nil {
		t.Errorf("seeds naming only this node: %v, %v; want none and an error", got, err)
	}
	if _, err := seedAddresses(dns, []string{"dpnode-0:http"}, 7946, ""); err == nil {
		t.Error("a seed with a bad port was taken")
	}
	// IPv6: with a port in brackets, and without a port, bracketed or not.
	got, err = seedAddresses(dns, []string{"[fd00::1]:7000", "[fd00::2]", "fd00::3"}, 7946, "")
	if want := []string{"[fd00::1]:7000", "[fd00::2]:7946", "[fd00::3]:7946"}; err != nil || !slices.Equal(got, want) {
		t.Errorf("IPv6 seeds: %v, %v; want %v", got, err, want)
	}
}

// TestSeedThatIsThisNodeIsNoJoin: a seed that routes back to this node
// under another address (here its bind address, while it advertises
// another) answers the join, as memberlist counts it; it is not a cluster
// to join, and a node that is not the founder keeps waiting.
func TestSeedThatIsThisNodeIsNoJoin(t *testing.T) {
	_, err := StartMembership(context.Background(), MembershipConfig{
		Name: "self-seeded", Bind: "127.0.0.227:7946", Advertise: "127.0.0.228:7946", Seeds: []string{"127.0.0.227:7946"},
		JoinTimeout: time.Second, Profile: "local", Meta: &dpnodev1.NodeMeta{Model: "m"}, Logger: slog.New(slog.DiscardHandler),
	})
	if err == nil || !strings.Contains(err.Error(), "the seeds that answered are this node itself") {
		t.Fatalf("a node whose only seed is itself: %v; want it to wait for a real one, and say why it gave up", err)
	}
}

// TestFounderStartsAndOthersJoinByName: the founder whose seeds do not
// answer starts the cluster at once; a node whose seed is a name that
// resolves to every node (itself, the founder and one not up) joins it.
func TestFounderStartsAndOthersJoinByName(t *testing.T) {
	dns := &controltest.DNS{Names: map[string][]string{"dpnode-headless": {"127.0.0.221", "127.0.0.222", "127.0.0.223"}}}
	a, err := gossipOn(t, "127.0.0.221", dns, true, time.Minute, "dpnode-headless:7946")
	if err != nil {
		t.Fatalf("the founder: %v", err)
	}
	b, err := gossipOn(t, "127.0.0.222", dns, false, time.Minute, "dpnode-headless:7946")
	if err != nil {
		t.Fatalf("the second node: %v", err)
	}
	waitMembers(t, "the joiner", b, 2)
	waitMembers(t, "the founder", a, 2)
}

// waitMembers waits until m sees n members: the side that was joined
// merges the joiner's state after the joiner has returned.
func waitMembers(t *testing.T, who string, m *Membership, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for m.NumMembers() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%s sees %d members, want %d", who, m.NumMembers(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestJoinWaitsForAFounder: a node started before any of its seeds is up
// resolves and tries again until one answers, and then joins it.
func TestJoinWaitsForAFounder(t *testing.T) {
	dns := &controltest.DNS{Names: map[string][]string{"dpnode-0.dpnode": {"127.0.0.225"}}, Looked: make(chan int, 1)}
	type result struct {
		m   *Membership
		err error
	}
	joined := make(chan result, 1)
	go func() {
		m, err := gossipOn(t, "127.0.0.224", dns, false, time.Minute, "dpnode-0.dpnode:7946")
		joined <- result{m, err}
	}()
	// The seed comes up only after the joiner has tried and is trying
	// again.
	for n := 0; n < 2; {
		select {
		case n = <-dns.Looked:
		case r := <-joined:
			t.Fatalf("the join ended before its seed was up: %v", r.err)
		case <-time.After(30 * time.Second):
			t.Fatal("the joiner did not look its seed up again")
		}
	}
	founder, err := gossipOn(t, "127.0.0.225", dns, true, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-joined:
		if r.err != nil {
			t.Fatalf("the join: %v", r.err)
		}
		waitMembers(t, "the joiner", r.m, 2)
		waitMembers(t, "the founder", founder, 2)
	case <-time.After(30 * time.Second):
		t.Fatal("the joiner did not join once its seed was up")
	}
}

// TestJoinGivesUpAtTheTimeout: a node whose seeds never answer, and that
// is not the founder, gives up after --join-timeout with an error that
// says what to change, having tried more than once.
func TestJoinGivesUpAtTheTimeout(t *testing.T) {
	dns := &controltest.DNS{Names: map[string][]string{}}
	_, err := gossipOn(t, "127.0.0.226", dns, false, 2*time.Second, "dpnode-headless:7946")
	if err == nil || !strings.Contains(err.Error(), "--join-timeout") || !strings.Contains(err.Error(), "no such host") {
		t.Fatalf("error %v; want one naming --join-timeout and the lookup's failure", err)
	}
	if n := dns.Lookups(); n < 2 {
		t.Fatalf("%d lookups; want the seed looked up again on each try", n)
	}
}
