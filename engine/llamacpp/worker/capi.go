//go:build llamacpp

// Package worker is the model worker of the llama.cpp engine: the process
// that holds one rank's model and KV cache and computes the steps its
// engine sends. It binds llama.cpp's C API with cgo, so it is built only
// with the llamacpp build tag, against llama.h from llama.cpp's source and
// its prebuilt libraries (make llamacpp).
package worker

/*
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <math.h>
#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

// The last error llama.cpp logged, which says why a load failed.
static char dpn_last_error[2048];
static int dpn_log_level = GGML_LOG_LEVEL_INFO;
static int dpn_last_level = GGML_LOG_LEVEL_INFO;

static void dpn_log(enum ggml_log_level level, const char * text, void * user) {
	(void)user;
	if (level == GGML_LOG_LEVEL_CONT) {
		level = dpn_last_level;
	}
	dpn_last_level = level;
	if (level == GGML_LOG_LEVEL_ERROR) {
		size_t n = strlen(dpn_last_error);
		if (n + strlen(text) >= sizeof(dpn_last_error)) {
			n = 0;
			dpn_last_error[0] = 0;
		}
		strncat(dpn_last_error, text, sizeof(dpn_last_error) - n - 1);
	}
	if (level >= dpn_log_level) {
		fputs(text, stderr);
	}
}

static void dpn_init(const char * backend_dir, int quiet) {
	dpn_log_level = quiet ? GGML_LOG_LEVEL_WARN : GGML_LOG_LEVEL_INFO;
	llama_log_set(dpn_log, NULL);
	ggml_backend_load_all_from_path(backend_dir);
	llama_backend_init();
}

static const char * dpn_take_error(void) { return dpn_last_error; }
static void dpn_clear_error(void) { dpn_last_error[0] = 0; }

// dpn_progress tells the engine how far the model's load is, every tenth,
// on a line of its own that the engine reads from the worker's log.
static int dpn_load_tenths = -1;

static bool dpn_progress(float progress, void * user) {
	(void)user;
	int tenths = (int)(progress * 10.0f);
	if (tenths > dpn_load_tenths) {
		dpn_load_tenths = tenths;
		fprintf(stderr, "dpnode-load-progress %d\n", tenths * 10);
	}
	return true;
}

static struct llama_model * dpn_load(const char * path, int vocab_only, int gpu_layers) {
	struct llama_model_params p = llama_model_default_params();
	p.vocab_only = vocab_only;
	p.n_gpu_layers = gpu_layers;
	if (!vocab_only) {
		p.progress_callback = dpn_progress;
	}
	return llama_model_load_from_file(path, p);
}

// greedy, when not NULL, holds a sampler chain per sequence that
// llama.cpp runs in its graph (backend sampling).
static struct llama_context * dpn_context(struct llama_model * m, unsigned n_ctx, unsigned n_batch, unsigned n_seq, unsigned n_outputs, int threads,
                                          int kv_f32, int flash, struct llama_sampler ** greedy) {
	struct llama_context_params p = llama_context_default_params();
	p.n_ctx = n_ctx;
	p.n_batch = n_batch;
	p.n_ubatch = n_batch < 512 ? n_batch : 512;
	p.n_seq_max = n_seq;
	// A step samples at most one token per sequence, and gives the
	// prompt log-probabilities of at most a chunk: logits for more would
	// only take memory (n_vocab floats a row).
	p.n_outputs_max = n_outputs;
	p.type_k = kv_f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
	p.type_v = p.type_k;
	p.flash_attn_type = flash ? LLAMA_FLASH_ATTN_TYPE_AUTO : LLAMA_FLASH_ATTN_TYPE_DISABLED;
	p.n_threads = threads;
	p.n_threads_batch = threads;
	// A KV stream per sequence: a step attends over each sequence's own
	// cells, whatever the others hold (the scheduler's streamKV).
	p.kv_unified = false;
	p.no_perf = true;
	struct llama_sampler_seq_config * cfg = NULL;
	if (greedy) {
		cfg = malloc(n_seq * sizeof *cfg);
		for (unsigned i = 0; i < n_seq; i++) {
			cfg[i].seq_id = (llama_seq_id) i;
			cfg[i].sampler = greedy[i];
		}
		p.samplers = cfg;
		p.n_samplers = n_seq;
	}
	struct llama_context * c = llama_init_from_model(m, p);
	free(cfg);
	return c;
}

// dpnode's greedy sampler for llama.cpp's graph when the output layer is
// on the CPU. llama.cpp's own greedy sampler takes each row's argmax with
// ggml's argmax, one scalar thread a row, over a padded copy of every
// output row (llama.cpp's build_sampling pads them so that a graph of one
// output stays the same whichever samplers run). This one takes every
// row's argmax in one op over the rows themselves, on all of the graph's
// threads, with the host's own greedy draw (dpn_greedy, passed in), so
// that both choose the same token: no copy of the logits, in the graph or
// out of it.
typedef int32_t (*dpn_row_argmax)(const float *, int32_t);

struct dpn_argmax_group {
	dpn_row_argmax argmax;
	// all is the graph's output rows and out their argmaxes, made by the
	// first sampler that a graph build applies; every chain shares them.
	struct ggml_tensor * all;
	struct ggml_tensor * out;
};

static void dpn_argmax_rows(struct ggml_tensor * dst, int ith, int nth, void * ud) {
	const struct dpn_argmax_group * g = ud;
	const struct ggml_tensor * src = dst->src[0];
	int32_t * out = (int32_t *) dst->data;
	for (int64_t r = ith; r < src->ne[1]; r += nth) {
		out[r] = g->argmax((const float *) ((const char *) src->data + r * src->nb[1]), (int32_t) src->ne[0]);
	}
}

static const char * dpn_argmax_name(const struct llama_sampler * s) {
	(void) s;
	return "dpnode-greedy";
}

// dpn_argmax_apply is the sampler on the host, where llama.cpp would run
// it outside a graph (dpnode does not): the first of the largest.
static void dpn_argmax_apply(struct llama_sampler * s, llama_token_data_array * cur) {
	(void) s;
	cur->selected = 0;
	for (size_t i = 1; i < cur->size; i++) {
		if (cur->data[i].logit > cur->data[cur->selected].logit) {
			cur->selected = (int64_t) i;
		}
	}
}

static struct llama_sampler * dpn_argmax_clone(const struct llama_sampler * s);

// The op runs only on the CPU: llama.cpp asks each sampler whether it can
// run on the buffer type of the output layer's device.
static bool dpn_argmax_backend_init(struct llama_sampler * s, ggml_backend_buffer_type_t buft, uint32_t n_outputs_max_per_seq) {
	(void) s;
	(void) n_outputs_max_per_seq;
	return ggml_backend_buft_is_host(buft);
}

static void dpn_argmax_backend_reset(struct llama_sampler * s) {
	struct dpn_argmax_group * g = s->ctx;
	g->all = NULL;
	g->out = NULL;
}

static void dpn_argmax_backend_apply(struct llama_sampler * s, struct ggml_context * ctx, struct ggml_cgraph * gf, struct llama_sampler_data * data) {
	(void) gf;
	struct dpn_argmax_group * g = s->ctx;
	struct ggml_tensor * row = data->logits;
	struct ggml_tensor * pad = row->view_src;
	// No logits out of the graph: llama.cpp would compute the padded copy
	// for them and copy each row to the host (llama_get_sampled_logits_ith),
	// which dpnode never reads.
	data->logits = NULL;
	// The row is a view of llama.cpp's padded copy of the output rows:
	// the same row of the rows themselves, while it is one of them (an
	// idle sequence's sampler gets the padding row, and is not computed).
	if (pad && pad->op == GGML_OP_PAD && pad->src[0] && pad->src[0]->type == GGML_TYPE_F32 && ggml_is_contiguous(pad->src[0]) &&
	    pad->src[0]->ne[0] == row->ne[0] && pad->nb[1] > 0 && row->view_offs % pad->nb[1] == 0) {
		struct ggml_tensor * all = pad->src[0];
		int64_t r = (int64_t) (row->view_offs / pad->nb[1]);
		if (r < all->ne[1]) {
			if (g->all != all) {
				g->all = all;
				g->out = ggml_custom_4d(ctx, GGML_TYPE_I32, all->ne[1], 1, 1, 1, &all, 1, dpn_argmax_rows, GGML_N_TASKS_MAX, g);
			}
			data->sampled = ggml_view_1d(ctx, g->out, 1, (size_t) r * ggml_element_size(g->out));
			return;
		}
	}
	// Any other row (llama.cpp's probe of the sampler, a layout this
	// code does not know): its argmax alone.
	data->sampled = ggml_custom_4d(ctx, GGML_TYPE_I32, 1, 1, 1, 1, &row, 1, dpn_argmax_rows, 1, g);
}

static struct llama_sampler_i dpn_argmax_iface = {
	.name = dpn_argmax_name,
	.apply = dpn_argmax_apply,
	.clone = dpn_argmax_clone,
	.backend_init = dpn_argmax_backend_init,
	.backend_apply = dpn_argmax_backend_apply,
	.backend_reset = dpn_argmax_backend_reset,
};

// A clone shares the group, which the chains own (dpn_free_chains).
static struct llama_sampler * dpn_argmax_clone(const struct llama_sampler * s) {
	return llama_sampler_init(&dpn_argmax_iface, s->ctx);
}

// dpn_chains are a greedy sampler chain per sequence, which llama.cpp
// computes in its graph: llama.cpp's greedy sampler, or with argmax set
// dpnode's (the output layer on the CPU).
struct dpn_chains {
	struct llama_sampler ** s;
	unsigned n;
	struct dpn_argmax_group g;
};

static struct dpn_chains * dpn_greedy_chains(unsigned n, dpn_row_argmax argmax) {
	struct dpn_chains * c = calloc(1, sizeof *c);
	c->s = malloc(n * sizeof *c->s);
	c->n = n;
	c->g.argmax = argmax;
	for (unsigned i = 0; i < n; i++) {
		c->s[i] = llama_sampler_chain_init(llama_sampler_chain_default_params());
		llama_sampler_chain_add(c->s[i], argmax ? llama_sampler_init(&dpn_argmax_iface, &c->g) : llama_sampler_init_greedy());
	}
	return c;
}

static void dpn_free_chains(struct dpn_chains * c) {
	for (unsigned i = 0; i < c->n; i++) {
		llama_sampler_free(c->s[i]);
	}
	free(c->s);
	free(c);
}

// dpn_attach gives every sequence its chain (on) or takes them all away;
// llama.cpp reserves its graph again at the next decode.
static int dpn_attach(struct llama_context * c, struct dpn_chains * s, int on) {
	int ok = 1;
	for (unsigned i = 0; i < s->n; i++) {
		if (!llama_set_sampler(c, (llama_seq_id) i, on ? s->s[i] : NULL)) {
			ok = 0;
		}
	}
	return ok;
}

static void dpn_batch_set(struct llama_batch * b, int i, int token, int pos, int seq, int logits) {
	b->token[i] = token;
	b->pos[i] = pos;
	b->n_seq_id[i] = 1;
	b->seq_id[i][0] = seq;
	b->logits[i] = logits;
}

static int dpn_meta_int(struct llama_model * m, const char * key, int def) {
	char buf[64];
	if (llama_model_meta_val_str(m, key, buf, sizeof buf) < 0) {
		return def;
	}
	return atoi(buf);
}

static const char * dpn_device(int gpu_layers) {
	static char out[512];
	out[0] = 0;
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		ggml_backend_dev_t d = ggml_backend_dev_get(i);
		enum ggml_backend_dev_type t = ggml_backend_dev_type(d);
		if (gpu_layers != 0 && t != GGML_BACKEND_DEVICE_TYPE_GPU && t != GGML_BACKEND_DEVICE_TYPE_IGPU) {
			continue;
		}
		if (gpu_layers == 0 && t != GGML_BACKEND_DEVICE_TYPE_CPU) {
			continue;
		}
		snprintf(out, sizeof out, "%s (%s)", ggml_backend_dev_name(d), ggml_backend_dev_description(d));
		break;
	}
	return out;
}

static int dpn_has_gpu(void) {
	for (size_t i = 0; i < ggml_backend_dev_count(); i++) {
		enum ggml_backend_dev_type t = ggml_backend_dev_type(ggml_backend_dev_get(i));
		if (t == GGML_BACKEND_DEVICE_TYPE_GPU || t == GGML_BACKEND_DEVICE_TYPE_IGPU) {
			return 1;
		}
	}
	return 0;
}
*/
import "C"

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/dpnode/dpnode/engine"
	"github.com/dpnode/dpnode/engine/llamacpp/sampling"
)

