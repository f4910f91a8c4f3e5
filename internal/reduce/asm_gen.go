//go:build ignore

// asm_gen writes kernels_amd64.s and kernels_amd64.go: the AVX2 (and F16C)
// reduction kernels. Run it with `go generate` in this folder (or
// `go run asm_gen.go`). The generated code is checked in; this program only
// needs to run again when a kernel changes.
//
// Every kernel has the Go signature
//
//	func name(dst, a, b *byte, n int)
//
// and computes dst = a (op) b over the first n&^31 bytes: a main loop of U
// 32-byte vectors per iteration, then single vectors. The caller finishes the
// last n%32 bytes in Go. Loads and stores are unaligned (VMOVDQU/VMOVUPS,
// VEX-encoded memory operands have no alignment requirement); the _nt
// variants store with VMOVNTDQ and need dst 32-byte aligned.
package main

import (
	"bytes"
	"fmt"
	"go/format"
	"log"
	"os"
	"strings"
)

// consts names the broadcast constants a kernel needs; each is loaded once in
// the prologue into a register counted down from Y15.
type constant struct {
	name  string // symbolic name used by ops, e.g. "zero"
	setup func(reg string) []string
}

var consts = map[string]constant{
	"zero": {"zero", func(r string) []string { return []string{"VPXOR " + r + ", " + r + ", " + r} }},
	"one32": {"one32", func(r string) []string {
		return []string{"MOVL $1, R8", "VMOVD R8, " + x(r), "VPBROADCASTD " + x(r) + ", " + r}
	}},
	"r7fff": {"r7fff", func(r string) []string {
		return []string{"MOVL $0x7fff, R8", "VMOVD R8, " + x(r), "VPBROADCASTD " + x(r) + ", " + r}
	}},
	"q40": {"q40", func(r string) []string {
		return []string{"MOVL $0x40, R8", "VMOVD R8, " + x(r), "VPBROADCASTD " + x(r) + ", " + r}
	}},
	"sign64": {"sign64", func(r string) []string {
		return []string{"MOVQ $0x8000000000000000, R8", "VMOVQ R8, " + x(r), "VPBROADCASTQ " + x(r) + ", " + r}
	}},
}

func x(y string) string { return "X" + strings.TrimPrefix(y, "Y") }

// An op combines lanes a and b (registers) into a, using temps t and the
// constant registers k.
type op struct {
	temps  int
	consts []string
	emit   func(a, b string, t []string, k map[string]string) []string
}

// binop is a single three-operand AVX instruction: a = a INSTR b (Intel
// operand order src1=a, src2=b, which decides which NaN payload wins).
func binop(instr string) op {
	return op{emit: func(a, b string, _ []string, _ map[string]string) []string {
		return []string{fmt.Sprintf("%s %s, %s, %s", instr, b, a, a)}
	}}
}

// fminmax is MAX or MIN over floats with hcomm's rules: NaN if either
// operand is NaN (the quiet NaN a+b produces), and -0 < +0.
//
//	m1 = vmax(a, b); m2 = vmax(b, a)    // equal operands: each returns its src2
//	r  = m1 AND m2 (max) / m1 OR m2 (min) // +0/-0 resolved bitwise
//	r  = unord(a, b) ? a+b : r
func fminmax(sfx, minmax string) op {
	combine := "VANDP" + sfx
	if minmax == "MIN" {
		combine = "VORP" + sfx
	}
	in := "V" + minmax + "P" + sfx
	return op{temps: 2, emit: func(a, b string, t []string, _ map[string]string) []string {
		return []string{
			fmt.Sprintf("%s %s, %s, %s", in, b, a, t[0]),
			fmt.Sprintf("%s %s, %s, %s", in, a, b, t[1]),
			fmt.Sprintf("%s %s, %s, %s", combine, t[1], t[0], t[0]),
			fmt.Sprintf("VCMPP%s $3, %s, %s, %s", sfx, b, a, t[1]),
			fmt.Sprintf("VADDP%s %s, %s, %s", sfx, b, a, a),
			fmt.Sprintf("VBLENDVP%s %s, %s, %s, %s", sfx, t[1], a, t[0], a),
		}
	}}
}

