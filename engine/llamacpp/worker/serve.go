//go:build llamacpp

package worker

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/dpnode/dpnode/engine/llamacpp"
	"github.com/dpnode/dpnode/engine/llamacpp/sampling"
	dpnodev1 "github.com/dpnode/dpnode/proto/dpnode/v1"
)

// Options set up Serve.
type Options struct {
	// BackendDir is where the ggml backends are when the engine does not
	// say.
	BackendDir string
}

// maxTokenizers bounds the tokenizations a vocabulary worker runs at
// once; each is a short call into llama.cpp that is safe to run
// concurrently.
const maxTokenizers = 4

// Serve answers the engine on conn until it hangs up: first a LoadModel,
// then steps (a model worker) or tokenizations (a vocabulary worker). It
// returns nil when the engine hung up, and an error when the model could
// not load or a step failed; the worker then exits, and its engine
// restarts it.
func Serve(conn net.Conn, opts Options) error {
	s := &server{conn: conn}
	req := &dpnodev1.WorkerRequest{}
	if err := llamacpp.ReadFrame(conn, req); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	load := req.GetLoad()
	if load == nil {
		return s.fail(req.Id, errors.New("the first request must load a model"))
	}
	ready, err := s.load(load, opts)
	if err != nil {
		return s.fail(req.Id, fmt.Errorf("loading %s: %w", load.Path, err))
	}
	if err := s.reply(&dpnodev1.WorkerReply{Id: req.Id, Body: &dpnodev1.WorkerReply_Ready{Ready: ready}}); err != nil {
		return err
	}
	sem := make(chan struct{}, maxTokenizers)
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		req := &dpnodev1.WorkerRequest{}
		if err := llamacpp.ReadFrame(conn, req); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		switch body := req.Body.(type) {
		case *dpnodev1.WorkerRequest_Step:
			if s.ctx == nil {
				return s.fail(req.Id, errors.New("a vocabulary worker computes no steps"))
			}
			done, err := s.step(body.Step)
			if err != nil {
				return s.fail(req.Id, err)
			}
			if err := s.reply(&dpnodev1.WorkerReply{Id: req.Id, Body: &dpnodev1.WorkerReply_Step{Step: done}}); err != nil {
				return err
			}
		case *dpnodev1.WorkerRequest_Tokenize:
			sem <- struct{}{}
			wg.Add(1)
			go func(id uint64, t *dpnodev1.TokenizeText) {
				defer wg.Done()
				defer func() { <-sem }()
				rep := &dpnodev1.WorkerReply{Id: id}
				if ids, err := s.model.tokenize(t.Text, t.AddSpecial, t.ParseSpecial); err != nil {
					rep.Body = &dpnodev1.WorkerReply_Error{Error: &dpnodev1.WorkerError{Message: err.Error()}}
				} else {
					rep.Body = &dpnodev1.WorkerReply_Tokens{Tokens: &dpnodev1.TokenIds{Ids: ids}}
				}
				_ = s.reply(rep)
			}(req.Id, body.Tokenize)
		case *dpnodev1.WorkerRequest_CheckGrammar:
			sem <- struct{}{}
			wg.Add(1)
			go func(id uint64, gbnf string) {
				defer wg.Done()
				defer func() { <-sem }()
				rep := &dpnodev1.WorkerReply{Id: id, Body: &dpnodev1.WorkerReply_GrammarChecked{GrammarChecked: &dpnodev1.GrammarChecked{}}}
				if err := checkGrammar(s.model, gbnf); err != nil {
					rep.Body = &dpnodev1.WorkerReply_Error{Error: &dpnodev1.WorkerError{Message: err.Error()}}
				}
				_ = s.reply(rep)
			}(req.Id, body.CheckGrammar.Gbnf)
		case *dpnodev1.WorkerRequest_Vocabulary:
			pieces, offsets, specialIDs, specialTexts := s.model.pieces()
			if err := s.reply(&dpnodev1.WorkerReply{Id: req.Id, Body: &dpnodev1.WorkerReply_Vocabulary{
				Vocabulary: &dpnodev1.Vocabulary{Pieces: pieces, Offsets: offsets, SpecialIds: specialIDs, SpecialTexts: specialTexts}}}); err != nil {
				return err
			}
		default:
			return s.fail(req.Id, fmt.Errorf("unexpected request %T", req.Body))
		}
	}
}