// initLibrary loads the backends from dir and sets up logging.
func initLibrary(dir string, quiet bool) {
	cdir := C.CString(dir)
	defer C.free(unsafe.Pointer(cdir))
	q := C.int(0)
	if quiet {
		q = 1
	}
	C.dpn_init(cdir, q)
}

// lastError returns what llama.cpp last logged as an error, and forgets
// it.
func lastError() string {
	s := strings.TrimSpace(C.GoString(C.dpn_take_error()))
	C.dpn_clear_error()
	return s
}

func withLastError(msg string) error {
	if e := lastError(); e != "" {
		return fmt.Errorf("%s: %s", msg, strings.ReplaceAll(e, "\n", "; "))
	}
	return errors.New(msg)
}

type model struct {
	m     *C.struct_llama_model
	vocab *C.struct_llama_vocab
}

func loadModel(path string, vocabOnly bool, gpuLayers int) (*model, error) {
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	vo := C.int(0)
	if vocabOnly {
		vo = 1
	}
	m := C.dpn_load(cpath, vo, C.int(gpuLayers))
	if m == nil {
		return nil, withLastError("llama.cpp could not load the model")
	}
	return &model{m: m, vocab: C.llama_model_get_vocab(m)}, nil
}

func (m *model) free() { C.llama_model_free(m.m) }

