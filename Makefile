# hoard: `make run` starts a single-node server, `make test` runs the tests.
GO ?= go
BIN := bin/hoard
DATA ?= $(CURDIR)/.hoard/server
LISTEN ?= 127.0.0.1:7100
SOAK ?= 30m

.PHONY: build run test proto bench fuzz clean conformance soak man

# hoard version says what it was built from (Go's own VCS stamping is
# off where GOFLAGS has -buildvcs=false).
LDFLAGS = -X main.built=$$(date -u +%Y-%m-%dT%H:%M:%SZ) \
	-X main.commit=$$(git rev-parse HEAD 2>/dev/null) \
	-X main.commitTime=$$(git log -1 --format=%cI 2>/dev/null) \
	-X main.modified=$$(git diff --quiet HEAD 2>/dev/null || echo true)

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/hoard

run: build
	@./scripts/run.sh $(BIN) $(DATA) $(LISTEN)

test: build
	$(GO) vet ./...
	HOARD_BIN=$(CURDIR)/$(BIN) $(GO) test -count=1 -timeout 20m ./...
	./scripts/fuzz-short.sh

# The long fault campaign (docs/reliability.md, "Fault campaign"); not in CI.
soak: build
	HOARD_BIN=$(CURDIR)/$(BIN) HOARD_SOAK=$(SOAK) HOARD_REQUIRE_FUSE=1 \
		$(GO) test -count=1 -timeout 24h -v -run '^TestFaultCampaign$$' ./integration/

man: build
	$(BIN) man man/man1

proto:
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" protoc -I proto --go_out=. --go_opt=module=github.com/hoardfs/hoard \
		--go-grpc_out=. --go-grpc_opt=module=github.com/hoardfs/hoard proto/hoard.proto

bench: build
	HOARD_BIN=$(CURDIR)/$(BIN) $(GO) run ./bench

clean:
	rm -rf bin .hoard

conformance: build
	./scripts/conformance.sh
