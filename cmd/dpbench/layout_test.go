package main

import (
	"encoding/json"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/image/font/sfnt"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
)

// TestFiguresLayOut draws each kind of figure dpbench makes and reads
// the SVG it wrote as a reader's eye would: no text runs into other text,
// no text, legends included, lies over a panel's data, and nothing lies
// off the page. The boxes are measured from what the SVG draws (each
// text's string, font and place, and each path's points), not from the
// layout code's own idea of where things went.
func TestFiguresLayOut(t *testing.T) {
	dir := t.TempDir()
	policies := []string{"dpnode live", "nginx least_conn", "dpnode p2c", "dpnode round-robin", "dpnode vllm"}
	var files []string
	for i, name := range policies {
		// Lines that rise to the top left, where a legend inside the
		// panel would sit.
		rep := report{Runs: []Summary{
			{Policy: name, Load: 0.5, TTFT: Percentiles{P50: 40, P99: 900 - 50*float64(i)}, ITL: Percentiles{P50: 9, P99: 300}},
			{Policy: name, Load: 0.8, TTFT: Percentiles{P50: 60, P99: 700}, ITL: Percentiles{P50: 14, P99: 200}},
			{Policy: name, Load: 0.95, TTFT: Percentiles{P50: 90, P99: 800 + 10*float64(i)}, ITL: Percentiles{P50: 20, P99: 280}},
		}}
		files = append(files, writeJSON(t, dir, fmt.Sprintf("policy-%d.json", i), rep))
	}
	target := writeJSON(t, dir, "target.json", report{Runs: []Summary{
		{OfferedRate: 2, TTFT: Percentiles{P50: 30, P99: 80}, ITL: Percentiles{P50: 8, P99: 20}},
		{OfferedRate: 4, TTFT: Percentiles{P50: 45, P99: 150}, ITL: Percentiles{P50: 10, P99: 30}},
		{OfferedRate: 8, TTFT: Percentiles{P50: 120, P99: 900}, ITL: Percentiles{P50: 15, P99: 60}},
	}})
	run, events := elasticRun(t, dir)
	title := "four ranks, real processes: lognormal prompts (median 1000) and outputs (median 200)"

	figures := []struct {
		name   string
		args   []string
		panels int
		legend []string
	}{
		{"policies against load", append([]string{"plot", "--title", title}, files...), 2, append(policies, "p99", "p50")},
		{"one target against rate", []string{"plot", "--title", "http://127.0.0.1:8000", target}, 2, []string{"p99", "p50"}},
		{"timeline", []string{"timeline", run, "--events", events, "--window", "2s", "--title",
			"TTFT during scale-up (4 -> 6 -> 8 ranks) and scale-down (-> 4), 29 req/s"}, 1, []string{"p99", "p50"}},
	}
	for _, f := range figures {
		t.Run(f.name, func(t *testing.T) {
			svg := filepath.Join(dir, strings.ReplaceAll(f.name, " ", "-")+".svg")
			cmd := newCommand()
			cmd.SetOut(io.Discard)
			cmd.SetArgs(append(f.args, "--out", svg))
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			checkLayout(t, readSVG(t, svg), f.panels, f.legend)
		})
	}
}

