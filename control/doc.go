// Package control is the control plane: who leads the cluster, which node
// holds which ranks, and the gossip and TLS that carry and guard it. The
// node actor that acts on it lives in actors/, which this package does
// not import.
//
// The files. election.go and roster.go are pure logic: nothing there
// starts a goroutine, reads a clock or touches a socket. gossip.go is a
// node's membership (hashicorp/memberlist): its start and join (seeds,
// backoff, the founder), claims and releases of ranks, and rosters on the
// wire. delegate.go is what memberlist calls: which peers it admits
// (conflicts, mismatches, their certificate's check), the rosters and
// refusals it takes, the membership events it hands on. tls.go is cluster
// TLS (TLSFiles): the actor transport's mutual TLS and the check of a
// peer's certificate; seal.go signs and checks what nodes gossip under it
// (Seal); ca.go is the CA that dpnode certs writes.
//
// Where a change goes. How ranks are given out, committed and released:
// roster.go. Who leads and when there is a quorum: election.go. Who may
// join, and what a node gossips: delegate.go and gossip.go. Certificates
// and signatures: tls.go, seal.go, ca.go. How the leader's node acts on
// these decisions (it receives the claims, publishes the rosters, sweeps
// joining holds, probes peers) is the node actor's: actors/node_authority.go
// and actors/node_liveness.go. Those are actor behaviour (messages,
// timers, watched processes), so they stay beside the actors they drive;
// every decision they apply is a pure function here, and this package
// imports no actors.
//
// Two words are kept apart. The leader is the node that decides the
// roster. The coordinator is vLLM's DP coordinator: the actor that gathers
// the ranks' loads, publishes snapshots and steps expert-parallel waves.
// The leader's node runs it, so the two fail over together; on the wire,
// in metrics and in /v1/cluster the leader is still called the
// coordinator's node, which dashboards and mixed-version clusters read.
//
// # The protocol
//
// Join. A node joins gossip (hashicorp/memberlist) with its metadata: what
// it serves (model, engine, expert parallelism), its boot time, and either
// the ranks it serves and its actor address, or, while it waits to be given
// ranks, the actor address where it already listens (joining). A peer that
// serves something else, or whose fixed ranks another node already serves,
// is refused at the join. Under cluster TLS a peer counts only once the
// actor transport at the address it gossips has shown a certificate of the
// cluster's CA and answered Identify with the peer's name; one that gossips
// no address is not counted.
//
// Elect. Every node runs Elect over the members it sees. The leader is the
// oldest member that serves (boot time, then name); its epoch is its boot
// time, so a later leader always has a larger one. There is a quorum when
// the members seen hold a majority of the ranks; without one no coordinator
// runs, so the two halves of a split cluster never both coordinate. A
// joining node counts only through the ranks the roster already gave it,
// and never leads.
//
// Claim. A node whose ranks are given out (--data-parallel-size auto, or a
// start rank of auto) sends a claim over the actor transport to every
// serving member's node actor until the roster answers it; gossip carries
// no claims, since its messages say nothing of who sent them. Only the
// leader acts, and only for a node gossip counts: Roster.Assign gives the
// lowest free ranks (or those asked for), or the claim is refused with a
// reason sent back. The first node of a deployment, finding no roster,
// founds it with its own ranks.
//
// Commit. An assigned hold is joining until its node serves those ranks
// (its metadata shows them): the leader then commits it, and the ranks
// join the deployment. A joining node that leaves first has its hold
// released; a new leader settles the joining holds it inherits.
//
// Release. A node leaving on purpose drains, then claims with release set:
// the leader takes its ranks out of the waves at once and releases them. A
// node that dies keeps its ranks (the size does not shrink) and takes
// them back when it returns under the same identity (--node-id, or else
// its gossip address).
//
// Spread. Each decision is a Roster with a larger version (ties broken by
// epoch), gossiped by broadcast, sent to every member over TCP, and part
// of every full state exchange. Nodes adopt only a newer roster; under
// cluster TLS the deciding node signs it, and nodes adopt no roster
// without a signature of a certificate of the CA. A node adopts a roster
// as the truth about ranks: its API server balances over the ranks it
// lists, and the coordinator keeps loads only for them.
package control
