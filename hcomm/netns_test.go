package hcomm_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hcomm-dev/hcomm/hcomm"
)

// The multi-host test: one rank per network namespace, the namespaces joined
// by veth pairs to a bridge with private addresses, so that each rank sees
// only its own interface — as on separate hosts — and reaches the others over
// tcp. It needs root and ip(8); CI runs as root.

const netnsPrefix = "hcnt" // every name this test creates starts with it

func ipCmd(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// cleanupNetns removes the namespaces and links of this run (id) and the
// leftovers of runs that were killed: a namespace is named
// <prefix><4 hex>-<pid>-<i>, and one whose pid is gone is a leftover, as is a
// link whose <4 hex> names no namespace (namespaces are made before links).
// A run of this test in another live process is left alone.
func cleanupNetns(t *testing.T, id string) {
	live := map[string]bool{} // run ids with a namespace of a live process
	if out, err := ipCmd("netns", "list"); err == nil {
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) == 0 || !strings.HasPrefix(f[0], netnsPrefix) {
				continue
			}
			name := f[0]
			parts := strings.Split(strings.TrimPrefix(name, netnsPrefix), "-")
			run := netnsPrefix + parts[0]
			pid := 0
			if len(parts) == 3 {
				pid, _ = strconv.Atoi(parts[1])
			}
			if run != id && pid > 0 && pid != os.Getpid() && syscall.Kill(pid, 0) != syscall.ESRCH {
				live[run] = true
				continue
			}
			if _, err := ipCmd("netns", "delete", name); err != nil {
				t.Logf("cleanup: %v", err)
			}
		}
	}
	if out, err := ipCmd("-o", "link", "show"); err == nil {
		for _, l := range strings.Split(out, "\n") {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			if !strings.HasPrefix(name, netnsPrefix) || len(name) < len(netnsPrefix)+4 || live[name[:len(netnsPrefix)+4]] {
				continue
			}
			if _, err := ipCmd("link", "delete", name); err != nil {
				t.Logf("cleanup: %v", err)
			}
		}
	}
}

// netnsHosts is a set of network namespaces joined by veth pairs to one
// bridge: n "hosts" at subnet.1 .. subnet.n.
type netnsHosts struct {
	id     string
	subnet string
	n      int
}

func (h *netnsHosts) ns(i int) string      { return fmt.Sprintf("%s-%d-%d", h.id, os.Getpid(), i) }
func (h *netnsHosts) hostEnd(i int) string { return fmt.Sprintf("%sh%d", h.id, i) }
func (h *netnsHosts) nsEnd(i int) string   { return fmt.Sprintf("%sn%d", h.id, i) }
func (h *netnsHosts) addr(i int) string    { return fmt.Sprintf("%s.%d", h.subnet, i+1) }

// makeNetnsHosts creates n namespaces, skipping the test where it cannot
// (not root, no ip(8), no tcp transport); everything is removed at cleanup.
func makeNetnsHosts(t *testing.T, n int) *netnsHosts {
	t.Helper()
	if testing.Short() {
		t.Skip("-short")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create network namespaces (CI runs as root)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs ip(8) from iproute2")
	}
	if !slices.Contains(hcomm.Transports(), hcomm.TransportTCP) {
		t.Skip("this build has no tcp transport")
	}
	var sfx [2]byte
	rand.Read(sfx[:])
	h := &netnsHosts{id: netnsPrefix + hex.EncodeToString(sfx[:]), subnet: fmt.Sprintf("10.213.%d", 1+int(sfx[0])%250), n: n}
	cleanupNetns(t, h.id)
	t.Cleanup(func() { cleanupNetns(t, h.id) })
	if _, err := ipCmd("netns", "add", h.ns(0)); err != nil {
		t.Skipf("cannot create network namespaces here: %v", err)
	}
	br := h.id + "br"
	steps := [][]string{{"link", "add", br, "type", "bridge"}, {"link", "set", br, "up"}}
	for i := 0; i < n; i++ {
		if i > 0 {
			steps = append(steps, []string{"netns", "add", h.ns(i)})
		}
		steps = append(steps,
			[]string{"link", "add", h.hostEnd(i), "type", "veth", "peer", "name", h.nsEnd(i)},
			[]string{"link", "set", h.nsEnd(i), "netns", h.ns(i)},
			[]string{"link", "set", h.hostEnd(i), "master", br},
			[]string{"link", "set", h.hostEnd(i), "up"},
			[]string{"-n", h.ns(i), "addr", "add", h.addr(i) + "/24", "dev", h.nsEnd(i)},
			[]string{"-n", h.ns(i), "link", "set", h.nsEnd(i), "up"},
			[]string{"-n", h.ns(i), "link", "set", "lo", "up"})
	}
	for _, s := range steps {
		if _, err := ipCmd(s...); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

func TestMultiHostNetns(t *testing.T) {
	// HCCL_EXEC_TIMEOUT 12 s: rank 0's store reports the silent rank lost
	// after half of it, before any wait on it times out.
	const n, victim, execTimeout = 3, 2, 12 * time.Second
	h := makeNetnsHosts(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	procs := launchRanks(t, ctx, n, "loop",
		func(r int) []string { return []string{"ip", "netns", "exec", h.ns(r)} },
		func(r int) []string {
			return []string{"MASTER_ADDR=" + h.addr(0), "MASTER_PORT=29500",
				"HCOMM_SOCKET_IFNAME==" + h.nsEnd(r), "HCOMM_TRANSPORT=tcp",
				fmt.Sprintf("HCCL_EXEC_TIMEOUT=%d", int(execTimeout/time.Second))}
		})
	for _, p := range procs {
		waitLine(t, p, "READY", 60*time.Second) // the first allreduce is checked by the rank
	}
	time.Sleep(100 * time.Millisecond)
	down := time.Now()
	if _, err := ipCmd("link", "set", h.hostEnd(victim), "down"); err != nil {
		t.Fatal(err)
	}
	checkSurvivors(t, procs, victim, down, execTimeout)
}