// elasticRun writes a run recorded with --detail and its events, as
// docs/bench/elastic.sh does: events a second or two apart, whose labels
// cannot all sit on one line, and one at the very end of the run, whose
// label has no room right of it.
func elasticRun(t *testing.T, dir string) (run, events string) {
	t.Helper()
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	var reqs []Record
	for i := range 3200 {
		ttft := 50 + float64(i%40)*20
		reqs = append(reqs, Record{StartMs: float64(i) * 34, TTFTMs: ttft, E2EMs: ttft + 2000})
	}
	run = writeJSON(t, dir, "elastic.json", report{Runs: []Summary{{StartedUnixMs: started, DurationS: 110, Requests: reqs}}})
	var ev strings.Builder
	for _, e := range []struct {
		at    float64
		label string
	}{{13.2, "C joins"}, {15, "C serves"}, {28, "D joins"}, {29.3, "D serves"}, {42, "C leaves"}, {56, "D leaves"}, {108.5, "load ends, nodes drain"}} {
		fmt.Fprintf(&ev, "%d %s\n", started+int64(e.at*1000), e.label)
	}
	events = filepath.Join(dir, "events.txt")
	if err := os.WriteFile(events, []byte(ev.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return run, events
}

func writeJSON(t *testing.T, dir, name string, rep report) string {
	t.Helper()
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// checkLayout checks that fig has panels data areas, draws each entry of
// legend once, and lays them out: no text over another, over the page's
// edge or over data, and no legend over data.
func checkLayout(t *testing.T, fig svgFigure, panels int, legend []string) {
	t.Helper()
	areas := fig.dataAreas()
	if len(areas) != panels {
		t.Errorf("%d panels' data areas, want %d: %v", len(areas), panels, areas)
	}
	for i, a := range fig.texts {
		if !fig.page.contains(a.box) {
			t.Errorf("%q %v runs off the page %v", a.s, a.box, fig.page)
		}
		for _, b := range fig.texts[i+1:] {
			if a.box.overlaps(b.box) {
				t.Errorf("%q %v overlaps %q %v", a.s, a.box, b.s, b.box)
			}
		}
		for k, area := range areas {
			if a.box.overlaps(area) {
				t.Errorf("%q %v lies over panel %d's data %v", a.s, a.box, k+1, area)
			}
		}
	}
	key := boxOf(nil)
	for _, entry := range legend {
		var found []svgText
		for _, tx := range fig.texts {
			if tx.s == entry {
				found = append(found, tx)
			}
		}
		if len(found) != 1 {
			t.Errorf("legend entry %q drawn %d times, want once", entry, len(found))
			continue
		}
		key = key.union(fig.withThumbnail(found[0].box))
	}
	for k, area := range areas {
		if key.overlaps(area) {
			t.Errorf("the legend %v lies over panel %d's data %v", key, k+1, area)
		}
	}
}

// svgFigure is what an SVG draws, in the page's coordinates: points, y
// down.
type svgFigure struct {
	page  box
	texts []svgText
	paths []svgPath
}

type svgText struct {
	s   string
	box box
}

type svgPath struct {
	style map[string]string
	box   box
}

// box is an axis-aligned rectangle.
type box struct{ minX, minY, maxX, maxY float64 }

// slack is the error of a coordinate as the SVG writes it: five
// significant digits, so up to 0.005 points on a page hundreds of points
// wide. Boxes that touch within it do not overlap.
const slack = 0.01

func (a box) overlaps(b box) bool {
	return a.minX < b.maxX-slack && b.minX < a.maxX-slack && a.minY < b.maxY-slack && b.minY < a.maxY-slack
}

func (a box) contains(b box) bool {
	return a.minX <= b.minX+slack && b.maxX <= a.maxX+slack && a.minY <= b.minY+slack && b.maxY <= a.maxY+slack
}

func (a box) union(b box) box {
	return box{min(a.minX, b.minX), min(a.minY, b.minY), max(a.maxX, b.maxX), max(a.maxY, b.maxY)}
}

func (a box) String() string {
	return fmt.Sprintf("[%.1f,%.1f]×[%.1f,%.1f]", a.minX, a.maxX, a.minY, a.maxY)
}

func boxOf(pts [][2]float64) box {
	b := box{math.Inf(1), math.Inf(1), math.Inf(-1), math.Inf(-1)}
	for _, p := range pts {
		b = box{min(b.minX, p[0]), min(b.minY, p[1]), max(b.maxX, p[0]), max(b.maxY, p[1])}
	}
	return b
}

// dataAreas are the panels' data areas: the grid spans each, a
// horizontal line across its width at each tick of the y axis and a
// vertical one across its height at each tick of the x axis.
func (f svgFigure) dataAreas() []box {
	grid := plotter.DefaultGridLineStyle
	r, g, b, _ := grid.Color.RGBA()
	stroke := fmt.Sprintf("#%02X%02X%02X", r>>8, g>>8, b>>8)
	width := strconv.FormatFloat(grid.Width.Points(), 'g', -1, 64)
	var across, up []box
	for _, p := range f.paths {
		if p.style["stroke"] != stroke || p.style["stroke-width"] != width {
			continue
		}
		switch {
		case p.box.minY == p.box.maxY:
			across = append(across, p.box)
		case p.box.minX == p.box.maxX:
			up = append(up, p.box)
		}
	}
	var areas []box
	for _, h := range across {
		for _, v := range up {
			if v.minX < h.minX-slack || v.minX > h.maxX+slack {
				continue
			}
			if a := (box{h.minX, v.minY, h.maxX, v.maxY}); !slices.Contains(areas, a) {
				areas = append(areas, a)
			}
		}
	}
	return areas
}

// withThumbnail is a legend entry's box with its thumbnail: the short
// line drawn level with the label, just left of it.
func (f svgFigure) withThumbnail(label box) box {
	height := label.maxY - label.minY
	b := label
	for _, p := range f.paths {
		if p.box.minY >= label.minY && p.box.maxY <= label.maxY && p.box.maxX <= label.minX && p.box.maxX >= label.minX-height {
			b = b.union(p.box)
		}
	}
	return b
}

// affine is an SVG transform matrix: x' = a x + c y + e, y' = b x + d y + f.
type affine struct{ a, b, c, d, e, f float64 }

var identity = affine{a: 1, d: 1}

func (m affine) then(n affine) affine {
	// m applied after n: the child's transform n is applied first.
	return affine{
		a: m.a*n.a + m.c*n.b, b: m.b*n.a + m.d*n.b,
		c: m.a*n.c + m.c*n.d, d: m.b*n.c + m.d*n.d,
		e: m.a*n.e + m.c*n.f + m.e, f: m.b*n.e + m.d*n.f + m.f,
	}
}

func (m affine) apply(x, y float64) [2]float64 {
	return [2]float64{m.a*x + m.c*y + m.e, m.b*x + m.d*y + m.f}
}

var transformRE = regexp.MustCompile(`(\w+)\(([^)]*)\)`)

// parseTransform reads the transforms gonum's SVG canvas writes:
// translate, scale and rotate.
func parseTransform(t *testing.T, s string) affine {
	t.Helper()
	m := identity
	for _, fn := range transformRE.FindAllStringSubmatch(s, -1) {
		var args []float64
		for _, a := range strings.FieldsFunc(fn[2], func(r rune) bool { return r == ',' || r == ' ' }) {
			v, err := strconv.ParseFloat(a, 64)
			if err != nil {
				t.Fatalf("transform %q: %v", s, err)
			}
			args = append(args, v)
		}
		var n affine
		switch {
		case fn[1] == "translate" && len(args) == 2:
			n = affine{a: 1, d: 1, e: args[0], f: args[1]}
		case fn[1] == "scale" && len(args) == 2:
			n = affine{a: args[0], d: args[1]}
		case fn[1] == "rotate" && len(args) == 1:
			sin, cos := math.Sincos(args[0] * math.Pi / 180)
			n = affine{a: cos, b: sin, c: -sin, d: cos}
		default:
			t.Fatalf("transform %q: %s not read", s, fn[0])
		}
		m = m.then(n)
	}
	return m
}

// readSVG reads the texts and paths of the SVG at path, and measures
// each text with the font it names, as gonum measures what it draws.
func readSVG(t *testing.T, path string) svgFigure {
	t.Helper()
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	dec := xml.NewDecoder(file)
	var fig svgFigure
	stack := []affine{identity}
	attrs := func(e xml.StartElement) map[string]string {
		m := map[string]string{}
		for _, a := range e.Attr {
			m[a.Name.Local] = a.Value
		}
		return m
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch e := tok.(type) {
		case xml.StartElement:
			at := attrs(e)
			ctm := stack[len(stack)-1].then(parseTransform(t, at["transform"]))
			stack = append(stack, ctm)
			switch e.Name.Local {
			case "svg":
				var x, y, w, h float64
				if _, err := fmt.Sscanf(at["viewBox"], "%g %g %g %g", &x, &y, &w, &h); err != nil {
					t.Fatalf("viewBox %q: %v", at["viewBox"], err)
				}
				fig.page = box{x, y, x + w, y + h}
			case "text":
				var s string
				if err := dec.DecodeElement(&s, &e); err != nil {
					t.Fatal(err)
				}
				stack = stack[:len(stack)-1]
				fig.texts = append(fig.texts, svgText{s: s, box: textBox(t, ctm, at, s)})
			case "path":
				fig.paths = append(fig.paths, svgPath{style: parseStyle(at["style"]), box: boxOf(pathPoints(t, ctm, at["d"]))})
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		}
	}
	return fig
}

func parseStyle(s string) map[string]string {
	m := map[string]string{}
	for _, kv := range strings.Split(s, ";") {
		k, v, _ := strings.Cut(kv, ":")
		m[strings.TrimSpace(k)] = strings.TrimSpace(v)
	}
	return m
}

var pathRE = regexp.MustCompile(`([A-Za-z])([^A-Za-z]*)`)

// pathPoints are the points of a path of moves and straight lines, which
// is all dpbench's figures draw.
func pathPoints(t *testing.T, ctm affine, d string) [][2]float64 {
	t.Helper()
	var pts [][2]float64
	for _, cmd := range pathRE.FindAllStringSubmatch(d, -1) {
		switch cmd[1] {
		case "M", "L":
			var x, y float64
			if _, err := fmt.Sscanf(cmd[2], "%g,%g", &x, &y); err != nil {
				t.Fatalf("path %q: %v", d, err)
			}
			pts = append(pts, ctm.apply(x, y))
		case "Z":
		default:
			t.Fatalf("path %q: %s not read", d, cmd[1])
		}
	}
	return pts
}

// textBox is the box of s as the SVG places it: from its start to its
// width in the font the style names, from the font's descent below the
// baseline to its ascent above.
func textBox(t *testing.T, ctm affine, at map[string]string, s string) box {
	t.Helper()
	x, errX := strconv.ParseFloat(at["x"], 64)
	y, errY := strconv.ParseFloat(at["y"], 64)
	if errX != nil || errY != nil {
		t.Fatalf("text %q at %q,%q", s, at["x"], at["y"])
	}
	style := parseStyle(at["style"])
	size, err := strconv.ParseFloat(strings.TrimSuffix(style["font-size"], "px"), 64)
	if err != nil {
		t.Fatalf("text %q: font size %q", s, style["font-size"])
	}
	face := fontFace(t, style, size)
	ext := face.Extents()
	// The text's own coordinates run y down from its baseline.
	return boxOf([][2]float64{
		ctm.apply(x, y-ext.Ascent.Points()),
		ctm.apply(x+face.Width(s).Points(), y-ext.Ascent.Points()),
		ctm.apply(x, y+ext.Descent.Points()),
		ctm.apply(x+face.Width(s).Points(), y+ext.Descent.Points()),
	})
}

// fontFace is the face the style names, of size points: plot's default
// font, the only one dpbench draws with.
func fontFace(t *testing.T, style map[string]string, size float64) font.Face {
	t.Helper()
	face := font.DefaultCache.Lookup(plot.DefaultFont, font.Points(size))
	family, err := face.Face.Name(nil, sfnt.NameIDFamily)
	if err != nil {
		t.Fatal(err)
	}
	if style["font-family"] != family || style["font-weight"] != "normal" || style["font-style"] != "normal" {
		t.Fatalf("font %v: want %s, normal weight and style", style, family)
	}
	return face
}
