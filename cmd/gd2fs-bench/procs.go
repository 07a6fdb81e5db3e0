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
	master, err := freeAddr()
	if err != nil {
		return nil, "", err
	}
	url := "http://" + master
	args := append([]string{"up", "--dir", dir, "--listen", master, "--port", "0",
		"--servers", strconv.Itoa(servers)}, extra...)
	cmd := exec.Command(bin, args...)
	cmd.Stderr = os.Stderr
	dieWithUs(cmd)
	if err := cmd.Start(); err != nil {
		return nil, "", err
	}
	up, err := waitServersUp(ctx, url, servers)
	if err != nil || !up {
		cmd.Process.Kill()
		cmd.Wait()
	}
	if err != nil {
		return nil, "", err
	}
	if !up {
		return nil, "", fmt.Errorf("gd2fs up (%s) did not bring %d servers up within 30 s", bin, servers)
	}
	return cmd, url, nil
}

// waitServersUp polls the master at url until it reports servers data
// servers up; false means they were not up within 30 s. The error is only
// that of making the client: a master not answering yet is waited for.
func waitServersUp(ctx context.Context, url string, servers int) (bool, error) {
	cl, err := client.New(client.Config{Master: url})
	if err != nil {
		return false, err
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
			return true, nil
		}
	}
	return false, nil
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

// freeAddr finds a free loopback address for a master; its servers take
// ephemeral ports (`gd2fs up --port 0`), so nothing races for a block of ports.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
