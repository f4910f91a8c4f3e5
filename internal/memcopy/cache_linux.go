package memcopy

import (
	"os"
	"path/filepath"
	"strings"
)

// l2Bytes returns the size of cpu0's level-2 data (or unified) cache from
// sysfs, or 0 when it cannot be read.
func l2Bytes() int64 {
	dirs, _ := filepath.Glob("/sys/devices/system/cpu/cpu0/cache/index*")
	for _, d := range dirs {
		if read(d, "level") != "2" {
			continue
		}
		if t := read(d, "type"); t != "Unified" && t != "Data" {
			continue
		}
		if n := parseSize(read(d, "size")); n > 0 {
			return n
		}
	}
	return 0
}

func read(dir, name string) string {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
