package sim

import (
	"fmt"
	"html"
	"math"
	"strings"

	"github.com/hcomm-dev/hcomm/internal/units"
)

// PlotSVG draws predicted busbw against size (log scale), one line per rank
// count and algorithm, as hcomm bench's --plot draws measured runs;
// measured points (by rank count), when given, are drawn as crosses in the
// colour of the rank count's first line.
func PlotSVG(title string, rs []Result, measured []Measured) string {
	const W, H, left, right, top, bottom = 960, 560, 70, 270, 40, 60
	pw, ph := float64(W-left-right), float64(H-top-bottom)
	type pt struct{ x, y float64 }
	var order []string
	ser := map[string][]pt{}
	first := map[int]string{} // rank count → its first series
	minX, maxX, maxY := math.Inf(1), math.Inf(-1), 0.0
	for _, r := range rs {
		if r.Bytes <= 0 || r.BusBW <= 0 {
			continue
		}
		key := fmt.Sprintf("%d ranks %s", r.Ranks, r.Algorithm)
		if r.Algorithm.String() == "auto" {
			key = fmt.Sprintf("%d ranks auto", r.Ranks)
		}
		if _, ok := ser[key]; !ok {
			order = append(order, key)
			if _, ok := first[r.Ranks]; !ok {
				first[r.Ranks] = key
			}
		}
		x := math.Log2(float64(r.Bytes))
		ser[key] = append(ser[key], pt{x, r.BusBW})
		minX, maxX, maxY = math.Min(minX, x), math.Max(maxX, x), math.Max(maxY, r.BusBW)
	}
	busbw := func(m Measured) float64 {
		if c, ok := colls[m.Collective]; ok && m.Time > 0 {
			return float64(m.Bytes) / m.Time / 1e9 * c.factor(m.Ranks)
		}
		return 0
	}
	for _, m := range measured {
		if m.Bytes > 0 {
			x := math.Log2(float64(m.Bytes))
			minX, maxX, maxY = math.Min(minX, x), math.Max(maxX, x), math.Max(maxY, busbw(m))
		}
	}
	if len(order) == 0 && len(measured) == 0 {
		minX, maxX = 0, 1
	}
	if maxX == minX {
		minX, maxX = minX-1, maxX+1
	}
	if maxY <= 0 {
		maxY = 1
	}
	maxY *= 1.05
	px := func(x float64) float64 { return left + (x-minX)/(maxX-minX)*pw }
	py := func(y float64) float64 { return top + ph - y/maxY*ph }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", W, H)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", left, html.EscapeString(title))
	for i := 0; i <= 5; i++ {
		y := maxY * float64(i) / 5
		fmt.Fprintf(&b, `<line x1="%d" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, left+pw, py(y), py(y))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.3g</text>`+"\n", left-6, py(y)+4, y)
	}
	for x := math.Ceil(minX); x <= maxX; x += math.Max(1, math.Ceil((maxX-minX)/12)) {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", px(x), top+ph+16, units.Size(int64(math.Exp2(x))))
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.1f" height="%.1f" fill="none" stroke="black"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">size (bytes, log scale)</text>`+"\n", left+pw/2, H-18)
	fmt.Fprintf(&b, `<text x="16" y="%.1f" text-anchor="middle" transform="rotate(-90 16 %.1f)">busbw (GB/s)</text>`+"\n", top+ph/2, top+ph/2)
	color := map[string]string{}
	ly := top + 10
	for i, k := range order {
		c := palette[i%len(palette)]
		color[k] = c
		var p []string
		for _, q := range ser[k] {
			p = append(p, fmt.Sprintf("%.1f,%.1f", px(q.x), py(q.y)))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(p, " "))
		fmt.Fprintf(&b, `<line x1="%d" x2="%d" y1="%d" y2="%d" stroke="%s" stroke-width="3"/>`, W-right+16, W-right+40, ly, ly, c)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", W-right+46, ly+4, html.EscapeString(k))
		ly += 18
	}
	if len(measured) > 0 {
		for _, m := range measured {
			c := color[first[m.Ranks]]
			if c == "" {
				c = "black"
			}
			x, y := px(math.Log2(float64(m.Bytes))), py(busbw(m))
			fmt.Fprintf(&b, `<path d="M%.1f %.1fl8 8M%.1f %.1fl-8 8" stroke="%s" stroke-width="2"/>`+"\n", x-4, y-4, x+4, y-4, c)
		}
		fmt.Fprintf(&b, `<text x="%d" y="%d">× measured (colour of its rank count)</text>`+"\n", W-right+16, ly+8)
	}
	b.WriteString("</svg>\n")
	return b.String()
}

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}
