//go:build !(amd64 || 386 || arm64 || ppc64le || wasm)

package reduce

// directView: this machine may be big-endian or fault on unaligned loads, so
// the Go loops go through aligned native copies (runChunked).
const directView = false
