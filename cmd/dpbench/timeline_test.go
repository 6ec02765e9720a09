package main

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestTimelineAndPhasesCutAtEvents(t *testing.T) {
	// Requests start every 100 ms for 6 s; TTFT is 10 ms, except 50 ms
	// for those that start from 2 s to 4 s (a scale event), and one in
	// that span fails.
	var reqs []Record
	for i := range 60 {
		r := Record{StartMs: float64(i * 100), TTFTMs: 10}
		if i >= 20 && i < 40 {
			r.TTFTMs = 50
		}
		if i == 30 {
			r.Err = "refused"
		}
		reqs = append(reqs, r)
	}
	ws := Timeline(reqs, time.Second)
	if len(ws) != 6 {
		t.Fatalf("%d windows, want 6", len(ws))
	}
	if ws[0].Requests != 10 || ws[0].TTFT.P99 != 10 || ws[3].Failed != 1 || ws[3].TTFT.P50 != 50 || ws[4].TTFT.P99 != 10 {
		t.Fatalf("windows: %+v", ws)
	}
	started := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	events, err := readEvents(strings.NewReader("# joins and leaves\n"+
		itoa(started+4000)+" node C left\n"+itoa(started+2000)+" node C joined\n"), started)
	if err != nil {
		t.Fatal(err)
	}
	if len(events) != 2 || events[0].Label != "node C joined" || events[0].At != 2*time.Second {
		t.Fatalf("events: %+v (want sorted, relative to the start)", events)
	}
	ps := Phases(reqs, events, 6*time.Second)
	if len(ps) != 3 {
		t.Fatalf("%d phases, want 3", len(ps))
	}
	if p := ps[0]; p.Requests != 20 || p.TTFT.P99 != 10 || p.To != 2*time.Second {
		t.Fatalf("steady state: %+v", p)
	}
	if p := ps[1]; p.Requests != 20 || p.Failed != 1 || p.TTFT.P50 != 50 || p.Label != "node C joined" {
		t.Fatalf("while C was in: %+v", p)
	}
	if p := ps[2]; p.Requests != 20 || p.TTFT.P99 != 10 || p.To != 6*time.Second {
		t.Fatalf("after C left: %+v", p)
	}
	if _, err := readEvents(strings.NewReader("soon node C joined\n"), started); err == nil {
		t.Fatal("an event without a time was read")
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
