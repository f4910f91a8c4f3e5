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

// BootAddrs returns every rank's bootstrap mailbox and standby store
// addresses, by rank ("" where a rank has none).
func BootAddrs(c *Comm) (mailboxes, standbys []string) {
	for _, p := range c.boot.peers {
		mailboxes = append(mailboxes, p.Mailbox)
		standbys = append(standbys, p.Standby)
	}
	return mailboxes, standbys
}

// MailboxConns returns how many connections c's bootstrap mailbox holds:
// those this rank dialled to other ranks' mailboxes, and those other ranks
// dialled to it (0, 0 without a mailbox).
func MailboxConns(c *Comm) (dialled, accepted int) {
	m := c.boot.mail
	if m == nil {
		return 0, 0
	}
	m.mu.Lock()
	for _, mc := range m.conns {
		select {
		case <-mc.ready:
			if mc.cli != nil {
				dialled++
			}
		default:
			dialled++ // in flight
		}
	}
	m.mu.Unlock()
	return dialled, m.srv.Conns()
}
