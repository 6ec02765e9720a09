// Package dp holds the pure logic of data parallelism: which rank takes a
// request (balancing policies), which ranks a node hosts and serves
// (topology and flag validation), and when the coordinator publishes load.
//
// Nothing here starts a goroutine, reads a clock or touches a socket: time
// comes in as arguments, so the same code runs in actors, in tests and in a
// virtual-time simulator.
package dp
