// Package sim is the simulated executor: a calibrated cost model of a named
// GPU+model profile, and deterministic text.
//
// A Profile (profile.go) is data loaded from a JSON file: the served model,
// its KV capacity and scheduler limits, the cost coefficients and the public
// measurements they were fitted to. The cost model (costmodel.go) is pure:
// given the shape of one engine step it returns how long that step takes on
// the profiled hardware, with no clock, goroutine or I/O, so the same batch
// always costs the same time.
package sim
