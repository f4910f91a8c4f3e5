package hcomm

// SetState lets the external tests drive the transitions Suspend and Resume
// make.
func SetState(c *Comm, s CommStatus) bool { return c.setState(s) }
