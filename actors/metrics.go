package actors

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dpnode/dpnode/engine"
)

// Histogram buckets of vLLM's metrics, so that dashboards built for vLLM
// read dpnode's the same way.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	// Waves and their collectives: sub-millisecond when steps are
	// simulated at no cost, tens of milliseconds on GPUs.
	shortBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	ratioBuckets = []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1}
	// A step's tokens, and the n of a call.
	iterationBuckets = []float64{1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}
	paramsNBuckets   = []float64{1, 2, 5, 10, 20}
)

// tokenBuckets are vLLM's buckets of a request's token counts: 1, 2, 5,
// 10, 20, 50, ... up to the context length.
func tokenBuckets(maxModelLen int) []float64 {
	var b []float64
	for scale := 1; ; scale *= 10 {
		for _, m := range []int{1, 2, 5} {
			if m*scale > maxModelLen {
				return b
			}
			b = append(b, float64(m*scale))
		}
	}
}

// failReasons are the reasons dpnode_requests_failed_total counts, each
// exported from the start.
var failReasons = []string{"drained", "too_many_restarts", "engine_lost", "no_rank", "rank_not_served", "rank_failed", "rank_lost", "engine_refused"}

// Metrics are a node's Prometheus series: vLLM's names with an engine
// label per rank and the served model's name, plus dpnode's own.
type Metrics struct {
	model                     string
	running, waiting, kvUsage *prometheus.GaugeVec
	success                   *prometheus.CounterVec
	promptTokens, generation  *prometheus.CounterVec
	prefixQueries, prefixHits *prometheus.CounterVec
	preemptions, steps        *prometheus.CounterVec
	computed, executorTime    *prometheus.CounterVec
	stepTime                  *prometheus.HistogramVec
	stepPhases                *prometheus.CounterVec
	ttft, itl, e2e            *prometheus.HistogramVec
	// A finished request's figures, as vLLM's.
	reqPrompt, reqGeneration, reqMaxGeneration *prometheus.HistogramVec
	paramsN, paramsMaxTokens                   *prometheus.HistogramVec
	queueTime, prefillTime, decodeTime         *prometheus.HistogramVec
	inferenceTime, reqTPOT                     *prometheus.HistogramVec
	iterationTokens                            *prometheus.HistogramVec
	cacheConfig                                *prometheus.GaugeVec
	restarts, migrated                         *prometheus.CounterVec
	redispatched, failed                       *prometheus.CounterVec
	inflight, ready                            *prometheus.GaugeVec
	engineFailed                               *prometheus.GaugeVec
	waves, dummySteps                          *prometheus.CounterVec
	collectiveTimeouts                         *prometheus.CounterVec
	waveDuration, balance                      *prometheus.HistogramVec
	collectiveWait, waveStart                  *prometheus.HistogramVec
	parked                                     prometheus.Gauge
	snapshots                                  prometheus.Counter
	nodesFoundGone                             prometheus.Counter
	// The deployment's size as this node knows it, and its changes.
	dpSize, rosterVersion prometheus.Gauge
	scaleUps, scaleDowns  prometheus.Counter
	// The coordinator this node follows, whether it runs it, and how
	// often it moved.
	coordEpoch, coordHere prometheus.Gauge
	coordFailovers        prometheus.Counter
	// outcomes maps a rank to its *outcomeSeries.
	outcomes sync.Map
	// events are the recent ones behind the counters, for the cluster
	// page: a counter says how many, an event says which and when.
	events eventLog
}

