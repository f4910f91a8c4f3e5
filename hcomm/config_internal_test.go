package hcomm

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/channel/tcp"
)

// A size or duration variable whose value overflows once scaled (MB to
// bytes, seconds to a Duration) is refused naming the variable and value,
// never wrapped into a small or negative size; the largest value that fits is
// taken as it is.
func TestEnvScaledOverflow(t *testing.T) {
	maxMB := int64(math.MaxInt64/2) >> 20
	maxS := int64(math.MaxInt64 / int64(time.Second))
	for _, tc := range []struct {
		name, val string
		ok        bool
	}{
		{"HCCL_BUFFSIZE", "9007199254740993", false}, // 2^53+1: wrapped to 2 MiB
		{"HCCL_BUFFSIZE", "8796093022208", false},    // 2^43: a negative byte count
		{"HCCL_BUFFSIZE", strconv.FormatInt(maxMB+1, 10), false},
		{"HCCL_BUFFSIZE", strconv.FormatInt(maxMB, 10), true},
		{"HCCL_CONNECT_TIMEOUT", "9223372037", false}, // > 2^63 ns
		{"HCCL_CONNECT_TIMEOUT", strconv.FormatInt(maxS, 10), true},
		{"HCCL_EXEC_TIMEOUT", "18446744073", false},
		{"HCCL_EXEC_TIMEOUT", strconv.FormatInt(maxS, 10), true},
		{"HCOMM_LIVENESS_TIMEOUT", "9223372037", false},
		{"HCOMM_LIVENESS_TIMEOUT", "0", false},
		{"HCOMM_LIVENESS_TIMEOUT", "-3", false},
		{"HCOMM_LIVENESS_TIMEOUT", strconv.FormatInt(maxS, 10), true},
	} {
		t.Run(tc.name+"="+tc.val, func(t *testing.T) {
			t.Setenv(tc.name, tc.val)
			c, err := Config{}.resolve()
			if !tc.ok {
				if err == nil || !strings.Contains(err.Error(), tc.name) || !strings.Contains(err.Error(), tc.val) {
					t.Fatalf("resolve = %+v, %v; want an error naming %s=%s", c, err, tc.name, tc.val)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.BufferSize <= 0 || 2*c.BufferSize <= 0 || c.ExecTimeout <= 0 || c.ConnectTimeout <= 0 || c.LivenessTimeout <= 0 {
				t.Fatalf("resolve = %+v: a size or timeout wrapped", c)
			}
		})
	}
	if _, err := (Config{BufferSize: math.MaxInt64/2 + 1}).resolve(); err == nil || !strings.Contains(err.Error(), "BufferSize") {
		t.Errorf("Config.BufferSize whose buffer overflows: %v", err)
	}
	if _, err := (Config{LivenessTimeout: -time.Second}).resolve(); err == nil || !strings.Contains(err.Error(), "LivenessTimeout") {
		t.Errorf("a negative Config.LivenessTimeout: %v", err)
	}
	t.Setenv("HCOMM_LIVENESS_TIMEOUT", "")
	if c, err := (Config{}).resolve(); err != nil || c.LivenessTimeout != DefaultLivenessTimeout {
		t.Errorf("LivenessTimeout by default = %v, %v; want %v", c.LivenessTimeout, err, DefaultLivenessTimeout)
	}
}

// HCOMM_TCP_SPIN is a duration (0: no polling, Config's negative); a bad
// value is refused naming the variable; code wins over it.
func TestTCPSpinSetting(t *testing.T) {
	for _, tc := range []struct {
		val  string
		want time.Duration // 0: an error
	}{
		{"", tcp.DefaultSpin},
		{"0", -1},
		{"1ms", time.Millisecond},
		{"50us", 50 * time.Microsecond},
		{"-1ms", 0},
		{"200", 0},
		{"2s", 0},
		{"fast", 0},
	} {
		t.Setenv("HCOMM_TCP_SPIN", tc.val)
		c, err := Config{}.resolve()
		if tc.want == 0 {
			if err == nil || !strings.Contains(err.Error(), "HCOMM_TCP_SPIN") || !strings.Contains(err.Error(), tc.val) {
				t.Errorf("HCOMM_TCP_SPIN=%q: resolve = %v, %v; want an error naming it", tc.val, c.TCPSpin, err)
			}
			continue
		}
		if err != nil || c.TCPSpin != tc.want {
			t.Errorf("HCOMM_TCP_SPIN=%q: TCPSpin = %v, %v; want %v", tc.val, c.TCPSpin, err, tc.want)
		}
	}
	t.Setenv("HCOMM_TCP_SPIN", "1ms")
	if c, err := (Config{TCPSpin: 5 * time.Microsecond}).resolve(); err != nil || c.TCPSpin != 5*time.Microsecond {
		t.Errorf("Config.TCPSpin 5µs under HCOMM_TCP_SPIN=1ms: %v, %v", c.TCPSpin, err)
	}
}

// HCOMM_TCP_CONGESTION: auto gives a 2-rank communicator's local sockets
// cubic, where the host allows it, and nothing else; system gives nothing;
// a name goes to every socket; a malformed value is refused naming the
// variable; code wins over it.
func TestTCPCongestionSetting(t *testing.T) {
	allow := func(string) error { return nil }
	refuse := func(name string) error { return fmt.Errorf("%s refused", name) }
	for _, c := range []struct {
		v             string
		n             int
		check         func(string) error
		remote, local string
	}{
		{"", 2, allow, "", "cubic"},
		{"auto", 2, allow, "", "cubic"},
		{"", 2, refuse, "", ""},
		{"", 3, allow, "", ""},
		{"auto", 64, allow, "", ""},
		{"system", 2, allow, "", ""},
		{"reno", 2, allow, "reno", "reno"},
		{"bbr", 8, allow, "bbr", "bbr"},
	} {
		remote, local := tcpCongestion(c.v, c.n, c.check)
		if remote != c.remote || local != c.local {
			t.Errorf("tcpCongestion(%q, %d ranks) = %q, %q; want %q, %q", c.v, c.n, remote, local, c.remote, c.local)
		}
	}
	for _, v := range []string{"Cubic", "bbr;rm", "a_name_longer_than_15", " cubic"} {
		t.Setenv("HCOMM_TCP_CONGESTION", v)
		if _, err := (Config{}).resolve(); err == nil || !strings.Contains(err.Error(), "HCOMM_TCP_CONGESTION") || !strings.Contains(err.Error(), fmt.Sprintf("%q", v)) {
			t.Errorf("HCOMM_TCP_CONGESTION=%q: resolve = %v; want an error naming it", v, err)
		}
	}
	t.Setenv("HCOMM_TCP_CONGESTION", "reno")
	if c, err := (Config{}).resolve(); err != nil || c.TCPCongestion != "reno" {
		t.Errorf("HCOMM_TCP_CONGESTION=reno: %q, %v", c.TCPCongestion, err)
	}
	if c, err := (Config{TCPCongestion: "system"}).resolve(); err != nil || c.TCPCongestion != "system" {
		t.Errorf("Config.TCPCongestion system under HCOMM_TCP_CONGESTION=reno: %q, %v", c.TCPCongestion, err)
	}
}