// minmax64 is signed or unsigned 64-bit MAX/MIN: VPCMPGTQ and a blend
// (unsigned flips the sign bits before comparing).
func minmax64(unsigned bool, max bool) op {
	o := op{temps: 2}
	if unsigned {
		o.consts = []string{"sign64"}
	}
	o.emit = func(a, b string, t []string, k map[string]string) []string {
		var s []string
		if unsigned {
			s = append(s,
				fmt.Sprintf("VPXOR %s, %s, %s", k["sign64"], a, t[0]),
				fmt.Sprintf("VPXOR %s, %s, %s", k["sign64"], b, t[1]),
				fmt.Sprintf("VPCMPGTQ %s, %s, %s", t[1], t[0], t[0]))
		} else {
			s = append(s, fmt.Sprintf("VPCMPGTQ %s, %s, %s", b, a, t[0])) // t0 = a > b
		}
		if max { // t0 ? a : b
			s = append(s, fmt.Sprintf("VPBLENDVB %s, %s, %s, %s", t[0], a, b, a))
		} else { // t0 ? b : a
			s = append(s, fmt.Sprintf("VPBLENDVB %s, %s, %s, %s", t[0], b, a, a))
		}
		return s
	}
	return o
}

// mul64 is the low 64 bits of a 64x64 product from three 32x32->64
// multiplies: al*bl + (ah*bl + al*bh)<<32.
var mul64 = op{temps: 3, emit: func(a, b string, t []string, _ map[string]string) []string {
	return []string{
		fmt.Sprintf("VPSRLQ $32, %s, %s", a, t[0]),
		fmt.Sprintf("VPMULUDQ %s, %s, %s", b, t[0], t[0]),
		fmt.Sprintf("VPSRLQ $32, %s, %s", b, t[1]),
		fmt.Sprintf("VPMULUDQ %s, %s, %s", a, t[1], t[1]),
		fmt.Sprintf("VPADDQ %s, %s, %s", t[1], t[0], t[0]),
		fmt.Sprintf("VPSLLQ $32, %s, %s", t[0], t[0]),
		fmt.Sprintf("VPMULUDQ %s, %s, %s", b, a, a),
		fmt.Sprintf("VPADDQ %s, %s, %s", t[0], a, a),
	}
}}

// Layouts: how a 32-byte block of elements becomes float32/native lanes.
const (
	plain = iota // one native 32-byte lane
	f16          // two float32 lanes via VCVTPH2PS / VCVTPS2PH (F16C)
	bf16         // two float32 lanes via word unpacks, RNE repack
)

type kernel struct {
	name   string
	layout int
	op     op
	unroll int  // 32-byte blocks per main-loop iteration: 1, 2 or 4
	nt     bool // non-temporal stores
	float  bool // use VMOVUPS rather than VMOVDQU (plain layout)
}