// NewMetrics registers a node's series on reg, for a model of context
// length maxModelLen. It is one table of the series, with their names and
// help, which reads best in one place.
func NewMetrics(reg prometheus.Registerer, model string, maxModelLen int) *Metrics {
	if maxModelLen <= 0 {
		maxModelLen = 8192
	}
	tokens := tokenBuckets(maxModelLen)
	labels := []string{"model_name", "engine"}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	counter := func(name, help string, extra ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append(labels[:2:2], extra...))
	}
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	}
	m := &Metrics{
		model:         model,
		running:       gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:       gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:       gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."),
		success:       counter("vllm:request_success_total", "Count of successfully processed requests.", "finished_reason"),
		promptTokens:  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		generation:    counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		prefixQueries: counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in tokens."),
		prefixHits:    counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in tokens."),
		preemptions:   counter("vllm:num_preemptions_total", "Cumulative number of preemptions from the engine."),
		steps:         counter("dpnode_engine_steps_total", "Engine steps run."),
		computed:      counter("dpnode_engine_computed_tokens_total", "Tokens the model computed, as its executor counted them: prefix-cache hits are not computed again."),
		executorTime: counter("dpnode_engine_executor_seconds_total",
			"The executor's own account of its steps' time: the model's compute in a llama.cpp worker, the modelled time in the simulator."),
		stepTime: hist("dpnode_engine_step_seconds", "A step's time as the engine sees it, from handing it to the executor to its result.", shortBuckets),
		stepPhases: counter("dpnode_engine_step_phase_seconds_total",
			"Where steps' time goes, by phase: engine (its own work between a step's result and the next step: outputs, stats, scheduling), "+
				"transport (to the executor and back), kv_ops (the step's KV moves), model (the forward pass until its outputs are ready), "+
				"sample (drawing tokens on the host), executor_other (the executor's remaining time: reading the step, filling the batch).", "phase"),
		ttft:          hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:           hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:           hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets),
		reqPrompt:     hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokens),
		reqGeneration: hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokens),
		reqMaxGeneration: hist("vllm:request_max_num_generation_tokens",
			"Histogram of maximum number of requested generation tokens.", tokens),
		paramsN:         hist("vllm:request_params_n", "Histogram of the n request parameter.", paramsNBuckets),
		paramsMaxTokens: hist("vllm:request_params_max_tokens", "Histogram of the max_tokens request parameter.", tokens),
		queueTime:       hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", e2eBuckets),
		inferenceTime:   hist("vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase for request.", e2eBuckets),
		prefillTime:     hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", e2eBuckets),
		decodeTime:      hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", e2eBuckets),
		reqTPOT: hist("vllm:request_time_per_output_token_seconds",
			"Histogram of time_per_output_token_seconds per request.", itlBuckets),
		iterationTokens: hist("vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", iterationBuckets),
		cacheConfig: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "vllm:cache_config_info",
			Help: "Information of the LLMEngine CacheConfig"}, cacheConfigLabels),
		restarts:     counter("dpnode_engine_restarts_total", "Engine actor crashes followed by a restart."),
		migrated:     counter("dpnode_requests_migrated_total", "Requests moved mid-stream off a crashed engine, counted on the rank they left."),
		redispatched: counter("dpnode_requests_redispatched_total", "Requests with no output yet sent again off a crashed engine, counted on the rank they left."),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dpnode_requests_failed_total",
			Help: "Requests that ended in an error, by reason."}, []string{"model_name", "reason"}),
		inflight:     gauge("dpnode_requests_in_flight", "Requests this API server has sent to the rank that have not finished."),
		ready:        gauge("dpnode_engine_ready", "1 while the rank's engine takes requests."),
		engineFailed: gauge("dpnode_engine_failed", "1 when the rank's engine crashed too often and was stopped."),
		waves:        counter("dpnode_waves_total", "Waves the engine stepped in (expert parallelism)."),
		collectiveTimeouts: counter("dpnode_collective_timeouts_total",
			"Steps whose collective waited out --ep-collective-timeout for missing ranks, which the group then went on without."),
		dummySteps: counter("dpnode_dummy_steps_total",
			"Steps the engine ran with no work, to keep a wave's collectives paired."),
		waveDuration: hist("dpnode_wave_duration_seconds", "From an engine's first step of a wave to the wave's end.", e2eBuckets),
		balance: hist("dpnode_step_balance_ratio",
			"Mean over max of the tokens per rank in a step of a wave (1 is perfect balance).", ratioBuckets),
		collectiveWait: hist("dpnode_collective_wait_seconds",
			"From an engine's step report to having every rank's: the per-step collective's cost.", shortBuckets),
		waveStart: hist("dpnode_wave_start_latency_seconds",
			"From the request that started a wave (at its API server) to this engine's first step in it.", shortBuckets),
		parked: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dpnode_requests_parked",
			Help: "Requests waiting for a rank to become available.", ConstLabels: prometheus.Labels{"model_name": model}}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "dpnode_load_snapshots_total",
			Help: "Load snapshots published by this node's coordinator."}),
		nodesFoundGone: prometheus.NewCounter(prometheus.CounterOpts{Name: "dpnode_nodes_found_gone_total",
			Help: "Peers this node found gone (their actor port refused connections) before gossip declared them dead."}),
		dpSize: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dpnode_data_parallel_size",
			Help: "Ranks in the deployment, as the newest roster this node has heard of says.", ConstLabels: prometheus.Labels{"model_name": model}}),
		rosterVersion: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dpnode_roster_version",
			Help: "Version of the newest roster (which node holds which ranks) this node has heard of."}),
		scaleUps: prometheus.NewCounter(prometheus.CounterOpts{Name: "dpnode_scale_ups_total",
			Help: "Roster changes this node heard of that grew the deployment (a node joined with new ranks)."}),
		scaleDowns: prometheus.NewCounter(prometheus.CounterOpts{Name: "dpnode_scale_downs_total",
			Help: "Roster changes this node heard of that shrank the deployment (a node left and gave its ranks back)."}),
		coordEpoch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dpnode_coordinator_epoch",
			Help: "Epoch of the coordinator this node follows (the boot time of its node, in Unix seconds); 0 while there is none with a quorum."}),
		coordHere: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dpnode_coordinator_running",
			Help: "1 while this node runs the cluster's coordinator, else 0."}),
		coordFailovers: prometheus.NewCounter(prometheus.CounterOpts{Name: "dpnode_coordinator_failovers_total",
			Help: "Times the coordinator this node follows moved to a new epoch after the first (a failover, or a quorum regained)."}),
	}
	for _, r := range failReasons {
		m.failed.WithLabelValues(model, r)
	}
	reg.MustRegister(m.reqPrompt, m.reqGeneration, m.reqMaxGeneration, m.paramsN, m.paramsMaxTokens,
		m.queueTime, m.inferenceTime, m.prefillTime, m.decodeTime, m.reqTPOT, m.iterationTokens, m.cacheConfig)
	reg.MustRegister(m.running, m.waiting, m.kvUsage, m.success, m.promptTokens, m.generation,
		m.prefixQueries, m.prefixHits, m.preemptions, m.steps, m.computed, m.executorTime, m.stepTime, m.stepPhases, m.ttft, m.itl, m.e2e, m.restarts,
		m.migrated, m.redispatched, m.failed, m.inflight, m.ready, m.engineFailed, m.parked, m.snapshots, m.nodesFoundGone,
		m.dpSize, m.rosterVersion, m.scaleUps, m.scaleDowns, m.coordEpoch, m.coordHere, m.coordFailovers,
		m.waves, m.dummySteps, m.collectiveTimeouts, m.waveDuration, m.balance, m.collectiveWait, m.waveStart)
	return m
}

