package engine

import "slices"

// noSeq marks a request or block that holds no KV sequence.
const noSeq int32 = -1

// seqTable places KV by sequence on top of the blocks, for an executor
// whose KV cells carry (sequence, position) rather than blocks: llama.cpp.
//
// Every block that holds KV has a home: the sequence whose cells hold its
// tokens, at positions [index·blockSize, (index+1)·blockSize). A request
// computes its new blocks into its own sequence, which becomes their home,
// and gets a cached prefix by copying each block's positions from its home
// (SeqCopy shares the cells; nothing is computed again). When a request
// leaves, its sequence lets go of every position except those of the
// blocks it is home to that stay findable in the prefix cache; a sequence
// that still homes such blocks is kept, and its id stays taken, until
// those blocks are evicted or the id is needed: then the least recently
// read kept sequence goes, its blocks that requests still hold moving
// their home to one of those requests' sequences.
//
// So the executor's cells in use never exceed the blocks held or cached,
// and an executor whose cache has NumBlocks·BlockSize cells never runs
// out of them.
//
// A shared cache has a cost a block cache does not: every step attends
// over (masks out) every cell in use, other sequences' and cached ones
// included. So the cells that only the prefix cache holds are kept to at
// most those that requests hold (or a step's budget, when fewer), the
// least recently read kept sequences going first.
type seqTable struct {
	// free holds the ids no request and no cached block uses.
	free []int32
	// live is set for the sequence of a request in the engine.
	live []bool
	// homed counts the blocks each sequence is home to.
	homed []int32
	// blocks lists the blocks each sequence is home to; an entry is stale
	// once the block's home has moved.
	blocks [][]int32
	// lastRead orders kept sequences for eviction.
	lastRead []uint64
	tick     uint64
	// cachedOnly counts the blocks that hold KV for the prefix cache
	// alone: no request holds them, and their home keeps their cells.
	cachedOnly int
	// ops are the moves for the next step.
	ops []SeqOp
}

func newSeqTable(slots int) *seqTable {
	t := &seqTable{
		live:     make([]bool, slots),
		homed:    make([]int32, slots),
		blocks:   make([][]int32, slots),
		lastRead: make([]uint64, slots),
	}
	for s := slots - 1; s >= 0; s-- {
		t.free = append(t.free, int32(s))
	}
	return t
}

func (t *seqTable) op(op SeqOp) { t.ops = append(t.ops, op) }

// read marks s as read now, for the eviction order of kept sequences.
func (t *seqTable) read(s int32) {
	t.tick++
	t.lastRead[s] = t.tick
}

// takeOps hands over the moves made since the last step.
func (c *kvCache) takeOps() []SeqOp {
	if c.seqs == nil {
		return nil
	}
	ops := c.seqs.ops
	c.seqs.ops = nil
	return ops
}

// takeSeq gives a request about to be admitted a sequence of its own,
// evicting a kept sequence when none is free. running holds every request
// that holds blocks.
func (c *kvCache) takeSeq(req *Request, running []*Request) {
	t := c.seqs
	if t == nil || req.seq != noSeq {
		return
	}
	if len(t.free) == 0 {
		c.evictKeptSeq(running)
	}
	s := t.free[len(t.free)-1]
	t.free = t.free[:len(t.free)-1]
	t.live[s] = true
	req.seq = s
	req.executorHasLast = false
}

// returnSeq gives back the sequence of a request that could not be
// admitted after all; it holds nothing yet.
func (c *kvCache) returnSeq(req *Request) {
	t := c.seqs
	if t == nil || req.seq == noSeq {
		return
	}
	t.live[req.seq] = false
	t.free = append(t.free, req.seq)
	req.seq = noSeq
}

// evictKeptSeq frees the id of the kept sequence read least recently.
func (c *kvCache) evictKeptSeq(running []*Request) {
	if !c.evictOldestKept(running) {
		panic("engine: no sequence id is free or kept; the config check should have made that impossible")
	}
}

// trimKept evicts kept sequences while the cells only the prefix cache
// holds outnumber those requests hold, and floor.
func (c *kvCache) trimKept(running []*Request, floor int) {
	if c.seqs == nil {
		return
	}
	held := c.capacity - c.available()
	for c.seqs.cachedOnly*c.blockSize > max(held*c.blockSize, floor) && c.evictOldestKept(running) {
	}
}

