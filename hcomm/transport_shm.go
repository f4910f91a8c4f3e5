package hcomm

import (
	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/shm"
)

// The shm transport: one Dialer per communicator. Ranks reach each other over
// shm when their shm.HostID (host, boot, network and pid namespaces) is equal;
// it is published in the bootstrap. Where the system lacks what shm needs,
// HostID is empty and shm is never chosen.

func newShmDialer(c *Comm) (channel.Dialer, error) {
	return shm.NewDialer(shm.Options{NoPeerReads: c.cfg.ShmCMADisable})
}

// shmHostID names what processes must share to reach each other over shm
// (shm.HostID); "" means never.
func shmHostID() string { return shm.HostID() }
