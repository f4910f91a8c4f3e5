package hcomm

import (
	"github.com/hcomm-dev/hcomm/channel"
	"github.com/hcomm-dev/hcomm/channel/shm"
)

// The shm transport: one Dialer per communicator. Ranks reach each other over
// shm when their shm.HostID (host, boot, network and pid namespaces) is equal;
// it is published in the bootstrap. Where the system lacks what shm needs,
// HostID is empty and shm is never chosen.
func init() {
	dialerMakers[TransportShm] = func(c *Comm) (channel.Dialer, error) { return shm.NewDialer(shm.Options{}) }
	shmHostID = shm.HostID
}
