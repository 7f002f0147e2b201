// Package chart draws the benchmark's headline comparisons as SVG
// figures for docs/benchmarks.md. A run of the benchmark saves each
// figure's numbers as JSON beside its SVG, so that the figures can be
// drawn again (a new style, a fix) without running the benchmark again.
package chart

import (
	"encoding/json"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// Chart is one figure: panels side by side, Columns to a row.
type Chart struct {
	Title   string
	Note    string // the machine, the date and the command, under the title; lines split at "; "
	Columns int    // 0: every panel in one row
	Panels  []Panel
}

// Panel is one plot of a figure. With Categories it is a grouped bar
// chart, each series a bar per category; without, each series is a line
// through its (X, Y) points.
type Panel struct {
	Title          string
	XLabel, YLabel string
	LogX, LogY     bool     // lines only: bars start at zero
	Categories     []string `json:",omitempty"`
	Ref            float64  `json:",omitempty"` // a dashed horizontal line at Ref when > 0
	RefName        string   `json:",omitempty"` // its legend entry
	Series         []Series
}

// Series is one thing measured. A point whose Y is not positive was not
// measured and is left out.
type Series struct {
	Name string
	X    []float64 `json:",omitempty"`
	Y    []float64
}

// palette gives each series of a panel the same colour in every figure:
// the baseline first, in grey.
var palette = []color.Color{
	color.RGBA{R: 0x70, G: 0x70, B: 0x70, A: 0xff},
	color.RGBA{R: 0xe6, G: 0x9f, B: 0x00, A: 0xff},
	color.RGBA{R: 0x00, G: 0x72, B: 0xb2, A: 0xff},
	color.RGBA{R: 0xcc, G: 0x79, B: 0xa7, A: 0xff},
	color.RGBA{R: 0x00, G: 0x9e, B: 0x73, A: 0xff},
	color.RGBA{R: 0xd5, G: 0x5e, B: 0x00, A: 0xff},
}

func init() {
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
}

const (
	panelW, panelH = 11 * vg.Centimeter, 8 * vg.Centimeter
	titleH, noteH  = 9 * vg.Millimeter, 4 * vg.Millimeter
	noteChar       = 1.8 * vg.Millimeter // a character of the note, wide
	minW           = 26 * vg.Centimeter  // room for a title of about 90 characters
)

// Save writes c as NAME.json and NAME.svg in dir.
func (c *Chart) Save(dir, name string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(c, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return c.Render(filepath.Join(dir, name+".svg"))
}

// RenderDir draws every figure saved in dir again, from its JSON.
func RenderDir(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no saved figures (*.json)", dir)
	}
	var drawn []string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return drawn, err
		}
		var c Chart
		if err := json.Unmarshal(b, &c); err != nil {
			return drawn, fmt.Errorf("%s: %w", f, err)
		}
		svg := strings.TrimSuffix(f, ".json") + ".svg"
		if err := c.Render(svg); err != nil {
			return drawn, fmt.Errorf("%s: %w", f, err)
		}
		drawn = append(drawn, svg)
	}
	return drawn, nil
}

// Render draws c into an SVG file at path.
func (c *Chart) Render(path string) error {
	if len(c.Panels) == 0 {
		return errors.New("a chart with no panels")
	}
	cols := c.Columns
	if cols <= 0 || cols > len(c.Panels) {
		cols = len(c.Panels)
	}
	rows := (len(c.Panels) + cols - 1) / cols
	w := max(vg.Length(cols)*panelW, minW)
	var note []string
	for _, line := range strings.Split(c.Note, "; ") {
		note = append(note, wrap(line, int(w/noteChar))...)
	}
	head := titleH + vg.Length(len(note))*noteH + vg.Millimeter*2
	h := vg.Length(rows)*panelH + head
	canvas := vgsvg.New(w, h)
	dc := draw.New(canvas)
	dc.SetColor(color.White)
	dc.Fill(dc.Rectangle.Path())

	plots := make([][]*plot.Plot, rows)
	for r := range plots {
		plots[r] = make([]*plot.Plot, cols)
	}
	for i := range c.Panels {
		p, err := c.Panels[i].plot(w / vg.Length(cols))
		if err != nil {
			return fmt.Errorf("panel %q: %w", c.Panels[i].Title, err)
		}
		plots[i/cols][i%cols] = p
	}
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadTop: head, PadX: vg.Centimeter / 2, PadY: vg.Centimeter / 2,
		PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4, PadBottom: vg.Millimeter * 2}
	canvases := plot.Align(plots, tiles, dc)
	for r := range plots {
		for col, p := range plots[r] {
			if p != nil {
				p.Draw(canvases[r][col])
			}
		}
	}
	heading := func(s string, size font.Length, y vg.Length) {
		sty := text.Style{Color: color.Black, Font: font.From(plot.DefaultFont, size), XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
		dc.FillText(sty, vg.Point{X: w / 2, Y: h - y}, s)
	}
	heading(c.Title, 14, 3*vg.Millimeter)
	for i, line := range note {
		heading(line, 9, titleH+vg.Length(i)*noteH)
	}

	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := canvas.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// plot is pn's plot, for a tile width wide.
func (pn *Panel) plot(width vg.Length) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = pn.Title
	p.Title.TextStyle.Font.Size = 11
	p.X.Label.Text, p.Y.Label.Text = pn.XLabel, pn.YLabel
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.TextStyle.Font.Size = 9
	p.Add(plotter.NewGrid())
	var err error
	if pn.Categories != nil {
		err = pn.bars(p, width)
	} else {
		err = pn.lines(p)
	}
	if err != nil {
		return nil, err
	}
	if pn.Ref > 0 {
		ref := plotter.NewFunction(func(float64) float64 { return pn.Ref })
		ref.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		ref.Color = color.Black
		p.Add(ref)
		if pn.RefName != "" {
			p.Legend.Add(pn.RefName, ref)
		}
		p.Y.Min = math.Min(p.Y.Min, pn.Ref)
		p.Y.Max = math.Max(p.Y.Max, pn.Ref)
	}
	// Room above the data for the legend: a third of the height again.
	if pn.LogY {
		p.Y.Max *= math.Pow(p.Y.Max/p.Y.Min, 0.35)
	} else {
		p.Y.Max += 0.35 * (p.Y.Max - p.Y.Min)
	}
	return p, nil
}

