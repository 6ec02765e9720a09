package engine

// noSeq marks a request that holds no KV stream.
const noSeq int32 = -1

// kvSpace is where a scheduler keeps its requests' KV: a pool of blocks
// (the simulated executor's, vLLM's paged layout) or a stream per
// sequence (llama.cpp's). The scheduler calls it from one goroutine.
type kvSpace interface {
	// admit gives a waiting request KV for its cached prefix and for up to
	// budget more tokens. It returns the prefix's tokens and the new
	// tokens to compute, or false, changing nothing, when the request
	// cannot start now.
	admit(req *Request, budget int) (cached, n int, ok bool)
	// grow makes room for n more tokens of a running request; false when
	// there is none, and the scheduler must preempt.
	grow(req *Request, n int) bool
	// computed records that req's KV now holds req.numComputed tokens:
	// its full blocks become findable by the prefix cache.
	computed(req *Request)
	// release gives back what req holds: it finished, was aborted or was
	// preempted. What the prefix cache can use of it stays findable.
	release(req *Request)
	// takeOps hands over the KV moves made since the last step, for an
	// executor that places KV by sequence (Batch.SeqOps).
	takeOps() []SeqOp
	// usage is the share of the KV that requests hold.
	usage() float64
}

var (
	_ kvSpace = (*kvCache)(nil)
	_ kvSpace = (*streamKV)(nil)
)

// streamKV gives each running request a KV stream of its own, for an
// executor whose KV lives in per-sequence streams of fixed capacity
// (llama.cpp with kv_unified off, as llama-server runs it). A step then
// attends over each sequence's own cells only: what other sequences and
// the prefix cache hold costs it nothing.
//
// The streams are in two regions. The first maxRunning streams run
// requests: a request takes the lowest free one, so that running
// sequences have nearly consecutive ids, and a gap between them is an
// empty stream. llama.cpp computes consecutive streams with equal token
// counts in one pass over the weights, and makes a pass of its own for
// each run of them; an executor can fill a gap of empty streams with a
// token that costs almost nothing (the llama.cpp worker does), while a
// gap of streams that hold long histories would make every stream of the
// pass attend over as many cells. The rest of the streams are kept: they
// hold finished requests' KV for the prefix cache, least recently used
// given up first.
//
// The prefix cache indexes the full blocks streams hold, by hash; a
// stream holding a block at its index holds every block before it, since
// a block's hash chains over all tokens before it. A request whose prompt
// starts with blocks a stream holds, kept or running, gets them by a copy
// of that stream into its own (llama.cpp copies whole streams only) whose
// tail past the hit is then removed; of the streams that hold the hit,
// the one that holds least is copied. A copy costs far less than
// computing the cells (the llama.cpp executor keeps the kept streams in
// host memory, as llama.cpp's per-sequence state: saving or restoring
// 1,000 tokens of the benchmark model takes 0.2 ms on a CPU, where
// computing 2,048 tokens takes 30 ms), but it is made only when the
// hit is at least 1/copyRatio of what the source holds: a prompt that
// shares a short system prompt with a long kept conversation computes it.
//
// A finished request's stream is copied into the kept region: into the
// kept stream its prefix came from when that holds a prefix of it (a
// conversation's last turn is replaced by its longer next turn), else
// into a free kept stream, else into the least recently used one. With no
// kept region (no more streams than running requests), an idle running
// stream keeps its last request's KV until a request needs the stream,
// and a hit on it takes it over in place.
type streamKV struct {
	blockSize     int
	prefixCaching bool
	// cells is each stream's capacity in tokens.
	cells int
	// running is how many streams run requests: [0, running). The others
	// are kept for the prefix cache.
	running int
	// copyRatio bounds what a hit copies: the source may hold at most
	// copyRatio times the hit (DefaultStreamCopyRatio); 0 copies nothing.
	copyRatio int
	streams   []kvStream
	// byHash finds a stream that holds a block, by the Key of the block's
	// hash; the stream's blocks have the whole hash.
	byHash map[uint64]int32
	tick   uint64
	ops    []SeqOp
}

