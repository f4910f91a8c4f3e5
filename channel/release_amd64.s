//go:build amd64 && !race

#include "textflag.h"

// func storeRelease(p *uint64, v uint64)
// A plain MOVQ: on amd64 (TSO) a store is not reordered with the stores
// before it, so it publishes them; unlike XCHGQ (what atomic.StoreUint64
// compiles to) it does not drain the store buffer and wait for the line's
// ownership before the caller goes on.
TEXT ·storeRelease(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ v+8(FP), BX
	MOVQ BX, (AX)
	RET
