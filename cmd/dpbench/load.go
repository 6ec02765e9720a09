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
	bar := newProgressBar(len(items), progress, label)
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
	if l.Open {
		sendOpen(ctx, items, start, l.MaxInFlight, stop, sent, one)
	} else {
		sendClosed(ctx, len(items), l.Concurrency, stop, sent, one)
	}
	elapsed := time.Since(start)
	var done []Outcome
	for i, o := range outcomes {
		if sent[i] {
			done = append(done, o)
		}
	}
	return done, elapsed
}

// newProgressBar counts the n requests of the run label on progress.
func newProgressBar(n int, progress io.Writer, label string) *progressbar.ProgressBar {
	return progressbar.NewOptions(n,
		progressbar.OptionSetWriter(progress),
		progressbar.OptionSetDescription(label),
		progressbar.OptionShowCount(),
		progressbar.OptionShowIts(),
		progressbar.OptionSetItsString("req"),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionClearOnFinish())
}

// sendOpen is the open loop: it sends each item at its arrival after
// start, each with one(i) in a goroutine of its own, and marks it in sent.
// With maxInFlight positive, an item past that many in flight waits for
// one to end. It stops sending when stop fires or ctx ends, and returns
// when every request it sent has ended.
func sendOpen(ctx context.Context, items []Item, start time.Time, maxInFlight int, stop <-chan time.Time, sent []bool, one func(i int)) {
	var wg sync.WaitGroup
	defer wg.Wait()
	var slots chan struct{}
	if maxInFlight > 0 {
		slots = make(chan struct{}, maxInFlight)
	}
	for i := range items {
		if wait := time.Until(start.Add(items[i].Arrival)); wait > 0 {
			select {
			case <-time.After(wait):
			case <-stop:
				return
			case <-ctx.Done():
				return
			}
		}
		if slots != nil {
			select {
			case slots <- struct{}{}:
			case <-stop:
				return
			case <-ctx.Done():
				return
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
}

// sendClosed is the closed loop: concurrency clients (at least one) each
// take the next of the n items, mark it in sent and send it with one(i),
// until the items run out, stop fires or ctx ends. It returns when every
// client has finished its last request.
func sendClosed(ctx context.Context, n, concurrency int, stop <-chan time.Time, sent []bool, one func(i int)) {
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
		if stopped || next >= n || ctx.Err() != nil {
			return -1
		}
		next++
		sent[next-1] = true
		return next - 1
	}
	var wg sync.WaitGroup
	for range max(concurrency, 1) {
		wg.Go(func() {
			for i := take(); i >= 0; i = take() {
				one(i)
			}
		})
	}
	wg.Wait()
}
