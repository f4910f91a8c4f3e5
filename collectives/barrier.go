package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Barrier enqueues on s a barrier: no task after it on s runs before every
// rank has reached it (HcclBarrier).
func Barrier(c *hcomm.Comm, s *device.Stream) error {
	const name = "Barrier"
	if err := checkArgs(c, name, 0, hcomm.Int8, hcomm.Sum, s); err != nil {
		return err
	}
	if done, err := laneBarrier(c, s); done { // lane.go
		return err
	}
	h := header{kind: kBarrier, dt: hcomm.Int8}
	if grouping(c) && recordCall(c, name, func() error { return Barrier(c, s) }) {
		return nil // group.go: GroupEnd issues it
	}
	return issue(c, name, kBarrier, s, nil, 0, func(sc *sched, algo Algorithm) error {
		h.algo = AlgoOneShot
		if sc.sparse() {
			// Above helloFullMax ranks the butterfly is the barrier (a
			// dissemination barrier: log2(n) rounds).
			sc.butterfly(h, nil)
			return nil
		}
		sc.hello(h, sc.others(), 0, 0, nil)
		return nil
	})
}
