//go:build race

package sim

// raceEnabled: the race detector slows the simulator about sixfold, and a
// bootstrap's refits are many simulations; `make test` runs
// TestBootstrapSpread without it.
const raceEnabled = true
