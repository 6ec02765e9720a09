package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Event is something that happened during a run (a node joined, one
// left), at a time since the run's start.
type Event struct {
	At    time.Duration
	Label string
}

// Window is the requests that started in one slice of a run's time.
type Window struct {
	// Start is the window's start, since the run's.
	Start    time.Duration
	Requests int
	Failed   int
	TTFT     Percentiles
}

// outcome is a recorded request as the run's tally takes it.
func (r Record) outcome() Outcome {
	return Outcome{TTFT: msDuration(r.TTFTMs), E2E: msDuration(r.E2EMs), PromptTokens: r.PromptTokens, CachedTokens: r.CachedTokens, OutputTokens: r.OutputTokens, Err: r.Err}
}

func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// Timeline cuts a run's requests, by their start, into windows of width.
func Timeline(reqs []Record, width time.Duration) []Window {
	var ts []tally
	for _, r := range reqs {
		i := int(msDuration(r.StartMs) / width)
		for len(ts) <= i {
			ts = append(ts, tally{})
		}
		ts[i].add(r.outcome())
	}
	ws := make([]Window, len(ts))
	for i, t := range ts {
		ws[i] = Window{Start: time.Duration(i) * width, Requests: t.sent, Failed: t.failed, TTFT: t.ttft.percentiles()}
	}
	return ws
}

// Phase is the requests that started between two events.
type Phase struct {
	Label    string
	From, To time.Duration
	Requests int
	Failed   int
	TTFT     Percentiles
}

// Phases cuts a run's requests at the events: before the first, then
// from each event to the next. A request belongs to the phase it started
// in.
func Phases(reqs []Record, events []Event, end time.Duration) []Phase {
	bounds := []Event{{At: 0, Label: "steady state, before the first event"}}
	bounds = append(bounds, events...)
	ts := make([]tally, len(bounds))
	for _, r := range reqs {
		i := len(bounds) - 1
		for i > 0 && msDuration(r.StartMs) < bounds[i].At {
			i--
		}
		ts[i].add(r.outcome())
	}
	phases := make([]Phase, len(bounds))
	for i, b := range bounds {
		phases[i] = Phase{Label: b.Label, From: b.At, To: end, Requests: ts[i].sent, Failed: ts[i].failed, TTFT: ts[i].ttft.percentiles()}
		if i+1 < len(bounds) {
			phases[i].To = bounds[i+1].At
		}
	}
	return phases
}

// readEvents reads lines of "UNIX_MS LABEL" and places them in the run
// that started at startedMs.
func readEvents(r io.Reader, startedMs int64) ([]Event, error) {
	var evs []Event
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		at, label, _ := strings.Cut(line, " ")
		ms, err := strconv.ParseInt(at, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("events line %d: want UNIX_MS LABEL, got %q", n, line)
		}
		evs = append(evs, Event{At: time.Duration(ms-startedMs) * time.Millisecond, Label: strings.TrimSpace(label)})
	}
	slices.SortStableFunc(evs, func(a, b Event) int { return int(a.At - b.At) })
	return evs, sc.Err()
}