type server struct {
	conn    net.Conn
	writeMu sync.Mutex
	model   *model
	ctx     *context
	// last is the token each sequence sampled last, which its next step
	// computes unless the engine sends tokens.
	last    []uint32
	hasLast []bool
	// history is what each sequence's penalties count, for a sequence
	// whose request has penalties: set by the engine, then each draw added.
	history []*sampling.History
	// grammars are the sequences' grammar states, for a sequence whose
	// request constrains its output; end is the token a grammar ends an
	// output with when nothing else may come.
	grammars []*grammar
	end      int32
	// samplers draw a step's tokens, a row per thread at a time.
	samplers *sampling.Pool
	// rows and params are the step's rows to sample, order and outIndex
	// the batch order of its sequences and each one's last token in the
	// batch: kept between steps.
	rows     []sampleRow
	params   []sampling.Params
	order    []int
	outIndex []int32
	// greedySteps counts the steps in a row whose rows were all greedy
	// while the graph's greedy chains were off.
	greedySteps int
	// prompts are the step's sequences that asked for prompt
	// log-probabilities, and where their tokens start in the batch.
	prompts []promptRows
	// fillers are the streams a step filled a gap with, and where.
	fillers     []filler
	streamCells int32
	// kept are the sequences past the context's, in host memory: each the
	// llama.cpp state of the cells it holds (empty: none). Sequence id
	// ctx.sequences()+i is kept[i].
	kept [][]byte
}

// promptRows is a sequence of a step whose first tokens' logits give its
// prompt's log-probabilities: st.Sequences[step], from batch index first.
type promptRows struct{ step, first int }

// promptLogprobs adds to done the prompt log-probabilities the step's
// sequences asked for: for each target, the log-softmax of the logits of
// the token before it, and the top tokens'.
func (s *server) promptLogprobs(st *dpnodev1.ExecuteStep, done *dpnodev1.StepDone) error {
	for _, p := range s.prompts {
		q := st.Sequences[p.step]
		if q.PromptTopLogprobs < 0 || q.PromptTopLogprobs > sampling.MaxTopLogprobs {
			return fmt.Errorf("%d top log-probabilities asked, at most %d", q.PromptTopLogprobs, sampling.MaxTopLogprobs)
		}
		out := &dpnodev1.PromptLogprobs{Seq: q.Seq, Logprobs: make([]*dpnodev1.TokenLogprobs, len(q.PromptLogprobTargets))}
		// llama.cpp hands out the rows one at a time; the work on them
		// runs on every thread.
		rows := make([][]float32, len(q.PromptLogprobTargets))
		for j, target := range q.PromptLogprobTargets {
			if int(target) >= s.ctx.nVocab {
				return fmt.Errorf("prompt token %d is not in the vocabulary of %d", target, s.ctx.nVocab)
			}
			rows[j] = s.ctx.logits(p.first + j)
		}
		s.samplers.Rows(len(rows), func(j int, smp *sampling.Sampler) {
			target, row := q.PromptLogprobTargets[j], rows[j]
			var top [sampling.MaxTopLogprobs]sampling.Logprob
			lse, n := smp.Logprobs(row, top[:q.PromptTopLogprobs])
			lp := &dpnodev1.TokenLogprobs{Logprob: row[target] - lse, TopTokenIds: make([]uint32, n), TopLogprobs: make([]float32, n)}
			if q.PromptRanks {
				// As much again as the log-probabilities: only when asked.
				lp.Rank = uint32(sampling.Rank(row, int32(target)))
			}
			for k := range n {
				lp.TopTokenIds[k], lp.TopLogprobs[k] = uint32(top[k].Token), top[k].Logprob
			}
			out.Logprobs[j] = lp
		})
		done.PromptLogprobs = append(done.PromptLogprobs, out)
	}
	return nil
}