// recordOutcome counts a request's end under its rank: successes by
// finish reason with their tokens and times, and aborts.
func (m *Metrics) recordOutcome(o Outcome) {
	if o.Rank < 0 {
		return
	}
	s := m.outcomeSeriesOf(o.Rank)
	switch o.Reason {
	case engine.FinishedStop:
		s.stop.Inc()
	case engine.FinishedLength:
		s.length.Inc()
	default:
		s.abort.Inc()
		return
	}
	s.promptTokens.Add(float64(o.PromptTokens))
	s.e2e.Observe(o.Latency.Seconds())
	s.prompt.Observe(float64(o.PromptTokens))
	s.generation.Observe(float64(o.GenerationTokens))
	if o.MaxTokens > 0 {
		s.maxTokens.Observe(float64(o.MaxTokens))
	}
	if o.N > 0 {
		s.n.Observe(float64(o.N))
		s.maxGeneration.Observe(float64(o.MaxGenerationTokens))
	}
	// vLLM's phases: waiting in the engine, then running (its prefill
	// until the first token, then its decode).
	first := o.FirstToken
	if first <= 0 {
		first = o.Latency
	}
	queued := min(o.Queued, first)
	decode := o.Latency - first
	s.queue.Observe(queued.Seconds())
	s.prefill.Observe((first - queued).Seconds())
	s.decode.Observe(decode.Seconds())
	s.inference.Observe((o.Latency - queued).Seconds())
	tpot := 0.0
	if o.GenerationTokens > 1 {
		tpot = decode.Seconds() / float64(o.GenerationTokens-1)
	}
	s.tpot.Observe(tpot)
}

