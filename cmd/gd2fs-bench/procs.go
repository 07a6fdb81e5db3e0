package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/gd2fs/gd2fs/client"
)

// gd2fsUp runs `gd2fs up` as its own process (master and servers), as the
// references run as theirs, so the benchmark's Go runtime hosts only the
// clients. It returns the process and the master's URL once every server is
// up. extra are more flags for `gd2fs up`.
func gd2fsUp(ctx context.Context, dir string, servers int, extra ...string) (*exec.Cmd, string, error) {
	bin, err := gd2fsPath()
	if err != nil {
		return nil, "", err
	}
	master, first, err := freePorts(servers)
	if err != nil {
		return nil, "", err
	}
	url := "http://" + master
	args := append([]string{"up", "--dir", dir, "--listen", master, "--port", strconv.Itoa(first),
		"--servers", strconv.Itoa(servers)}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	dieWithUs(cmd)
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	cl, err := client.New(client.Config{Master: url})
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, "", err
	}
	defer cl.Close()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		st, err := cl.Status(ctx)
		if err != nil {
			continue
		}
		up := 0
		for _, s := range st.Servers {
			if s.State == "up" {
				up++
			}
		}
		if up == servers {
			return cmd, url, nil
		}
	}
	cmd.Process.Kill()
	cmd.Wait()
	return nil, "", fmt.Errorf("gd2fs up (%s) did not bring %d servers up within 30 s", bin, servers)
}

// dieWithUs has the kernel kill cmd when the benchmark dies, so an
// interrupted run (Ctrl-C) leaves no server or Redis behind.
func dieWithUs(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// stopProc ends a process the benchmark started and reaps it.
func stopProc(cmd *exec.Cmd) {
	cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// freePorts finds a free loopback port for a master and n consecutive free
// ones for servers (`gd2fs up` puts server i on port+i). Another process
// may take one before gd2fs binds it; gd2fsUp then fails and says so.
func freePorts(n int) (master string, first int, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", 0, err
	}
	master = l.Addr().String()
	defer l.Close()
	for try := 0; try < 50; try++ {
		probe, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", 0, err
		}
		first = probe.Addr().(*net.TCPAddr).Port
		probe.Close()
		ok := true
		var held []net.Listener
		for i := 0; i < n && ok; i++ {
			q, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(first+i))
			if err != nil {
				ok = false
				break
			}
			held = append(held, q)
		}
		for _, q := range held {
			q.Close()
		}
		if ok {
			return master, first, nil
		}
	}
	return "", 0, fmt.Errorf("no %d consecutive free loopback ports", n)
}
