// Package bench holds the references gd2fs benchmarks measure themselves
// against in the same run (DESIGN.md §9).
package bench

import (
	"io"
	"net"
	"sort"
	"sync"
	"time"
)

// Loopback moves total bytes over streams parallel loopback TCP connections
// (a plain Go sender and receiver, 4 MiB writes) and returns bytes/second.
func Loopback(total int64, streams int) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	per := total / int64(streams)
	var wg sync.WaitGroup
	errc := make(chan error, 2*streams)
	go func() {
		for i := 0; i < streams; i++ {
			c, err := ln.Accept()
			if err != nil {
				errc <- err
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				buf := make([]byte, 4<<20)
				if _, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{c}, buf); err != nil {
					errc <- err
				}
			}()
		}
	}()
	conns := make([]net.Conn, streams)
	for i := range conns {
		if conns[i], err = net.Dial("tcp", ln.Addr().String()); err != nil {
			return 0, err
		}
	}
	start := time.Now()
	var swg sync.WaitGroup
	for _, c := range conns {
		swg.Add(1)
		go func() {
			defer swg.Done()
			buf := make([]byte, 4<<20)
			for sent := int64(0); sent < per; {
				n := min(int64(len(buf)), per-sent)
				if _, err := c.Write(buf[:n]); err != nil {
					errc <- err
					return
				}
				sent += n
			}
			c.(*net.TCPConn).CloseWrite()
		}()
	}
	swg.Wait()
	wg.Wait()
	el := time.Since(start)
	for _, c := range conns {
		c.Close()
	}
	select {
	case err := <-errc:
		return 0, err
	default:
	}
	return float64(per*int64(streams)) / el.Seconds(), nil
}

// Median of xs (xs is sorted in place).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[len(xs)/2]
}
