# hoard: `make run` starts a single-node server, `make test` runs the tests.
GO ?= go
BIN := bin/hoard
DATA ?= $(CURDIR)/.hoard/server
LISTEN ?= 127.0.0.1:7100
SOAK ?= 30m

.PHONY: build run test proto bench fuzz clean conformance soak man deb deb-version

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

# The long fault campaign and the one-file model checker, each for SOAK
# (docs/reliability.md); not in CI.
soak: build
	HOARD_BIN=$(CURDIR)/$(BIN) HOARD_SOAK=$(SOAK) HOARD_REQUIRE_FUSE=1 \
		$(GO) test -count=1 -timeout 24h -v -run '^(TestFaultCampaign|TestFsxModel)$$' ./integration/

man: build
	$(BIN) man man/man1

# A Debian package in $(DIST) of what contrib/nfpm.yaml lists; nfpm runs
# as a Go module tool, outside go.mod. The binary is static (no cgo), so
# the package needs no particular libc, and stamped by Go with its
# version from git (hoard version says it).
DIST ?= dist
NFPM ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
# Debian's version of git describe's, each sorting after the one before:
# v1.2 -> 1.2, v1.2-3-gSHA -> 1.2+3.gSHA, v1.2-rc1 -> 1.2~rc1, before any
# tag (a bare hash, which may start with a digit) 0.0~gitDATE.SHA.
GIT_DESCRIBE ?= $(shell git describe --tags --always 2>/dev/null)
DEB_VERSION ?= $(or $(if $(GIT_DESCRIBE),$(shell echo '$(GIT_DESCRIBE)' | sed -E \
	-e 's/^v([0-9])/\1/' -e 's/-([0-9]+)-g([0-9a-f]+)$$/+\1.g\2/' -e 's/-/~/g' \
	-e '/^[0-9]+\.[0-9]/!s/^/0.0~git$(shell TZ=UTC git log -1 --date=format-local:%Y%m%d%H%M%S --format=%cd 2>/dev/null)./')),0.0~unknown)

deb-version:
	@echo '$(DEB_VERSION)'

deb:
	test -n "$(DIST)"
	rm -rf $(DIST)/stage $(DIST)/hoard_*.deb
	mkdir -p $(DIST)/stage/man1 $(DIST)/stage/doc
	CGO_ENABLED=0 GOFLAGS="$$GOFLAGS -buildvcs=auto" $(MAKE) --no-print-directory build BIN=$(DIST)/stage/hoard
	$(DIST)/stage/hoard man $(DIST)/stage/man1
	gzip -9n $(DIST)/stage/man1/*.1
	cp README.md $(wildcard LICENSE*) $(DIST)/stage/doc/
	HOARD_STAGE=$(DIST)/stage HOARD_VERSION='$(DEB_VERSION)' HOARD_ARCH=$$($(GO) env GOARCH) \
		$(NFPM) pkg --packager deb --config contrib/nfpm.yaml --target $(DIST)/
	rm -rf $(DIST)/stage

proto:
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" protoc -I proto --go_out=. --go_opt=module=github.com/hoardfs/hoard \
		--go-grpc_out=. --go-grpc_opt=module=github.com/hoardfs/hoard proto/hoard.proto

# The parts make bench runs: the library and the mount (all), trees of
# small files, Postmark and the proxy's store layouts. Each draws its
# figures for docs/benchmarks.md into docs/charts.
BENCH ?= all,tree,postmark,hades

bench: build
	HOARD_BIN=$(CURDIR)/$(BIN) $(GO) run ./bench -only $(BENCH) -charts docs/charts

clean:
	rm -rf bin .hoard

conformance: build
	./scripts/conformance.sh
