# The Go release dpnode builds with (go.mod's toolchain): the go command of
# an older Go fetches it through the module proxy once.
GOTOOLCHAIN           ?= go1.27.3
export GOTOOLCHAIN
# Tool versions are pinned so that generated code is the same everywhere.
BUF_VERSION           ?= v1.75.0
PROTOC_GEN_GO_VERSION ?= v1.36.12
GOBIN                 ?= $(shell go env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

GO_FILES = $(shell git ls-files '*.go' | grep -v '\.pb\.go$$')

.PHONY: build run test lint proto proto-check tools bench chaos chaos-llamacpp fuzz clean llamacpp llamacpp-test testmodel browser-test deploy-test

build:
	go build -buildvcs=auto -o bin/dpnode ./cmd/dpnode
	go build -o bin/dpbench ./cmd/dpbench

# One node on this machine: simulated engines, one per (virtual) GPU.
run:
	go run ./cmd/dpnode join

# The test command of the README: formatting, vet, and the race-checked
# suite, of dpnode and of its deployment files.
test: lint deploy-test
	go test -race -count=1 -timeout 15m ./...

lint:
	@unformatted="$$(gofmt -l $(GO_FILES))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	cd deploy && go vet ./...

# The deployment files, a module of their own (deploy/): every
# kustomization built and checked against the flags and ports of the dpnode
# built from this tree, the dashboard's queries against the series dpnode
# registers, the Dockerfile against what the manifests expect of it.
deploy-test:
	cd deploy && go test -race -count=1 -timeout 10m ./...

tools:
	go install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
	go install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)

proto:
	buf lint
	buf generate

# Fails when the committed generated code differs from what the .proto
# files generate.
proto-check: proto
	@git diff --exit-code -- proto/ || { echo "generated protobuf code is stale: run make proto and commit"; exit 1; }
	@untracked="$$(git ls-files --others --exclude-standard proto/)"; \
	if [ -n "$$untracked" ]; then echo "generated files not committed: $$untracked"; exit 1; fi

# The cluster page in a real browser: Debian's chromium (apt-get install
# chromium; or CHROMIUM=path), headless, over a two-node cluster. It
# prints where it saved its screenshot.
browser-test:
	go test -tags browser -run TestClusterPageInABrowser -timeout 5m -v -count=1 ./node

# The fault-injection suite: load on a three-node cluster while engines,
# actors and nodes crash, hang and lose their network (nftables, as root).
# CI runs a short form; CHAOS_DURATION=10m is the full one. CHAOS_ENGINE
# picks the nodes' engine: sim, or openai (each node in front of two
# servers of its own, which are killed among the faults).
CHAOS_DURATION ?= 10m
CHAOS_ENGINE ?= sim
chaos:
	go test -tags chaos -run TestChaos -timeout 30m -v -count=1 ./node -chaos.duration=$(CHAOS_DURATION) -chaos.engine=$(CHAOS_ENGINE)

# The chaos suite on the llama.cpp engine: the test model on every rank,
# and model and tokenizer workers killed among the other faults.
chaos-llamacpp: llamacpp
	$(LLAMACPP_TEST_ENV) go test -tags 'chaos llamacpp' -run TestChaos -timeout 30m -v -count=1 ./node \
		-chaos.duration=$(CHAOS_DURATION) -chaos.engine=llamacpp

