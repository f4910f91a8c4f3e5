# hcomm: make test | bench | lint | demo
GO ?= go

.PHONY: test bench lint demo
# The README's test command: every package, with the race detector.
test:
	$(GO) test -race -count=1 -timeout 12m ./...

bench:
	$(GO) test -run XXX -bench . -benchtime 2000x ./device ./notify
	$(GO) test -run XXX -bench . ./internal/reduce ./collectives

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

demo:
	$(GO) run ./examples/sample
