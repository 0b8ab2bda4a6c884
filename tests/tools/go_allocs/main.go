// A Go program that allocates (tests/allocations.rs): the Go runtime's
// allocator is its own, built CGO_ENABLED=0 it maps no libc, so the
// allocation profiler, which probes a libc's malloc family, refuses it.
//
// Usage: go_allocs SECONDS
package main

import (
	"os"
	"strconv"
	"time"
)

var sink [][]byte

func main() {
	seconds := 60.0
	if len(os.Args) > 1 {
		if parsed, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = parsed
		}
	}
	end := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(end) {
		sink = append(sink, make([]byte, 4096))
		if len(sink) > 256 {
			sink = sink[:0]
		}
		time.Sleep(time.Millisecond)
	}
}
