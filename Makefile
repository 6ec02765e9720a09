# Tool versions are pinned so that generated code is the same everywhere.
BUF_VERSION           ?= v1.75.0
PROTOC_GEN_GO_VERSION ?= v1.36.12
GOBIN                 ?= $(shell go env GOPATH)/bin
export PATH := $(GOBIN):$(PATH)

GO_FILES = $(shell git ls-files '*.go' | grep -v '\.pb\.go$$')

.PHONY: build run test lint proto proto-check tools bench chaos clean

build:
	go build -o bin/dpnode ./cmd/dpnode
	go build -o bin/dpbench ./cmd/dpbench

# One node on this machine: simulated engines, one per (virtual) GPU.
run:
	go run ./cmd/dpnode join

# The test command of the README: formatting, vet, and the race-checked suite.
test: lint
	go test -race -count=1 -timeout 15m ./...

lint:
	@unformatted="$$(gofmt -l $(GO_FILES))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	go vet ./...

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

# The fault-injection suite: load on a three-node cluster while engines,
# actors and nodes crash, hang and lose their network (nftables, as root).
# CI runs a short form; CHAOS_DURATION=10m is the full one.
CHAOS_DURATION ?= 10m
chaos:
	go test -tags chaos -run TestChaos -timeout 30m -v -count=1 ./cluster -chaos.duration=$(CHAOS_DURATION)

bench:
	go test -run '^$$' -bench . -benchtime 3s ./http/ ./engine/... ./actors/

clean:
	rm -rf bin
