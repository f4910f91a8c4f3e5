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
