package main

import (
	"cmp"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// series is one line of the plot: a group of runs (one policy, or one
// target) against the load.
type series struct {
	name string
	x    []float64
	sums []Summary
}

// xOf is where a run sits on the load axis, and the axis' name.
func xOf(s Summary) (float64, string) {
	switch {
	case s.Load > 0:
		return 100 * s.Load, "offered load (% of measured capacity)"
	case s.OfferedRate > 0:
		return s.OfferedRate, "offered rate (requests/s)"
	default:
		return float64(s.Concurrency), "concurrency (clients)"
	}
}

// groupOf is the line a run belongs to.
func groupOf(s Summary) string {
	if s.Policy != "" {
		return s.Policy
	}
	return "dpbench"
}

// savePlot draws two panels against the load, one colour per group: TTFT
// p99 (solid) and p50 (dashed), and ITL p99 (solid) and p50 (dashed). The
// format follows path's extension (.svg, .png or .pdf).
func savePlot(path, title string, sums []Summary) error {
	var groups []*series
	xLabel := ""
	for _, s := range sums {
		x, name := xOf(s)
		xLabel = name
		i := slices.IndexFunc(groups, func(g *series) bool { return g.name == groupOf(s) })
		if i < 0 {
			groups = append(groups, &series{name: groupOf(s)})
			i = len(groups) - 1
		}
		groups[i].x = append(groups[i].x, x)
		groups[i].sums = append(groups[i].sums, s)
	}
	dashed := []vg.Length{vg.Points(5), vg.Points(3)}
	// Both panels draw the groups in the same colours, so one legend
	// names them for both.
	leg := newLegend()
	if len(groups) > 1 {
		for gi, g := range groups {
			leg.Add(g.name, legendLine(palette[gi%len(palette)], nil))
		}
	}
	leg.Add("p99", legendLine(color.Black, nil))
	leg.Add("p50", legendLine(color.Black, dashed))
	panels := []struct {
		title, yLabel string
		p99, p50      func(Summary) float64
	}{
		{"time to first token", "TTFT (ms, log scale)", func(s Summary) float64 { return s.TTFT.P99 }, func(s Summary) float64 { return s.TTFT.P50 }},
		{"inter-token latency", "ITL (ms, log scale)", func(s Summary) float64 { return s.ITL.P99 }, func(s Summary) float64 { return s.ITL.P50 }},
	}
	row := make([]*plot.Plot, len(panels))
	for pi, panel := range panels {
		p := newPanel()
		p.Title.Text = panel.title
		p.X.Label.Text = xLabel
		p.Y.Label.Text = panel.yLabel
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = logTicks{}
		for gi, g := range groups {
			c := palette[gi%len(palette)]
			for k, value := range []func(Summary) float64{panel.p99, panel.p50} {
				line, err := lineOf(g, value, c)
				if err != nil {
					return err
				}
				if line == nil {
					continue
				}
				if k == 1 {
					line.Dashes = dashed
				}
				p.Add(line)
			}
		}
		row[pi] = p
	}
	return writeFigure(path, func(c draw.Canvas) {
		area, key := layOut(c, title, &leg)
		canvases := plot.Align([][]*plot.Plot{row}, draw.Tiles{Rows: 1, Cols: len(row), PadX: 2 * margin}, area)
		for i, p := range row {
			p.Draw(canvases[0][i])
		}
		key.Max.Y = row[0].DataCanvas(canvases[0][0]).Max.Y
		leg.Draw(key)
	})
}

// margin is the space between a figure's parts, and around them.
const margin = 2 * vg.Millimeter

// newPanel is a plot with a grid, whose axis labels stand clear of the
// tick labels: gonum sets them a font size apart, less than the height
// of the glyphs, so that the one's descenders touch the other's capitals.
func newPanel() *plot.Plot {
	p := plot.New()
	p.X.Label.Padding = margin / 2
	p.Y.Label.Padding = margin / 2
	p.Add(plotter.NewGrid())
	return p
}

// newLegend is a legend for the column to the right of a figure's panels
// (see layOut), its entries a line apart. gonum steps from one entry to
// the next by the top of a line's Rectangle, the font's ascent less its
// line gap, and then Padding: without it, one entry's descenders reach
// into the next one's capitals.
func newLegend() plot.Legend {
	leg := plot.NewLegend()
	leg.Top, leg.Left = true, true
	leg.Padding = leg.TextStyle.FontExtents().Height - leg.TextStyle.Rectangle("p99").Max.Y
	return leg
}

// legendLine is a legend's sample of a line of colour c, dashed as
// dashes.
func legendLine(c color.Color, dashes []vg.Length) *plotter.Line {
	return &plotter.Line{LineStyle: draw.LineStyle{Color: c, Width: vg.Points(1.5), Dashes: dashes}}
}

// layOut cuts a figure's canvas as a reader expects to find it: the
// title once, centred on a line of its own at the top, and the legend in
// a column at the right, where it covers none of the panels' data. It
// draws the title, and returns the area left for the panels and the
// legend's column; the caller draws the legend there, its top level with
// that of the panels' data.
func layOut(c draw.Canvas, title string, leg *plot.Legend) (area, key draw.Canvas) {
	c = draw.Crop(c, margin, -margin, margin, -margin)
	if title != "" {
		sty := text.Style{Font: font.From(plot.DefaultFont, 14), Handler: plot.DefaultTextHandler, XAlign: draw.XCenter, YAlign: draw.YTop}
		c.FillText(sty, vg.Point{X: c.Center().X, Y: c.Max.Y}, title)
		c.Max.Y -= sty.Height(title) + margin
	}
	width := leg.Rectangle(c).Size().X
	area, key = c, c
	area.Max.X -= width + 2*margin
	key.Min.X = key.Max.X - width
	return area, key
}

// writeFigure draws a 12 × 5 inch figure and writes it to path, in the
// format its extension names.
func writeFigure(path string, drawOn func(draw.Canvas)) error {
	const width, height = 12 * vg.Inch, 5 * vg.Inch
	format := strings.TrimPrefix(strings.ToLower(filepath.Ext(path)), ".")
	c, err := draw.NewFormattedCanvas(width, height, format)
	if err != nil {
		return fmt.Errorf("plot %s: %w (want .svg, .png or .pdf)", path, err)
	}
	drawOn(draw.New(c))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return f.Close()
}

var palette = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 255}, color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 255},
	color.RGBA{R: 0x2c, G: 0xa0, B: 0x2c, A: 255}, color.RGBA{R: 0x94, G: 0x67, B: 0xbd, A: 255},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 255}, color.RGBA{R: 0x8c, G: 0x56, B: 0x4b, A: 255},
}

