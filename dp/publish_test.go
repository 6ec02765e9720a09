package dp

import (
	"testing"
	"time"
)

func TestPublisherCadence(t *testing.T) {
	cfg := DefaultPublishConfig()
	p := NewPublisher(cfg)
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }

	type step struct {
		at        time.Duration
		change    bool
		publish   bool
		heartbeat bool
		next      time.Duration
	}
	steps := []step{
		{at: 0, publish: true, next: 3 * time.Second},
		{at: 10 * time.Millisecond, change: true, publish: false, next: 100 * time.Millisecond},
		{at: 60 * time.Millisecond, change: true, publish: false, next: 100 * time.Millisecond},
		{at: 100 * time.Millisecond, publish: true, next: 3100 * time.Millisecond},
		{at: 150 * time.Millisecond, publish: false, next: 3100 * time.Millisecond},
		{at: 3100 * time.Millisecond, publish: true, heartbeat: true, next: 6100 * time.Millisecond},
		{at: 5 * time.Second, change: true, publish: true, next: 8 * time.Second},
		{at: 5010 * time.Millisecond, change: true, publish: false, next: 5100 * time.Millisecond},
	}
	for i, s := range steps {
		if s.change {
			p.Changed()
		}
		publish, hb, next := p.Due(at(s.at))
		if publish != s.publish || hb != s.heartbeat || !next.Equal(at(s.next)) {
			t.Fatalf("step %d at %v: publish=%v heartbeat=%v next=%v; want %v %v %v",
				i, s.at, publish, hb, next.Sub(t0), s.publish, s.heartbeat, s.next)
		}
	}
	// A wave change cannot wait for the interval.
	p.Urgent()
	if publish, _, _ := p.Due(at(5020 * time.Millisecond)); !publish {
		t.Fatal("an urgent change waited for the interval")
	}
}
