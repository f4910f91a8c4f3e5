# hcomm: make test | bench | lint | demo
GO ?= go

.PHONY: test bench lint demo
# The README's test command: every package with the race detector, then the
# collective matrices whole and the simulator's bootstrap without it.
test:
	$(GO) test -race -count=1 -timeout 12m ./...
	# The collective matrices whole, at full size (the race run covers fewer types),
	# the mid-size thresholds at every rank count (the race run takes 3), the lent
	# writes over tcp in every type (the race run leaves out float64), and the
	# determinism tests' 100 runs (the race run makes 25).
	$(GO) test -count=1 -timeout 8m -run 'Matrix|Large|Deterministic|MidSize|LentOverTCP' ./collectives
	# The simulator's bootstrap, whose refits are many simulations.
	$(GO) test -count=1 -timeout 4m -run 'Bootstrap' ./internal/sim

bench:
	$(GO) test -run XXX -bench . -benchtime 2000x ./device ./notify
	$(GO) test -run XXX -bench . ./internal/reduce ./collectives

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

demo:
	$(GO) run ./examples/sample
