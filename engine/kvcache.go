package engine

import (
	"crypto/sha256"
	"encoding/binary"
)

// BlockHash names a full KV block by its tokens, every token before it,
// and the request's cache salt: equal hashes mean equal prefixes of the
// same salt. It is SHA-256, as vLLM's is, so that no client can craft a
// prompt whose block another client's prefix would be mistaken for (and
// be served from, or learn of). It is stable across processes, which lets
// a balancer compute the hashes an engine does.
type BlockHash [sha256.Size]byte

// Key is the hash's first 64 bits: a map key cheaper to hash and compare
// than the whole. Two hashes may share a key (by chance, or by a client
// who tried 2^32 prompts); whoever looks a block up by key compares the
// whole hash, so a shared key costs a cache miss, never a wrong hit, and
// no client can make another's prefix miss without 2^64 tries.
func (h BlockHash) Key() uint64 { return binary.LittleEndian.Uint64(h[:8]) }

// HashBlock chains a block's tokens onto the hash of the blocks before it
// (SaltHash of the request's salt for the first block).
func HashBlock(parent BlockHash, tokens []uint32) BlockHash {
	// One call of the hash over parent and tokens: with the SHA
	// instructions of current CPUs, about 0.17 µs for a block of 16.
	var stack [sha256.Size + 64]byte
	buf := stack[:0]
	if n := sha256.Size + 4*len(tokens); n > len(stack) {
		buf = make([]byte, 0, n)
	}
	buf = append(buf, parent[:]...)
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	return sha256.Sum256(buf)
}

// SaltHash is the parent of a request's first block: the zero hash
// without a salt, else a hash of the salt, so that requests of different
// salts share no block, whatever their tokens.
func SaltHash(salt string) BlockHash {
	if salt == "" {
		return BlockHash{}
	}
	return sha256.Sum256(append([]byte("dpnode cache salt\x00"), salt...))
}

// PrefixHashes returns the chained hashes of the full blocks of tokens,
// as an engine names them in its prefix cache.
func PrefixHashes(tokens []uint32, blockSize int, salt string) []BlockHash {
	hs := make([]BlockHash, 0, len(tokens)/blockSize)
	h := SaltHash(salt)
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		h = HashBlock(h, tokens[i:i+blockSize])
		hs = append(hs, h)
	}
	return hs
}

// FNV-1a's 64-bit parameters (hash/fnv's).
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// fnvTokens is FNV-1a over a seed and tokens, each little-endian: a fast
// hash for keys that no client can gain anything by colliding. It is
// hash/fnv's New64a over those bytes, written out: a simulated run hashes
// every prompt, and the interface call per token cost more than the hash.
func fnvTokens(seed uint64, tokens []uint32) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < 64; i += 8 {
		h = (h ^ (seed >> i & 0xff)) * fnvPrime64
	}
	for _, t := range tokens {
		h = (h ^ uint64(t&0xff)) * fnvPrime64
		h = (h ^ uint64(t>>8&0xff)) * fnvPrime64
		h = (h ^ uint64(t>>16&0xff)) * fnvPrime64
		h = (h ^ uint64(t>>24)) * fnvPrime64
	}
	return h
}

const noBlock = -1

// kvBlock is one block's state: 48 bytes, so that few of an array of
// them straddle two cache lines.
type kvBlock struct {
	refCount int32
	// Links of the free queue, which holds every used block with refCount
	// 0 in eviction order: the head is evicted first.
	prev, next int32
	// hash is valid when cached is true; the block is then findable by its
	// hash until it is evicted.
	hash   BlockHash
	cached bool
	// indexed is set while byHash finds this block for its hash (see
	// findable), so that releasing a block need not look it up.
	indexed bool
	free    bool
}