// filler is one token put in a stream that is not in the step, at pos,
// and taken out after it.
type filler struct{ seq, pos int32 }

// maxFillGap is the widest gap between the step's sequence ids that the
// worker fills. llama.cpp computes a run of consecutive streams with equal
// token counts in one pass over the weights, and makes a pass of its own
// for each run: in a decode step whose sequences have ids 3, 5 and 9 it
// makes three. The worker closes such gaps with a token in each stream
// between, computed beside the others without logits and removed after
// the step: a token is far cheaper than a pass. But a pass attends over
// as many cells in each of its streams as its longest stream holds, so a
// gap stream that holds a long history makes every stream of the pass
// attend over it: such gaps are filled up to maxFillGap wide, and gaps of
// empty streams (the scheduler keeps running sequences among the lowest
// ids, so that is what its gaps are) up to maxEmptyFillGap.
const (
	maxFillGap      = 8
	maxEmptyFillGap = 64
)

// reattachAfter is how many steps of greedy rows only the worker waits
// before it samples them in the graph again: each switch makes llama.cpp
// reserve its graph, so a mix of greedy and sampled requests stays on the
// host instead of switching back and forth.
const reattachAfter = 256

// sampleRow is one token a step samples.
type sampleRow struct {
	seq    int32
	logits []float32
	tok    int32
	// logprobs are the drawn token's, when its request asked.
	logprobs *dpnodev1.TokenLogprobs
}

func (s *server) reply(r *dpnodev1.WorkerReply) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	return llamacpp.WriteFrame(s.conn, r)
}

// fail tells the engine why the worker stops, and returns that error.
func (s *server) fail(id uint64, err error) error {
	_ = s.reply(&dpnodev1.WorkerReply{Id: id, Body: &dpnodev1.WorkerReply_Error{Error: &dpnodev1.WorkerError{Message: err.Error()}}})
	return err
}

