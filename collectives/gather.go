package collectives

import (
	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/hcomm"
)

// Gather enqueues on s the collection of every rank's sendCount elements into
// root's recv, rank p's at recv + p*sendCount (MPI_Gather; HCCL has none).
// recv is only written on root.
func Gather(send, recv device.Ptr, sendCount int64, dt hcomm.DataType, root int, c *hcomm.Comm, s *device.Stream, o *Options) error {
	return rooted(c, "Gather", kGather, send, recv, sendCount, dt, root, s, o)
}