// outcomeSeries are a rank's series that a request's end counts in,
// resolved once: recordOutcome runs on every HTTP handler's goroutine, and
// resolving labels per request was a twenty-fifth of the CPU under load.
type outcomeSeries struct {
	stop, length, abort                    prometheus.Counter
	promptTokens                           prometheus.Counter
	e2e, prompt, generation, maxGeneration prometheus.Observer
	n, maxTokens                           prometheus.Observer
	queue, prefill, decode, inference      prometheus.Observer
	tpot                                   prometheus.Observer
}

// outcomeSeriesOf returns the rank's series, made (each at zero) on the
// first call.
func (m *Metrics) outcomeSeriesOf(rank int) *outcomeSeries {
	if s, ok := m.outcomes.Load(rank); ok {
		return s.(*outcomeSeries)
	}
	l := prometheus.Labels{"model_name": m.model, "engine": strconv.Itoa(rank)}
	reason := func(r string) prometheus.Counter {
		return m.success.With(prometheus.Labels{"model_name": m.model, "engine": l["engine"], "finished_reason": r})
	}
	s := &outcomeSeries{stop: reason("stop"), length: reason("length"), abort: reason("abort"),
		promptTokens: m.promptTokens.With(l), e2e: m.e2e.With(l),
		prompt: m.reqPrompt.With(l), generation: m.reqGeneration.With(l), maxGeneration: m.reqMaxGeneration.With(l),
		n: m.paramsN.With(l), maxTokens: m.paramsMaxTokens.With(l),
		queue: m.queueTime.With(l), prefill: m.prefillTime.With(l), decode: m.decodeTime.With(l), inference: m.inferenceTime.With(l),
		tpot: m.reqTPOT.With(l)}
	got, _ := m.outcomes.LoadOrStore(rank, s)
	return got.(*outcomeSeries)
}

// cacheConfigLabels are the labels of vllm:cache_config_info: the fields
// of vLLM's CacheConfig that dpnode's engines know, with the engine.
var cacheConfigLabels = []string{"block_size", "enable_prefix_caching", "num_gpu_blocks", "engine"}

// CacheConfig is what vllm:cache_config_info says of a rank's KV cache.
type CacheConfig struct {
	BlockSize           int
	EnablePrefixCaching bool
	// NumGPUBlocks is the cache's capacity in blocks; 0 where not known
	// (a server dpnode stands in front of).
	NumGPUBlocks int
}

// setCacheConfig exports the rank's cache configuration; a remote rank's
// is its own node's to export.
func (rm *rankMetrics) setCacheConfig(c CacheConfig) {
	if rm.cacheConfig != nil {
		rm.cacheConfig(c)
	}
}

// setCacheConfig exports rank's cache configuration in vLLM's spelling of
// each value (Python's: True, None).
func (m *Metrics) setCacheConfig(rank int, c CacheConfig) {
	m.cacheConfig.DeletePartialMatch(prometheus.Labels{"engine": strconv.Itoa(rank)})
	orNone := func(v int) string {
		if v <= 0 {
			return "None"
		}
		return strconv.Itoa(v)
	}
	pyBool := map[bool]string{true: "True", false: "False"}[c.EnablePrefixCaching]
	m.cacheConfig.WithLabelValues(orNone(c.BlockSize), pyBool, orNone(c.NumGPUBlocks), strconv.Itoa(rank)).Set(1)
}

// rankMetrics holds one rank's series, resolved once so that the per-token
// path does no label lookups.
type rankMetrics struct {
	running, waiting, kvUsage prometheus.Gauge
	generation                prometheus.Counter
	prefixQueries, prefixHits prometheus.Counter
	preemptions, steps        prometheus.Counter
	computed, executorTime    prometheus.Counter
	stepTime                  prometheus.Observer
	// phases are the step phase series, by stepPhase.
	phases                    [numStepPhases]prometheus.Counter
	ttft, itl                 prometheus.Observer
	restarts, migrated        prometheus.Counter
	redispatched              prometheus.Counter
	inflight, ready, failed   prometheus.Gauge
	waves, dummySteps         prometheus.Counter
	collectiveTimeouts        prometheus.Counter
	waveDuration, balance     prometheus.Observer
	collectiveWait, waveStart prometheus.Observer
	iterationTokens           prometheus.Observer
	// cacheConfig exports the engine's cache configuration; nil for a
	// remote rank.
	cacheConfig func(CacheConfig)
}

