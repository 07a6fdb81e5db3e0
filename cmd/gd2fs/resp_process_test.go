package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gd2fs/gd2fs/client"
)

// respCmd encodes one RESP command.
func respCmd(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

// respReply reads one simple, error, integer, null or bulk reply.
func respReply(br *bufio.Reader) (string, error) {
	line, err := br.ReadString('\n')
	if err != nil {
		return "", err
	}
	if line[0] != '$' || line == "$-1\r\n" {
		return strings.TrimRight(line, "\r\n"), nil
	}
	n, err := strconv.Atoi(strings.TrimSpace(line[1:]))
	if err != nil {
		return "", err
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(br, b); err != nil {
		return "", err
	}
	return string(b[:n]), nil
}

// TestRESPOwnerDies runs a master and three servers as processes, each with
// a Redis-protocol endpoint, stores keys through one endpoint, SIGKILLs the
// server owning some of them, and sends one pipeline of GETs: the dead
// owner's keys answer a miss ($-1), every other key its value, and the
// pipeline runs to its end. Once the master has marked the server down,
// SETs of those keys work again (they moved to the survivors).
func TestRESPOwnerDies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs processes")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	maddr := freeAddr(t)
	murl := "http://" + maddr
	const token = "tok"
	spawn(t, bin, "master", "--listen", maddr, "--meta", "sqlite://"+filepath.Join(dir, "meta.db"),
		"--token", token, "--down-after", "1s", "--repair-after", "-1s")
	raddrs := make([]string, 3)
	kill := make([]func(), 3)
	for i := range raddrs {
		raddrs[i] = freeAddr(t)
		cmd := spawn(t, bin, "server", "--master", murl, "--token", token, "--listen", freeAddr(t),
			"--mem", "16MiB", "--kv-mem", "64MiB", "--id", fmt.Sprintf("s%d", i), "--heartbeat", "200ms",
			"--resp-listen", raddrs[i])
		kill[i] = func() { cmd.Process.Signal(syscall.SIGKILL); cmd.Wait() }
	}
	cl, err := client.New(client.Config{Master: murl, Token: token, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	waitUp(t, cl, 3)

	nc, err := net.DialTimeout("tcp", raddrs[0], 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(60 * time.Second))
	br := bufio.NewReader(nc)
	do := func(args ...string) string {
		t.Helper()
		if _, err := io.WriteString(nc, respCmd(args...)); err != nil {
			t.Fatal(err)
		}
		r, err := respReply(br)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := do("AUTH", token); r != "+OK" {
		t.Fatalf("AUTH: %s", r)
	}
	const n = 60
	for i := 0; i < n; i++ {
		if r := do("SET", fmt.Sprintf("k%d", i), fmt.Sprintf("v%d", i)); r != "+OK" {
			t.Fatalf("SET k%d: %s", i, r)
		}
	}
	// Which keys live on the server about to die (s1)?
	onVictim := map[int]bool{}
	victims := 0
	kv := cl.KV("perf")
	for i := 0; i < n; i++ {
		info, err := kv.Stat(context.Background(), fmt.Sprintf("k%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if info.Server == "s1" {
			onVictim[i] = true
			victims++
		}
	}
	if victims == 0 {
		t.Fatal("no key on s1")
	}
	kill[1]()

	var pipe strings.Builder
	for i := 0; i < n; i++ {
		pipe.WriteString(respCmd("GET", fmt.Sprintf("k%d", i)))
	}
	pipe.WriteString(respCmd("PING"))
	if _, err := io.WriteString(nc, pipe.String()); err != nil {
		t.Fatal(err)
	}
	misses := 0
	for i := 0; i < n; i++ {
		r, err := respReply(br)
		if err != nil {
			t.Fatalf("GET k%d: %v", i, err)
		}
		want := fmt.Sprintf("v%d", i)
		if onVictim[i] {
			want = "$-1"
			misses++
		}
		if r != want {
			t.Errorf("GET k%d (on the dead server: %v): %q, want %q", i, onVictim[i], r, want)
		}
	}
	if r, err := respReply(br); err != nil || r != "+PONG" {
		t.Fatalf("pipeline did not run to its end: %q %v", r, err)
	}
	t.Logf("%d of %d keys were on the killed server and answered a miss", misses, n)

	// After the master marks s1 down, its keys have new owners.
	waitUp(t, cl, 2)
	for i := 0; i < n; i++ {
		if !onVictim[i] {
			continue
		}
		key := fmt.Sprintf("k%d", i)
		deadline := time.Now().Add(10 * time.Second)
		for {
			r := do("SET", key, "again")
			if r == "+OK" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("SET %s after the owner died: %s", key, r)
			}
			time.Sleep(100 * time.Millisecond) // the endpoint refreshes its map at most once a second
		}
		if r := do("GET", key); r != "again" {
			t.Fatalf("GET %s: %q", key, r)
		}
	}
}
