package hcomm

// SetDecideHook sets the hook a shrink's coordinator runs before it
// publishes its decision (agree.go); call it before any communicator exists.
func SetDecideHook(f func(rank int)) { decideHook = f }

// SetShrinkHook sets the hook a shrink runs at the points a test orders
// (agree.go: "decided", "await", "read"); call it before any communicator
// exists.
func SetShrinkHook(f func(point string, rank int)) { shrinkHook = f }

// SetPeersHook sets the hook a joining rank other than 0 runs before it
// reads rank 0's list of ranks (init.go); call it before any communicator
// exists, and set it back to nil when done.
func SetPeersHook(f func(rank int)) { peersHook = f }

// RootServed returns how many messages rank 0's bootstrap store has served
// (bootstrap.Server.Served); c must be rank 0 of a multi-process init.
func RootServed(c *Comm) int64 { return c.boot.root.Served() }

// SetGatherHook sets the hook a joining rank runs at the steps of its tree
// gather (ring.go); call it before any communicator exists, and set it
// back to nil when done.
func SetGatherHook(f func(rank, step int)) { gatherHook = f }

// WatchLooks returns how many times c's loss watch has looked at the event
// counter in rank 0's store (health.go: three messages each, four when an
// event was skipped).
func WatchLooks(c *Comm) int64 { return c.health.looks.Load() }
