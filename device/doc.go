// Package device is hcomm's device runtime: devices, memory, streams, events,
// host callbacks and exception reports, with the semantics of Huawei's ACL
// runtime (aclrt*) and the CUDA driver's event API (cuEvent*).
//
// No accelerator is needed: the default backend is a host device whose memory
// is mapped outside the Go heap (stable addresses that behave like device
// addresses) and whose streams are goroutines running tasks in order. The
// backend sits behind an internal interface so that a real accelerator can be
// added without touching the packages above.
//
// Where to start: Open a device, Malloc memory, CreateStream, enqueue work
// (MemcpyAsync, LaunchCallback, Event.Record, Stream.WaitEvent), then
// Synchronize. The README has a table from each ACL / CUDA function to its Go
// name here.
//
// The caller's duties:
//
//  1. Memory touched by queued work stays allocated until that work completes
//     (synchronize before Free). A slice from Bytes must not outlive the memory.
//  2. Handles belong to the device context they came from; mixing contexts is an
//     ErrInvalidHandle error.
//  3. Every Stream is destroyed, and every Device closed, by whoever made it:
//     Close and Destroy wait for the goroutines they started and are idempotent.
//  4. Errors of queued tasks surface at the stream's next Synchronize and
//     through the exception callback (SetExceptionInfoCallback); the tasks
//     after a failed one are skipped until then.
//
// A stream's queue is bounded, as a GPU's launch queue is: an enqueue that
// finds MaxPending tasks queued waits until the stream has run half of them
// (or gives up after 100 ms without progress, so that a blocking host
// callback that launches on its own stream cannot deadlock). A caller far
// ahead of its stream therefore holds a bounded heap.
//
// Memory and other processes: on Linux every allocation of the host backend
// is its own memfd, reserved in full at Malloc (fallocate), sealed against
// shrinking and mapped MAP_SHARED; Share hands out a descriptor of it so that
// another process (the shm transport's peer) maps the same pages. Reserving
// at Malloc means memory that cannot be had is an ErrMemoryAllocation error
// naming the size, not a crash at first touch. The size of /dev/shm does not
// limit it (a memfd lives in no mounted file system); RAM plus swap and the
// process's memory cgroup do, and the error says which and how to change it.
// Each allocation holds one file descriptor until Free (the limit is ulimit
// -n). Nothing is left behind when a process dies.
//
// Timeouts: calls that block take a context.Context; their ...WithTimeout twins
// take ACL's convention as a time.Duration (negative waits forever, zero polls).
// Timeout errors match context.DeadlineExceeded with errors.Is.
//
// Departures from ACL, each deliberate: Go has no thread ids, so
// SubscribeReport and ProcessReport take a caller-chosen id; a stream with no
// subscriber runs its callbacks itself instead of failing; several contexts may
// be open on one device id; event flags take CUDA's values (see EventFlag).
package device