# Every Go fuzz target of the module (found by go test -list, so new ones
# join on their own), one after another, FUZZTIME each, one worker. What a
# target finds is kept under its package's testdata/fuzz/, where go test
# replays it as a regression case from then on. Go's fuzzer can fail a run
# with no fault of the code when a worker is starved or still minimizing at
# the deadline ("context deadline exceeded", or golang/go#56238): such a
# run writes no failing input, and the target runs again, up to three times
# in all. A run that wrote a failing input fails at once.
FUZZTIME ?= 2m
fuzz:
	@set -e; list=$$(go test -run '^$$' -list '^Fuzz' ./...); \
	targets=$$(echo "$$list" | awk '/^Fuzz/ { names[++n] = $$1 } /^ok/ { for (i = 1; i <= n; i++) print $$2 "," names[i]; n = 0 }'); \
	test -n "$$targets" || { echo "no fuzz targets found"; exit 1; }; \
	log=$$(mktemp); trap 'rm -f $$log' EXIT; \
	for t in $$targets; do \
		pkg=$${t%,*}; name=$${t#*,}; \
		for try in 1 2 3; do \
			echo "== fuzz $$pkg $$name for $(FUZZTIME)$$( [ $$try -gt 1 ] && echo ", try $$try")"; \
			if go test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -parallel 1 $$pkg >$$log 2>&1; then \
				cat $$log; break; fi; \
			cat $$log; \
			if grep -q "Failing input written to" $$log || [ $$try = 3 ]; then exit 1; fi; \
			echo "== $$name failed without a failing input: the fuzzer's own trouble; again"; \
		done; \
	done

bench:
	go test -run '^$$' -bench . -benchtime 3s ./http/ ./engine/... ./actors/

# The llama.cpp engine. llama.cpp comes from the npm package node-llama-cpp,
# pinned: its prebuilt libraries (CPU by default; LLAMACPP_GPU=cuda adds the
# CUDA build) and its source, a git bundle, for llama.h, the tokenizers and
# the chat templates of the tests. Everything lands in .llamacpp/, and the
# worker, linked to the libraries it finds in bin/llamacpp/, next to
# bin/dpnode.
NODE_LLAMA_CPP_VERSION ?= 3.21.1
LLAMACPP_GPU           ?=
LLAMACPP_HOME          ?= $(CURDIR)/.llamacpp
LLAMACPP_NPM            = $(LLAMACPP_HOME)/npm/node_modules
LLAMACPP_SRC           ?= $(LLAMACPP_HOME)/src
LLAMACPP_LIBS           = $(LLAMACPP_NPM)/@node-llama-cpp/linux-x64$(if $(LLAMACPP_GPU),-$(LLAMACPP_GPU))/bins/linux-x64$(if $(LLAMACPP_GPU),-$(LLAMACPP_GPU))
# The CUDA build names its libraries libllama.cuda.*; its -ext package has a
# CUDA backend with the CUDA runtime inside, for machines without CUDA 13's.
LLAMACPP_FLAVOUR        = $(if $(LLAMACPP_GPU),.$(LLAMACPP_GPU))
LLAMACPP_FALLBACK       = $(LLAMACPP_NPM)/@node-llama-cpp/linux-x64-$(LLAMACPP_GPU)-ext/bins/linux-x64-$(LLAMACPP_GPU)/fallback
LLAMACPP_CGO_CFLAGS     = -O2 -g -Wno-deprecated-declarations -I$(LLAMACPP_SRC)/include -I$(LLAMACPP_SRC)/ggml/include
LLAMACPP_CGO_LDFLAGS    = -L$(CURDIR)/bin/llamacpp -l:libllama$(LLAMACPP_FLAVOUR).v0.4.0.so -l:libggml$(LLAMACPP_FLAVOUR).v0.4.0.so -l:libggml-base.so -Wl,-rpath,$$ORIGIN/llamacpp

$(LLAMACPP_NPM)/node-llama-cpp/package.json:
	@command -v npm >/dev/null || { echo "make llamacpp needs npm (Debian: apt-get install npm)"; exit 1; }
	mkdir -p $(LLAMACPP_HOME)/npm
	test -f $(LLAMACPP_HOME)/npm/package.json || echo '{"private":true}' > $(LLAMACPP_HOME)/npm/package.json
	cd $(LLAMACPP_HOME)/npm && npm install --save-exact --omit=optional --ignore-scripts --no-audit --no-fund \
		node-llama-cpp@$(NODE_LLAMA_CPP_VERSION) @node-llama-cpp/linux-x64@$(NODE_LLAMA_CPP_VERSION) \
		$(if $(LLAMACPP_GPU),@node-llama-cpp/linux-x64-$(LLAMACPP_GPU)@$(NODE_LLAMA_CPP_VERSION) @node-llama-cpp/linux-x64-$(LLAMACPP_GPU)-ext@$(NODE_LLAMA_CPP_VERSION))

$(LLAMACPP_SRC)/include/llama.h: $(LLAMACPP_NPM)/node-llama-cpp/package.json
	rm -rf $(LLAMACPP_SRC)
	git clone --quiet $(LLAMACPP_NPM)/node-llama-cpp/llama/gitRelease.bundle $(LLAMACPP_SRC)

llamacpp: $(LLAMACPP_SRC)/include/llama.h
	rm -rf bin/llamacpp
	mkdir -p bin/llamacpp
	cp $(LLAMACPP_LIBS)/*.so bin/llamacpp/
	$(if $(LLAMACPP_GPU),ldconfig -p | grep -q libcublas.so.13 || cp $(LLAMACPP_FALLBACK)/*.so bin/llamacpp/)
	CGO_CFLAGS="$(LLAMACPP_CGO_CFLAGS)" CGO_LDFLAGS='$(LLAMACPP_CGO_LDFLAGS)' \
		go build -tags llamacpp -o bin/dpnode-llama-worker ./cmd/dpnode-llama-worker
	go build -buildvcs=auto -o bin/dpnode ./cmd/dpnode
	@echo "llama.cpp engine ready: bin/dpnode join --engine llamacpp --model FILE.gguf"

# A random-weight model with Llama 3's tokenizer and chat template, as the
# tests write it: no trained weights are needed to exercise the engine.
TESTMODEL ?= $(LLAMACPP_HOME)/testmodel.gguf
testmodel: $(LLAMACPP_SRC)/include/llama.h
	go run ./cmd/dpnode testmodel --vocab $(LLAMACPP_SRC)/models/ggml-vocab-llama-bpe.gguf \
		--chat-template $(LLAMACPP_SRC)/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja --out $(TESTMODEL)

# The tests of the llama.cpp engine: they need make llamacpp's worker, the
# bundle's tokenizers and templates, and Python's jinja2 as the reference
# renderer of chat templates. The rest of the suite is make test's.
LLAMACPP_TEST_ENV = DPNODE_LLAMACPP_SRC=$(LLAMACPP_SRC) DPNODE_LLAMACPP_WORKER=$(CURDIR)/bin/dpnode-llama-worker \
	CGO_CFLAGS="$(LLAMACPP_CGO_CFLAGS)" CGO_LDFLAGS='$(LLAMACPP_CGO_LDFLAGS)'
llamacpp-test: llamacpp
	$(LLAMACPP_TEST_ENV) go vet -tags llamacpp ./engine/llamacpp/... ./engine/grammar/ ./cmd/dpnode-llama-worker ./http/ ./node/
	$(LLAMACPP_TEST_ENV) go vet -tags 'chaos llamacpp' ./node/
	$(LLAMACPP_TEST_ENV) go test -tags llamacpp -race -count=1 -timeout 20m ./engine/llamacpp/...
	$(LLAMACPP_TEST_ENV) go test -tags llamacpp -race -count=1 -timeout 10m -run 'ChatTemplates|ContentAsText' ./http/
	$(LLAMACPP_TEST_ENV) go test -tags llamacpp -race -count=1 -timeout 10m -run 'LlamaCpp' ./engine/grammar/
	$(LLAMACPP_TEST_ENV) go test -tags llamacpp -race -count=1 -timeout 20m -run 'LlamaCpp|OpenAIEngine' ./node/
	$(LLAMACPP_TEST_ENV) go test -tags 'chaos llamacpp' -race -count=1 -timeout 10m -run 'LlamaCppAPIServerCrash' ./node/

clean:
	rm -rf bin
