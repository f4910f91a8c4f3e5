//go:build linux

// tcp-pingpong-go is pingpong.c's tcpspin written in Go: the 8-byte round
// trip over tcp loopback between two processes, each busy-polling its
// non-blocking socket with raw read and write system calls and doing
// nothing else. It is the floor of hcomm bench p2p over tcp for a Go
// program: the part of hcomm's round trip above it is hcomm's, the part
// between it and tcpspin is Go's (BENCHMARKS.md, stop 37).
//
//	go build -o /tmp/tcp-pingpong-go ./scripts/tcp-pingpong-go
//	taskset -c 1 /tmp/tcp-pingpong-go server 39123 20000 &
//	taskset -c 0 /tmp/tcp-pingpong-go client 39123 20000
package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
	"unsafe"
)

func fdOf(c net.Conn) int {
	c.(*net.TCPConn).SetNoDelay(true)
	f, err := c.(*net.TCPConn).File()
	if err != nil {
		panic(err)
	}
	fd := int(f.Fd())
	if err := syscall.SetNonblock(fd, true); err != nil {
		panic(err)
	}
	return fd
}

func rd(fd int, b []byte) {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
		if e == 0 && int(n) > 0 {
			return
		}
	}
}

func wr(fd int, b []byte) {
	syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)))
}

func main() {
	port := os.Args[2]
	n, _ := strconv.Atoi(os.Args[3])
	buf := make([]byte, 64)
	if os.Args[1] == "server" {
		ln, err := net.Listen("tcp", "127.0.0.1:"+port)
		if err != nil {
			panic(err)
		}
		c, err := ln.Accept()
		if err != nil {
			panic(err)
		}
		fd := fdOf(c)
		for i := 0; i < n+1000; i++ {
			rd(fd, buf)
			wr(fd, buf[:8])
		}
		return
	}
	var c net.Conn
	var err error
	for i := 0; i < 100; i++ {
		if c, err = net.Dial("tcp", "127.0.0.1:"+port); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		panic(err)
	}
	fd := fdOf(c)
	for i := 0; i < 1000; i++ {
		wr(fd, buf[:8])
		rd(fd, buf)
	}
	t := time.Now()
	for i := 0; i < n; i++ {
		wr(fd, buf[:8])
		rd(fd, buf)
	}
	fmt.Printf("tcp-pingpong-go RTT %.2f us\n", time.Since(t).Seconds()*1e6/float64(n))
}
