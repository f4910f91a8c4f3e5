package dp

// SetTestHookDescriptor sets (nil: clears) the hook that may change a rank's
// step descriptor before the ranks compare them.
func SetTestHookDescriptor(f func(rank int, d []uint64)) { testHookDescriptor = f }

// WordModel is the index of the model hash in a step descriptor.
const WordModel = wModel
