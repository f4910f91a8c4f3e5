# hcomm: make test | bench | lint | demo
GO ?= go

.PHONY: test bench lint demo
# The README's test command: every package with the race detector, then what
# the race run trims, whole, and the simulator's bootstrap without it.
test:
	$(GO) test -race -count=1 -timeout 16m ./...
	# Every collectives test the race run trims (a test that looks at raceEnabled
	# belongs here), whole: the matrices at full size (the race run covers fewer
	# types), the mid-size thresholds at every rank count (it takes 3), the lent
	# writes and reads in every type and shape, Bruck's, the two-level schedules'
	# and the windows' rank counts, the property test's trials, the determinism
	# tests' 100 runs (it makes 25), and the allocation count (it skips it: the
	# race detector allocates).
	$(GO) test -count=1 -timeout 8m -run 'Matrix|Large|Deterministic|MidSize|LentOverTCP|LentReadsOverShm|AllGatherPush|DirectAllReduce|Bruck|TestHier|TestWindows|SchedulesDeliver|Allocations' ./collectives
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
