//go:build linux

package shm

// FilesMapped is how many of the peer's memory files t has mapped for
// ReadPeer.
func FilesMapped(t *Transport) int {
	t.files.mu.Lock()
	defer t.files.mu.Unlock()
	return len(t.files.files)
}

// FilesMax is the bound on them.
const FilesMax = peerFilesMax

// SetProbeCMA makes the ends connected after it try process_vm_readv at
// connect, or not (as a ptrace policy that refuses it would); it returns
// the previous setting.
func SetProbeCMA(on bool) bool {
	old := probeCMA
	probeCMA = on
	return old
}

// CMA reports whether the pair reads through process_vm_readv (not only
// through the peer's memory files).
func CMA(t *Transport) bool { return t.cma }

// PeerReadPiece is the most one copy of ReadPeer or WritePeer moves
// between two looks at its stop.
const PeerReadPiece = peerReadPiece