func main() {
	var ks []kernel
	add := func(name string, layout int, o op, unroll int, float bool) {
		ks = append(ks, kernel{name: name, layout: layout, op: o, unroll: unroll, float: float})
	}
	for _, f := range []struct{ t, s string }{{"F32", "S"}, {"F64", "D"}} {
		add("add"+f.t, plain, binop("VADDP"+f.s), 4, true)
		add("mul"+f.t, plain, binop("VMULP"+f.s), 4, true)
		add("max"+f.t, plain, fminmax(f.s, "MAX"), 4, true)
		add("min"+f.t, plain, fminmax(f.s, "MIN"), 4, true)
	}
	for _, i := range []struct{ t, s string }{{"8", "B"}, {"16", "W"}, {"32", "D"}} {
		add("addI"+i.t, plain, binop("VPADD"+i.s), 4, false)
		if i.t != "8" {
			add("mulI"+i.t, plain, binop("VPMULL"+i.s), 4, false)
		}
		add("maxI"+i.t, plain, binop("VPMAXS"+i.s), 4, false)
		add("minI"+i.t, plain, binop("VPMINS"+i.s), 4, false)
		add("maxU"+i.t, plain, binop("VPMAXU"+i.s), 4, false)
		add("minU"+i.t, plain, binop("VPMINU"+i.s), 4, false)
	}
	add("addI64", plain, binop("VPADDQ"), 4, false)
	add("mulI64", plain, mul64, 4, false)
	add("maxI64", plain, minmax64(false, true), 4, false)
	add("minI64", plain, minmax64(false, false), 4, false)
	add("maxU64", plain, minmax64(true, true), 4, false)
	add("minU64", plain, minmax64(true, false), 4, false)
	for _, h := range []struct {
		t      string
		layout int
	}{{"F16", f16}, {"BF16", bf16}} {
		add("add"+h.t, h.layout, binop("VADDPS"), 2, false)
		add("mul"+h.t, h.layout, binop("VMULPS"), 2, false)
		add("max"+h.t, h.layout, fminmax("S", "MAX"), 2, false)
		add("min"+h.t, h.layout, fminmax("S", "MIN"), 2, false)
	}
	// Non-temporal variants of the plain sums, for large out-of-place
	// reductions (see kernels_amd64.go for when they are used).
	for _, name := range []string{"addF32", "addF64", "addI32", "addI64"} {
		for _, k := range ks {
			if k.name == name {
				k.name += "NT"
				k.nt = true
				ks = append(ks, k)
			}
		}
	}

	var s bytes.Buffer
	fmt.Fprintf(&s, "// Code generated by asm_gen.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\n#include \"textflag.h\"\n")
	for _, k := range ks {
		genKernel(&s, k)
	}
	if err := os.WriteFile("kernels_amd64.s", s.Bytes(), 0o644); err != nil {
		log.Fatal(err)
	}

	var g bytes.Buffer
	fmt.Fprintf(&g, "// Code generated by asm_gen.go; DO NOT EDIT.\n\n//go:build amd64 && !purego\n\npackage reduce\n\n")
	for _, k := range ks {
		fmt.Fprintf(&g, "//go:noescape\nfunc %s(dst, a, b *byte, n int)\n\n", k.name)
	}
	src, err := format.Source(g.Bytes())
	if err != nil {
		log.Fatal(err)
	}
	if err := os.WriteFile("kernels_amd64.go", src, 0o644); err != nil {
		log.Fatal(err)
	}
}