func (m *model) metaString(key string) string {
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	buf := make([]byte, 256)
	n := C.llama_model_meta_val_str(m.m, ckey, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	if n < 0 {
		return ""
	}
	if int(n) >= len(buf) {
		buf = make([]byte, int(n)+1)
		C.llama_model_meta_val_str(m.m, ckey, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	}
	return C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
}

func (m *model) metaInt(key string, def int) int {
	ckey := C.CString(key)
	defer C.free(unsafe.Pointer(ckey))
	return int(C.dpn_meta_int(m.m, ckey, C.int(def)))
}

func (m *model) description() string {
	buf := make([]byte, 256)
	C.llama_model_desc(m.m, (*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	return C.GoString((*C.char)(unsafe.Pointer(&buf[0])))
}

func (m *model) nVocab() int        { return int(C.llama_vocab_n_tokens(m.vocab)) }
func (m *model) contextLength() int { return int(C.llama_model_n_ctx_train(m.m)) }
func (m *model) size() uint64       { return uint64(C.llama_model_size(m.m)) }
func (m *model) layers() int        { return int(C.llama_model_n_layer(m.m)) }
func (m *model) isEOG(t int) bool   { return bool(C.llama_vocab_is_eog(m.vocab, C.llama_token(t))) }
func (m *model) bos() int           { return int(C.llama_vocab_bos(m.vocab)) }
func (m *model) addBOS() bool       { return bool(C.llama_vocab_get_add_bos(m.vocab)) }

// partialRemoval says whether the model's KV can lose a range of positions
// of one sequence, which the engine's scheduler needs.
func (m *model) partialRemoval() error {
	switch {
	case bool(C.llama_model_is_recurrent(m.m)):
		return errors.New("it is a recurrent model, whose state cannot lose part of a sequence")
	case bool(C.llama_model_is_hybrid(m.m)):
		return errors.New("it is a hybrid recurrent model, whose state cannot lose part of a sequence")
	case C.llama_model_n_swa(m.m) > 0:
		return errors.New("it uses sliding-window attention, whose KV cache cannot lose part of a sequence")
	}
	return nil
}

// kvBytesPerToken is the KV cache's size per token of context with
// elements of elemSize bytes: every layer keeps a key and a value of
// n_head_kv heads.
func (m *model) kvBytesPerToken(elemSize uint64) uint64 {
	arch := m.metaString("general.architecture")
	nLayer := int(C.llama_model_n_layer(m.m))
	nHead := int(C.llama_model_n_head(m.m))
	nHeadKV := int(C.llama_model_n_head_kv(m.m))
	nEmbd := int(C.llama_model_n_embd(m.m))
	headK, headV := nEmbd, nEmbd
	if nHead > 0 {
		headK, headV = nEmbd/nHead, nEmbd/nHead
	}
	headK = m.metaInt(arch+".attention.key_length", headK)
	headV = m.metaInt(arch+".attention.value_length", headV)
	return uint64(nLayer) * uint64(nHeadKV) * uint64(headK+headV) * elemSize
}

// pieces returns every token's text as output shows it: special tokens
// render as nothing (vLLM skips them), byte tokens as their byte. The
// special tokens' own text, for output that keeps them
// (skip_special_tokens false), comes apart: their ids and texts.
func (m *model) pieces() ([]byte, []uint32, []uint32, [][]byte) {
	n := m.nVocab()
	var all []byte
	offsets := make([]uint32, 0, n+1)
	var specialIDs []uint32
	var specialTexts [][]byte
	buf := make([]byte, 256)
	piece := func(t int, special bool) []byte {
		k := C.llama_token_to_piece(m.vocab, C.llama_token(t), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, C.bool(special))
		if k < 0 {
			buf = make([]byte, -int(k))
			k = C.llama_token_to_piece(m.vocab, C.llama_token(t), (*C.char)(unsafe.Pointer(&buf[0])), C.int32_t(len(buf)), 0, C.bool(special))
		}
		return buf[:max(k, 0)]
	}
	for t := range n {
		offsets = append(offsets, uint32(len(all)))
		plain := len(all)
		all = append(all, piece(t, false)...)
		if sp := piece(t, true); string(sp) != string(all[plain:]) {
			specialIDs = append(specialIDs, uint32(t))
			specialTexts = append(specialTexts, append([]byte(nil), sp...))
		}
	}
	offsets = append(offsets, uint32(len(all)))
	return all, offsets, specialIDs, specialTexts
}

// tokenize is llama_tokenize; it is safe for concurrent use.
func (m *model) tokenize(text string, addSpecial, parseSpecial bool) ([]uint32, error) {
	ctext := C.CString(text)
	defer C.free(unsafe.Pointer(ctext))
	capacity := len(text) + 8
	for {
		out := make([]C.llama_token, capacity)
		n := C.llama_tokenize(m.vocab, ctext, C.int32_t(len(text)), &out[0], C.int32_t(capacity), C.bool(addSpecial), C.bool(parseSpecial))
		if n == C.INT32_MIN {
			return nil, errors.New("the text is too long to tokenize")
		}
		if n < 0 {
			capacity = int(-n)
			continue
		}
		ids := make([]uint32, n)
		for i := range ids {
			ids[i] = uint32(out[i])
		}
		return ids, nil
	}
}

type context struct {
	c      *C.struct_llama_context
	mem    C.llama_memory_t
	batch  C.struct_llama_batch
	nBatch int
	nVocab int
	// greedy is a greedy sampler chain per sequence, for llama.cpp to
	// run in its graph, or nil; attached says whether it does now.
	greedy   *C.struct_dpn_chains
	argmax   C.dpn_row_argmax
	attached bool
}

// graphGreedy is where a context takes greedy rows' argmaxes.
type graphGreedy int

const (
	// greedyOnHost: every row's logits come out; the host samples.
	greedyOnHost graphGreedy = iota
	// greedyLlama: llama.cpp's greedy sampler, in the graph on the
	// device of the output layer (a GPU).
	greedyLlama
	// greedyCPU: dpnode's argmax op in the graph, the output layer on
	// the CPU: the host's own greedy draw, without copying the logits.
	greedyCPU
)

// newContext makes the context; unless greedy is greedyOnHost every
// sequence starts with a greedy sampler chain that llama.cpp computes in
// its graph.
func newContext(m *model, cells, batch, seqs, threads int, kvF32, flash bool, greedy graphGreedy) (*context, error) {
	f32, fa := C.int(0), C.int(0)
	if kvF32 {
		f32 = 1
	}
	if flash {
		fa = 1
	}
	var argmax C.dpn_row_argmax
	if greedy == greedyCPU {
		argmax = C.dpn_row_argmax(sampling.GreedyFunc())
	}
	var chains *C.struct_dpn_chains
	var perSeq **C.struct_llama_sampler
	if greedy != greedyOnHost {
		chains = C.dpn_greedy_chains(C.uint(seqs), argmax)
		perSeq = chains.s
	}
	c := C.dpn_context(m.m, C.uint(cells), C.uint(batch), C.uint(seqs), C.uint(seqs+engine.PromptLogprobsChunk), C.int(threads), f32, fa, perSeq)
	if c == nil {
		if chains != nil {
			C.dpn_free_chains(chains)
		}
		return nil, withLastError("llama.cpp could not create the context")
	}
	n := int(C.llama_n_batch(c))
	return &context{c: c, mem: C.llama_get_memory(c), batch: C.llama_batch_init(C.int32_t(n), 0, 1), nBatch: n, nVocab: m.nVocab(),
		greedy: chains, argmax: argmax, attached: chains != nil}, nil
}

// attachGreedy gives every sequence its greedy chain in the graph (on), or
// takes them away so that every row's logits come out. llama.cpp reserves
// its graph again at the next decode: a switch costs about what a KV copy
// does, so the worker switches seldom.
func (c *context) attachGreedy(on bool) error {
	if c.greedy == nil || c.attached == on {
		return nil
	}
	o := C.int(0)
	if on {
		o = 1
	}
	if on {
		// llama.cpp initializes a chain for its graph once: new chains.
		// The old ones are in no graph since the decode after they came
		// off (which reserved the graph again).
		n := c.greedy.n
		C.dpn_free_chains(c.greedy)
		c.greedy = C.dpn_greedy_chains(n, c.argmax)
	}
	if C.dpn_attach(c.c, c.greedy, o) == 0 {
		// Leave every sequence without a chain: the host then samples
		// all rows, which is always right.
		C.dpn_attach(c.c, c.greedy, 0)
		c.attached = false
		return withLastError("llama.cpp could not run greedy sampling in its graph")
	}
	c.attached = on
	return nil
}

// sampled is the token the graph's greedy chain chose for the step's i-th
// output, or -1 when it chose none.
func (c *context) sampled(i int) int32 {
	t := C.llama_get_sampled_token_ith(c.c, C.int32_t(i))
	if t == C.LLAMA_TOKEN_NULL {
		return -1
	}
	return int32(t)
}

func (c *context) cells() int       { return int(C.llama_n_ctx(c.c)) }
func (c *context) sequences() int   { return int(C.llama_n_seq_max(c.c)) }
func (c *context) streamCells() int { return int(C.llama_n_ctx_seq(c.c)) }

// seqCopy makes dst's stream a copy of src's whole stream; llama.cpp
// copies the buffer at the next decode.
func (c *context) seqCopy(src, dst int32) {
	C.llama_memory_seq_cp(c.mem, C.llama_seq_id(src), C.llama_seq_id(dst), -1, -1)
}

// saveState writes the cells sequence seq holds, as llama.cpp's
// per-sequence state, into buf (grown as needed), and returns it; false
// when llama.cpp could not.
func (c *context) saveState(seq int32, buf []byte) ([]byte, bool) {
	n := int(C.llama_state_seq_get_size_ext(c.c, C.llama_seq_id(seq), 0))
	if n == 0 {
		return buf[:0], false
	}
	buf = slices.Grow(buf[:0], n)[:n]
	w := C.llama_state_seq_get_data_ext(c.c, (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(buf))), C.size_t(n), C.llama_seq_id(seq), 0)
	return buf[:w], w != 0
}

// restoreState makes sequence seq hold the cells of a state saveState
// wrote, in place of what it held.
func (c *context) restoreState(state []byte, seq int32) bool {
	return C.llama_state_seq_set_data_ext(c.c, (*C.uint8_t)(unsafe.Pointer(unsafe.SliceData(state))), C.size_t(len(state)), C.llama_seq_id(seq), 0) != 0
}

// posMax is the last position sequence seq holds, -1 when it holds none.
func (c *context) posMax(seq int32) int32 {
	return int32(C.llama_memory_seq_pos_max(c.mem, C.llama_seq_id(seq)))
}

func (c *context) seqRemove(seq, p0, p1 int32) bool {
	return bool(C.llama_memory_seq_rm(c.mem, C.llama_seq_id(seq), C.llama_pos(p0), C.llama_pos(p1)))
}

// batchToken sets entry i of the batch.
func (c *context) batchToken(i int, token uint32, pos, seq int32, logits bool) {
	l := C.int(0)
	if logits {
		l = 1
	}
	C.dpn_batch_set(&c.batch, C.int(i), C.int(token), C.int(pos), C.int(seq), l)
}

// decode computes the first n entries of the batch.
func (c *context) decode(n int) error {
	c.batch.n_tokens = C.int32_t(n)
	switch rc := C.llama_decode(c.c, c.batch); rc {
	case 0:
		// A GPU backend computes asynchronously: the decode's time is
		// counted to when its outputs are ready, not to the launch.
		C.llama_synchronize(c.c)
		return nil
	case 1:
		return errors.New("llama.cpp found no free KV cells for the step")
	default:
		return withLastError(fmt.Sprintf("llama_decode failed (%d)", int(rc)))
	}
}

// logits is the row of the step's i-th output in the batch: nVocab floats
// that llama.cpp owns until the next decode.
func (c *context) logits(i int) []float32 {
	return unsafe.Slice((*float32)(unsafe.Pointer(C.llama_get_logits_ith(c.c, C.int32_t(i)))), c.nVocab)
}

func (c *context) free() {
	C.llama_batch_free(c.batch)
	C.llama_free(c.c)
	if c.greedy != nil {
		// After the context, which uses them until it is freed.
		C.dpn_free_chains(c.greedy)
	}
}

func systemInfo() string { return C.GoString(C.llama_print_system_info()) }

func deviceName(gpuLayers int) string { return C.GoString(C.dpn_device(C.int(gpuLayers))) }

func hasGPU() bool { return C.dpn_has_gpu() != 0 }
