package hcomm

import (
	"fmt"

	"github.com/hcomm-dev/hcomm/device"
	"github.com/hcomm-dev/hcomm/thread"
)

// Thread is a communication thread (ThreadHandle): a stream and its notifies.
type Thread = thread.Thread

// ThreadAcquire creates n threads, each a new stream with notifyNumPerThread
// notifies (HcclThreadAcquire). The communicator owns them: Destroy frees them.
func (c *Comm) ThreadAcquire(engine Engine, n, notifyNumPerThread int) ([]*Thread, error) {
	const op = "ThreadAcquire"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if !engine.supported() {
		return nil, c.errorf(op, -1, ErrNotSupport, nil, "engine %v is not supported: hcomm runs on the host (CPU, CPU_TS)", engine)
	}
	ts, err := thread.Acquire(c.dev, fmt.Sprintf("comm %s rank %d", c.name, c.rank), n, notifyNumPerThread)
	if err != nil {
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	c.mu.Lock()
	c.threads = append(c.threads, ts...)
	c.mu.Unlock()
	return ts, nil
}

// ThreadAcquireWithStream wraps a stream the caller owns, which must belong to
// the communicator's device (HcclThreadAcquireWithStream). The caller
// synchronizes and destroys the stream.
func (c *Comm) ThreadAcquireWithStream(engine Engine, s *device.Stream, notifyNum int) (*Thread, error) {
	const op = "ThreadAcquireWithStream"
	if err := c.usable(op); err != nil {
		return nil, err
	}
	if !engine.supported() {
		return nil, c.errorf(op, -1, ErrNotSupport, nil, "engine %v is not supported: hcomm runs on the host (CPU, CPU_TS)", engine)
	}
	if s == nil || s.Device() != c.dev {
		return nil, c.errorf(op, -1, ErrPtr, nil, "stream is nil or belongs to another device context")
	}
	t, err := thread.WithStream(s, fmt.Sprintf("comm %s rank %d", c.name, c.rank), notifyNum)
	if err != nil {
		return nil, c.errorf(op, -1, ErrPara, err, "")
	}
	c.mu.Lock()
	c.threads = append(c.threads, t)
	c.mu.Unlock()
	return t, nil
}