func genKernel(w *bytes.Buffer, k kernel) {
	// constants
	need := append([]string(nil), k.op.consts...)
	if k.layout == bf16 {
		need = append(need, "zero", "one32", "r7fff", "q40")
	}
	kreg := map[string]string{}
	var setup []string
	next := 15
	for _, c := range need {
		if _, ok := kreg[c]; ok {
			continue
		}
		r := fmt.Sprintf("Y%d", next)
		next--
		kreg[c] = r
		setup = append(setup, consts[c].setup(r)...)
	}
	lanes := 1
	if k.layout != plain {
		lanes = 2
	}
	temps := k.op.temps
	if k.layout == bf16 && temps < 3 {
		temps = 3 // the RNE repack needs three
	}
	reg := 0
	alloc := func() string {
		if reg > next {
			log.Fatalf("%s: out of registers", k.name)
		}
		reg++
		return fmt.Sprintf("Y%d", reg-1)
	}
	tmp := make([]string, temps)
	for i := range tmp {
		tmp[i] = alloc()
	}
	type block struct{ a, b []string }
	mk := func(n int) []block {
		saved := reg
		bs := make([]block, n)
		for i := range bs {
			for l := 0; l < lanes; l++ {
				bs[i].a = append(bs[i].a, alloc())
				bs[i].b = append(bs[i].b, alloc())
			}
		}
		reg = saved
		return bs
	}
	body := func(n int) []string {
		bs := mk(n)
		var s []string
		mov := "VMOVDQU"
		if k.float {
			mov = "VMOVUPS"
		}
		// loads
		for i, bl := range bs {
			off := i * 32
			switch k.layout {
			case plain:
				s = append(s, fmt.Sprintf("%s %d(SI)(AX*1), %s", mov, off, bl.a[0]),
					fmt.Sprintf("%s %d(DX)(AX*1), %s", mov, off, bl.b[0]))
			case f16:
				for l := 0; l < 2; l++ {
					s = append(s, fmt.Sprintf("VCVTPH2PS %d(SI)(AX*1), %s", off+16*l, bl.a[l]),
						fmt.Sprintf("VCVTPH2PS %d(DX)(AX*1), %s", off+16*l, bl.b[l]))
				}
			case bf16:
				z := kreg["zero"]
				for _, p := range []struct {
					base string
					r    []string
				}{{"SI", bl.a}, {"DX", bl.b}} {
					s = append(s, fmt.Sprintf("VMOVDQU %d(%s)(AX*1), %s", off, p.base, p.r[1]),
						fmt.Sprintf("VPUNPCKLWD %s, %s, %s", p.r[1], z, p.r[0]),
						fmt.Sprintf("VPUNPCKHWD %s, %s, %s", p.r[1], z, p.r[1]))
				}
			}
		}
		// ops
		for _, bl := range bs {
			for l := range bl.a {
				s = append(s, k.op.emit(bl.a[l], bl.b[l], tmp, kreg)...)
			}
		}
		// stores
		for i, bl := range bs {
			off := i * 32
			switch k.layout {
			case plain:
				st := mov
				if k.nt {
					st = "VMOVNTDQ"
				}
				s = append(s, fmt.Sprintf("%s %s, %d(DI)(AX*1)", st, bl.a[0], off))
			case f16:
				for l := 0; l < 2; l++ {
					s = append(s, fmt.Sprintf("VCVTPS2PH $0, %s, %d(DI)(AX*1)", bl.a[l], off+16*l))
				}
			case bf16:
				for l := 0; l < 2; l++ {
					r := bl.a[l]
					s = append(s,
						fmt.Sprintf("VPSRLD $16, %s, %s", r, tmp[0]),
						fmt.Sprintf("VPAND %s, %s, %s", kreg["one32"], tmp[0], tmp[1]),
						fmt.Sprintf("VPADDD %s, %s, %s", kreg["r7fff"], tmp[1], tmp[1]),
						fmt.Sprintf("VPADDD %s, %s, %s", r, tmp[1], tmp[1]),
						fmt.Sprintf("VPSRLD $16, %s, %s", tmp[1], tmp[1]),
						fmt.Sprintf("VPOR %s, %s, %s", kreg["q40"], tmp[0], tmp[0]),
						fmt.Sprintf("VCMPPS $3, %s, %s, %s", r, r, tmp[2]),
						fmt.Sprintf("VBLENDVPS %s, %s, %s, %s", tmp[2], tmp[0], tmp[1], r))
				}
				s = append(s, fmt.Sprintf("VPACKUSDW %s, %s, %s", bl.a[1], bl.a[0], bl.a[0]),
					fmt.Sprintf("VMOVDQU %s, %d(DI)(AX*1)", bl.a[0], off))
			}
		}
		return s
	}

	fmt.Fprintf(w, "\n// func %s(dst, a, b *byte, n int)\nTEXT ·%s(SB), NOSPLIT, $0-32\n", k.name, k.name)
	out := func(lines ...string) {
		for _, l := range lines {
			if strings.HasSuffix(l, ":") {
				fmt.Fprintf(w, "%s\n", l)
			} else {
				fmt.Fprintf(w, "\t%s\n", l)
			}
		}
	}
	out("MOVQ dst+0(FP), DI", "MOVQ a+8(FP), SI", "MOVQ b+16(FP), DX", "MOVQ n+24(FP), CX")
	out(setup...)
	out("XORQ AX, AX", "MOVQ CX, BX", fmt.Sprintf("ANDQ $-%d, BX", 32*k.unroll), "JZ tail", "loop:")
	out(body(k.unroll)...)
	out(fmt.Sprintf("ADDQ $%d, AX", 32*k.unroll), "CMPQ AX, BX", "JB loop", "tail:")
	if k.unroll > 1 {
		out("MOVQ CX, BX", "ANDQ $-32, BX", "CMPQ AX, BX", "JAE done", "tail1:")
		out(body(1)...)
		out("ADDQ $32, AX", "CMPQ AX, BX", "JB tail1", "done:")
	}
	if k.nt {
		out("SFENCE")
	}
	out("VZEROUPPER", "RET")
}
