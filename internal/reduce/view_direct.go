//go:build amd64 || 386 || arm64 || ppc64le || wasm

package reduce

// directView: this machine is little-endian (so buffer bytes mean what the
// wire format says) and loads and stores unaligned elements correctly, so the
// Go loops can read buffers in place at any offset (buf[1:]).
const directView = true
