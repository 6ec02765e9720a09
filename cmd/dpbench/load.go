package main

import (
	"context"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// Load is how requests are sent.
type Load struct {
	// Open sends each item at its arrival time (an open loop; Rate, when
	// set, is the rate the arrivals were drawn at); else Concurrency
	// clients each send their next request when the previous one ends (a
	// closed loop).
	Open        bool
	Rate        float64
	Concurrency int
	// MaxInFlight caps the requests in flight in an open loop, as vLLM's
	// --max-concurrency does (0: no cap): a request past it waits.
	MaxInFlight int
	// Duration stops sending new requests after this long (0: none).
	Duration time.Duration
	// Timeout bounds each request.
	Timeout time.Duration
}

// send runs items against t under load l, and returns their outcomes in
// item order (unsent items are left out) and the run's duration, from
// the first send to the last end.
func send(ctx context.Context, t *Target, items []Item, l Load, progress io.Writer, label string) ([]Outcome, time.Duration) {
	bar := progressbar.NewOptions(len(items),
		progressbar.OptionSetWriter(progress),
		progressbar.OptionSetDescription(label),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("req"),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionClearOnFinish())
	defer bar.Finish()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	outcomes := make([]Outcome, len(items))
	sent := make([]bool, len(items))
	start := time.Now()
	var stop <-chan time.Time
	if l.Duration > 0 {
		timer := time.NewTimer(l.Duration)
		defer timer.Stop()
		stop = timer.C
	}
	one := func(i int) {
		rctx, cancel := context.WithTimeout(ctx, l.Timeout)
		outcomes[i] = t.Send(rctx, &items[i], start)
		cancel()
		_ = bar.Add(1)
	}
	var wg sync.WaitGroup
	if l.Open {
		var slots chan struct{}
		if l.MaxInFlight > 0 {
			slots = make(chan struct{}, l.MaxInFlight)
		}
	open:
		for i := range items {
			if wait := time.Until(start.Add(items[i].Arrival)); wait > 0 {
				select {
				case <-time.After(wait):
				case <-stop:
					break open
				case <-ctx.Done():
					break open
				}
			}
			if slots != nil {
				select {
				case slots <- struct{}{}:
				case <-stop:
					break open
				case <-ctx.Done():
					break open
				}
			}
			sent[i] = true
			wg.Go(func() {
				one(i)
				if slots != nil {
					<-slots
				}
			})
		}
	} else {
		var mu sync.Mutex
		next := 0
		stopped := false
		go func() {
			select {
			case <-stop:
			case <-ctx.Done():
			}
			mu.Lock()
			stopped = true
			mu.Unlock()
		}()
		take := func() int {
			mu.Lock()
			defer mu.Unlock()
			if stopped || next >= len(items) || ctx.Err() != nil {
				return -1
			}
			next++
			sent[next-1] = true
			return next - 1
		}
		for range max(l.Concurrency, 1) {
			wg.Go(func() {
				for i := take(); i >= 0; i = take() {
					one(i)
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	var done []Outcome
	for i, o := range outcomes {
		if sent[i] {
			done = append(done, o)
		}
	}
	return done, elapsed
}
