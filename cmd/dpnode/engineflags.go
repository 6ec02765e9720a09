package main

import (
	"fmt"
	"strings"

	"github.com/spf13/pflag"

	"github.com/dpnode/dpnode/engines"
)

// engineHelp lists the engines for --engine's help.
func engineHelp() string {
	var names []string
	for _, e := range engines.All() {
		names = append(names, fmt.Sprintf("%s (%s)", e.Name, e.Summary))
	}
	return strings.Join(names, ", ")
}

// checkEngineFlags refuses a flag of an engine other than the chosen one:
// it would be ignored, and the node would not serve as asked.
func checkEngineFlags(chosen string, flags map[string]*pflag.FlagSet) error {
	for _, e := range engines.All() {
		if e.Name == chosen {
			continue
		}
		var err error
		// The command line was parsed on the command's set, which shares
		// the engine's flags: Changed is theirs, Visit's list is not.
		flags[e.Name].VisitAll(func(f *pflag.Flag) {
			if err == nil && f.Changed && !ownedByChosen(f.Name, chosen, flags) {
				err = fmt.Errorf("invalid flags: --%s is the %s engine's; --engine %s does not use it", f.Name, e.Name, chosen)
			}
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// ownedByChosen reports whether the chosen engine takes the flag too.
func ownedByChosen(name, chosen string, flags map[string]*pflag.FlagSet) bool {
	fs := flags[chosen]
	return fs != nil && fs.Lookup(name) != nil
}