func (s *server) load(l *dpnodev1.LoadModel, opts Options) (*dpnodev1.ModelReady, error) {
	dir := l.BackendDir
	if dir == "" {
		dir = opts.BackendDir
	}
	initLibrary(dir, l.VocabOnly)
	if l.GpuLayers != 0 && !hasGPU() {
		return nil, errors.New("no GPU backend could be loaded (is the CUDA build of llama.cpp installed, and a driver?)")
	}
	m, err := loadModel(l.Path, l.VocabOnly, int(l.GpuLayers))
	if err != nil {
		return nil, err
	}
	s.model = m
	ready := &dpnodev1.ModelReady{
		Architecture:  m.metaString("general.architecture"),
		Description:   m.description(),
		ContextLength: uint32(m.contextLength()),
		VocabSize:     uint32(m.nVocab()),
		BosTokenId:    int32(m.bos()),
		AddBos:        m.addBOS(),
		SystemInfo:    systemInfo(),
	}
	for t := range m.nVocab() {
		if m.isEOG(t) {
			ready.EogTokenIds = append(ready.EogTokenIds, uint32(t))
		}
	}
	if l.VocabOnly {
		return ready, nil
	}
	if err := m.partialRemoval(); err != nil {
		return nil, fmt.Errorf("dpnode cannot serve this model: %w", err)
	}
	elem, seqs, stream, err := kvShape(l, m, ready)
	if err != nil {
		return nil, err
	}
	// llama.cpp computes the output layer on the GPU when every layer is
	// offloaded; there its own greedy sampler runs, and on the CPU
	// dpnode's argmax op, when asked for (see GreedyInGraph).
	onGPU := l.GpuLayers != 0 && hasGPU() && (l.GpuLayers < 0 || int(l.GpuLayers) > m.layers())
	greedy := greedyOnHost
	switch {
	case l.GreedyInGraph == dpnodev1.GreedyInGraph_GREEDY_IN_GRAPH_OFF:
	case onGPU:
		greedy = greedyLlama
	case l.GreedyInGraph == dpnodev1.GreedyInGraph_GREEDY_IN_GRAPH_ON:
		greedy = greedyCPU
	}
	inGraph := greedy != greedyOnHost
	inContext := seqs
	if l.ContextSequences > 0 {
		inContext = min(seqs, uint64(l.ContextSequences))
	}
	ctx, err := newContext(m, int(inContext*stream), int(l.MaxBatchTokens), int(inContext), int(l.Threads), elem == 4, l.FlashAttention, greedy)
	if err != nil {
		return nil, err
	}
	s.kept = make([][]byte, seqs-inContext)
	ready.GreedyInGraph = inGraph
	s.ctx = ctx
	s.samplers = sampling.NewPool(m.nVocab(), int(l.Threads))
	s.streamCells = int32(ctx.streamCells())
	s.last = make([]uint32, ctx.sequences())
	s.hasLast = make([]bool, ctx.sequences())
	s.history = make([]*sampling.History, ctx.sequences())
	s.grammars = make([]*grammar, ctx.sequences())
	if len(ready.EogTokenIds) > 0 {
		s.end = int32(ready.EogTokenIds[0])
	}
	ready.KvCells = uint32(seqs * uint64(ctx.streamCells()))
	ready.MaxBatchTokens = uint32(ctx.nBatch)
	ready.Sequences = uint32(seqs)
	ready.StreamCells = uint32(ctx.streamCells())
	return ready, nil
}

// kvShape is the KV cache a load asks for, as llama.cpp lays it out: the
// bytes of an element, the sequences that fit the memory given, and the
// cells of each one's stream. It fills in ready's KV and model sizes.
func kvShape(l *dpnodev1.LoadModel, m *model, ready *dpnodev1.ModelReady) (elem, seqs, stream uint64, err error) {
	switch l.KvCacheDtype {
	case "f16":
		elem = 2
	case "f32":
		elem = 4
	default:
		return 0, 0, 0, fmt.Errorf("KV cache type %q: it must be f16 or f32", l.KvCacheDtype)
	}
	ready.KvBytesPerToken = m.kvBytesPerToken(elem)
	ready.ModelBytes = m.size()
	ready.Device = deviceName(int(l.GpuLayers))
	seqs = uint64(l.Sequences)
	if seqs < 1 || seqs > 256 {
		return 0, 0, 0, fmt.Errorf("%d sequences asked; llama.cpp takes 1 to 256", seqs)
	}
	if l.StreamCells < 1 {
		return 0, 0, 0, errors.New("a KV stream of no cells asked")
	}
	// llama.cpp pads each stream to a multiple of 256 cells.
	stream = (uint64(l.StreamCells) + 255) / 256 * 256
	if ready.KvBytesPerToken > 0 && l.KvCacheBytes > 0 {
		seqs = min(seqs, l.KvCacheBytes/(stream*ready.KvBytesPerToken))
	}
	if seqs == 0 {
		return 0, 0, 0, fmt.Errorf("a KV cache of %d bytes (%d bytes a token) holds less than one sequence of the max model length %d: give it more memory (--kv-cache-memory-bytes) or lower --max-model-len",
			l.KvCacheBytes, ready.KvBytesPerToken, l.StreamCells)
	}
	return elem, seqs, stream, nil
}

