# sandgate. `make run` starts the gateway on the local provider; `make test`
# runs the whole suite (what CI runs).
GO      ?= go
BIN     ?= bin/gateway
LISTEN  ?= 127.0.0.1:8080
STATE   ?= $(CURDIR)/.state
# The gateway is built without cgo: its sandbox init drops capabilities on
# all threads, which the Go runtime only allows in a cgo-free binary.
export CGO_ENABLED ?= 0

.PHONY: build image run test check check-generated generate vet bench soak bench-go clean web agent-image k8s-up k8s-down fuzz e2b-sdk

build: web
	$(GO) build -o $(BIN) ./cmd/gateway
	$(GO) build -o $(dir $(BIN))sandgate-agent ./cmd/sandgate-agent

# The gateway's container image (Dockerfile), built from a context made
# aside with the module vendor tree (scripts/image-context.sh), so the
# build needs no network and the checkout gets no vendor/. No registry is
# assumed: pass base images you have, e.g.
#   make image IMAGE_ARGS='--build-arg BUILDER=golang:1.26-bookworm --build-arg RUNTIME=scratch'
IMAGE      ?= sandgate/gateway:dev
IMAGE_ARGS ?=
image: web
	@ctx=$$(mktemp -d) && trap 'rm -rf "$$ctx"' EXIT && scripts/image-context.sh "$$ctx" && \
	  docker build $(IMAGE_ARGS) -t $(IMAGE) "$$ctx" && echo "built $(IMAGE)"

# The kubernetes provider's agent image (--k8s-agent-image): the static
# agent, and the pods' egress point (--k8s-egress-sidecar), as a docker-archive to load into a registry or a node
# (docker load, ctr images import).
AGENT_IMAGE ?= sandgate.local/sandgate-agent:dev
agent-image:
	$(GO) build -o bin/agent-image/sandgate-agent ./cmd/sandgate-agent
	$(GO) build -o bin/agent-image/sandgate-egress ./cmd/sandgate-egress
	scripts/k8s/mkimage.sh bin/agent-image $(AGENT_IMAGE) bin/sandgate-agent-image.tar '["/sandgate-agent"]' '["version"]'
	@echo "bin/sandgate-agent-image.tar holds $(AGENT_IMAGE)"

# The test cluster the kubernetes provider's tests run on (a single-node
# Kubernetes on loopback; the first start builds it: ~9 min, ~4.6 GB of
# build cache under /var/tmp/sandgate-k8s). Needs root.
k8s-up:
	scripts/k8s/up.sh

k8s-down:
	scripts/k8s/down.sh

# The terminal page's xterm.js files: npm ci from web/package-lock.json,
# then a copy into web/static/vendor (embedded; not committed).
web: web/static/vendor/.stamp

