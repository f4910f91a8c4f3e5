//go:build !race

package hcomm_test

// raceEnabled tells the tests that the race detector slows this binary.
const raceEnabled = false
