//go:build amd64 && !purego

#include "textflag.h"

// func streamCopy(dst, src *byte, n int)
TEXT ·streamCopy(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	XORQ AX, AX
	TESTQ CX, CX
	JZ done
loop:
	VMOVDQU 0(SI)(AX*1), Y0
	VMOVDQU 32(SI)(AX*1), Y1
	VMOVDQU 64(SI)(AX*1), Y2
	VMOVDQU 96(SI)(AX*1), Y3
	VMOVNTDQ Y0, 0(DI)(AX*1)
	VMOVNTDQ Y1, 32(DI)(AX*1)
	VMOVNTDQ Y2, 64(DI)(AX*1)
	VMOVNTDQ Y3, 96(DI)(AX*1)
	ADDQ $128, AX
	CMPQ AX, CX
	JB loop
	SFENCE
	VZEROUPPER
done:
	RET
