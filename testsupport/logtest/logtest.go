// Package logtest holds what tests read logs with.
package logtest

import (
	"strings"
	"sync"
)

// Buffer collects what a logger (or a child process) writes while the
// test reads it: safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
