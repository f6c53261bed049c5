# sandgate. `make run` starts the gateway on the local provider; `make test`
# runs the whole suite (what CI runs).
GO      ?= go
BIN     ?= bin/gateway
LISTEN  ?= 127.0.0.1:8080
STATE   ?= $(CURDIR)/.state
# The gateway is built without cgo: its sandbox init drops capabilities on
# all threads, which the Go runtime only allows in a cgo-free binary.
export CGO_ENABLED ?= 0

.PHONY: build run test check-generated generate vet bench clean

build:
	$(GO) build -o $(BIN) ./cmd/gateway

run: build
	$(BIN) serve --listen $(LISTEN) --state-dir $(STATE)

generate:
	$(GO) generate ./internal/api/

check-generated:
	scripts/check-generated.sh

vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# -race needs cgo; the tests build their own cgo-free gateway binary where
# they need one.
test: check-generated vet
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 30m ./...

bench:
	CGO_ENABLED=1 $(GO) test -run '^$$' -bench . -benchtime 300x ./cmd/gateway/ ./internal/providers/local/ ./internal/handlers/

clean:
	rm -rf bin .state
