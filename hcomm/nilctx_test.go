package hcomm_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/hcomm"
	"github.com/hcomm-dev/hcomm/hcommtest"
)

// TestNilContext: every call of the package that takes a context refuses a
// nil one with ErrPara naming the call, before it creates, connects or
// waits for anything — a nil-pointer panic deep inside a setup or a wait is
// what the check replaces.
func TestNilContext(t *testing.T) {
	comms := hcommtest.Options{Config: &hcomm.Config{Name: "nilctx", BufferSize: 64 << 10}}.New(t, 2, hcommtest.Auto)
	c := comms[0]
	threads, err := c.ThreadAcquire(hcomm.EngineCPU, 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer c.ThreadFree(threads)
	d := hcomm.ChannelDescInit(1)
	d[0].RemoteRank = 1
	var nilCtx context.Context
	var m hcomm.Membership
	for _, k := range []struct {
		op   string
		call func() error
	}{
		{"InitFromEnv", func() error { _, err := hcomm.InitFromEnvContext(nilCtx, nil); return err }},
		{"InitRootInfo", func() error {
			_, err := hcomm.InitRootInfoContext(nilCtx, 2, hcomm.RootInfo{}, 0, nil)
			return err
		}},
		{"InitClusterInfo", func() error { _, err := hcomm.InitClusterInfoContext(nilCtx, "ranktable.json", 0, nil); return err }},
		{"Join", func() error { _, err := hcomm.JoinContext(nilCtx, hcomm.JoinToken{}, 0, nil); return err }},
		{"ElasticFromEnv", func() error { _, err := hcomm.ElasticFromEnv(nilCtx); return err }},
		{"Membership.Pending", func() error { _, err := m.Pending(nilCtx); return err }},
		{"Membership.Admit", func() error { return m.Admit(nilCtx, hcomm.JoinToken{}) }},
		{"Membership.AwaitToken", func() error { _, _, err := m.AwaitToken(nilCtx); return err }},
		{"Membership.End", func() error { return m.End(nilCtx) }},
		{"ChannelAcquire", func() error { _, err := c.ChannelAcquireContext(nilCtx, hcomm.EngineCPU, d); return err }},
		{"Split", func() error { _, err := c.SplitContext(nilCtx, 0, 0, nil); return err }},
		{"Grow", func() error { _, err := c.Grow(nilCtx, hcomm.JoinToken{}, nil); return err }},
		{"Shrink", func() error { _, _, err := c.Shrink(nilCtx, []int{1}, nil); return err }},
		{"ThreadSynchronize", func() error { return hcomm.ThreadSynchronizeContext(nilCtx, threads[0]) }},
	} {
		err := k.call()
		var he *hcomm.Error
		if !errors.As(err, &he) || he.Op != k.op || he.Code != hcomm.ErrPara || !strings.Contains(err.Error(), "nil context") {
			t.Errorf("%s(nil context): %v, want an ErrPara *hcomm.Error of %s naming the nil context", k.op, err, k.op)
		}
	}
}
