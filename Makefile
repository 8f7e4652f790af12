# identityd: `make run` starts the server on its embedded SQLite default;
# `make test` runs every test (PostgreSQL too when TEST_DATABASE_URL is set).
GO      ?= go
BIN     := bin/identityd
NODE_E2E := e2e/node

.PHONY: run build test vet node-deps bench fmt screens

build:
	$(GO) build -o $(BIN) ./cmd/identityd

run: build
	./$(BIN) serve

vet:
	$(GO) vet ./...

# The Node end-to-end suite needs its packages; install them from the lockfile
# when they are missing.
node-deps:
	@test -d $(NODE_E2E)/node_modules/openid-client -a -d $(NODE_E2E)/node_modules/playwright-core -a -d $(NODE_E2E)/node_modules/axe-core || (cd $(NODE_E2E) && npm ci --no-audit --no-fund)

test: vet node-deps
	$(GO) test -race -count=1 -timeout 25m ./...

# Screenshots of the hosted pages, desktop and phone, into docs/screens.
screens: node-deps
	IDENTITYD_SCREENS=1 $(GO) test -count=1 -run '^(TestBrowserSignIn|TestBrowserUpstream|TestBrowserPasswordReset|TestBrowserPasskeys|TestHITLApprovalPageBrowser|TestCIBAClientAndConsentPageBrowser)$$/sqlite' ./e2e/

# Benchmarks measure; they assert nothing. Set BENCH_DATABASE_URL to a fresh
# PostgreSQL database to measure that dialect as well (the load generator
# uses it as it is; the intent and analytics benchmarks make a schema of
# their own in it). loadgen's authz phases measure checks/s through the API;
# BenchmarkPasskeySignInWrites, what a sign-in costs the store's writer.
bench: build
	$(GO) run ./cmd/loadgen -server $(BIN)
	@if [ -n "$(BENCH_DATABASE_URL)" ]; then $(GO) run ./cmd/loadgen -server $(BIN) -database "$(BENCH_DATABASE_URL)"; fi
	TEST_DATABASE_URL="$(BENCH_DATABASE_URL)" $(GO) test -run '^$$' -bench 'BenchmarkIntentSearch|BenchmarkAnalyticsOverview' -benchtime 1x -timeout 60m -v ./persistence/ | grep -E 'p50|p99|rolled|first overview|^ok|FAIL'
	TEST_DATABASE_URL="$(BENCH_DATABASE_URL)" $(GO) test -run '^$$' -bench 'BenchmarkPasskeySignInWrites' -benchtime 20000x ./persistence/ | grep -E 'sign-ins/s|^ok|FAIL'


fmt:
	gofmt -w $$(git ls-files '*.go')
