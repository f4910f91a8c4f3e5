package collectives

// SetTestJitter sets the hook that runs before each step of every schedule
// (testJitter), for the determinism tests; nil removes it. Call it only while
// no collective runs.
func SetTestJitter(f func(rank int)) { testJitter = f }
