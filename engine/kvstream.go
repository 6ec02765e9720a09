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
// A stream is free, running (it holds a running request's KV) or kept
// (it holds a finished request's KV for the prefix cache). The prefix
// cache indexes the full blocks streams hold, by hash; a stream holding
// a block at its index holds every block before it, since a block's hash
// chains over all tokens before it. A request whose prompt starts with
// blocks a stream holds gets them without computing them:
//
//   - from a kept stream: it takes that stream over, and the stream's
//     tail past the hit is removed (a conversation coming back finds its
//     last turn so), when the hit is at least half of what the stream
//     holds, or at least copyMinTokens, or the stream is the next to
//     give up; otherwise the hit is computed again, since cutting a kept
//     conversation off for a shared system prompt would lose more than it
//     saves;
//   - from a running stream, when the hit is at least copyMinTokens: it
//     is given a stream of its own (a free one, else the least recently
//     used kept one) and the holder's whole stream is copied into it,
//     which is the only copy llama.cpp makes between streams, and the
//     copy's tail past the hit is removed. A copy costs llama.cpp a new
//     worst-case graph besides the memory: on the benchmark CPU, 50 to
//     80 ms, what computing 500 tokens costs; a shorter hit is computed.
//
// A request without a hit takes a free stream, else the least recently
// used kept one. New streams are the lowest free ids, so that running
// sequences tend to have consecutive ids: llama.cpp computes consecutive
// streams with equal token counts in one pass over the weights.
type streamKV struct {
	blockSize     int
	prefixCaching bool
	// cells is each stream's capacity in tokens.
	cells int
	// running bounds the running requests: usage is a share of what they
	// may hold.
	running int
	// copyMinTokens is the shortest hit worth copying a running stream
	// for (DefaultStreamCopyMinTokens).
	copyMinTokens int
	streams       []kvStream
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
	// at positions [i·blockSize, (i+1)·blockSize). Only a stream with
	// blocks is kept for the prefix cache.
	blocks []BlockHash
	// used is the positions [0, used) that hold KV, as the scheduler last
	// knew them.
	used int
	// lastUsed orders kept streams for eviction.
	lastUsed uint64
}

// DefaultStreamCopyMinTokens is the shortest prefix hit for which a
// request copies a running request's stream rather than computing the
// prefix again (see streamKV).
const DefaultStreamCopyMinTokens = 1024

func newStreamKV(streams, cells, blockSize, maxRunning int, prefixCaching bool) *streamKV {
	return &streamKV{
		blockSize:     blockSize,
		prefixCaching: prefixCaching,
		cells:         cells,
		running:       min(streams, maxRunning),
		copyMinTokens: DefaultStreamCopyMinTokens,
		streams:       make([]kvStream, streams),
		byHash:        make(map[uint64]int32),
	}
}

func (k *streamKV) op(op SeqOp) { k.ops = append(k.ops, op) }

func (k *streamKV) takeOps() []SeqOp {
	ops := k.ops
	k.ops = nil
	return ops
}

// lookup finds the longest prefix of req's full blocks that a stream
// holds, and the stream to take it from: of the kept streams that hold
// it, the one that holds least besides (taking it over loses least), else
// the running stream that holds it. At least one token is always left to
// compute, because the step that computes it samples the next one.
func (k *streamKV) lookup(req *Request) (int32, int) {
	if !k.prefixCaching {
		return noSeq, 0
	}
	maxBlocks := (req.numTokens() - 1) / k.blockSize
	req.extendHashes(k.blockSize, maxBlocks)
	src, m := noSeq, 0
	for i := 0; i < maxBlocks; i++ {
		h := req.blockHashes[i]
		s, ok := k.byHash[h.Key()]
		if !ok || len(k.streams[s].blocks) <= i || k.streams[s].blocks[i] != h {
			break
		}
		src, m = s, i+1
	}
	if m == 0 {
		return noSeq, 0
	}
	last, kept := req.blockHashes[m-1], noSeq
	for s := range k.streams {
		st := &k.streams[s]
		if st.req != nil || len(st.blocks) < m || st.blocks[m-1] != last {
			continue
		}
		if kept == noSeq || len(st.blocks) < len(k.streams[kept].blocks) ||
			len(st.blocks) == len(k.streams[kept].blocks) && st.lastUsed < k.streams[kept].lastUsed {
			kept = int32(s)
		}
	}
	if kept != noSeq {
		return kept, m
	}
	return src, m
}

// pick returns the stream a request without a stream of its own to take
// over gets: the lowest free one, else the least recently used kept one
// other than avoid; noSeq when every stream runs.
func (k *streamKV) pick(avoid int32) int32 {
	victim := noSeq
	for s := range k.streams {
		st := &k.streams[s]
		switch {
		case st.req != nil || int32(s) == avoid:
		case len(st.blocks) == 0 && st.used == 0:
			return int32(s)
		case victim == noSeq || st.lastUsed < k.streams[victim].lastUsed:
			victim = int32(s)
		}
	}
	return victim
}

func (k *streamKV) admit(req *Request, budget int) (int, int, bool) {
	src, m := k.lookup(req)
	// Take a kept stream over when the hit is at least half of what it
	// holds (a conversation's next turn holds all of its last), or worth
	// a copy, or when it is the stream a miss would give up anyway.
	// Otherwise taking it over would throw away more of the prefix cache
	// than the hit saves: a prompt that shares only a system prompt with a
	// kept conversation would cut that conversation off for a few blocks.
	// A kept stream is never copied: a copy stalls every sequence of the
	// rank while llama.cpp reserves its graph again.
	takeOver := m > 0 && k.streams[src].req == nil &&
		(2*m >= len(k.streams[src].blocks) || m*k.blockSize >= k.copyMinTokens || k.pick(noSeq) == src)
	if m > 0 && !takeOver && m*k.blockSize < k.copyMinTokens {
		// Computed again for less than the copy would cost.
		src, m = noSeq, 0
	}
	cached := m * k.blockSize
	dst := src
	if m == 0 || !takeOver {
		if dst = k.pick(src); dst == noSeq {
			return 0, 0, false
		}
	}
	st := &k.streams[dst]
	if dst != src {
		k.forget(dst, 0)
		if m > 0 {
			k.op(SeqOp{Kind: SeqCopy, Src: src, Dst: dst, P0: -1, P1: -1})
			st.blocks = append(st.blocks[:0], k.streams[src].blocks[:m]...)
			k.streams[src].lastUsed = k.touch()
		}
	} else {
		k.forget(dst, m)
	}
	// Past the hit the stream holds another request's tokens, or those of
	// a step that computed an aborted request: they go.
	k.op(SeqOp{Kind: SeqRemove, Dst: dst, P0: int32(cached), P1: -1})
	st.used, st.req, st.lastUsed = cached, req, k.touch()
	req.seq, req.executorHasLast = dst, false
	return cached, min(req.numTokens()-cached, budget), true
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
	if len(st.blocks) > 0 {
		// Kept for the prefix cache.
		st.lastUsed = k.touch()
		return
	}
	k.op(SeqOp{Kind: SeqRemove, Dst: s, P0: 0, P1: -1})
	st.used = 0
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
