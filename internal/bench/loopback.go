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
// (a plain Go sender and receiver, 4 MiB writes and 4 MiB reads, as a
// client writes and reads pieces) and returns bytes/second.
func Loopback(total int64, streams int) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	per := total / int64(streams)
	bufs := loopBuffers(2 * streams)
	var wg sync.WaitGroup
	errc := make(chan error, 2*streams)
	go func() {
		for i := range streams {
			c, err := ln.Accept()
			if err != nil {
				errc <- err
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				// Read into our own 4 MiB buffer: io.Copy into io.Discard
				// would use io.Discard's ReadFrom and its 8 KiB buffer, a
				// syscall per 8 KiB, which no gd2fs path pays (a reference
				// that weak made gd2fs reads look faster than loopback).
				buf := bufs[streams+i]
				for {
					if _, err := c.Read(buf); err != nil {
						if err != io.EOF {
							errc <- err
						}
						return
					}
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
	for i, c := range conns {
		swg.Add(1)
		go func() {
			defer swg.Done()
			buf := bufs[i]
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

// loopBuf holds the loopback reference's 4 MiB buffers from one run to
// the next, written once when made. The gd2fs cases move bytes from and
// into buffers the benchmark made once (and DRAM pages a server reuses);
// new buffers every run would charge the reference the first touch of
// fresh memory, which on a virtual machine costs more than the copy.
var loopBuf struct {
	sync.Mutex
	bufs [][]byte
}

func loopBuffers(n int) [][]byte {
	loopBuf.Lock()
	defer loopBuf.Unlock()
	for len(loopBuf.bufs) < n {
		b := Buffer(4 << 20)
		for i := range b {
			b[i] = byte(i*7 + i>>13)
		}
		loopBuf.bufs = append(loopBuf.bufs, b)
	}
	return loopBuf.bufs[:n]
}

// Median of xs (xs is sorted in place).
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[len(xs)/2]
}
