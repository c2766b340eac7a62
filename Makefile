# moat build vocabulary. `make help` lists targets.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := bin/moat
ROOT ?= /var/lib/moat
ADDR ?= :8080
TESTFLAGS ?= -count=1 -timeout 45m

.PHONY: help deps deps-docker build run test test-short vet bench fmt clean

help: ## List targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ## Install the Debian packages moat needs (root, idempotent)
	@bash scripts/install-deps.sh

build: ## Build the static moat binary into bin/moat
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/moat

run: deps build ## Install deps, build, and run `moat serve` with the native runtime
	$(BIN) serve --runtime oci --root $(ROOT) --listen $(ADDR)

vet: ## go vet
	$(GO) vet ./...

deps-docker: ## Install and start dockerd for the docker backend tests (root, idempotent)
	@bash scripts/docker-setup.sh

test: deps deps-docker vet build ## Run every test (as root: includes the runtime and end-to-end tests)
	MOAT_BIN=$(CURDIR)/$(BIN) $(GO) test $(TESTFLAGS) -p 1 ./...
	cd client && $(GO) test -count=1 ./...

test-short: ## Unit tests only (no root needed)
	$(GO) test -short -count=1 ./...

bench: build ## Print create-latency figures (moat bench create)
	$(BIN) bench create --runtime-class crun -n 100
	$(BIN) bench create --runtime-class runc -n 100

fmt: ## gofmt
	gofmt -w $$(git ls-files '*.go')

clean: ## Remove build output
	rm -rf bin
