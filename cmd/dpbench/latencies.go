package main

import (
	"math/bits"
	"time"
)

// latencies holds a run's values of one latency and reads their mean,
// maximum and percentiles (nearest rank). It keeps the values themselves,
// and reads exact percentiles, up to exactLimit of them; past that it
// counts them in log-linear buckets (HdrHistogram's layout: 2^subBucketBits
// buckets to each power of two of nanoseconds), in constant memory, and a
// percentile is its bucket's midpoint: within 1/2^(subBucketBits+1) of the
// exact value, relatively (PercentileError). Mean and maximum stay exact.
type latencies struct {
	n        int
	sum      time.Duration
	min, max time.Duration
	// exact holds the values until there are more than exactLimit; then
	// buckets counts them.
	exact   []time.Duration
	buckets []uint64
}

const (
	// exactLimit is the most values kept exactly: what an endpoint run
	// collects, where a simulation of a million requests collects
	// hundreds of millions of inter-token gaps.
	exactLimit    = 1 << 16
	subBucketBits = 7
	subBuckets    = 1 << subBucketBits
	// numBuckets covers every non-negative int64.
	numBuckets = (64 - subBucketBits) * subBuckets
)

// PercentileError bounds the relative error of a percentile read from
// buckets: 1/256, about 0.4%.
const PercentileError = 1.0 / (2 * subBuckets)

func (l *latencies) add(d time.Duration) {
	if l.n == 0 || d < l.min {
		l.min = d
	}
	if l.n == 0 || d > l.max {
		l.max = d
	}
	l.n++
	l.sum += d
	if l.buckets != nil {
		l.buckets[bucketOf(d)]++
		return
	}
	l.exact = append(l.exact, d)
	if len(l.exact) > exactLimit {
		l.buckets = make([]uint64, numBuckets)
		for _, v := range l.exact {
			l.buckets[bucketOf(v)]++
		}
		l.exact = nil
	}
}

// approximate reports whether the percentiles come from buckets.
func (l *latencies) approximate() bool { return l.buckets != nil }

// percentiles reads the mean, maximum and percentiles, in milliseconds.
func (l *latencies) percentiles() Percentiles {
	if l.buckets == nil {
		return percentiles(l.exact)
	}
	at := func(q float64) float64 {
		i := uint64(nearestRank(q, l.n))
		seen := uint64(0)
		for b, c := range l.buckets {
			if seen += c; seen > i {
				return ms(min(max(bucketMid(b), l.min), l.max))
			}
		}
		return ms(l.max)
	}
	return Percentiles{Mean: ms(l.sum / time.Duration(l.n)), P50: at(0.5), P90: at(0.9), P99: at(0.99), Max: ms(l.max)}
}

// bucketOf is the bucket of d: d itself below subBuckets, then
// subBuckets to each power of two, each 1/subBuckets of its lower bound
// wide or less. A negative d counts as 0.
func bucketOf(d time.Duration) int {
	v := uint64(max(d, 0))
	if v < subBuckets {
		return int(v)
	}
	shift := bits.Len64(v) - 1 - subBucketBits
	return (shift+1)<<subBucketBits + int(v>>shift) - subBuckets
}

// bucketMid is the middle of bucket b, the value its counts read as.
func bucketMid(b int) time.Duration {
	if b < subBuckets {
		return time.Duration(b)
	}
	shift := b>>subBucketBits - 1
	low := uint64(b&(subBuckets-1)+subBuckets) << shift
	return time.Duration(low + (uint64(1)<<shift)/2)
}