// evictOldestKept evicts the kept sequence read least recently; it
// reports false when no sequence is kept.
func (c *kvCache) evictOldestKept(running []*Request) bool {
	t := c.seqs
	victim := noSeq
	for s := range t.live {
		if !t.live[s] && t.homed[s] > 0 && (victim == noSeq || t.lastRead[s] < t.lastRead[victim]) {
			victim = int32(s)
		}
	}
	if victim == noSeq {
		return false
	}
	for _, id := range t.blocks[victim] {
		b := &c.blocks[id]
		if b.home != victim {
			continue
		}
		if b.refCount == 0 {
			// Nobody holds it: it leaves the prefix cache with its KV.
			if c.findable(id) {
				c.unindex(id)
			}
			b.cached = false
			b.home = noSeq
			t.cachedOnly--
			continue
		}
		c.rehome(id, running)
	}
	t.homed[victim] = 0
	t.blocks[victim] = t.blocks[victim][:0]
	t.op(SeqOp{Kind: SeqRemove, Dst: victim, P0: 0, P1: -1})
	t.free = append(t.free, victim)
	return true
}

// rehome moves a block's home to the sequence of a request that holds it,
// which shares its cells already.
func (c *kvCache) rehome(id int32, running []*Request) {
	b := &c.blocks[id]
	for _, r := range running {
		if int(b.index) < len(r.blocks) && r.blocks[b.index] == id && r.seq != b.home {
			b.home = noSeq
			c.home(id, r.seq, int(b.index))
			return
		}
	}
	panic("engine: a block with references is held by no running request")
}

// home makes seq the home of block id, the index-th of its sequences.
func (c *kvCache) home(id, seq int32, index int) {
	t := c.seqs
	b := &c.blocks[id]
	if b.home != noSeq {
		panic("engine: homing a block that has a home")
	}
	b.home, b.index = seq, int32(index)
	t.homed[seq]++
	t.blocks[seq] = append(t.blocks[seq], id)
}

// unhome takes a block out of its home; with removeKV its cells there are
// given back too. A kept sequence that homes nothing more is free.
func (c *kvCache) unhome(id int32, removeKV bool) {
	t := c.seqs
	b := &c.blocks[id]
	s := b.home
	if removeKV {
		p0 := b.index * int32(c.blockSize)
		t.op(SeqOp{Kind: SeqRemove, Dst: s, P0: p0, P1: p0 + int32(c.blockSize)})
	}
	b.home = noSeq
	t.homed[s]--
	if b.refCount == 0 {
		t.cachedOnly--
	}
	if t.homed[s] == 0 && !t.live[s] {
		t.blocks[s] = t.blocks[s][:0]
		t.free = append(t.free, s)
	}
}

// sharePrefix copies the cells of a request's cached prefix into its
// sequence, one move per run of blocks with the same home.
func (c *kvCache) sharePrefix(req *Request, prefix []int32) {
	t := c.seqs
	bs := int32(c.blockSize)
	for j := 0; j < len(prefix); {
		home := c.blocks[prefix[j]].home
		k := j + 1
		for k < len(prefix) && c.blocks[prefix[k]].home == home {
			k++
		}
		t.read(home)
		t.op(SeqOp{Kind: SeqCopy, Src: home, Dst: req.seq, P0: int32(j) * bs, P1: int32(k) * bs})
		j = k
	}
}

// releaseSeq drops a request's blocks and its sequence. Its sequence keeps
// the cells of the blocks it is home to that stay findable in the prefix
// cache, and lets go of every other position.
func (c *kvCache) releaseSeq(req *Request) {
	t := c.seqs
	s := req.seq
	var drop []int
	for i := len(req.blocks) - 1; i >= 0; i-- {
		id := req.blocks[i]
		b := &c.blocks[id]
		c.unref(id)
		findable := c.findable(id)
		if b.home == s && findable {
			continue
		}
		if b.home == s {
			// s is live still: unhome leaves its id alone.
			c.unhome(id, false)
		}
		drop = append(drop, i)
	}
	req.blocks = req.blocks[:0]
	req.numCachedBlocks = 0
	if s == noSeq {
		return
	}
	req.seq = noSeq
	t.live[s] = false
	if t.homed[s] == 0 {
		t.blocks[s] = t.blocks[s][:0]
		t.op(SeqOp{Kind: SeqRemove, Dst: s, P0: 0, P1: -1})
		t.free = append(t.free, s)
		return
	}
	// Kept for the cache: give back the rest, a move per run of blocks.
	slices.Reverse(drop)
	bs := int32(c.blockSize)
	for j := 0; j < len(drop); {
		k := j + 1
		for k < len(drop) && drop[k] == drop[k-1]+1 {
			k++
		}
		t.op(SeqOp{Kind: SeqRemove, Dst: s, P0: int32(drop[j]) * bs, P1: int32(drop[k-1]+1) * bs})
		j = k
	}
	t.read(s)
}
