package bench

import (
	"fmt"
	"html"
	"math"
	"os"
	"strings"

	"github.com/hcomm-dev/hcomm/internal/units"
)

// writePlot draws busbw against size (log scale) as SVG: one colour per
// collective/type/op, solid for out-of-place, dashed for in-place.
func writePlot(path string, r *report) error {
	svg := plotSVG(r.rows, r.nranks)
	if err := os.WriteFile(path, []byte(svg), 0o644); err != nil {
		return fmt.Errorf("--plot: %w", err)
	}
	return nil
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

func plotSVG(rows []Row, nranks int) string {
	const W, H, left, right, top, bottom = 900, 520, 70, 250, 40, 60
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	type pt struct{ x, y float64 }
	type series struct {
		name    string
		out, in []pt
	}
	var order []string
	ser := map[string]*series{}
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, row := range rows {
		if row.Size <= 0 {
			continue
		}
		key := row.Coll + " " + row.Type
		if row.RedOp != "none" {
			key += " " + row.RedOp
		}
		s := ser[key]
		if s == nil {
			s = &series{name: key}
			ser[key] = s
			order = append(order, key)
		}
		x := math.Log2(float64(row.Size))
		minX, maxX = math.Min(minX, x), math.Max(maxX, x)
		if row.Out != nil && !row.Out.NA {
			s.out = append(s.out, pt{x, row.Out.BusBW})
			maxY = math.Max(maxY, row.Out.BusBW)
		}
		if row.In != nil && !row.In.NA {
			s.in = append(s.in, pt{x, row.In.BusBW})
			maxY = math.Max(maxY, row.In.BusBW)
		}
	}
	if len(order) == 0 {
		minX, maxX = 0, 1
	}
	if maxX == minX {
		minX, maxX = minX-1, maxX+1
	}
	maxY = niceCeil(maxY)
	px := func(x float64) float64 { return left + (x-minX)/(maxX-minX)*pw }
	py := func(y float64) float64 { return top + ph - y/maxY*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">hcomm bench: bus bandwidth, %d ranks</text>`+"\n", left, nranks)
	// grid and ticks
	for i := 0; i <= 5; i++ {
		y := maxY * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+pw, py(y), py(y))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.3g</text>`+"\n", left-6, py(y)+4, y)
	}
	stepX := math.Max(1, math.Ceil((maxX-minX)/12))
	for x := math.Ceil(minX); x <= maxX; x += stepX {
		fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%d" y2="%.1f" stroke="#eee"/>`+"\n", px(x), px(x), top, top+ph)
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(x), top+ph+16, units.Size(int64(math.Exp2(x))))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="black"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">size (bytes, log scale)</text>`+"\n", left+pw/2, H-18)
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">busbw (GB/s)</text>`+"\n", top+ph/2, top+ph/2)
	line := func(pts []pt, color, dash string) {
		if len(pts) == 0 {
			return
		}
		var p []string
		for _, q := range pts {
			p = append(p, fmt.Sprintf("%.1f,%.1f", px(q.x), py(q.y)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(p, " "))
		for _, q := range pts {
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="2.5" fill="%s"/>`+"\n", px(q.x), py(q.y), color)
		}
	}
	// Legend: one colour per series, then what solid and dashed mean.
	ly := top + 10
	for i, k := range order {
		s := ser[k]
		color := palette[i%len(palette)]
		line(s.out, color, "")
		line(s.in, color, ` stroke-dasharray="6 4"`)
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>`, W-right+16, W-right+40, ly, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", W-right+46, ly+4, html.EscapeString(s.name))
		ly += 20
	}
	ly += 10
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black" stroke-width="2"/>`, W-right+16, W-right+40, ly, ly)
	fmt.Fprintf(&b, `<text x="%d" y="%d">out-of-place</text>`+"\n", W-right+46, ly+4)
	ly += 20
	fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="black" stroke-width="2" stroke-dasharray="6 4"/>`, W-right+16, W-right+40, ly, ly)
	fmt.Fprintf(&b, `<text x="%d" y="%d">in-place</text>`+"\n", W-right+46, ly+4)
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds y up to 1, 2 or 5 times a power of ten (1 for y <= 0).
func niceCeil(y float64) float64 {
	if y <= 0 || math.IsNaN(y) || math.IsInf(y, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(y)))
	for _, m := range []float64{1, 2, 5, 10} {
		if y <= m*p {
			return m * p
		}
	}
	return 10 * p
}