// sampleParams are the engine's for a token of sequence seq, as the
// sampler takes them.
func (s *server) sampleParams(seq int32, p *dpnodev1.SampleParams) (sampling.Params, error) {
	sp := sampling.Params{Temperature: p.Temperature, TopK: p.TopK, TopP: p.TopP, Seed: p.Seed,
		Presence: p.PresencePenalty, Frequency: p.FrequencyPenalty, Repetition: p.RepetitionPenalty, MinP: p.MinP}
	for _, t := range p.BannedTokenIds {
		sp.Banned = append(sp.Banned, int32(t))
	}
	if len(p.LogitBiasTokenIds) != len(p.LogitBiasValues) {
		return sp, fmt.Errorf("%d logit bias tokens but %d values", len(p.LogitBiasTokenIds), len(p.LogitBiasValues))
	}
	for i, t := range p.LogitBiasTokenIds {
		if int(t) >= s.ctx.nVocab {
			return sp, fmt.Errorf("a logit bias for token %d, not in the vocabulary of %d", t, s.ctx.nVocab)
		}
		sp.LogitBias = append(sp.LogitBias, sampling.Bias{Token: int32(t), Value: p.LogitBiasValues[i]})
	}
	if h := p.History; h != nil {
		s.history[seq] = sampling.NewHistory(h.Prompt, h.Output)
	}
	if p.Logprobs {
		if p.TopLogprobs < 0 || p.TopLogprobs > sampling.MaxTopLogprobs {
			return sp, fmt.Errorf("%d top log-probabilities asked, at most %d", p.TopLogprobs, sampling.MaxTopLogprobs)
		}
		sp.Logprobs, sp.TopLogprobs = true, int(p.TopLogprobs)
	}
	if sp.Penalized() {
		if sp.History = s.history[seq]; sp.History == nil {
			return sp, fmt.Errorf("penalties for sequence %d, which has no history", seq)
		}
	}
	if p.Grammar != "" {
		s.grammars[seq].free()
		g, err := newGrammar(s.model, p.Grammar, p.GetHistory().GetOutput(), s.end)
		if err != nil {
			s.grammars[seq] = nil
			return sp, fmt.Errorf("sequence %d: %w", seq, err)
		}
		s.grammars[seq] = g
	}
	switch g := s.grammars[seq]; {
	case p.Constrained && g == nil:
		return sp, fmt.Errorf("a constrained draw for sequence %d, which has no grammar", seq)
	case p.Constrained:
		sp.Constraint = g
	case g != nil:
		// Another request has the sequence now.
		g.free()
		s.grammars[seq] = nil
	}
	return sp, nil
}

func (s *server) step(st *dpnodev1.ExecuteStep) (*dpnodev1.StepDone, error) {
	start := time.Now()
	c := s.ctx
	done := &dpnodev1.StepDone{}
	if err := s.kvOps(st.Ops); err != nil {
		return nil, err
	}
	done.KvOpsNanos = time.Since(start).Nanoseconds()
	n, err := s.batch(st)
	if err != nil {
		return nil, err
	}
	if err := s.placeSampling(len(s.prompts) > 0); err != nil {
		return nil, err
	}
	// The requests' tokens: a gap's fillers are not theirs.
	done.ComputedTokens = uint32(n - len(s.fillers))
	done.GapTokens = uint32(len(s.fillers))
	if n > 0 {
		t := time.Now()
		if err := c.decode(n); err != nil {
			return nil, err
		}
		done.DecodeNanos = time.Since(t).Nanoseconds()
	}
	for _, f := range s.fillers {
		if !c.seqRemove(f.seq, f.pos, -1) {
			return nil, fmt.Errorf("llama.cpp could not remove the gap's token from sequence %d", f.seq)
		}
	}
	sampleStart := time.Now()
	if err := s.promptLogprobs(st, done); err != nil {
		return nil, err
	}
	if err := s.draw(); err != nil {
		return nil, err
	}
	s.advance(done)
	end := time.Now()
	done.SampleNanos = end.Sub(sampleStart).Nanoseconds()
	done.ComputeNanos = end.Sub(start).Nanoseconds()
	return done, nil
}

