package main

import (
	"bufio"
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
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
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
	return Outcome{TTFT: msDuration(r.TTFTMs), E2E: msDuration(r.E2EMs), PromptTokens: r.PromptTokens, OutputTokens: r.OutputTokens, Err: r.Err}
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
// with a vertical line at each event.
func saveTimeline(path, title string, ws []Window, events []Event) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "time since the load began (s)"
	p.Y.Label.Text = "TTFT (ms)"
	p.Add(plotter.NewGrid())
	top := 0.0
	for k, pick := range []func(Percentiles) float64{func(q Percentiles) float64 { return q.P99 }, func(q Percentiles) float64 { return q.P50 }} {
		var xys plotter.XYs
		for _, w := range ws {
			if w.Requests-w.Failed == 0 {
				continue
			}
			v := pick(w.TTFT)
			xys = append(xys, plotter.XY{X: w.Start.Seconds(), Y: v})
			top = max(top, v)
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
		p.Legend.Add([]string{"p99", "p50"}[k], line)
	}
	p.Y.Min, p.Y.Max = 0, top*1.25
	var labels plotter.XYLabels
	for i, e := range events {
		mark, err := plotter.NewLine(plotter.XYs{{X: e.At.Seconds(), Y: 0}, {X: e.At.Seconds(), Y: top * 1.25}})
		if err != nil {
			return err
		}
		mark.Color = palette[2+i%(len(palette)-2)]
		mark.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		p.Add(mark)
		// Labels stagger down, so that close events do not overwrite
		// each other.
		labels.XYs = append(labels.XYs, plotter.XY{X: e.At.Seconds(), Y: top * (1.2 - 0.07*float64(i%4))})
		labels.Labels = append(labels.Labels, " "+e.Label)
	}
	if len(events) > 0 {
		l, err := plotter.NewLabels(labels)
		if err != nil {
			return err
		}
		p.Add(l)
	}
	p.Legend.Top, p.Legend.Left = true, true
	p.Legend.YOffs = -vg.Points(2)
	return writeFigure(path, p.Draw)
}
