package hcomm

// SetDecideHook sets the hook a shrink's coordinator runs before it
// publishes its decision (agree.go); call it before any communicator exists.
func SetDecideHook(f func(rank int)) { decideHook = f }