// lineOf is g's line of value against the load, in load order; nil when
// no run has a value (a log axis has no zero).
func lineOf(g *series, value func(Summary) float64, c color.Color) (*plotter.Line, error) {
	order := make([]int, len(g.x))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(g.x[a], g.x[b]) })
	pts := plotter.XYs{}
	for _, i := range order {
		if v := value(g.sums[i]); v > 0 {
			pts = append(pts, plotter.XY{X: g.x[i], Y: v})
		}
	}
	if len(pts) == 0 {
		return nil, nil
	}
	line, err := plotter.NewLine(pts)
	if err != nil {
		return nil, err
	}
	line.Color, line.Width = c, vg.Points(1.5)
	return line, nil
}

// logTicks marks 1, 2 and 5 times the powers of ten.
type logTicks struct{}

// Ticks implements plot.Ticker.
func (logTicks) Ticks(lo, hi float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v < lo || v > hi {
				continue
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
		}
	}
	return ticks
}

// newPlotCommand is "dpbench plot": one plot, and one table, of the runs
// of several --out files (say, one per server or policy, each --label'd).
func newPlotCommand() *cobra.Command {
	var out, title string
	cmd := &cobra.Command{
		Use:   "plot RESULTS.json...",
		Short: "Draw the runs of several result files in one plot",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, files []string) error {
			var runs []Summary
			for _, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					return err
				}
				var rep report
				if err := json.Unmarshal(b, &rep); err != nil {
					return fmt.Errorf("%s: %w", f, err)
				}
				runs = append(runs, rep.Runs...)
			}
			printTable(cmd.OutOrStdout(), runs)
			if out == "" {
				return nil
			}
			return savePlot(out, title, runs)
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "the plot (.svg, .png or .pdf)")
	cmd.Flags().StringVar(&title, "title", "", "the plot's title")
	return cmd
}