// kvCache is a pool of fixed-size KV blocks with prefix caching, in the
// manner of vLLM's block pool: a freed block keeps its contents and hash
// until it is reused, so a later request with the same prefix finds it.
//
// The eviction order starts with the fresh blocks, those never used, in
// id order: a freed block joins the end, and only a block that was used
// can leave from the middle (a prefix hit). So the fresh blocks need no
// entries until they are taken: blocks holds those used so far, block id
// len(blocks) is the next fresh one, and the free queue links the used
// ones that are free. A simulation of hundreds of engines then neither
// writes every block of every cache up front nor holds the cache of an
// engine that never fills it.
type kvCache struct {
	blockSize     int
	prefixCaching bool
	// capacity is the number of blocks; blocks holds the ids below
	// len(blocks), the others are fresh.
	capacity   int
	blocks     []kvBlock
	head, tail int32
	// numFree counts the blocks in the free queue, fresh ones apart.
	numFree int
	// byHash finds a findable block by its hash's Key.
	byHash map[uint64]int32
}

func newKVCache(numBlocks, blockSize int, prefixCaching bool) *kvCache {
	return &kvCache{
		blockSize:     blockSize,
		prefixCaching: prefixCaching,
		capacity:      numBlocks,
		head:          noBlock,
		tail:          noBlock,
		byHash:        make(map[uint64]int32),
	}
}

// numBlocks is how many blocks have been used: ids from 0 to it.
func (c *kvCache) numBlocks() int { return len(c.blocks) }

// fresh is how many blocks were never used.
func (c *kvCache) fresh() int { return c.capacity - len(c.blocks) }

// available is how many blocks an allocation may take: the free ones,
// fresh or used.
func (c *kvCache) available() int { return c.numFree + c.fresh() }

// usage is the share of blocks held by requests; cached blocks that nobody
// holds count as free, as in vLLM.
func (c *kvCache) usage() float64 {
	if c.capacity == 0 {
		return 0
	}
	return 1 - float64(c.available())/float64(c.capacity)
}

// takeFresh takes the first block never used: the head of the eviction
// order while any is left.
func (c *kvCache) takeFresh() int32 {
	if len(c.blocks) == cap(c.blocks) {
		grown := make([]kvBlock, len(c.blocks), min(c.capacity, max(2*cap(c.blocks), 256)))
		copy(grown, c.blocks)
		c.blocks = grown
	}
	id := int32(len(c.blocks))
	c.blocks = append(c.blocks, kvBlock{refCount: 1, prev: noBlock, next: noBlock})
	return id
}

func (c *kvCache) pushFree(id int32) {
	b := &c.blocks[id]
	b.free = true
	b.prev, b.next = c.tail, noBlock
	if c.tail != noBlock {
		c.blocks[c.tail].next = id
	} else {
		c.head = id
	}
	c.tail = id
	c.numFree++
}

func (c *kvCache) removeFree(id int32) {
	b := &c.blocks[id]
	if !b.free {
		panic("engine: removing a block that is not in the free queue")
	}
	if b.prev != noBlock {
		c.blocks[b.prev].next = b.next
	} else {
		c.head = b.next
	}
	if b.next != noBlock {
		c.blocks[b.next].prev = b.prev
	} else {
		c.tail = b.prev
	}
	b.prev, b.next, b.free = noBlock, noBlock, false
	c.numFree--
}

// popFree takes the block at the head of the eviction order, evicting
// its cached contents.
func (c *kvCache) popFree() int32 {
	if c.fresh() > 0 {
		return c.takeFresh()
	}
	id := c.head
	if id == noBlock {
		panic("engine: free queue empty after the free count allowed an allocation")
	}
	c.removeFree(id)
	b := &c.blocks[id]
	if c.findable(id) {
		c.unindex(id)
	}
	b.cached = false
	b.refCount = 1
	return id
}

// findable reports whether block id is the one a prefix lookup finds for
// its hash; a block cached while another of the same hash was findable is
// not.
func (c *kvCache) findable(id int32) bool { return c.blocks[id].indexed }

// unindex makes a findable block id unfindable.
func (c *kvCache) unindex(id int32) {
	b := &c.blocks[id]
	delete(c.byHash, b.hash.Key())
	b.indexed = false
}

// touch takes a reference on a cached block found by a prefix lookup.
func (c *kvCache) touch(id int32) {
	b := &c.blocks[id]
	if b.refCount == 0 {
		c.removeFree(id)
	}
	b.refCount++
}