// kvOps copies and removes KV cache streams as the scheduler asks, before
// the step's batch. Copies between the context's sequences are llama.cpp's
// (whole streams, at the next decode); a copy to or from a kept sequence
// saves or restores its state at once.
func (s *server) kvOps(ops []*dpnodev1.KVOp) error {
	c := s.ctx
	inContext := int32(len(s.last))
	nSeq := inContext + int32(len(s.kept))
	for _, op := range ops {
		switch o := op.Op.(type) {
		case *dpnodev1.KVOp_Copy:
			src, dst := o.Copy.Src, o.Copy.Dst
			if src < 0 || src >= nSeq || dst < 0 || dst >= nSeq {
				return fmt.Errorf("a KV copy between sequences %d and %d, of %d", src, dst, nSeq)
			}
			if src == dst || o.Copy.P0 > 0 || o.Copy.P1 > 0 {
				return fmt.Errorf("a KV copy of positions [%d, %d) from sequence %d to %d: only whole streams are copied, between two", o.Copy.P0, o.Copy.P1, src, dst)
			}
			if err := s.copySeq(src, dst); err != nil {
				return err
			}
		case *dpnodev1.KVOp_Remove:
			seq := o.Remove.Seq
			if seq < 0 || seq >= nSeq {
				return fmt.Errorf("a KV removal from sequence %d, of %d", seq, nSeq)
			}
			whole := o.Remove.P0 <= 0 && o.Remove.P1 < 0
			if seq >= inContext {
				if !whole {
					return fmt.Errorf("a KV removal of positions [%d, %d) from kept sequence %d: a kept sequence is removed whole", o.Remove.P0, o.Remove.P1, seq)
				}
				s.kept[seq-inContext] = s.kept[seq-inContext][:0]
				continue
			}
			if !c.seqRemove(seq, o.Remove.P0, o.Remove.P1) {
				return fmt.Errorf("llama.cpp could not remove positions [%d, %d) of sequence %d", o.Remove.P0, o.Remove.P1, seq)
			}
			if whole {
				s.hasLast[seq] = false
			}
		}
	}
	return nil
}

// copySeq makes dst hold what src holds: in the context, or kept.
func (s *server) copySeq(src, dst int32) error {
	c, inContext := s.ctx, int32(len(s.last))
	switch {
	case src < inContext && dst < inContext:
		c.seqCopy(src, dst)
	case dst >= inContext && src < inContext:
		state, ok := c.saveState(src, s.kept[dst-inContext])
		s.kept[dst-inContext] = state
		if !ok {
			return fmt.Errorf("llama.cpp could not save sequence %d's KV", src)
		}
		return nil
	case dst >= inContext:
		s.kept[dst-inContext] = append(s.kept[dst-inContext][:0], s.kept[src-inContext]...)
		return nil
	default:
		if !c.seqRemove(dst, 0, -1) {
			return fmt.Errorf("llama.cpp could not empty sequence %d", dst)
		}
		if state := s.kept[src-inContext]; len(state) > 0 && !c.restoreState(state, dst) {
			return fmt.Errorf("llama.cpp could not restore kept sequence %d's KV into sequence %d", src, dst)
		}
	}
	s.hasLast[dst] = false
	return nil
}

