package resp_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/internal/cluster"
)

// BenchmarkRESPGet reads values with GET over 4 connections (one request in
// flight each) from gd2fs's endpoint (one data server, in this process) and,
// as the reference in the same run, from a redis-server process when one is
// installed. Compare the MB/s of the two sub-benchmarks of each size.
//
//	go test -run '^$' -bench RESPGet ./internal/resp/
func BenchmarkRESPGet(b *testing.B) {
	c, err := cluster.Start(context.Background(), cluster.Config{Dir: b.TempDir(), Servers: 1, MemBytes: 8 << 20,
		KVMemBytes: 512 << 20, RESP: true})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	targets := [][2]string{{"gd2fs", c.RESP[0].Addr()}}
	if _, err := os.Stat("/usr/bin/redis-server"); err == nil {
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := l.Addr().String()
		l.Close()
		_, port, _ := net.SplitHostPort(addr)
		cmd := exec.Command("/usr/bin/redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		defer func() { cmd.Process.Kill(); cmd.Wait() }()
		for i := 0; i < 100; i++ {
			if nc, err := net.Dial("tcp", addr); err == nil {
				nc.Close()
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		targets = append(targets, [2]string{"redis", addr})
	}
	for _, size := range []int{64 << 10, 1 << 20} {
		for _, tg := range targets {
			b.Run(tg[0]+"/"+strconv.Itoa(size>>10)+"KiB", func(b *testing.B) {
				const keys = 64
				val := make([]byte, size)
				nc, err := net.Dial("tcp", tg[1])
				if err != nil {
					b.Fatal(err)
				}
				br := bufio.NewReader(nc)
				for k := 0; k < keys; k++ {
					nc.Write(encode("SET", "b"+strconv.Itoa(k), string(val)))
					if _, err := br.ReadString('\n'); err != nil {
						b.Fatal(err)
					}
				}
				nc.Close()
				b.SetBytes(int64(size))
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for w := 0; w < 4; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						nc, err := net.Dial("tcp", tg[1])
						if err != nil {
							b.Error(err)
							return
						}
						defer nc.Close()
						br := bufio.NewReaderSize(nc, 64<<10)
						dst := make([]byte, size+2)
						for {
							i := next.Add(1) - 1
							if i >= int64(b.N) {
								return
							}
							nc.Write(encode("GET", "b"+strconv.Itoa(int(i%keys))))
							line, err := br.ReadString('\n')
							if err != nil || line != "$"+strconv.Itoa(size)+"\r\n" {
								b.Errorf("GET: %q %v", line, err)
								return
							}
							if _, err := io.ReadFull(br, dst); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
			})
		}
	}
}
