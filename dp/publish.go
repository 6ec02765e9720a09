package dp

import "time"

// PublishConfig sets how often the coordinator publishes load snapshots.
type PublishConfig struct {
	// MinInterval is the least time between two snapshots while loads
	// change: 100 ms, as vLLM's coordinator, bounds the fan-out traffic to
	// ten snapshots a second however busy the engines are.
	MinInterval time.Duration
	// Heartbeat is the longest time without a snapshot, so that receivers
	// can tell a quiet coordinator from a dead one; vLLM uses 3–5 s.
	Heartbeat time.Duration
}

// DefaultPublishConfig is vLLM's cadence.
func DefaultPublishConfig() PublishConfig {
	return PublishConfig{MinInterval: 100 * time.Millisecond, Heartbeat: 3 * time.Second}
}

// Publisher decides when a snapshot is due.
type Publisher struct {
	cfg     PublishConfig
	dirty   bool
	urgent  bool
	last    time.Time
	started bool
}

// NewPublisher returns a publisher that publishes at once on the first
// change or Due.
func NewPublisher(cfg PublishConfig) *Publisher { return &Publisher{cfg: cfg} }

// Changed records that some load changed.
func (p *Publisher) Changed() { p.dirty = true }

// Urgent records a change that must go out at once, not after the
// interval: a wave starting or ending, which frontends act on.
func (p *Publisher) Urgent() { p.dirty, p.urgent = true, true }

// Due says whether to publish at now, whether that snapshot is a heartbeat
// (nothing changed), and when to ask again if nothing else happens.
func (p *Publisher) Due(now time.Time) (publish, heartbeat bool, next time.Time) {
	switch {
	case !p.started, p.urgent:
		publish = true
	case p.dirty && now.Sub(p.last) >= p.cfg.MinInterval:
		publish = true
	case !p.dirty && now.Sub(p.last) >= p.cfg.Heartbeat:
		publish, heartbeat = true, true
	}
	if publish {
		p.started, p.dirty, p.urgent, p.last = true, false, false, now
		return publish, heartbeat, now.Add(p.cfg.Heartbeat)
	}
	if p.dirty {
		return false, false, p.last.Add(p.cfg.MinInterval)
	}
	return false, false, p.last.Add(p.cfg.Heartbeat)
}