// batch fills llama.cpp's batch with the step's tokens, and the rows to
// sample with what each draws by; it returns the batch's size.
func (s *server) batch(st *dpnodev1.ExecuteStep) (int, error) {
	c := s.ctx
	nSeq := int32(len(s.last))
	s.rows, s.params = s.rows[:0], s.params[:0]
	// The batch goes in sequence order: llama.cpp computes consecutive
	// sequences with equal token counts in one pass over the weights, and
	// splits a step into one pass per run of them.
	s.order = s.order[:0]
	for i, q := range st.Sequences {
		if q.Seq < 0 || q.Seq >= nSeq || q.Pos < 0 {
			return 0, fmt.Errorf("a step of sequence %d at position %d, of %d sequences", q.Seq, q.Pos, nSeq)
		}
		s.order = append(s.order, i)
	}
	slices.SortFunc(s.order, func(a, b int) int { return cmp.Compare(st.Sequences[a].Seq, st.Sequences[b].Seq) })
	s.outIndex = slices.Grow(s.outIndex[:0], len(st.Sequences))[:len(st.Sequences)]
	// Gaps are filled only in a step of one token a sequence (decodes):
	// a run needs equal token counts.
	oneEach := true
	for _, q := range st.Sequences {
		if len(q.Tokens) > 1 {
			oneEach = false
			break
		}
	}
	s.fillers = s.fillers[:0]
	s.prompts = s.prompts[:0]
	n := 0
	for k, i := range s.order {
		q := st.Sequences[i]
		if oneEach && k > 0 {
			n = s.fill(st.Sequences[s.order[k-1]].Seq, q.Seq, n, len(s.order)-k)
		}
		tokens := q.Tokens
		if len(tokens) == 0 {
			if !s.hasLast[q.Seq] {
				return 0, fmt.Errorf("sequence %d continues from its sampled token, but it sampled none", q.Seq)
			}
			tokens = []uint32{s.last[q.Seq]}
		}
		if n+len(tokens) > c.nBatch {
			return 0, fmt.Errorf("a step of more than %d tokens", c.nBatch)
		}
		if len(q.PromptLogprobTargets) > len(tokens) {
			return 0, fmt.Errorf("%d prompt log-probability targets for %d tokens of sequence %d", len(q.PromptLogprobTargets), len(tokens), q.Seq)
		}
		if len(q.PromptLogprobTargets) > 0 {
			s.prompts = append(s.prompts, promptRows{step: i, first: n})
		}
		for j, t := range tokens {
			if int(t) >= c.nVocab {
				return 0, fmt.Errorf("token %d is not in the vocabulary of %d", t, c.nVocab)
			}
			last := j == len(tokens)-1
			c.batchToken(n, t, q.Pos+int32(j), q.Seq, (last && q.Sample != nil) || j < len(q.PromptLogprobTargets))
			n++
		}
		s.outIndex[i] = int32(n - 1)
	}
	// Rows in the step's order, which is the order of the tokens sampled.
	for i, q := range st.Sequences {
		if q.Sample != nil {
			// The batch index of the row, until its logits are out.
			sp, err := s.sampleParams(q.Seq, q.Sample)
			if err != nil {
				return 0, err
			}
			s.rows = append(s.rows, sampleRow{seq: q.Seq, tok: s.outIndex[i]})
			s.params = append(s.params, sp)
		}
	}
	return n, nil
}

// draw samples each row's token from the decode's logits.
func (s *server) draw() error {
	c := s.ctx
	if c.attached {
		// Every row is greedy, and llama.cpp took its argmax in the graph.
		for i := range s.rows {
			r := &s.rows[i]
			if r.tok = c.sampled(int(r.tok)); r.tok < 0 {
				return fmt.Errorf("llama.cpp sampled no token for sequence %d in its graph", r.seq)
			}
		}
	} else {
		// llama.cpp hands out the rows one at a time (it may reorder its
		// outputs on the first); the draws then run on every thread.
		for i := range s.rows {
			s.rows[i].logits = c.logits(int(s.rows[i].tok))
		}
		s.samplers.Rows(len(s.rows), func(i int, smp *sampling.Sampler) {
			r, p := &s.rows[i], &s.params[i]
			if !p.Logprobs {
				r.tok = smp.Sample(r.logits, p)
				return
			}
			// Of the raw logits, before the draw writes over them.
			var top [sampling.MaxTopLogprobs]sampling.Logprob
			lse, n := smp.Logprobs(r.logits, top[:p.TopLogprobs])
			lp := &dpnodev1.TokenLogprobs{TopTokenIds: make([]uint32, n), TopLogprobs: make([]float32, n)}
			for j := range n {
				lp.TopTokenIds[j], lp.TopLogprobs[j] = uint32(top[j].Token), top[j].Logprob
			}
			// The drawn token's raw logit, unless the draw changes it.
			raw := r.logits
			if p.WritesLogits() {
				raw = smp.Keep(r.logits)
			}
			r.tok = smp.Sample(r.logits, p)
			lp.Logprob = raw[r.tok] - lse
			r.logprobs = lp
		})
	}
	return nil
}

