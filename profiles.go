// Package dpnode holds the data files compiled into the dpnode binary: the
// simulated executor's profiles.
package dpnode

import "embed"

// SimProfiles holds every profile of the simulated executor, one JSON file
// each under testdata/profiles/ (see engine/sim.LoadProfile). They live in
// testdata so the go tool treats them as data, and are embedded so the
// binary runs a named profile without the source tree.
//
//go:embed testdata/profiles/*.json
var SimProfiles embed.FS
