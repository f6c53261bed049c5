# sandgate. `make run` starts the gateway on the local provider; `make test`
# runs the whole suite (what CI runs).
GO      ?= go
BIN     ?= bin/gateway
LISTEN  ?= 127.0.0.1:8080
STATE   ?= $(CURDIR)/.state
# The gateway is built without cgo: its sandbox init drops capabilities on
# all threads, which the Go runtime only allows in a cgo-free binary.
export CGO_ENABLED ?= 0

.PHONY: build run test check-generated generate vet bench clean web

build: web
	$(GO) build -o $(BIN) ./cmd/gateway
	$(GO) build -o $(dir $(BIN))sandgate-agent ./cmd/sandgate-agent

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
test: web check-generated vet
	CGO_ENABLED=1 $(GO) test -race -count=1 -timeout 30m ./...

bench:
	CGO_ENABLED=1 $(GO) test -run '^$$' -bench . -benchtime 300x ./cmd/gateway/ ./internal/providers/local/ ./internal/handlers/

clean:
	rm -rf bin .state
