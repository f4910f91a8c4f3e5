package device_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/hcomm-dev/hcomm/device"
)

// TestMapIsTheMemoryOnTheHost: on the host backend a view is the memory
// itself: writes through it are the device's bytes at once, and Fetch and
// Flush move nothing and allocate nothing.
func TestMapIsTheMemoryOnTheHost(t *testing.T) {
	t.Setenv("HCOMM_DEVICE_VIEW", "")
	d := open(t, 0)
	p, _ := d.Malloc(64)
	v, err := d.Map(p.Add(8), 16)
	if err != nil {
		t.Fatal(err)
	}
	if !v.Mapped() || v.Len() != 16 {
		t.Fatalf("host view: Mapped %v, Len %d; want true, 16", v.Mapped(), v.Len())
	}
	copy(v.Bytes(), "0123456789abcdef")
	got := make([]byte, 16)
	d.MemcpyDtoH(got, p.Add(8))
	if string(got) != "0123456789abcdef" {
		t.Fatalf("device holds %q after a write through a mapped view", got)
	}
	allocs := testing.AllocsPerRun(100, func() {
		w, err := d.Map(p, 64)
		if err != nil {
			t.Fatal(err)
		}
		if w.Fetch(0, 64) != nil || w.Flush(8, 8) != nil || w.Unmap() != nil {
			t.Fatal("fetch, flush or unmap of a mapped view failed")
		}
	})
	if allocs != 0 {
		t.Errorf("Map, Fetch, Flush, Unmap of a host view allocate %.1f times, want 0", allocs)
	}
}

// TestCopiedViewKeepsTheContract runs a view as an accelerator backend makes
// it (HCOMM_DEVICE_VIEW=copy): the image changes only at Fetch, the device
// only at Flush, and an unmapped or freed view is refused.
func TestCopiedViewKeepsTheContract(t *testing.T) {
	t.Setenv("HCOMM_DEVICE_VIEW", "copy")
	d := open(t, 0)
	p, _ := d.Malloc(64)
	d.MemcpyHtoD(p, []byte("before"))
	v, err := d.Map(p, 64)
	if err != nil {
		t.Fatal(err)
	}
	if v.Mapped() {
		t.Fatal("HCOMM_DEVICE_VIEW=copy: the view is mapped, want a copy")
	}
	if string(v.Bytes()[:6]) != "before" {
		t.Fatalf("a new view holds %q, want the memory's bytes", v.Bytes()[:6])
	}
	d.MemcpyHtoD(p, []byte("device"))
	if string(v.Bytes()[:6]) != "before" {
		t.Fatal("the copy changed without a Fetch")
	}
	if err := v.Fetch(0, 6); err != nil {
		t.Fatal(err)
	}
	if string(v.Bytes()[:6]) != "device" {
		t.Fatalf("after Fetch the view holds %q, want %q", v.Bytes()[:6], "device")
	}
	copy(v.Bytes()[8:], "host")
	got := make([]byte, 4)
	d.MemcpyDtoH(got, p.Add(8))
	if bytes.Equal(got, []byte("host")) {
		t.Fatal("the device saw a write to the copy before Flush")
	}
	if err := v.Flush(8, 4); err != nil {
		t.Fatal(err)
	}
	d.MemcpyDtoH(got, p.Add(8))
	if string(got) != "host" {
		t.Fatalf("after Flush the device holds %q, want %q", got, "host")
	}
	for _, r := range [][2]int64{{-1, 1}, {0, 65}, {60, 8}, {65, 0}} {
		wantCode(t, v.Fetch(r[0], r[1]), device.ErrInvalidValue)
		wantCode(t, v.Flush(r[0], r[1]), device.ErrInvalidValue)
	}
	v.Unmap()
	wantCode(t, v.Fetch(0, 1), device.ErrInvalidHandle)
	w, _ := d.Map(p, 8)
	d.Free(p)
	wantCode(t, w.Flush(0, 8), device.ErrInvalidValue)
	wantCode(t, func() error { _, err := d.Map(p, 8); return err }(), device.ErrInvalidValue)
}

