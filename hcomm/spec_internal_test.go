package hcomm

import (
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestBootstrapSpecStatesTheIdleTimeout ties internal/bootstrap/spec.md's
// idle timeout, the time after which a silent rank is lost, to the value
// hcomm gives the bootstrap server (the spec once said [2 s, 30 s] while
// the code computed [5 s, 30 s]; now both are HCOMM_LIVENESS_TIMEOUT).
func TestBootstrapSpecStatesTheIdleTimeout(t *testing.T) {
	b, err := os.ReadFile("../internal/bootstrap/spec.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`HCOMM_LIVENESS_TIMEOUT,\s+(\d+)\s+s\s+by\s+default`).FindSubmatch(b)
	if m == nil {
		t.Fatal("spec.md does not state the idle timeout as HCOMM_LIVENESS_TIMEOUT with its default")
	}
	s, _ := strconv.Atoi(string(m[1]))
	if got := time.Duration(s) * time.Second; got != DefaultLivenessTimeout {
		t.Fatalf("spec.md says the idle timeout defaults to %v, the code %v", got, DefaultLivenessTimeout)
	}
	if got := (Config{}).livenessTimeout(); got != DefaultLivenessTimeout {
		t.Fatalf("a zero Config's liveness timeout is %v, want the default %v", got, DefaultLivenessTimeout)
	}
}