func (m *Metrics) forRank(rank int, local bool) *rankMetrics {
	e := strconv.Itoa(rank)
	l := prometheus.Labels{"model_name": m.model, "engine": e}
	// Create the per-reason series now, so that a rank shows zeros before
	// its first request rather than no series.
	for _, r := range []string{"stop", "length", "abort"} {
		m.success.With(prometheus.Labels{"model_name": m.model, "engine": e, "finished_reason": r})
	}
	m.outcomeSeriesOf(rank)
	// What this node's API server sees of the rank's requests, and its
	// readiness as this node sees it.
	rm := &rankMetrics{
		generation: m.generation.With(l), ttft: m.ttft.With(l), itl: m.itl.With(l),
		migrated: m.migrated.With(l), redispatched: m.redispatched.With(l),
		inflight: m.inflight.With(l), ready: m.ready.With(l), failed: m.engineFailed.With(l),
	}
	if !local {
		// Another node's engine: its own state is in that node's metrics,
		// and a zero here would read as an idle engine. Detached series
		// take the writes and are never exported.
		gauge := func() prometheus.Gauge { return prometheus.NewGauge(prometheus.GaugeOpts{Name: "detached"}) }
		counter := func() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "detached"}) }
		hist := func() prometheus.Observer { return prometheus.NewHistogram(prometheus.HistogramOpts{Name: "detached"}) }
		rm.running, rm.waiting, rm.kvUsage = gauge(), gauge(), gauge()
		rm.prefixQueries, rm.prefixHits, rm.preemptions, rm.steps = counter(), counter(), counter(), counter()
		rm.computed, rm.executorTime, rm.restarts = counter(), counter(), counter()
		rm.waves, rm.dummySteps, rm.collectiveTimeouts = counter(), counter(), counter()
		rm.stepTime, rm.waveDuration, rm.balance, rm.collectiveWait, rm.waveStart = hist(), hist(), hist(), hist(), hist()
		rm.iterationTokens = hist()
		for i := range rm.phases {
			rm.phases[i] = counter()
		}
		return rm
	}
	rm.running, rm.waiting, rm.kvUsage = m.running.With(l), m.waiting.With(l), m.kvUsage.With(l)
	rm.prefixQueries, rm.prefixHits = m.prefixQueries.With(l), m.prefixHits.With(l)
	rm.preemptions, rm.steps, rm.computed = m.preemptions.With(l), m.steps.With(l), m.computed.With(l)
	rm.executorTime, rm.stepTime, rm.restarts = m.executorTime.With(l), m.stepTime.With(l), m.restarts.With(l)
	for i, name := range stepPhaseNames {
		rm.phases[i] = m.stepPhases.With(prometheus.Labels{"model_name": m.model, "engine": e, "phase": name})
	}
	rm.waves, rm.dummySteps, rm.collectiveTimeouts = m.waves.With(l), m.dummySteps.With(l), m.collectiveTimeouts.With(l)
	rm.waveDuration, rm.balance = m.waveDuration.With(l), m.balance.With(l)
	rm.collectiveWait, rm.waveStart = m.collectiveWait.With(l), m.waveStart.With(l)
	rm.iterationTokens = m.iterationTokens.With(l)
	rm.cacheConfig = func(c CacheConfig) { m.setCacheConfig(rank, c) }
	return rm
}

// stepPhase indexes rankMetrics.phases.
type stepPhase int

const (
	phaseEngine stepPhase = iota
	phaseTransport
	phaseKVOps
	phaseModel
	phaseSample
	phaseExecutorOther
	numStepPhases
)

var stepPhaseNames = [numStepPhases]string{"engine", "transport", "kv_ops", "model", "sample", "executor_other"}

// observeStep adds a step's parts to the phase series: wall is the step as
// the engine saw it, res the executor's own account.
func (rm *rankMetrics) observeStep(wall time.Duration, res engine.StepResult) {
	p := res.Phases
	rm.phases[phaseTransport].Add(max(0, wall-res.Duration).Seconds())
	rm.phases[phaseKVOps].Add(p.KVOps.Seconds())
	rm.phases[phaseModel].Add(p.Model.Seconds())
	rm.phases[phaseSample].Add(p.Sample.Seconds())
	rm.phases[phaseExecutorOther].Add(max(0, res.Duration-p.KVOps-p.Model-p.Sample).Seconds())
}

func (m *Metrics) failedWith(reason string) {
	m.failed.WithLabelValues(m.model, reason).Inc()
}