type kvStream struct {
	// req is the running request whose KV the stream holds; nil when the
	// stream is free or kept.
	req *Request
	// blocks are the hashes of the full blocks the stream holds: block i
	// at positions [i·blockSize, (i+1)·blockSize). Only a kept stream with
	// blocks is worth keeping.
	blocks []BlockHash
	// used is the positions [0, used) that hold KV, as the scheduler last
	// knew them.
	used int
	// lastUsed orders kept streams for eviction.
	lastUsed uint64
	// from is the kept stream a running request's prefix was copied from,
	// or noSeq.
	from int32
}

// DefaultStreamCopyRatio bounds a prefix hit's copy: the stream copied may
// hold at most this many times the hit's tokens (see streamKV).
const DefaultStreamCopyRatio = 8

func newStreamKV(streams, cells, blockSize, maxRunning int, prefixCaching bool) *streamKV {
	k := &streamKV{
		blockSize:     blockSize,
		prefixCaching: prefixCaching,
		cells:         cells,
		running:       min(streams, maxRunning),
		copyRatio:     DefaultStreamCopyRatio,
		streams:       make([]kvStream, streams),
		byHash:        make(map[uint64]int32),
	}
	for i := range k.streams {
		k.streams[i].from = noSeq
	}
	return k
}

func (k *streamKV) op(op SeqOp) { k.ops = append(k.ops, op) }

func (k *streamKV) takeOps() []SeqOp {
	ops := k.ops
	k.ops = nil
	return ops
}

// lookup finds the longest prefix of req's full blocks that a stream
// holds, and of the streams that hold it the one that holds least (the
// cheapest to copy). At least one token is always left to compute,
// because the step that computes it samples the next one.
func (k *streamKV) lookup(req *Request) (int32, int) {
	if !k.prefixCaching || req.sampling.PromptLogprobs {
		return noSeq, 0
	}
	maxBlocks := (req.numTokens() - 1) / k.blockSize
	req.extendHashes(k.blockSize, maxBlocks)
	m := 0
	for i := 0; i < maxBlocks; i++ {
		h := req.blockHashes[i]
		s, ok := k.byHash[h.Key()]
		if !ok || len(k.streams[s].blocks) <= i || k.streams[s].blocks[i] != h {
			break
		}
		m = i + 1
	}
	if m == 0 {
		return noSeq, 0
	}
	last, src := req.blockHashes[m-1], noSeq
	for s := range k.streams {
		st := &k.streams[s]
		if len(st.blocks) < m || st.blocks[m-1] != last {
			continue
		}
		if src == noSeq || st.used < k.streams[src].used {
			src = int32(s)
		}
	}
	return src, m
}

// free returns the lowest running stream that holds nothing, else (with
// no kept streams, below) the least recently used idle one, whose KV it
// gives up; noSeq when every running stream runs a request.
func (k *streamKV) free() int32 {
	victim := noSeq
	for s := range k.running {
		st := &k.streams[s]
		switch {
		case st.req != nil:
		case len(st.blocks) == 0 && st.used == 0:
			return int32(s)
		case victim == noSeq || st.lastUsed < k.streams[victim].lastUsed:
			victim = int32(s)
		}
	}
	if victim != noSeq {
		k.forget(victim, 0)
		k.op(SeqOp{Kind: SeqRemove, Dst: victim, P0: 0, P1: -1})
		k.streams[victim].used = 0
	}
	return victim
}

func (k *streamKV) admit(req *Request, budget int) (int, int, bool) {
	src, m := k.lookup(req)
	if m > 0 && m*k.blockSize*k.copyRatio < k.streams[src].used {
		// Copying the source, or cutting it, would cost more than
		// computing the hit.
		src, m = noSeq, 0
	}
	var dst int32
	if m > 0 && int(src) < k.running && k.streams[src].req == nil {
		// With no kept streams (a KV budget of no more streams than
		// running requests), an idle running stream keeps its finished
		// request's KV: it is taken over in place.
		dst = src
		k.forget(dst, m)
	} else {
		if dst = k.free(); dst == noSeq {
			return 0, 0, false
		}
		k.streams[dst].blocks = k.streams[dst].blocks[:0]
		if m > 0 {
			k.op(SeqOp{Kind: SeqCopy, Src: src, Dst: dst, P0: -1, P1: -1})
			k.streams[dst].blocks = append(k.streams[dst].blocks, k.streams[src].blocks[:m]...)
			k.streams[src].lastUsed = k.touch()
		}
	}
	st := &k.streams[dst]
	st.from = noSeq
	if m > 0 && src != dst && k.streams[src].req == nil {
		st.from = src
	}
	cached := m * k.blockSize
	// Past the hit the stream holds the source's other tokens, or those
	// of a step that computed an aborted request: they go.
	k.op(SeqOp{Kind: SeqRemove, Dst: dst, P0: int32(cached), P1: -1})
	st.used, st.req, st.lastUsed = cached, req, k.touch()
	req.seq, req.executorHasLast = dst, false
	return cached, min(req.numTokens()-cached, budget), true
}

