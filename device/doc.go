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
//     (synchronize before Free). A slice from Bytes, or a View from Map, must
//     not outlive the memory. Code that touches memory whose owner may free
//     it at any moment — another rank's, in one process — holds it instead
//     (Hold, then Pin and Unpin around each copy): a Free waits for the
//     copy in flight, and a Pin after it fails.
//  2. Handles (streams, events) belong to the device context they came from;
//     mixing contexts is an ErrInvalidHandle error. Memory belongs to the
//     context that allocated it, as on ACL: Free, Share, Memset(Async), Map,
//     Bytes, CheckRange, the Go-slice copies and copy descriptors take only the
//     context's own memory (ErrInvalidValue for another's), and Memcpy and
//     MemcpyAsync are the explicit copies that may name memory of any context
//     of the process (MemcpyInterDeviceToDevice, MemcpyDeviceToDevice,
//     MemcpyDefault).
//  3. Every Stream is destroyed, and every Device closed, by whoever made it:
//     Close and Destroy wait for the goroutines they started and are idempotent.
//  4. Errors of queued tasks surface at the stream's next Synchronize and
//     through the exception callback (SetExceptionInfoCallback); the tasks
//     after a failed one are skipped until then. A failure crosses to other
//     streams through events, as CUDA's sticky errors do: a Stream.WaitEvent
//     on work that did not all run fails too, wrapping the producer's failure,
//     so the waiting stream skips its later tasks and its Synchronize reports
//     it. Stream.TakeError takes a stream's failure without waiting.
//
// A stream's queue is bounded, as a GPU's launch queue is: an enqueue that
// finds MaxPending tasks queued waits until the stream has run half of them
// (or gives up after 100 ms without progress, so that a blocking host
// callback that launches on its own stream cannot deadlock). A caller far
// ahead of its stream therefore holds a bounded heap. A caller more than
// YieldAhead tasks ahead yields the processor at each further enqueue: the
// stream's worker is a goroutine of the same process, and where the two
// share a processor it runs between the enqueues instead of after a burst.
//
// Memory and other processes: on Linux every allocation of the host backend
// is its own memfd, reserved in full at Malloc (fallocate), sealed against
// shrinking and mapped MAP_SHARED; Share hands out a descriptor of it so that
// another process (the shm transport's peer) maps the same pages. Reserving
// at Malloc means memory that cannot be had is an ErrMemoryAllocation error
// naming the size, not a crash at first touch. The size of /dev/shm does not
// limit it (a memfd lives in no mounted file system); RAM plus swap and the
// process's memory cgroup do, and the error says which and how to change it.
// MallocLazy is the exception: its pages are committed as they are first
// touched, for memory that is large and used in part (a communicator's HCCL
// buffer). Each allocation holds one file descriptor until Free (the limit is ulimit
// -n). Nothing is left behind when a process dies.
//
// The default stream: every context has one (DefaultStream, ACL's and CUDA's
// NULL stream), made at its first use and destroyed by Close. A nil *Stream
// means it wherever the call's other arguments name the context — Event.Record
// and Event.Reset (the event's), Stream.WaitEvent (the event's),
// MemcpyAsync, MemcpyHtoDAsync, MemcpyDtoHAsync, MemsetAsync and
// MemcpyAsyncWithDesc (the memory's). Where nothing does (Launch,
// LaunchCallback, Synchronize, Query, SubscribeReport, ...) a nil stream is an
// ErrInvalidHandle error at the call.
//
// Host views (Map): the host backend's memory is host memory, and Bytes hands
// it out as a slice. Code that must also run on an accelerator, whose memory
// the processor cannot address, goes through Map instead: a View is the memory
// itself on the host backend (zero copy, no allocation) and a host copy
// elsewhere, and its Fetch and Flush say where bytes cross (see View for the
// contract). HCOMM_DEVICE_VIEW=copy, read when a context is opened, makes the
// host backend copy too, so that tests catch a missing Fetch or Flush. What
// still assumes host-addressable memory: Bytes and its users — hcomm's data
// plane (LocalCopy, LocalReduce and the reads and writes of a channel) and the
// transports (inproc and shm copy with the processor between mapped memories,
// tcp receives into memory with read(2)) — which an accelerator backend would
// replace with device copies and DMA; and the backend interface itself, whose
// memory is a []byte.
//
// Observing: Device.ObserveTasks tells a function of every task the
// context's streams run — queued or inline, its stream, sequence number,
// name, start and end, whether it failed — as it ends: the feed of a
// profiler or a timeline (hcomm's Config.TraceDir). Without observers it
// costs a task one atomic load.
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
