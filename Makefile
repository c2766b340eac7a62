# moat build vocabulary. `make help` lists targets.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := bin/moat
# The benchmarks and scale drivers are their own binary (`moat bench` runs it).
BENCH_BIN := bin/moat-bench
ROOT ?= /var/lib/moat
ADDR ?= :8080
TESTFLAGS ?= -count=1 -timeout 45m

.PHONY: help deps deps-browser console agent release screenshots deps-runsc deps-docker deps-k8s deps-images deps-guest deps-npm deps-otelcol check-debian-build generate-k8s build run test test-race test-setup test-build test-short vet lint bench bench-e2b bench-overhead bench-k8s bench-k8s-claims bench-k8s-node fmt clean generate verify check-generated check-generated-k8s

help: ## List targets
	@grep -E '^[a-z0-9-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

deps: ## Install the Debian packages moat needs (root, idempotent)
	@bash scripts/install-deps.sh

build: console agent ## Build the static moat binary into bin/moat (with the web console and the agent), and bin/moat-bench
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN) ./cmd/moat
	CGO_ENABLED=0 $(GO) build -trimpath -o $(BENCH_BIN) ./cmd/moat-bench

release: console ## Build dist/: static linux/amd64 and linux/arm64 archives (each carrying its arch's agent), the OCI image (layout and tarball, no Docker), SHA256SUMS; VERSION=v<chart appVersion>
	@GO=$(GO) bash scripts/release.sh

# The in-sandbox agent is its own lean artifact; moat embeds it from
# internal/agentbin/payload, so it is built first.
AGENT_PAYLOAD := internal/agentbin/payload/moat-agent

agent: ## Build the in-sandbox agent (cmd/moat-agent) into bin/moat-agent, where moat embeds it from
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags='-s -w' -o bin/moat-agent ./cmd/moat-agent
	cp bin/moat-agent $(AGENT_PAYLOAD).tmp && mv $(AGENT_PAYLOAD).tmp $(AGENT_PAYLOAD)

# The web console is built from web/console into internal/console/dist/app,
# which the binary embeds; it is rebuilt when its sources or lockfile change.
CONSOLE_OUT := internal/console/dist/app/index.html
CONSOLE_SRC := $(shell find web/console/src web/console/public -type f 2>/dev/null) \
	web/console/index.html web/console/vite.config.ts web/console/tsconfig.json web/console/package.json web/console/package-lock.json

console: $(CONSOLE_OUT) ## Build the web console (npm ci + vite) for embedding

$(CONSOLE_OUT): $(CONSOLE_SRC)
	@bash scripts/build-console.sh

deps-browser: ## Install Debian's chromium for the web console's browser test (root, idempotent)
	@bash scripts/install-deps.sh --browser

screenshots: build ## Rewrite docs/console/*.png from the browser test (root)
	MOAT_BIN=$(CURDIR)/$(BIN) MOAT_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/console MOAT_REQUIRE_BROWSER=1 \
		$(GO) test -count=1 -run 'TestConsoleBrowser' ./test/e2e/

# RUNSC_DIR holds a current gVisor runsc built from the module proxy; it is
# put first on PATH so that the runsc class can take memory snapshots
# (Debian 12's runsc cannot checkpoint a networked sandbox).
RUNSC_DIR = $(shell bash scripts/build-runsc.sh --print-dir)

deps-runsc: ## Build a current gVisor runsc from the module proxy into the cache (about 75 s once, then instant)
	@bash scripts/build-runsc.sh

run: deps deps-runsc build ## Install deps, build, and run `moat serve` with the native runtime
	PATH=$(RUNSC_DIR):$$PATH $(BIN) serve --runtime oci --root $(ROOT) --listen $(ADDR)

generate: ## Regenerate internal/gen from api/openapi/*.yaml (oapi-codegen pinned in tools.mod)
	$(GO) generate ./internal/gen/...

# GEN_SUM fingerprints the generated tree (tracked or not).
GEN_SUM = find internal/gen -type f -name '*.gen.go' | sort | xargs sha256sum | sha256sum

