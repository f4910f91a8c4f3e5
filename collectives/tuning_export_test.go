package collectives

// SetPieceOverride makes every collective of the process use pieces of b
// bytes (bounded by the layout's slot; 0 restores the tuning table's) until
// the returned function restores the previous setting.
func SetPieceOverride(b int64) (restore func()) {
	old := pieceOverride.Swap(b)
	return func() { pieceOverride.Store(old) }
}

// TunedAlgo is the tuning table's algorithm for a call (tunedAlgo).
func TunedAlgo(collective string, bytes int64, n int, mapped bool) (Algorithm, bool) {
	return tunedAlgo(kindOf(collective), bytes, n, mapped)
}

// TunedPiece is pieceFor with a slot of pieceMax.
func TunedPiece(collective string, algo Algorithm, bytes int64, n int, mapped bool) int64 {
	return pieceFor(kindOf(collective), algo, bytes, n, mapped, pieceMax)
}

func kindOf(name string) kind {
	for k, s := range kindNames {
		if s == name {
			return kind(k)
		}
	}
	return 0
}
