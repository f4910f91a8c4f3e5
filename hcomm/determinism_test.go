package hcomm

import (
	"strings"
	"testing"
)

func TestDeterministicFromEnvAndConfig(t *testing.T) {
	for _, tc := range []struct {
		env  string // "-": unset
		cfg  Determinism
		want Determinism
	}{
		{"-", DeterministicDefault, DeterministicOff},
		{"", DeterministicDefault, DeterministicOff},
		{"false", DeterministicDefault, DeterministicOff},
		{"FALSE", DeterministicDefault, DeterministicOff},
		{"0", DeterministicDefault, DeterministicOff},
		{"true", DeterministicDefault, DeterministicOn},
		{" True ", DeterministicDefault, DeterministicOn},
		{"1", DeterministicDefault, DeterministicOn},
		{"strict", DeterministicDefault, DeterministicStrict},
		{"STRICT", DeterministicDefault, DeterministicStrict},
		// code wins over the environment
		{"strict", DeterministicOff, DeterministicOff},
		{"false", DeterministicStrict, DeterministicStrict},
		{"-", DeterministicOn, DeterministicOn},
	} {
		if tc.env == "-" {
			t.Setenv("HCCL_DETERMINISTIC", "")
		} else {
			t.Setenv("HCCL_DETERMINISTIC", tc.env)
		}
		c, err := Config{Deterministic: tc.cfg}.resolve()
		if err != nil {
			t.Fatalf("HCCL_DETERMINISTIC=%q, Config %v: %v", tc.env, tc.cfg, err)
		}
		if c.Deterministic != tc.want {
			t.Errorf("HCCL_DETERMINISTIC=%q, Config %v: resolved to %v, want %v", tc.env, tc.cfg, c.Deterministic, tc.want)
		}
	}
}

func TestDeterministicRefusesBadValues(t *testing.T) {
	t.Setenv("HCCL_DETERMINISTIC", "yes")
	_, err := Config{}.resolve()
	if err == nil || !strings.Contains(err.Error(), `HCCL_DETERMINISTIC="yes"`) || !strings.Contains(err.Error(), "strict") {
		t.Errorf("HCCL_DETERMINISTIC=yes: got %v, want an error naming the variable and its values", err)
	}
	t.Setenv("HCCL_DETERMINISTIC", "")
	_, err = Config{Deterministic: 7}.resolve()
	if err == nil || !strings.Contains(err.Error(), "Config.Deterministic 7") {
		t.Errorf("Config.Deterministic 7: got %v, want an error naming the field", err)
	}
	if got := Determinism(7).String(); got != "Determinism(7)" {
		t.Errorf("Determinism(7).String() = %q", got)
	}
}