// advance records the drawn tokens: in the step's answer, with their
// log-probabilities when any row asked, and in each sequence's history
// and grammar.
func (s *server) advance(done *dpnodev1.StepDone) {
	logprobs := false
	for i := range s.params {
		logprobs = logprobs || s.params[i].Logprobs
	}
	for i := range s.rows {
		r := &s.rows[i]
		if logprobs {
			lp := r.logprobs
			if lp == nil {
				lp = &dpnodev1.TokenLogprobs{}
			}
			done.Logprobs = append(done.Logprobs, lp)
			r.logprobs = nil
		}
		if h := s.params[i].History; h != nil {
			h.Add(r.tok)
		}
		// The grammar advances over its token. The draw checked every
		// token it returns but the end token, which a finished grammar
		// forces even where it does not allow it: that ends the output.
		if g := s.grammars[r.seq]; s.params[i].Constraint != nil && (r.tok != g.End() || g.Allows(r.tok)) {
			g.accept(r.tok)
		}
		s.last[r.seq], s.hasLast[r.seq] = uint32(r.tok), true
		done.Tokens = append(done.Tokens, uint32(r.tok))
		r.logits = nil
	}
}

// placeSampling decides, before a decode, where its rows are sampled: in
// llama.cpp's graph when every row is greedy (and the graph's greedy
// chains are on), on the host when any row needs its logits. A row that
// needs them switches the chains off at once; they come back after
// reattachAfter steps of greedy rows only.
func (s *server) placeSampling(needLogits bool) error {
	c := s.ctx
	// A step of prompt log-probabilities needs the logits whether it
	// samples or not: llama.cpp's backend sampling takes at most one
	// output a sequence.
	if c.greedy == nil || (len(s.rows) == 0 && !needLogits) {
		return nil
	}
	host := needLogits
	for i := range s.params {
		if s.params[i].NeedsLogits() {
			host = true
			break
		}
	}
	switch {
	case host:
		s.greedySteps = 0
		return c.attachGreedy(false)
	case !c.attached:
		if s.greedySteps++; s.greedySteps >= reattachAfter {
			s.greedySteps = 0
			return c.attachGreedy(true)
		}
	}
	return nil
}

// fill puts a token in each stream between the step's sequences a and b
// (a < b), when the gap is narrow enough (maxFillGap, maxEmptyFillGap)
// and each of its streams has room, so that llama.cpp computes them in
// one pass; rest is how many of the step's sequences are still to come.
// It returns the batch's length.
func (s *server) fill(a, b int32, n, rest int) int {
	gap := int(b - a - 1)
	if gap == 0 || gap > maxEmptyFillGap || n+gap+rest > s.ctx.nBatch {
		return n
	}
	first := len(s.fillers)
	for seq := a + 1; seq < b; seq++ {
		pos := s.ctx.posMax(seq) + 1
		if pos >= s.streamCells || pos > 0 && gap > maxFillGap {
			s.fillers = s.fillers[:first]
			return n
		}
		s.fillers = append(s.fillers, filler{seq: seq, pos: pos})
	}
	for _, f := range s.fillers[first:] {
		s.ctx.batchToken(n, 0, f.pos, f.seq, false)
		n++
	}
	return n
}