// computedPrefix returns the cached blocks that hold the longest prefix of
// req's tokens. At least one token is always left to compute, because the
// step that computes it is the one that samples the next token.
func (c *kvCache) computedPrefix(req *Request) []int32 {
	if !c.prefixCaching {
		return nil
	}
	maxBlocks := (req.numTokens() - 1) / c.blockSize
	req.extendHashes(c.blockSize, maxBlocks)
	var hits []int32
	for i := 0; i < maxBlocks; i++ {
		h := req.blockHashes[i]
		id, ok := c.byHash[h.Key()]
		if !ok || c.blocks[id].hash != h {
			break
		}
		hits = append(hits, id)
	}
	return hits
}

// allocate gives req the blocks it needs to hold numNewTokens more tokens
// after its computed ones, taking references on the prefix blocks found
// first (only when req holds no blocks yet). It reports false, changing
// nothing, when too few blocks are free.
func (c *kvCache) allocate(req *Request, numNewTokens int, prefix []int32) bool {
	need := ceilDiv(req.numComputed+len(prefix)*c.blockSize+numNewTokens, c.blockSize) - len(req.blocks) - len(prefix)
	if need < 0 {
		need = 0
	}
	// Prefix blocks nobody holds sit in the free queue; taking them leaves
	// fewer blocks to allocate from.
	evictable := 0
	for _, id := range prefix {
		if c.blocks[id].refCount == 0 {
			evictable++
		}
	}
	if need > c.available()-evictable {
		return false
	}
	if len(prefix) > 0 {
		for _, id := range prefix {
			c.touch(id)
		}
		req.blocks = append(req.blocks, prefix...)
		req.numCachedBlocks = int32(len(prefix))
	}
	for range need {
		req.blocks = append(req.blocks, c.popFree())
	}
	return true
}

// cacheFullBlocks makes req's fully computed blocks findable by hash.
func (c *kvCache) cacheFullBlocks(req *Request) {
	if !c.prefixCaching {
		return
	}
	full := min(req.numComputed/c.blockSize, len(req.blocks))
	if full <= int(req.numCachedBlocks) {
		return
	}
	req.extendHashes(c.blockSize, full)
	for i := int(req.numCachedBlocks); i < full; i++ {
		id := req.blocks[i]
		b := &c.blocks[id]
		h := req.blockHashes[i]
		if b.cached {
			continue
		}
		b.hash, b.cached = h, true
		if _, dup := c.byHash[h.Key()]; !dup {
			c.byHash[h.Key()] = id
			b.indexed = true
		}
	}
	req.numCachedBlocks = int32(full)
}

// release drops req's references. Blocks are queued last block first, so
// that a prefix's tail is evicted before its head, which more requests share.
func (c *kvCache) release(req *Request) {
	for i := len(req.blocks) - 1; i >= 0; i-- {
		c.unref(req.blocks[i])
	}
	req.blocks = req.blocks[:0]
	req.numCachedBlocks = 0
}

// unref drops a reference to block id; with none left it joins the free
// queue.
func (c *kvCache) unref(id int32) {
	b := &c.blocks[id]
	b.refCount--
	if b.refCount < 0 {
		panic("engine: block reference count below zero")
	}
	if b.refCount == 0 {
		if !c.findable(id) {
			// A duplicate of a block already findable by hash: nobody
			// can hit it, so it need not wait behind useful blocks.
			b.cached = false
		}
		c.pushFree(id)
	}
}

// admit implements kvSpace: the longest cached prefix, then blocks for
// up to budget more tokens.
func (c *kvCache) admit(req *Request, budget int) (int, int, bool) {
	prefix := c.computedPrefix(req)
	cached := len(prefix) * c.blockSize
	n := min(req.numTokens()-cached, budget)
	if !c.allocate(req, n, prefix) {
		return 0, 0, false
	}
	return cached, n, true
}

// grow implements kvSpace.
func (c *kvCache) grow(req *Request, n int) bool { return c.allocate(req, n, nil) }

// computed implements kvSpace.
func (c *kvCache) computed(req *Request) { c.cacheFullBlocks(req) }

// takeOps implements kvSpace: blocks need no moves.
func (c *kvCache) takeOps() []SeqOp { return nil }

func ceilDiv(a, b int) int { return (a + b - 1) / b }
