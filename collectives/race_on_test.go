//go:build race

package collectives_test

// raceEnabled: the race detector slows these tests about tenfold; the
// matrices then cover fewer combinations, and `make test` runs them whole
// without it.
const raceEnabled = true