// TestMemoryOfAnotherContext: memory belongs to the context that allocated
// it; the calls that touch one context's memory refuse another's, naming it,
// while Memcpy copies between contexts (ACL's explicit inter-device copy).
func TestMemoryOfAnotherContext(t *testing.T) {
	d, o := open(t, 0), open(t, 1)
	s := stream(t, d)
	p, _ := o.Malloc(64)
	mine, _ := d.Malloc(64)
	buf := make([]byte, 8)
	for name, err := range map[string]error{
		"Bytes":           func() error { _, err := d.Bytes(p, 8); return err }(),
		"Map":             func() error { _, err := d.Map(p, 8); return err }(),
		"CheckRange":      d.CheckRange(p, 8),
		"Memset":          d.Memset(p, 8, 1),
		"MemcpyHtoD":      d.MemcpyHtoD(p, buf),
		"MemcpyDtoH":      d.MemcpyDtoH(buf, p),
		"MemsetAsync":     s.MemsetAsync(p, 8, 1),
		"MemcpyHtoDAsync": s.MemcpyHtoDAsync(p, buf),
		"MemcpyDtoHAsync": s.MemcpyDtoHAsync(buf, p),
	} {
		if !errors.Is(err, device.ErrInvalidValue) || !strings.Contains(err.Error(), "another device context") {
			t.Errorf("%s on another context's memory: %v, want ErrInvalidValue naming another device context", name, err)
		}
	}
	sync0(t, s)
	if err := d.Memcpy(mine, p, 8, device.MemcpyInterDeviceToDevice); err != nil {
		t.Errorf("Memcpy from another context: %v", err)
	}
	if err := s.MemcpyAsync(p, mine, 8, device.MemcpyDeviceToDevice); err != nil {
		t.Errorf("MemcpyAsync to another context: %v", err)
	}
	sync0(t, s)
	if err := d.CheckRange(mine, 64); err != nil {
		t.Errorf("CheckRange of own memory: %v", err)
	}
	wantCode(t, d.CheckRange(mine, 65), device.ErrInvalidValue)
}

// TestNilStreamIsTheDefaultStream: where a call names the context through
// its event or memory, a nil stream is that context's default stream, as
// ACL and CUDA take NULL; where nothing names it, nil is refused at the call.
func TestNilStreamIsTheDefaultStream(t *testing.T) {
	d := open(t, 0)
	def, err := d.DefaultStream()
	if err != nil {
		t.Fatal(err)
	}
	p, _ := d.Malloc(16)
	q, _ := d.Malloc(16)
	e := event(t, d, device.EventDefault)

	g := block(t, def)
	if err := e.Record(nil); err != nil {
		t.Fatalf("Record(nil): %v", err)
	}
	if err := e.Query(); !errors.Is(err, device.ErrEventNotComplete) {
		t.Fatalf("Record(nil) behind a held default stream: Query = %v, want not ready", err)
	}
	var nilStream *device.Stream
	if err := nilStream.MemcpyHtoDAsync(p, []byte("12345678")); err != nil {
		t.Fatalf("MemcpyHtoDAsync on nil: %v", err)
	}
	if err := nilStream.MemcpyAsync(q, p, 8, device.MemcpyDeviceToDevice); err != nil {
		t.Fatalf("MemcpyAsync on nil: %v", err)
	}
	if err := nilStream.MemsetAsync(q.Add(8), 8, 'x'); err != nil {
		t.Fatalf("MemsetAsync on nil: %v", err)
	}
	out := make([]byte, 16)
	if err := nilStream.MemcpyDtoHAsync(out, q); err != nil {
		t.Fatalf("MemcpyDtoHAsync on nil: %v", err)
	}
	if err := nilStream.WaitEvent(e); err != nil {
		t.Fatalf("WaitEvent on nil: %v", err)
	}
	if err := e.Reset(nil); err != nil {
		t.Fatalf("Reset(nil): %v", err)
	}
	if out[0] != 0 {
		t.Fatal("a copy on the nil stream ran before the default stream's earlier task")
	}
	close(g)
	sync0(t, def)
	if string(out) != "12345678xxxxxxxx" {
		t.Fatalf("the nil-stream copies left %q, want %q", out, "12345678xxxxxxxx")
	}
	if err := e.Query(); err != nil {
		t.Fatalf("after the default stream ran: Query = %v", err)
	}

	wantCode(t, nilStream.Launch("task", func(<-chan struct{}) error { return nil }), device.ErrInvalidHandle)
	wantCode(t, nilStream.LaunchCallback(func() {}, device.CallbackBlock), device.ErrInvalidHandle)
	wantCode(t, nilStream.MemcpyDtoHAsync(out, 0), device.ErrInvalidHandle)
	var nilEvent *device.Event
	wantCode(t, nilEvent.Record(nil), device.ErrInvalidHandle)
}

// TestLaunchNilIsRefused: a nil task fails the call, not the stream later.
func TestLaunchNilIsRefused(t *testing.T) {
	d := open(t, 0)
	s := stream(t, d)
	wantCode(t, s.Launch("nothing", nil), device.ErrInvalidValue)
	wantCode(t, s.LaunchCallback(nil, device.CallbackBlock), device.ErrInvalidValue)
	sync0(t, s)
}
