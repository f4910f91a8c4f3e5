package device

// ExceptionInfo describes an asynchronous task that failed (aclrtExceptionInfo /
// rtExceptionInfo). The getters below mirror ACL's accessors.
type ExceptionInfo struct {
	TaskID    uint32 // the task's sequence number on its stream
	StreamID  uint32 // the stream's id (Stream.ID)
	ThreadID  uint32 // the id of the goroutine that ran the stream's tasks
	DeviceID  uint32 // the device id
	ErrorCode uint32 // the Code of the failure, as an aclError value
	Err       error  // the failure itself, with the details of its message
}

// noInfo is what ACL's getters return for a nil info.
const noInfo = 0xFFFFFFFF

// GetTaskIDFromExceptionInfo returns info's task id (aclrtGetTaskIdFromExceptionInfo),
// 0xFFFFFFFF for nil.
func GetTaskIDFromExceptionInfo(info *ExceptionInfo) uint32 {
	if info == nil {
		return noInfo
	}
	return info.TaskID
}

// GetStreamIDFromExceptionInfo returns info's stream id, 0xFFFFFFFF for nil.
func GetStreamIDFromExceptionInfo(info *ExceptionInfo) uint32 {
	if info == nil {
		return noInfo
	}
	return info.StreamID
}

// GetThreadIDFromExceptionInfo returns info's thread id, 0xFFFFFFFF for nil.
func GetThreadIDFromExceptionInfo(info *ExceptionInfo) uint32 {
	if info == nil {
		return noInfo
	}
	return info.ThreadID
}

// GetDeviceIDFromExceptionInfo returns info's device id, 0xFFFFFFFF for nil.
func GetDeviceIDFromExceptionInfo(info *ExceptionInfo) uint32 {
	if info == nil {
		return noInfo
	}
	return info.DeviceID
}

// GetErrorCodeFromExceptionInfo returns info's error code, 0xFFFFFFFF for nil.
func GetErrorCodeFromExceptionInfo(info *ExceptionInfo) uint32 {
	if info == nil {
		return noInfo
	}
	return info.ErrorCode
}

// SetExceptionInfoCallback sets the function called, on the failing stream's
// goroutine, each time an asynchronous task of this device fails
// (aclrtSetExceptionInfoCallback). The last setting wins; nil clears it. The
// callback must not block for long: the stream waits for it.
func (d *Device) SetExceptionInfoCallback(cb func(*ExceptionInfo)) error {
	if err := d.check("SetExceptionInfoCallback"); err != nil {
		return err
	}
	if cb == nil {
		d.exc.Store(nil)
	} else {
		d.exc.Store(&cb)
	}
	return nil
}

func (d *Device) raise(s *Stream, seq uint64, err error) {
	p := d.exc.Load()
	if p == nil {
		return
	}
	(*p)(&ExceptionInfo{
		TaskID:    uint32(seq),
		StreamID:  uint32(s.id),
		ThreadID:  s.tid,
		DeviceID:  uint32(d.id),
		ErrorCode: uint32(CodeOf(err)),
		Err:       err,
	})
}