// keep returns the kept stream that a finished request's stream st is
// copied into: the one its prefix came from while that holds a prefix of
// it, else a free one, else the least recently used one.
func (k *streamKV) keep(st *kvStream) int32 {
	if f := st.from; f != noSeq {
		fs := &k.streams[f]
		if n := len(fs.blocks); n > 0 && n <= len(st.blocks) && fs.blocks[n-1] == st.blocks[n-1] {
			return f
		}
	}
	victim := noSeq
	for s := k.running; s < len(k.streams); s++ {
		if len(k.streams[s].blocks) == 0 {
			return int32(s)
		}
		if victim == noSeq || k.streams[s].lastUsed < k.streams[victim].lastUsed {
			victim = int32(s)
		}
	}
	return victim
}

func (k *streamKV) touch() uint64 {
	k.tick++
	return k.tick
}

// grow always succeeds: a stream holds the longest request the scheduler
// admits (MaxModelLen is at most its capacity).
func (k *streamKV) grow(req *Request, n int) bool {
	if req.numComputed+n > k.cells {
		panic("engine: a request outgrew its stream; the config check should have made that impossible")
	}
	return true
}

func (k *streamKV) computed(req *Request) {
	st := &k.streams[req.seq]
	st.used = req.numComputed
	if !k.prefixCaching {
		return
	}
	full := req.numComputed / k.blockSize
	if full <= len(st.blocks) {
		return
	}
	req.extendHashes(k.blockSize, full)
	for i := len(st.blocks); i < full; i++ {
		h := req.blockHashes[i]
		st.blocks = append(st.blocks, h)
		if _, ok := k.byHash[h.Key()]; !ok {
			k.byHash[h.Key()] = req.seq
		}
	}
}

func (k *streamKV) release(req *Request) {
	s := req.seq
	if s == noSeq {
		return
	}
	req.seq = noSeq
	st := &k.streams[s]
	st.req = nil
	if len(st.blocks) > 0 && len(k.streams) == k.running {
		// No kept streams: the stream keeps it until it is needed.
		st.lastUsed = k.touch()
		return
	}
	if len(st.blocks) > 0 {
		dst := k.keep(st)
		d := &k.streams[dst]
		if len(d.blocks) != len(st.blocks) || d.blocks[len(d.blocks)-1] != st.blocks[len(st.blocks)-1] {
			// Not what dst holds already (an aborted hit holds only that).
			k.forget(dst, 0)
			k.op(SeqOp{Kind: SeqCopy, Src: s, Dst: dst, P0: -1, P1: -1})
			d.blocks = append(d.blocks[:0], st.blocks...)
			d.used = st.used
		}
		d.lastUsed = k.touch()
	}
	// The index finds st's blocks in the kept copy, or in other holders.
	k.forget(s, 0)
	k.op(SeqOp{Kind: SeqRemove, Dst: s, P0: 0, P1: -1})
	st.used, st.from = 0, noSeq
}

// forget takes a stream's blocks from keep on out of the prefix cache:
// where the index finds one of them in this stream, it finds it in
// another stream that holds it, or not at all.
func (k *streamKV) forget(s int32, keep int) {
	st := &k.streams[s]
	for i := keep; i < len(st.blocks); i++ {
		h := st.blocks[i]
		if k.byHash[h.Key()] != s {
			continue
		}
		delete(k.byHash, h.Key())
		for t := range k.streams {
			if o := &k.streams[t]; int32(t) != s && len(o.blocks) > i && o.blocks[i] == h {
				k.byHash[h.Key()] = int32(t)
				break
			}
		}
	}
	st.blocks = st.blocks[:keep]
}

func (k *streamKV) usage() float64 {
	held := 0
	for i := range k.streams {
		if k.streams[i].req != nil {
			held += k.streams[i].used
		}
	}
	return float64(held) / float64(k.running*k.cells)
}