check-generated: ## Fail if internal/gen is stale against the specs in the working tree
	@before=$$($(GEN_SUM)); $(MAKE) --no-print-directory generate >/dev/null; \
	if [ "$$before" != "$$($(GEN_SUM))" ]; then \
		echo "internal/gen was stale against api/openapi and has been regenerated: review and commit it" >&2; exit 1; fi

verify: generate ## Fail if the generated code or the specs differ from what is committed
	@if ! git diff --quiet -- internal/gen api/openapi || [ -n "$$(git status --porcelain --untracked-files=all -- internal/gen api/openapi)" ]; then \
		git status --short -- internal/gen api/openapi >&2; \
		echo "uncommitted changes in api/openapi or internal/gen after 'make generate': commit the specs together with the regenerated code" >&2; exit 1; fi

vet: ## go vet
	$(GO) vet ./...
	cd client && $(GO) vet ./...

# staticcheck is pinned in tools.mod; built once into bin/.
STATICCHECK := bin/staticcheck

$(STATICCHECK): tools.mod tools.sum
	$(GO) build -modfile=tools.mod -o $@ honnef.co/go/tools/cmd/staticcheck

lint: vet $(STATICCHECK) check-generated check-generated-k8s ## go vet + staticcheck (zero findings), gofmt, generated code current, docs name every package, client side cross-compiles for darwin and windows
	$(STATICCHECK) ./...
	cd client && ../$(STATICCHECK) ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:" $$out >&2; exit 1; fi
	@bash scripts/check-docs.sh
	@# The client side (CLI verbs, moat mcp, the Go SDK) runs on laptops.
	@for os in darwin windows; do \
		GOOS=$$os GOARCH=amd64 CGO_ENABLED=0 $(GO) build -o /dev/null ./cmd/moat ./internal/mcp || exit 1; \
		(cd client && GOOS=$$os GOARCH=amd64 CGO_ENABLED=0 $(GO) build ./...) || exit 1; \
	done

# K8S_GEN_SUM fingerprints what controller-gen writes (tracked or not).
K8S_GEN_SUM = { find api config/crd/bases config/rbac deploy/helm/moat/crds -type f | sort; echo deploy/helm/moat/templates/clusterrole.yaml; } | xargs sha256sum | sha256sum

check-generated-k8s: ## Fail if the deepcopy code, CRDs, RBAC or the Helm chart's copies are stale against api/ and the controller
	@before=$$($(K8S_GEN_SUM)); $(MAKE) --no-print-directory generate-k8s >/dev/null; \
	if [ "$$before" != "$$($(K8S_GEN_SUM))" ]; then \
		echo "controller-gen output was stale and has been regenerated (make generate-k8s): review and commit it" >&2; exit 1; fi

K8S_TOOLS = $(shell bash scripts/build-k8s-tools.sh --print-dir)

deps-k8s: ## Build the Kubernetes test tools (kube-apiserver, etcd, kwok, kubelet, containerd, ...) from the module proxy into the cache (slow once, then instant)
	@bash scripts/build-k8s-tools.sh