func (pn *Panel) bars(p *plot.Plot, width vg.Length) error {
	if pn.LogX || pn.LogY {
		return errors.New("bars start at zero: no log scale")
	}
	n := len(pn.Series)
	// Bars of a category fill 70% of its share of the axis.
	group := 0.7 * (width - 2*vg.Centimeter) / vg.Length(max(len(pn.Categories), 1))
	bar := group / vg.Length(max(n, 1))
	for i, s := range pn.Series {
		if len(s.Y) != len(pn.Categories) {
			return fmt.Errorf("series %q: %d values for %d categories", s.Name, len(s.Y), len(pn.Categories))
		}
		vals := make(plotter.Values, len(s.Y))
		for j, y := range s.Y {
			vals[j] = math.Max(y, 0)
		}
		b, err := plotter.NewBarChart(vals, bar)
		if err != nil {
			return err
		}
		b.Color = palette[i%len(palette)]
		b.LineStyle.Width = 0
		b.Offset = (vg.Length(i) - vg.Length(n-1)/2) * bar
		p.Add(b)
		p.Legend.Add(s.Name, b)
	}
	p.NominalX(pn.Categories...)
	// The axis spans whole categories, not only their centres.
	p.X.Min, p.X.Max = -0.5, float64(len(pn.Categories))-0.5
	p.Y.Min = 0
	p.Y.Padding = 0
	p.Y.Tick.Marker = plainTicks{}
	return nil
}

func (pn *Panel) lines(p *plot.Plot) error {
	var xs []float64
	for i, s := range pn.Series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("series %q: %d x and %d y", s.Name, len(s.X), len(s.Y))
		}
		var pts plotter.XYs
		for j := range s.X {
			if s.Y[j] > 0 && (s.X[j] > 0 || !pn.LogX) {
				pts = append(pts, plotter.XY{X: s.X[j], Y: s.Y[j]})
				xs = append(xs, s.X[j])
			}
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		l.Color, sc.Color = palette[i%len(palette)], palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		sc.Shape = draw.CircleGlyph{}
		p.Add(l, sc)
		p.Legend.Add(s.Name, l, sc)
	}
	if len(xs) == 0 {
		return errors.New("nothing measured")
	}
	// Ticks at the measured x values: they are what was chosen to run.
	p.X.Tick.Marker = valueTicks(xs)
	if pn.LogX {
		p.X.Scale = plot.LogScale{}
	}
	if pn.LogY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
	} else {
		p.Y.Tick.Marker = plainTicks{}
	}
	return nil
}

// valueTicks labels exactly the given values.
func valueTicks(vs []float64) plot.ConstantTicks {
	seen := map[float64]bool{}
	var ts plot.ConstantTicks
	for _, v := range vs {
		if !seen[v] {
			seen[v] = true
			ts = append(ts, plot.Tick{Value: v, Label: label(v)})
		}
	}
	return ts
}

// wrap breaks s at spaces into lines of at most n characters, where it can.
func wrap(s string, n int) []string {
	var lines []string
	for len(s) > n {
		i := strings.LastIndexByte(s[:n], ' ')
		if i <= 0 {
			break
		}
		lines, s = append(lines, s[:i]), s[i+1:]
	}
	return append(lines, s)
}

// plainTicks are gonum's default ticks labelled without trailing zeros
// or exponents.
type plainTicks struct{}

func (plainTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = label(ts[i].Value)
		}
	}
	return ts
}

func label(v float64) string {
	if math.Abs(v) >= 1 || v == 0 {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

// logTicks labels 1, 2 and 5 times each power of ten, so that a range
// within one decade still has labels.
type logTicks struct{}

func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: label(v)})
			}
		}
	}
	return ts
}