func newTimelineCommand() *cobra.Command {
	var out, eventsPath, title string
	var width time.Duration
	cmd := &cobra.Command{
		Use:   "timeline RESULTS.json",
		Short: "TTFT over time of a run recorded with --detail, with events (joins, leaves) marked",
		Long: `Reads a live run's result file written with --detail, and a file of events, one a line:
UNIX_MS LABEL. Prints TTFT p50 and p99 for each phase between events against the steady state
before the first, and with --out draws them over time in windows of --window.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := os.ReadFile(args[0])
			if err != nil {
				return err
			}
			var rep report
			if err := json.Unmarshal(b, &rep); err != nil {
				return fmt.Errorf("%s: %w", args[0], err)
			}
			if len(rep.Runs) != 1 || len(rep.Runs[0].Requests) == 0 || rep.Runs[0].StartedUnixMs == 0 {
				return fmt.Errorf("%s: want one live run recorded with --detail", args[0])
			}
			run := rep.Runs[0]
			var events []Event
			if eventsPath != "" {
				f, err := os.Open(eventsPath)
				if err != nil {
					return err
				}
				events, err = readEvents(f, run.StartedUnixMs)
				f.Close()
				if err != nil {
					return err
				}
			}
			phases := Phases(run.Requests, events, time.Duration(run.DurationS*float64(time.Second)))
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(w, "phase\tfrom s\tto s\trequests\tfailed\tTTFT p50 ms\tTTFT p99 ms")
			for _, p := range phases {
				fmt.Fprintf(w, "%s\t%.1f\t%.1f\t%d\t%d\t%.1f\t%.1f\n", p.Label, p.From.Seconds(), p.To.Seconds(), p.Requests, p.Failed, p.TTFT.P50, p.TTFT.P99)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if out == "" {
				return nil
			}
			return saveTimeline(out, title, Timeline(run.Requests, width), events)
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "draw TTFT over time here (.svg, .png or .pdf)")
	cmd.Flags().StringVar(&eventsPath, "events", "", "file of events, one a line: UNIX_MS LABEL")
	cmd.Flags().StringVar(&title, "title", "", "the plot's title")
	cmd.Flags().DurationVar(&width, "window", 2*time.Second, "width of the windows the plot draws")
	return cmd
}

// saveTimeline draws TTFT p50 and p99 per window against the run's time,
// with a vertical line at each event, named above the data.
func saveTimeline(path, title string, ws []Window, events []Event) error {
	p := newPanel()
	p.X.Label.Text = "time since the load began (s)"
	p.Y.Label.Text = "TTFT (ms)"
	leg := newLegend()
	for k, pick := range []func(Percentiles) float64{func(q Percentiles) float64 { return q.P99 }, func(q Percentiles) float64 { return q.P50 }} {
		var xys plotter.XYs
		for _, w := range ws {
			if w.Requests-w.Failed == 0 {
				continue
			}
			xys = append(xys, plotter.XY{X: w.Start.Seconds(), Y: pick(w.TTFT)})
		}
		if len(xys) == 0 {
			continue
		}
		line, err := plotter.NewLine(xys)
		if err != nil {
			return err
		}
		line.Color = palette[k]
		line.Width = vg.Points(1.5)
		p.Add(line)
		leg.Add([]string{"p99", "p50"}[k], line)
	}
	p.Y.Min = 0
	for _, e := range events {
		p.X.Min, p.X.Max = min(p.X.Min, e.At.Seconds()), max(p.X.Max, e.At.Seconds())
	}
	sty := text.Style{Font: font.From(plot.DefaultFont, 10), Handler: plot.DefaultTextHandler}
	return writeFigure(path, func(c draw.Canvas) {
		area, key := layOut(c, title, &leg)
		// Where the events fall does not depend on the height left for
		// the data, so their labels can be placed before the strip they
		// need is cut off the top of the area.
		data := p.DataCanvas(area)
		trX, _ := p.Transforms(&data)
		xs := make([]vg.Length, len(events))
		widths := make([]vg.Length, len(events))
		for i, e := range events {
			xs[i], widths[i] = trX(e.At.Seconds()), sty.Width(e.Label)
		}
		gap := sty.Width(" ")
		lefts, rows := placeLabels(xs, widths, gap, key.Max.X)
		line := sty.FontExtents().Height
		if len(rows) > 0 {
			area.Max.Y -= vg.Length(slices.Max(rows)+1)*line + margin/2
		}
		p.Draw(area)
		data = p.DataCanvas(area)
		descent := sty.FontExtents().Descent
		for i, e := range events {
			bottom := data.Max.Y + margin/2 + vg.Length(rows[i])*line
			mark := draw.LineStyle{Color: palette[2+i%(len(palette)-2)], Width: vg.Points(1), Dashes: []vg.Length{vg.Points(4), vg.Points(3)}}
			c.StrokeLine2(mark, xs[i], data.Min.Y, xs[i], bottom+line)
			c.FillText(sty, vg.Point{X: lefts[i], Y: bottom + descent}, e.Label)
		}
		key.Max.Y = data.Max.Y
		leg.Draw(key)
	})
}

// placeLabels lays out the labels of events whose lines are at xs, of
// widths, in rows above the data, row 0 the lowest, and returns where
// each starts and its row. A label starts gap right of its line, or ends
// gap left of it where it would pass right. Each line runs up to its
// label's row, so a label takes the lowest row where it overlaps no other
// label, no line that runs past it to a higher row crosses it, and its
// own line crosses no label below it. Placed from the right, the labels
// of close events stair up to the left.
func placeLabels(xs, widths []vg.Length, gap, right vg.Length) (lefts []vg.Length, rows []int) {
	lefts = make([]vg.Length, len(xs))
	rows = make([]int, len(xs))
	order := make([]int, len(xs))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(xs[b], xs[a]) })
	top := -1
	for n, i := range order {
		lefts[i] = xs[i] + gap
		if lefts[i]+widths[i] > right {
			lefts[i] = xs[i] - gap - widths[i]
		}
		fits := func(row int) bool {
			for _, j := range order[:n] {
				across := lefts[i] < lefts[j]+widths[j]+gap && lefts[j] < lefts[i]+widths[i]+gap
				switch {
				case rows[j] == row && across,
					rows[j] > row && lefts[i] <= xs[j] && xs[j] <= lefts[i]+widths[i],
					rows[j] < row && lefts[j] <= xs[i] && xs[i] <= lefts[j]+widths[j]:
					return false
				}
			}
			return true
		}
		// A row above all others always holds the label, if at the cost
		// of a line through another.
		rows[i] = top + 1
		for row := range top + 1 {
			if fits(row) {
				rows[i] = row
				break
			}
		}
		top = max(top, rows[i])
	}
	return lefts, rows
}