web/static/vendor/.stamp: web/package.json web/package-lock.json
	cd web && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	rm -f web/static/vendor/*.mjs web/static/vendor/*.css web/static/vendor/LICENSE-*
	cp web/node_modules/@xterm/xterm/lib/xterm.mjs web/node_modules/@xterm/xterm/css/xterm.css \
	  web/node_modules/@xterm/addon-fit/lib/addon-fit.mjs web/static/vendor/
	cp web/node_modules/@xterm/xterm/LICENSE web/static/vendor/LICENSE-xterm
	cp web/node_modules/@xterm/addon-fit/LICENSE web/static/vendor/LICENSE-addon-fit
	sed -i '/^\/\/# sourceMappingURL=/d' web/static/vendor/*.mjs
	touch $@

# The E2B JavaScript SDK the E2B face's end-to-end test runs
# (cmd/gateway TestE2BSDK*), pinned by its package-lock.json; not committed.
E2B_SDK := internal/e2b/testdata/sdk
e2b-sdk: $(E2B_SDK)/node_modules/.stamp

$(E2B_SDK)/node_modules/.stamp: $(E2B_SDK)/package.json $(E2B_SDK)/package-lock.json
	cd $(E2B_SDK) && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	touch $@

run: build
	$(BIN) serve --listen $(LISTEN) --state-dir $(STATE)

generate:
	$(GO) generate ./internal/api/ ./internal/e2b/envd/

check-generated:
	scripts/check-generated.sh

# vet compiles package web, which embeds the vendored xterm files.
vet: web
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# -race needs cgo; the tests build their own cgo-free gateway binary where
# they need one.
# Two test binaries at once (one per core). Three filled the cores' idle
# tail and took a warm run from 8.9 to 6.7 minutes, but three of five
# rehearsals then failed a timing-bound test: not before they are fixed.
# The longest test binaries are named first (go test starts packages in
# the order given), so that the short ones fill the end instead of one
# long package running alone on one core.
# The fuzz targets run beside the suite (their packages need no root or
# daemon; each runs a fixed time, so they fill the waits of the suite's
# end-to-end tests): FUZZTIME 10s each there with one worker (two would
# take both cores from the suite for the whole time), their output after
# the suite's. Last, the daemon and API server restart tests (each fails
# every other user of its daemon), side by side (the cluster runs on its
# own containerd). The whole phase's time is printed at its end.
SLOW_TESTS = ./cmd/gateway ./internal/providers/docker ./internal/providers/local \
	./internal/providers/kubernetes ./bench ./internal/handlers
empty :=
space := $(empty) $(empty)
SLOW_TESTS_RE = /($(subst $(space),|,$(strip $(patsubst ./%,%,$(SLOW_TESTS)))))$$
test: web e2b-sdk check-generated vet k8s-up
	@log=$$(mktemp); trap 'rm -f $$log' EXIT; start=$$(date +%s); \
	  $(MAKE) --no-print-directory fuzz FUZZTIME=10s FUZZPARALLEL=1 >$$log 2>&1 & fuzz=$$!; \
	  CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 30m $(SLOW_TESTS) \
	    $$($(GO) list ./... | grep -vE '$(SLOW_TESTS_RE)'); rc=$$?; \
	  wait $$fuzz; frc=$$?; cat $$log; \
	  took() { echo "make test: $$1 after $$(( $$(date +%s) - start )) s"; }; \
	  [ $$rc -eq 0 ] && [ $$frc -eq 0 ] || { took "go test exit $$rc, fuzz exit $$frc"; exit 1; }; \
	  SANDGATE_DOCKER_RESTART_TEST=1 SANDGATE_K8S_RESTART_TEST=1 CGO_ENABLED=1 $(GO) test -race -count=1 \
	    -run '^(TestRealDaemonRestart|TestAPIServerRestart)$$' ./internal/providers/docker/ ./internal/providers/kubernetes/ || \
	    { took "a restart test failed"; exit 1; }; \
	  took "go test, fuzzing and the restart tests passed"

# Quick feedback (under 2 minutes): gofmt, vet, the generated code, and
# the tests of every package that needs no root, docker daemon, cluster
# or browser. Left to `make test`: the providers that run sandboxes, rootfs
# (loop mounts), the gateway binary's end-to-end tests and the benchmark
# harness.
NEEDS_HOST = /(cmd/gateway|bench|internal/providers/(docker|kubernetes|local)(/.*)?|internal/rootfs)$$
check: check-generated vet
	CGO_ENABLED=1 $(GO) test -race -count=1 $$($(GO) list ./... | grep -vE '$(NEEDS_HOST)')

# Each fuzz target for FUZZTIME from its seeds (the seeds also run as plain
# tests in `go test`). A crash is saved under the package's testdata/fuzz:
# commit it with the fix, as a regression test.
FUZZTIME ?= 5s
FUZZ = ./internal/wire:FuzzDecodeClient ./internal/wire:FuzzReplayFrame \
	./internal/sandbox:FuzzLeaseToken ./internal/sandbox:FuzzFilePath ./internal/sandbox:FuzzCreateValidation \
	./internal/handlers:FuzzParseSince ./internal/rootfs:FuzzUnpack
fuzz:
	@GO=$(GO) FUZZTIME=$(FUZZTIME) FUZZPARALLEL=$(FUZZPARALLEL) scripts/fuzz.sh $(FUZZ)

# The benchmark harness (bench/): the gateway against its baselines on the
# local and docker providers; table on stdout, JSON and SVG in bench/results.
# Needs root and a docker daemon. BENCH_FLAGS passes more (e.g. -quick).
bench: build
	$(GO) run ./bench -gateway $(BIN) $(BENCH_FLAGS)

# 10 minutes of mixed traffic on the local provider: no error, no lost
# byte, flat memory (a 60 s version runs in make test).
soak: build
	$(GO) run ./bench -gateway $(BIN) -soak 10m

# The Go benchmarks of the packages (interleaved A/B in each).
bench-go:
	CGO_ENABLED=1 $(GO) test -run '^$$' -bench . -benchtime 300x ./cmd/gateway/ ./internal/providers/local/ ./internal/handlers/

clean:
	rm -rf bin .state