generate-k8s: ## Regenerate deepcopy, CRDs and RBAC (controller-gen) and copy them into the Helm chart
	@bash scripts/build-k8s-tools.sh controller-gen
	$(K8S_TOOLS)/controller-gen object paths=./api/...
	$(K8S_TOOLS)/controller-gen crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(K8S_TOOLS)/controller-gen rbac:roleName=moat-controller paths=./internal/k8s/controller/... output:rbac:artifacts:config=config/rbac
	cp config/crd/bases/*.yaml deploy/helm/moat/crds/
	{ sed -n '1,/^rules:/p' deploy/helm/moat/templates/clusterrole.yaml | sed '$$d'; sed -n '/^rules:/,$$p' config/rbac/role.yaml; } > deploy/helm/moat/templates/clusterrole.yaml.tmp
	mv deploy/helm/moat/templates/clusterrole.yaml.tmp deploy/helm/moat/templates/clusterrole.yaml

deps-docker: ## Install and start dockerd for the docker backend tests (root, idempotent)
	@bash scripts/docker-setup.sh

deps-images: ## Build the debootstrap test images (E2B's base; Jupyter kernels, JDK, node on top of it) into the cache (a few minutes once, then instant)
	@bash scripts/build-test-images.sh e2b-base >/dev/null
	@bash scripts/build-test-images.sh debian-kernels >/dev/null

deps-guest: ## Build the stock Debian 12 guest (QEMU, Debian's kernel, cgroup v2) the guest tests boot (test/guest; a few minutes once, then instant)
	@bash scripts/build-guest.sh

check-debian-build: ## Check the build path on a pristine debootstrap'ed Debian 12 chroot (git, make; Debian's Node 18, npm and golang-go 1.19): make build (root; cached tree)
	@bash scripts/check-debian-build.sh

deps-otelcol: ## Build the test OpenTelemetry Collector the audit trail's OTLP e2e test exports to (tools/otelcol; cached by version)
	@bash scripts/build-otelcol.sh

deps-npm: ## Install the locked npm packages of the JS SDK compatibility tests (test/compat/js, test/compat/e2b)
	@bash scripts/npm-ci.sh test/compat/js
	@bash scripts/npm-ci.sh test/compat/e2b

# The set-up of `make test`. The Debian packages come first (apt holds one
# lock); then every other stage runs at once, so that the CPU-bound Go
# builds overlap the network- and disk-bound ones (module downloads,
# debootstrap, npm): a cold set-up takes about as long as its longest
# stage, the Kubernetes tools (docs/BENCHMARKS.md "Build and CI").
# Their lines interleave; each script prefixes its own. (No --output-sync:
# GNU make 4.3 locks stdout for it, and hangs when that is /dev/null and
# another process holds a lock on it.)
test-setup: deps deps-browser deps-docker ## Everything `make test` needs before the tests run (root, idempotent)
	@$(MAKE) --no-print-directory -j deps-runsc deps-k8s deps-images deps-guest deps-npm deps-otelcol test-build

# build, then lint one step at a time: its generators (check-generated,
# check-generated-k8s) rewrite files that vet, staticcheck and the builds
# compile, and the console build rewrites the directory the binary embeds.
test-build:
	@$(MAKE) --no-print-directory build
	@$(MAKE) --no-print-directory -j1 lint

# RACE_PKGS run under the race detector in `make test` (with -short: no
# root, runtime or end-to-end parts): the packages with goroutines of their
# own (proxies, streams, pools, allocators, stores, the API) and the
# client. Not ./...: the rest is sequential code or root-only tests, and
# race-building every package costs more than it finds. Measured on the
# shared 2-core build host (load ~30 from other jobs): 34 min wall, 3.5
# CPU-minutes; k8s/alloc (a real apiserver) and execd/code (kernels) are
# the longest. Every race it found is fixed; a new one fails the run.
RACE_PKGS := ./internal/audit/... ./internal/telemetry ./internal/egress ./internal/egress/dnsproxy ./internal/egress/mitm \
	./internal/egress/vault ./internal/execd ./internal/execd/code ./internal/execd/envd ./internal/execd/proc \
	./internal/execd/wire ./internal/httpapi ./internal/ingress ./internal/k8s/alloc ./internal/lifecycle/... \
	./internal/metrics ./internal/store ./internal/tenant ./internal/web/... ./internal/mcp ./internal/e2b

test-race: ## The race-detector stage of `make test` alone (RACE_PKGS with -short, and the client)
	$(GO) test -race -short -count=1 $(RACE_PKGS)
	cd client && $(GO) test -race -short -count=1 ./...

test: test-setup ## Run every test (as root: includes the runtime and end-to-end tests)
	@# The run gets its own directory (its TMPDIR, the test-network journal);
	@# leakcheck fails the run if it left a bridge, netns, nft table, mount,
	@# cgroup or process behind (see internal/testutil/leakcheck).
	@run=$$(mktemp -d /tmp/mtr.XXXXXX) && \
	$(GO) run ./internal/testutil/leakcheck snapshot $$run && \
	( export PATH=$(RUNSC_DIR):$$PATH MOAT_BIN=$(CURDIR)/$(BIN) MOAT_BENCH_BIN=$(CURDIR)/$(BENCH_BIN) MOAT_AGENT_BIN=$(CURDIR)/bin/moat-agent MOAT_REQUIRE_K8S=1 MOAT_REQUIRE_BROWSER=1 MOAT_REQUIRE_GUEST=1 MOAT_REQUIRE_RUNTIMES=runc,crun,runsc MOAT_TEST_RUN=$$run TMPDIR=$$run; \
		$(MAKE) --no-print-directory test-race && \
		$(GO) test $(TESTFLAGS) -p 1 ./... && (cd client && $(GO) test -count=1 ./...) ); rc=$$? ; \
	$(GO) run ./internal/testutil/leakcheck check $$run || rc=1; \
	if [ $$rc = 0 ]; then rm -rf $$run; else echo "test run directory kept: $$run" >&2; fi; exit $$rc

test-short: ## Unit tests only: -short skips every root, runtime and end-to-end test, even as root
	$(GO) test -short -count=1 ./...

bench: build ## Print create-latency figures (moat-bench create)
	$(BENCH_BIN) create --runtime-class crun -n 100
	$(BENCH_BIN) create --runtime-class runc -n 100

bench-e2b: build ## Time to interactive through E2B's JS SDK on loopback: cold (crun), warm pool, burst of 100 (root, node)
	MOAT_BIN=$(CURDIR)/$(BIN) MOAT_AGENT_BIN=$(CURDIR)/bin/moat-agent $(GO) test -count=1 -timeout 40m -v -run '^TestE2BSDKBench$$' ./test/e2e/ -e2b.bench

bench-overhead: build deps-otelcol ## Cost of auditing and tracing: create and exec p50 without and with (root; OVERHEAD='-overhead.creates=100 -overhead.execs=500')
	MOAT_BIN=$(CURDIR)/$(BIN) MOAT_BENCH_BIN=$(CURDIR)/$(BENCH_BIN) MOAT_AGENT_BIN=$(CURDIR)/bin/moat-agent $(GO) test -count=1 -timeout 30m -v -run '^TestAuditOverheadBench$$' ./test/e2e/ -overhead.bench $(OVERHEAD)

# moat-bench k8s measures a cluster that exists; these bring up throw-away
# ones from the test harness (internal/testutil/k8stest, linked into neither binary).
bench-k8s: build deps-k8s ## Kubernetes batch figures on kwok's fake nodes (moat-bench k8s -n 100)
	MOAT_BIN=$(CURDIR)/$(BIN) MOAT_BENCH_BIN=$(CURDIR)/$(BENCH_BIN) $(GO) test -count=1 -run '^$$' -bench BenchmarkKwok -benchtime 1x ./internal/bench/k8s/

bench-k8s-claims: build deps-k8s ## Claims through the Lifecycle API at scale on kwok (moat-bench k8s claims; SCALE='-scale.nodes=100 -scale.pool=1000')
	MOAT_BIN=$(CURDIR)/$(BIN) MOAT_BENCH_BIN=$(CURDIR)/$(BENCH_BIN) $(GO) test -count=1 -timeout 60m -run '^$$' -bench BenchmarkClaims -benchtime 1x ./internal/bench/k8s/scale/ $(SCALE)

bench-k8s-node: build deps-k8s ## Kubernetes sandbox figures on a real single-node cluster (root; moat-bench k8s --image)
	MOAT_BIN=$(CURDIR)/$(BIN) MOAT_BENCH_BIN=$(CURDIR)/$(BENCH_BIN) $(GO) test -count=1 -timeout 30m -run '^$$' -bench BenchmarkRealNode -benchtime 1x ./internal/bench/k8s/

fmt: ## gofmt
	gofmt -w $$(git ls-files '*.go')

clean: ## Remove build output
	rm -rf bin dist internal/console/dist/app $(AGENT_PAYLOAD)
